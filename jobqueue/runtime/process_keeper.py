"""A worker process's keeper thread: what goes on while a job holds the main thread.

The keeper leaves with the supervisor (it notices the new parent within a tick where the kernel
sends no parent-death signal), writes outcomes that would otherwise wait longer than
``flush_interval``, and renews the running job's lease while the supervisor misses its renewals.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from jobqueue.job import Message
from jobqueue.runtime.holdings import Holdings
from jobqueue.runtime.oscalls import die_with_supervisor, orphaned
from jobqueue.runtime.resilience import DatabaseGuard
from jobqueue.runtime.writer import OutcomeWriter, Unwritten
from jobqueue.storage.store_deliveries import FlushResult

if TYPE_CHECKING:
    from jobqueue.runtime.process import ChildSpec
    from jobqueue.settings import Settings
    from jobqueue.storage.store import Store

logger = logging.getLogger("jobqueue.worker")

KEEPER_TICK_SECONDS = 0.1


class KeeperThread:
    """The keeper thread's work: WorkerProcess.main starts the thread, and WorkerProcess sets the
    attributes declared below (two of them are its methods)."""

    spec: ChildSpec
    settings: Settings
    store: Store
    held: Holdings
    keeper_stop: threading.Event
    keeper_writer: OutcomeWriter
    keeper_renewals: DatabaseGuard
    keeper_renew_after_ns: int
    keeper_lost: int | None
    keeper_renewed_id: int | None
    acked_first: int | None
    _timeout_of: Callable[[Message], float | None]
    _written: Callable[[FlushResult], None]

    def _keeper(self) -> None:
        """Keeper thread: leave with the supervisor; while a job runs, write overdue outcomes, and
        renew its lease while the supervisor does not."""
        while not self.keeper_stop.wait(KEEPER_TICK_SECONDS):
            if orphaned(self.spec.supervisor_pid):
                die_with_supervisor()
            try:
                self._keep_running_lease()
            except Exception as exc:  # tried again next tick; the supervisor may be back by then
                logger.debug("keeper could not renew the running job's lease: %s", exc)
            taken = self.held.take_overdue(self.settings.flush_interval)
            if not taken:
                continue
            try:
                result = self.keeper_writer.write(taken, give_up=lambda: True)
            except Unwritten as refused:
                self._written(refused.written)
                self.held.restore(refused.remaining)  # the main loop writes them, or says why not
                continue
            except Exception as exc:
                # Nothing is lost: what it took is written later (fenced, so writing twice is harmless).
                logger.debug("keeper could not write %s outcome(s) yet: %s", len(taken), exc)
                self.held.restore(taken)
                continue
            self._written(result)

    def _keep_running_lease(self) -> None:
        """While the supervisor misses its renewals (stopped or stuck), renew the running job's
        lease from here, as the supervisor would have: the job is alive and running, and letting
        its lease run out would have another worker run it at the same time. Not past the job's
        hard time limit, which only the supervisor enforces."""
        lease = self.held.running_lease()
        if lease is None:
            return
        message, renewed_ns = lease
        now_ns = time.monotonic_ns()
        interval = self.settings.heartbeat_interval
        # The supervisor renews every interval, a tick late at most: past half an interval more,
        # it missed one. (At least half the lease is left then.)
        if now_ns - renewed_ns <= (1.5 * interval + KEEPER_TICK_SECONDS) * 1e9:
            return
        if now_ns < self.keeper_renew_after_ns or message.id in (self.acked_first, self.keeper_lost):
            return  # tried a moment ago; or nothing to renew: archived before it ran, or lost
        deadline = self._timeout_of(message)
        if deadline is not None and self.held.running_since is not None:
            if time.monotonic() - self.held.running_since > deadline:
                return
        ok, kept = self.keeper_renewals.try_once(
            lambda: self.store.extend_lease(message.id, message.lease_token, self.settings.release_stuck_timeout)
        )
        if not ok:
            self.keeper_renew_after_ns = now_ns + int(min(1.0, interval / 3) * 1e9)  # the database is out too
            return
        if not kept:
            self.keeper_lost = message.id  # its outcome will be fenced out; nothing to renew
            return
        self.held.lease_extended(message, now_ns)
        if message.id != self.keeper_renewed_id:  # once per job
            self.keeper_renewed_id = message.id
            logger.warning(
                "worker process %s: job %s %s: its lease renewed by the worker process itself (the "
                "supervisor, pid %s, has renewed nothing for %.1f s: stopped, stuck, or the database "
                "unavailable to it)",
                os.getpid(),
                message.id,
                message.task_name,
                self.spec.supervisor_pid,
                (now_ns - self.spec.slot.renewed_ns()) / 1e9,
            )
