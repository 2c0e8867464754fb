"""A supervisor's periodic upkeep: the heartbeat that renews its processes' leases and worker
rows, expired leases released (never right after the lease clock jumped), the pool's
housekeeping when it falls to this supervisor, the schedules' upkeep, and SQLite's journal
written back. Each step tries the database once per tick and never blocks the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from jobqueue import clock
from jobqueue.clock import host_now, utcnow
from jobqueue.runtime.housekeeping import Housekeeping
from jobqueue.runtime.pool import Child
from jobqueue.runtime.process import worker_row
from jobqueue.runtime.resilience import DatabaseGuard
from jobqueue.runtime.retry_later import RETRY_SOON_SECONDS, RetryLater
from jobqueue.runtime.schedule_upkeep import ScheduleUpkeep
from jobqueue.storage.dialects import WorkerState
from jobqueue.storage.dialects.wakeup import Waker

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.settings import Settings
    from jobqueue.storage.store import Store

logger = logging.getLogger("jobqueue.supervisor")

# How often the supervisor writes SQLite's journal back into the database file (its worker
# processes leave that to it, see Store.take_over_checkpoints).
CHECKPOINT_SECONDS = 1.0

T = TypeVar("T")


class Maintenance:
    """The upkeep on a supervisor's ticks; the attributes declared below are set by Supervisor."""

    app: JobQueue
    settings: Settings
    store: Store
    guard: DatabaseGuard
    later: RetryLater
    housekeeping: Housekeeping
    schedule_upkeep: ScheduleUpkeep
    waker: Waker
    children: dict[int, Child]
    supervisor_id: str
    size: int
    stopping: bool
    unspent: int
    tidies: bool
    checkpoints: bool
    next_checkpoint: float
    next_heartbeat: float
    next_release: float
    release_after: float
    renewed_ns: int | None
    clock_mark: tuple[float, datetime] | None
    last_loop_error: tuple[str, float] | None

    def _maintenance(self) -> None:
        """The upkeep due on this tick. Each step is tried on its own: one that fails with an error
        no retry mends (a statement the database refuses) is logged and tried again on its own
        timer, while the other steps, and the rest of the supervisor's turn (stopping a --burst
        worker, killing jobs past --graceful-timeout), go on."""
        now = time.monotonic()
        if self.checkpoints and now >= self.next_checkpoint:
            self.next_checkpoint = now + CHECKPOINT_SECONDS
            self._step(self._checkpoint)
        if now >= self.next_heartbeat:
            self._step(self._renew, now)
        if now >= self.next_release:
            self.next_release = now + RETRY_SOON_SECONDS
            released = self._step(self._release_expired, now)
            if self.tidies and now >= self.release_after:  # nor any worker row taken for dead
                # Keys whose rows came back: their jobs are takeable, and no enqueue says so.
                self.unspent = min(self.unspent + (self._step(self.housekeeping.run, now) or 0), self.size)
            if self.schedule_upkeep.busy:
                self._step(self.guard.try_once, self.schedule_upkeep.sync_busy)
            if self.app.schedules and not self.stopping:
                self._step(self.schedule_upkeep.keep)
            if released:
                self.next_release = now + self.settings.release_stuck_interval

    def _step(self, step: Callable[..., T], *args: Any) -> T | None:
        """``step(*args)``, or None after logging what it raised."""
        try:
            return step(*args)
        except Exception as exc:
            self._log_error(exc)
            return None

    def _log_error(self, exc: Exception) -> None:
        """Log an error of the supervisor's own (once a minute for the same one)."""
        text = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if self.last_loop_error is None or self.last_loop_error[0] != text or now - self.last_loop_error[1] > 60:
            logger.error("supervisor: %s; it keeps running and tries again", text, exc_info=exc)
            self.last_loop_error = (text, now)

    def _release_expired(self, now: float) -> bool:
        """Release the messages whose lease expired, unless the lease clock just jumped; whether
        the database answered."""
        if self._lease_clock_jumped():
            # Every lease looks closer to its end than it is: renewed first (here, and by
            # every other supervisor when it sees the jump) before any is taken for expired.
            self._renew(now)
            self.release_after = now + self.settings.release_stuck_timeout
        ok, released = (True, 0) if now < self.release_after else self.guard.try_once(self.store.release_expired)
        if released:
            logger.warning("released %s message(s) whose lease expired (a worker died or stalled)", released)
            self.unspent = min(self.unspent + released, self.size)  # ready now: our idle processes take them
        return ok

    def _lease_clock_jumped(self) -> bool:
        """Whether the lease clock (this host's on SQLite, the database server's elsewhere) went
        forward by more than a heartbeat's interval beyond the time that passed (a clock set
        forward, a machine resumed from suspend). Leases are stamped by that clock: after such a
        jump, live ones would look expired and their jobs run twice.

        The reading also tells how far this host's clock is off the server's: this process and its
        worker processes correct theirs by it (see jobqueue.clock)."""
        sent = host_now()
        ok, server = self.guard.try_once(self.store.lease_clock_now, reads=True)
        if not ok or server is None:  # not read this time (the database is down)
            return False
        read_at = time.monotonic()  # as the answer comes: a slow query must not look like a jump
        if not self.store.dialect.client_clock:
            clock.observe(server, sent, host_now())
            for child in self.children.values():  # every time: whatever changed it, they follow
                child.spec.slot.set_clock_base(clock.shared())
        mark, self.clock_mark = self.clock_mark, (read_at, server)
        if mark is None:
            return False
        ahead = (server - mark[1]).total_seconds() - (read_at - mark[0])
        if ahead <= self.settings.heartbeat_interval:
            return False
        logger.warning(
            "the lease clock (%s) went %.0f s further than the time that passed; renewing every lease now "
            "and releasing none for %.0f s, so that live jobs are not taken for stuck ones",
            "this host's clock" if self.store.dialect.client_clock else "the database server's clock",
            ahead,
            self.settings.release_stuck_timeout,
        )
        return True

    def _renew(self, now: float) -> None:
        """Renew the leases of every child's jobs (the heartbeat), and look who else serves our queues."""
        # Set first: an error below must not make every tick try again. Soon enough that one
        # failure leaves the worker processes' leases fresh (see WorkerProcess.lease_window).
        self.next_heartbeat = now + min(RETRY_SOON_SECONDS, self.settings.heartbeat_interval / 3)
        children = list(self.children.values())
        workers = [self._worker_state(child) for child in children]
        sent_ns = time.monotonic_ns()
        ok, _ = self.guard.try_once(
            lambda: self.store.heartbeat(workers, self.settings.release_stuck_timeout), doing="renewing leases"
        )
        if ok:
            # Each child starts buffered work only while its leases are fresh, and renews its
            # running job's lease itself when these renewals stop (this process stopped or stuck).
            # After renewals stopped for longer than a lease (an outage, this process frozen),
            # what the children held before may have been released and taken by others: this
            # renewal does not vouch for it.
            done_ns = time.monotonic_ns()
            lapsed = (
                self.renewed_ns is not None and done_ns - self.renewed_ns > self.settings.release_stuck_timeout * 1e9
            )
            self.renewed_ns = sent_ns
            for child in children:
                child.spec.slot.renewed(sent_ns, lapsed)
            self.next_heartbeat = now + self.settings.heartbeat_interval
            # Rows deleted meanwhile (as stale, while this process renewed nothing) come back: a
            # worker missing from the registry is missing from `jobqueue workers` and health probes.
            # Only processes past their own registration (in their loop: idle, running or done
            # with a job): one still starting registers itself.
            rows = [
                worker_row(c.spec.worker_id, self.supervisor_id, c.process.pid, self.settings.queues)
                for c in children
                if _in_its_loop(c)
            ]
            found, missing = self.guard.try_once(lambda: self.store.register_missing_workers(rows))
            if found and missing:
                logger.warning(
                    "%s worker process row(s) of this supervisor were gone from the worker registry (deleted as "
                    "stale while it renewed nothing); registered again",
                    missing,
                )
            # Who else serves these queues: news of work is shared out among us.
            found, peers = self.guard.try_once(
                lambda: self.store.supervisor_peers(
                    self.supervisor_id, self.settings.queues, self.settings.worker_stale_after
                ),
                reads=True,
            )
            if found and peers is not None:
                self.waker.set_peers(*peers)
                # The housekeeping every supervisor of a pool could do is done by the first.
                self.tidies = peers[0] == 0

    def _checkpoint(self) -> None:
        """Write SQLite's journal back; an error is logged once until it succeeds again (the
        journal grows meanwhile, and the workers go on)."""
        what = "write the database journal back"
        try:
            self.guard.try_once(self.store.checkpoint)
        except Exception:
            if what not in self.later.failing:
                logger.exception("could not %s; trying again every %.0f s", what, CHECKPOINT_SECONDS)
            self.later.failing.add(what)
        else:
            self.later.failing.discard(what)

    @staticmethod
    def _worker_state(child: Child) -> WorkerState:
        """What a child is doing, for its worker row (the slot's running time is on the monotonic
        clock, which every process of the host shares)."""
        view = child.spec.slot.read_raw()
        since = None
        if view.running_id and view.running_since_ns:
            since = utcnow() - timedelta(seconds=(time.monotonic_ns() - view.running_since_ns) / 1e9)
        return WorkerState(child.spec.worker_id, view.running_id or None, since, view.done)


def _in_its_loop(child: Child) -> bool:
    """Whether a worker process has registered itself and runs its loop, by its slot."""
    view = child.spec.slot.read_raw()
    return bool(view.idle or view.running_id or view.done)
