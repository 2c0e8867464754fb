"""How a worker process takes work: how much it fetches and when, and how it idles until its
supervisor brings news of work. While the supervisor renews no lease, it takes no work at all.

A fetch is sized to about ``PREFETCH_WINDOW_SECONDS`` of work, at most ``fetch_batch_size``: no-op
jobs come in large batches, slow jobs one at a time. A fetch that comes back short of its limit
means the queues are empty for now: the process then waits, sending nothing, until woken.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import time
from typing import TYPE_CHECKING

from jobqueue import clock
from jobqueue.job import Message
from jobqueue.runtime.holdings import Holdings
from jobqueue.runtime.oscalls import drain, poke
from jobqueue.runtime.process_keeper import KEEPER_TICK_SECONDS
from jobqueue.runtime.resilience import DatabaseGuard
from jobqueue.storage.store_acquire import new_lease_token

if TYPE_CHECKING:
    from jobqueue.runtime.process import ChildSpec
    from jobqueue.settings import Settings
    from jobqueue.storage.store import Store

logger = logging.getLogger("jobqueue.worker")

PREFETCH_WINDOW_SECONDS = 0.1


class Fetching:
    """Fetching and idling, for WorkerProcess: the attributes declared below are set by it."""

    spec: ChildSpec
    settings: Settings
    store: Store
    guard: DatabaseGuard
    held: Holdings
    capacity: int
    lease_window: float
    rated: bool
    stopping: bool
    idle: bool
    silent_since: float | None
    next_fetch_at: float
    avg_duration: float | None
    pending_token: int | None
    wake_at: float | None

    def _supervisor_renewing(self) -> bool:
        """False while the supervisor has renewed nothing for longer than the start window: it is
        stopped (SIGSTOP, a debugger) or stuck, and a job taken now could outlive its lease with
        nobody to renew it, and run again elsewhere at the same time. No new work is taken then."""
        silent = time.monotonic_ns() - self.spec.slot.renewed_ns() > self.lease_window * 1e9
        if not silent:
            if self.silent_since is not None:
                logger.warning(
                    "worker process %s: the supervisor renews leases again after %.1f s; taking work again",
                    os.getpid(),
                    time.monotonic() - self.silent_since,
                )
                self.silent_since = None
            return True
        if self.silent_since is None:
            self.silent_since = time.monotonic()
            logger.warning(
                "worker process %s: the supervisor (pid %s) has renewed no lease for over %.1f s (it is "
                "stopped or stuck, or the database is unavailable to it); this process takes no new job "
                "until it does",
                os.getpid(),
                self.spec.supervisor_pid,
                self.lease_window,
            )
        return False

    def _wait_for_supervisor(self) -> None:
        """Nothing to run and the supervisor silent: look again a tick later (or when woken)."""
        self._set_idle(True)
        ready, _, _ = select.select([self.spec.wake_r], [], [], KEEPER_TICK_SECONDS)
        if ready:
            drain(self.spec.wake_r)
        self.next_fetch_at = 0.0

    def _fetch_due(self) -> bool:
        if time.monotonic() < self.next_fetch_at:
            return False
        # An empty buffer always fetches (its batch list starts anew); a top-up only when a whole
        # batch fits and the slot can list one more batch.
        held = len(self.held)
        return not held or (self.capacity - held >= self.settings.fetch_batch_size and self.held.can_fetch())

    def fetch_limit(self) -> int:
        """How many messages to ask for: what fits, and no more than PREFETCH_WINDOW_SECONDS of work."""
        limit = min(self.settings.fetch_batch_size, self.capacity - len(self.held))
        if self.avg_duration is None:
            # Nothing known yet: one message tells us how long they take, and asking for a second
            # tells whether more wait (then a sibling is woken for them; the supervisor takes the
            # second back for an idle process if the first turns out slow).
            return min(2, limit)
        return max(1, min(limit, int(PREFETCH_WINDOW_SECONDS / max(self.avg_duration, 1e-6))))

    def _fetch(self) -> None:
        limit = self.fetch_limit()
        clock.follow(self.spec.slot.clock_base())  # due times on the server's clock

        sent_ns = 0

        def acquire() -> list[Message]:
            nonlocal sent_ns
            # The token is ours before the statement runs, so an acquisition whose COMMIT reply was
            # lost (connection dropped) can be found and undone before we try again.
            self.pending_token = new_lease_token()
            sent_ns = time.monotonic_ns()  # the lease runs from no earlier than this
            messages = self.store.acquire(
                self.spec.worker_id,
                self.settings.queues,
                limit,
                self.settings.release_stuck_timeout,
                token=self.pending_token,
                flow=True,
                rated=self.rated,
            )
            self.pending_token = None
            return messages

        messages = self.guard.call(
            acquire, give_up=lambda: self.stopping, on_retry=self._undo_lost_acquire, doing="acquiring jobs"
        )
        self.held.add_fetched(messages, sent_ns)
        now = time.monotonic()
        if len(messages) >= limit:
            # A full batch: more may be waiting, so the supervisor wakes a sibling, and this
            # process looks again as soon as it has room.
            poke(self.spec.more_w)
            self.next_fetch_at = now + self.settings.min_fetch_interval
        else:
            # The queues had no more for us: the next fetch waits for news of work, which the
            # supervisor brings (new jobs, and delayed ones coming due), so that an idle process
            # sends no statement and a job that arrives alone costs one acquire.
            self.next_fetch_at = math.inf
        if self.wake_at is not None:
            # A message we deferred comes due before then: look again right then.
            if self.wake_at <= now:
                self.wake_at = None
            else:
                self.next_fetch_at = min(self.next_fetch_at, self.wake_at)
        due_in = self.store.flow_due_in if self.rated else None
        if due_in is not None:
            # A key held back by its rate may start its next job then.
            self.next_fetch_at = min(self.next_fetch_at, now + max(0.001, due_in))
        if not messages and not len(self.held):
            self._set_idle(True)
        elif messages:
            self._set_idle(False)

    def _undo_lost_acquire(self) -> None:
        if self.pending_token is not None:
            self.store.release_token(self.pending_token)
            self.pending_token = None

    def _idle_wait(self) -> None:
        # A signal wakes the select below through the wake-up descriptor, which a job may have
        # cleared (asyncio.run() after loop.add_signal_handler() does as it ends): set again here,
        # before the stop is looked at, rather than after every job (a microsecond each).
        signal.set_wakeup_fd(self.spec.wake_w, warn_on_full_buffer=False)
        timeout = self.next_fetch_at - time.monotonic()
        if timeout <= 0 or self.stopping:
            return
        self._set_idle(True)
        ready, _, _ = select.select([self.spec.wake_r], [], [], None if timeout == math.inf else timeout)
        if ready:
            drain(self.spec.wake_r)
            self.next_fetch_at = 0.0  # woken: work may have arrived (or a signal, which the loop sees)

    def _set_idle(self, idle: bool) -> None:
        if idle == self.idle:
            return
        self.idle = idle
        self.spec.slot.set_idle(idle)
        if idle:
            poke(self.spec.idle_w)  # news that found nobody idle is ours now
