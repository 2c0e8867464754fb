"""Database work the supervisor could not do now: kept, and tried again every second.

The supervisor's loop never blocks on the database: returning a dead process's messages, or the
buffer taken back from behind a slow job, is tried once; during an outage (or while the database
refuses it) the step is kept and tried again on later ticks, until it succeeds or the supervisor
stops. Each step is whole (a release and its record of a timeout), so a retry never does half.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.runtime.writer import Unwritten

logger = logging.getLogger("jobqueue.supervisor")

RETRY_SOON_SECONDS = 1.0


class RetryLater:
    """The steps kept for later, and which of them fail for a reason retrying may not fix."""

    def __init__(self, guard: DatabaseGuard) -> None:
        self.guard = guard
        self.pending: list[tuple[str, Callable[[], Any]]] = []
        self.failing: set[str] = set()  # database work that failed for a reason retrying may not fix
        self.next_retry = 0.0

    def do(self, what: str, operation: Callable[[], Any]) -> None:
        """Run ``operation`` now; during an outage, or while the database refuses it, keep it for later."""
        try:
            ok, _ = self.guard.try_once(operation)
        except (GaveUp, Unwritten):
            ok = False
        except Exception:
            if what not in self.failing:  # once, not every retry
                logger.exception("could not %s; trying again", what)
            self.failing.add(what)
            ok = False
        if ok:
            self.failing.discard(what)
        else:
            self.pending.append((what, operation))

    def retry_due(self, now_anyway: bool = False) -> None:
        """Try the kept steps again, if a second has passed since the last try (or ``now_anyway``)."""
        now = time.monotonic()
        if now < self.next_retry and not now_anyway:
            return
        pending, self.pending = self.pending, []
        for what, operation in pending:
            self.do(what, operation)
        self.next_retry = now + (RETRY_SOON_SECONDS if self.pending else 0.0)

    def finish(self, seconds: float, stopped: Callable[[], bool]) -> None:
        """On the way out: keep trying for up to ``seconds`` (unless ``stopped()``), then say what
        was given up."""
        deadline = time.monotonic() + seconds
        while self.pending and time.monotonic() < deadline and not stopped():
            time.sleep(RETRY_SOON_SECONDS)
            self.retry_due(now_anyway=True)
        for what, _ in self.pending:
            logger.error("gave up trying to %s; the messages return to the queue when their leases expire", what)
