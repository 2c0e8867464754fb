"""How idle workers learn that new work arrived, as each database can tell them.

Two roles, both given by the dialect:

- a **Waker** for the supervisor, asked while some of its processes idle: SQLite reads
  ``PRAGMA data_version`` (it changes whenever another connection commits, and reading it touches
  no table); MySQL asks one indexed question ("is anything ready?") for the whole pool; on
  PostgreSQL the processes listen themselves, and the supervisor's waker does nothing.
- a **Listener** for a worker process, where the database can notify (PostgreSQL's LISTEN): a
  descriptor that becomes readable on news. The dialect runs that process's acquire on the same
  connection, so the acquire that follows a notification reaches a server process that is awake.

Where the supervisor learns of work, it wakes one idle process per piece of news; processes keep
their own slow poll (``max_fetch_interval``) as the fallback, and for delayed jobs coming due.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger("jobqueue.supervisor")


class Waker:
    """The supervisor's: nothing to wait on, never says there is news."""

    def fileno(self) -> int | None:
        """A descriptor that becomes readable on news, or None."""
        return None

    def due_in(self, now: float) -> float | None:
        """Seconds until the next poll, or None when this waker does not poll."""
        return None

    def check(self, now: float) -> int:
        """Consume what arrived; how many pieces of news (0: nothing new)."""
        return 0

    def close(self) -> None:
        pass


class PollingWaker(Waker):
    """Ask ``poll`` every ``interval`` seconds while processes idle."""

    def __init__(self, poll: Callable[[], bool], interval: float) -> None:
        self.poll = poll
        self.interval = interval
        self.next_at = 0.0

    def due_in(self, now: float) -> float | None:
        return max(0.0, self.next_at - now)

    def check(self, now: float) -> int:
        if now < self.next_at:
            return 0
        self.next_at = now + self.interval
        try:
            return int(self.poll())
        except Exception as exc:  # an outage: the supervisor's guard reports it elsewhere
            logger.debug("idle poll failed: %s", exc)
            return 0


class Listener(Protocol):
    """A worker process's view of its database's notifications."""

    def wait(self, also: list[int], timeout: float) -> tuple[bool, list[int]]:
        """Block until news arrives, a descriptor of ``also`` is readable, or ``timeout`` passes;
        return whether there was news, and which of ``also`` are readable."""

    def drain(self) -> None:
        """Read what arrived, from another thread, while the main one runs a job."""

    def close(self) -> None: ...
