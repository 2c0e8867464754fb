"""How a worker process writes its jobs' outcomes: all that wait, retried while the database
refuses them, each logged once written (or said lost when fencing dropped it), and an ACK_FIRST
job's outcome before it runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from jobqueue.job import MessageState, Outcome, OutcomeKind
from jobqueue.runtime import metrics
from jobqueue.runtime.holdings import Holdings
from jobqueue.runtime.outcome_log import log_outcome
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.runtime.writer import OutcomeWriter, Unwritten
from jobqueue.storage.store_deliveries import FlushResult

if TYPE_CHECKING:
    from jobqueue.storage.store import Store

logger = logging.getLogger("jobqueue.worker")

FLUSH_BACKOFF_MAX_SECONDS = 30.0


class Flushing:
    """Outcome writing, for WorkerProcess (whose attributes these are)."""

    store: Store
    guard: DatabaseGuard
    writer: OutcomeWriter
    held: Holdings
    last_flush: float
    acked_first: int | None

    def _flush(self, give_up: Callable[[], bool] = lambda: False) -> None:
        """Write every pending outcome; while the database refuses all writes, keep them and retry."""
        backoff = 1.0
        while True:
            taken = self.held.take_pending()
            if not taken:
                return
            try:
                # Retrying is safe: outcomes are fenced, so any a lost COMMIT did apply come back as lost.
                result = self.writer.write(taken, give_up=give_up)
            except GaveUp:
                self.held.restore(taken)
                raise
            except Unwritten as refused:
                self._written(refused.written)
                self.held.restore(refused.remaining)
                logger.error(
                    "worker process %s: the database refuses to store %s outcome(s) (%s); they are kept "
                    "and written again in %.0f s",
                    os.getpid(),
                    len(refused.remaining),
                    refused.__cause__,
                    backoff,
                    exc_info=refused.__cause__,
                )
                deadline = time.monotonic() + backoff
                while time.monotonic() < deadline and not give_up():
                    time.sleep(0.1)
                if give_up():
                    raise GaveUp("the database refuses to store outcomes") from None
                backoff = min(backoff * 2, FLUSH_BACKOFF_MAX_SECONDS)
                continue
            self._written(result, self.guard.last_call_retried)
            return

    def _written(self, result: FlushResult, retried: bool = False) -> None:
        self.held.written(result.applied, result.lost)
        self.last_flush = time.monotonic()
        self._report(result, retried)

    @staticmethod
    def _report(result: FlushResult, retried: bool) -> None:
        """One line per outcome written; for one dropped by fencing, say that the lease was lost."""
        if logger.isEnabledFor(logging.INFO):
            for outcome in result.applied:
                log_outcome(outcome)
        else:  # only failures and retries have a line then (at ERROR and WARNING)
            for outcome in result.applied:
                if outcome.kind is OutcomeKind.RETRY or outcome.state is MessageState.FAILED:
                    log_outcome(outcome)
        if metrics.active is not None:
            metrics.active.written(result.applied)
            if not retried:  # on a retry, "lost" may be an outcome the first try applied
                metrics.active.lost(result.lost)
        for outcome in result.lost:
            if outcome.kind is OutcomeKind.RETURN:
                continue  # a hand-back whose lease had gone anyway: nothing was lost
            if retried:
                logger.info(
                    "job %s %s: outcome not applied on retry (applied before the connection dropped, "
                    "or the lease was lost)",
                    outcome.message.id,
                    outcome.message.task_name,
                )
            else:
                logger.warning(
                    "job %s %s: lease lost (it expired and the message was released or taken by "
                    "another worker); this delivery's %s outcome is dropped",
                    outcome.message.id,
                    outcome.message.task_name,
                    outcome.state.public,
                )

    def _ack_first(self, outcome: Outcome) -> bool:
        """Record one outcome before the handler runs (ACK_FIRST); False if the lease was lost."""
        result = self.writer.write([outcome])
        if result.applied:
            acked = result.applied[0].state is MessageState.COMPLETED
        else:
            # After a lost COMMIT reply the retry finds the job archived: ours if it carries our stamp.
            acked = self.guard.last_call_retried and self.store.archived_with(outcome.message.id, outcome.finished_at)
        if acked:
            self.acked_first = outcome.message.id
        return acked
