"""What a supervisor does with the work its processes held: a dead process's messages returned
to the queue (a kill for a hard time limit recorded first, as the failed attempt it was), and
the unstarted buffer behind a job that runs too long taken back. Every step is retried on later
ticks while the database is out (see retry_later).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from jobqueue.clock import utcnow
from jobqueue.errors import TimeLimitExceeded
from jobqueue.job import MessageState, OutcomeKind
from jobqueue.runtime import metrics
from jobqueue.runtime.executor import Executor
from jobqueue.runtime.outcome_log import outcome_fields
from jobqueue.runtime.pool import Child, Pool
from jobqueue.runtime.process import HOARD_SECONDS
from jobqueue.runtime.resilience import DatabaseGuard
from jobqueue.runtime.retry_later import RetryLater
from jobqueue.runtime.slot import SlotView
from jobqueue.runtime.writer import OutcomeWriter

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store

logger = logging.getLogger("jobqueue.supervisor")


class Reaping:
    """Reaping and taking back, for Supervisor (whose attributes these are)."""

    app: JobQueue
    store: Store
    guard: DatabaseGuard
    later: RetryLater
    executor: Executor
    pool: Pool
    children: dict[int, Child]
    metrics: metrics.Metrics | None
    stopping: bool
    done_by_dead: int
    unspent: int

    def _reap(self) -> None:
        for death in self.pool.dead():
            child, code, view = death.child, death.code, death.view
            self.done_by_dead += view.done
            # A process leaves with status 0 only between jobs (recycled, stopping): one that ends
            # mid-job (a job calling os._exit(0)) died as surely as one killed by a signal.
            if (code != 0 or view.running_id) and child.timed_out is None and not child.killed_stopping:
                how = f"signal {-code}" if code < 0 else f"code {code}"
                running = f" while running job {view.running_id}" if view.running_id else ""
                logger.error(
                    "worker process %s (pid %s) exited with %s%s; its messages are returned now",
                    death.index,
                    child.process.pid,
                    how,
                    running,
                )
            self._release(child)
            os.close(child.spec.wake_w)
            if not self.stopping:
                if self.metrics is not None:
                    self.metrics.process_died(child.process.pid, death.cause)
                self.pool.respawn_later(death)
        self.pool.reap_orphans()

    def _release(self, child: Child) -> None:
        """Record a timeout kill, then return everything the dead child held, as one retried step.

        The timeout is recorded first: once the message is released its lease token is gone and the
        kill could no longer be recorded as the failed attempt it was. Of the rest, only the job
        that was running when the child died is charged a delivery (it may have killed the child),
        unless the supervisor killed it as it stopped;
        jobs it had finished without writing their outcomes keep their attempt but no delivery,
        and unstarted ones go back as if never fetched.
        """
        worker_id, pid, timed_out, killed_stopping = (
            child.spec.worker_id,
            child.process.pid,
            child.timed_out,
            child.killed_stopping,
        )
        started = child.spec.slot.started_ids()
        view = child.spec.slot.read_raw()
        running = view.running_id or None

        def release() -> None:
            if timed_out is not None:
                self._record_timeout(timed_out)
            released = self.store.release_worker(
                worker_id, running=running, finished=started, charge_running=not killed_stopping
            )
            if released:
                logger.info("returned %s message(s) held by worker process pid %s to the queue", released, pid)
            self.store.remove_workers([worker_id])

        self.later.do(f"release the messages of pid {pid}", release)

    def _record_timeout(self, view: SlotView) -> None:
        message = self.store.held_message(view.running_id, view.token)
        if message is None:
            return
        task = self.app.registry.get(message.task_name)
        limit = task.options.timeout if task else None
        exc = TimeLimitExceeded(
            f"job ran past its timeout of {limit} s; its worker process was killed, with the programs it started"
        )
        started = None
        if view.running_since_ns:  # on this host's clock, as every other outcome's times are
            started = utcnow() - timedelta(seconds=(time.monotonic_ns() - view.running_since_ns) / 1e9)
        outcome = self.executor.nack_for_timeout(message, exc, started)
        # Never blocks the loop: during an outage the whole step is tried again next tick.
        OutcomeWriter(self.store, self.guard).write([outcome], give_up=lambda: True)
        if self.metrics is not None:
            self.metrics.written([outcome])
        if outcome.kind is OutcomeKind.RETRY:
            logger.warning(
                "job %s %s killed after its timeout of %s s; retry at %s",
                message.id,
                message.task_name,
                limit,
                outcome.next_attempt_at,
                extra=outcome_fields(outcome),
            )
        elif outcome.state is MessageState.COMPLETED:
            logger.warning(
                "job %s %s killed after its timeout of %s s; completed with the error (ack policy ACK)",
                message.id,
                message.task_name,
                limit,
                extra=outcome_fields(outcome),
            )
        else:
            logger.error(
                "job %s %s killed after its timeout of %s s; failed",
                message.id,
                message.task_name,
                limit,
                extra=outcome_fields(outcome),
            )

    def _take_back_buffers(self) -> None:
        """Return to the queue the unstarted messages waiting behind a job that has run too long.

        Done from here, not by the child: a job holding the GIL (a long C call, a runaway regular
        expression) stops every thread of its process. The child will not start them any more
        once the slot no longer lists their batch, so they can be released at once.
        """
        slow_since = time.monotonic_ns() - int(HOARD_SECONDS * 1e9)
        for child in self.children.values():
            revoked = child.spec.slot.revoke_buffer(slow_since)
            if revoked is None:
                continue
            worker_id, pid = child.spec.worker_id, child.process.pid

            def release(
                tokens: list[int] = revoked.tokens,
                started: list[int] | None = revoked.started,
                pid: int | None = pid,
                worker_id: str = worker_id,
            ) -> None:
                count = self.store.release_unstarted(worker_id, tokens, started)
                if count:
                    logger.info(
                        "handed back %s unstarted message(s) waiting behind a slow job in worker process pid %s",
                        count,
                        pid,
                    )
                    self.unspent += 1  # an idle process of ours takes them now
                    self.store.notify()  # and idle processes elsewhere

            self.later.do(f"hand back the buffer of pid {pid}", release)
