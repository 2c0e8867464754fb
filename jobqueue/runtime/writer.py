"""Writing outcomes: through outages, and around an outcome the database refuses.

A flush writes many outcomes in one transaction. When the database refuses it for a reason that
retrying cannot fix (a NUL character in text on PostgreSQL, a statement over MySQL's
``max_allowed_packet``, a value too long for its column), the flush is split in halves until the
refused outcome stands alone: the others are written, and that one job is failed instead, with the
database's reason as its error. When the archive refuses even that (the refusal is tied to the
row), the job goes back to the queue with the error, to be tried again later. Only when even that
cannot be written is the error raised: then the database refuses every write, not this job's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from jobqueue.clock import utcnow
from jobqueue.job import ErrorInfo, MessageState, Outcome, OutcomeKind
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.storage.store import Store
from jobqueue.storage.store_deliveries import FlushResult

logger = logging.getLogger("jobqueue.worker")


REFUSED_RETRY_SECONDS = 60.0


def _never() -> bool:
    return False


class Unwritten(Exception):
    """The database refuses every write: ``written`` were applied before it started refusing, and
    ``remaining`` still wait (``__cause__`` holds the database's error)."""

    def __init__(self, written: FlushResult, remaining: list[Outcome]) -> None:
        super().__init__(f"the database refuses to store outcomes ({len(remaining)} waiting)")
        self.written = written
        self.remaining = remaining


class OutcomeWriter:
    def __init__(self, store: Store, guard: DatabaseGuard) -> None:
        self.store = store
        self.guard = guard

    def write(self, outcomes: list[Outcome], give_up: Callable[[], bool] = _never) -> FlushResult:
        """Write ``outcomes`` (retrying through outages); a refused one fails its job instead.

        Raises GaveUp when ``give_up()`` stops the retries during an outage, and Unwritten when
        the database refuses every write.
        """
        if not outcomes:
            return FlushResult()
        try:
            return self._attempt(outcomes, give_up)
        except (GaveUp, MemoryError):  # out of memory: this process's trouble, not the database's refusal
            raise
        except Exception as exc:
            if len(outcomes) == 1:
                return self._refused(outcomes[0], exc, give_up)
        middle = len(outcomes) // 2
        parts = [outcomes[:middle], outcomes[middle:]]
        done = FlushResult()
        for index, part in enumerate(parts):
            rest = [outcome for later in parts[index + 1 :] for outcome in later]
            try:
                done = _merged(done, self.write(part, give_up))
            except Unwritten as refused:
                raise Unwritten(_merged(done, refused.written), refused.remaining + rest) from refused.__cause__
            except GaveUp as stopped:
                if not done.applied and not done.lost:
                    raise
                raise Unwritten(done, part + rest) from stopped  # say what was written before the outage
        return done

    def _attempt(self, outcomes: list[Outcome], give_up: Callable[[], bool]) -> FlushResult:
        return self.guard.call(
            lambda: self.store.flush(outcomes), give_up=give_up, probe=self.store.ping, doing="writing job outcomes"
        )

    def _refused(self, outcome: Outcome, exc: Exception, give_up: Callable[[], bool]) -> FlushResult:
        message = outcome.message
        if outcome.kind is OutcomeKind.RETURN:
            # Nothing of the job's own is in a hand-back: a refusal is the database's, not the job's.
            raise Unwritten(FlushResult(), [outcome]) from exc
        # First a bare failure in the archive; if the archive refuses even that (the refusal is tied
        # to the row, such as an archive that already holds its id), the job waits in the queue
        # with the error, to be tried again later, instead of holding up every other outcome.
        for replacement in (refused_outcome(outcome, exc), refused_retry(outcome, exc)):
            try:
                result = self._attempt([replacement], give_up)
            except (GaveUp, MemoryError):
                raise
            except Exception:
                continue
            error = replacement.error.message if replacement.error else exc
            if replacement.kind is OutcomeKind.ARCHIVE:
                logger.error(
                    "job %s %s: the database refused its %s outcome (%s); the job is failed instead",
                    message.id,
                    message.task_name,
                    outcome.state.public,
                    error,
                )
            else:
                logger.error(
                    "job %s %s: the database refused its %s outcome and even a bare failure (%s); "
                    "the job waits in the queue and is tried again at %s",
                    message.id,
                    message.task_name,
                    outcome.state.public,
                    error,
                    replacement.next_attempt_at,
                )
            return result
        # Even the requeue is refused: every write is, not this job's.
        raise Unwritten(FlushResult(), [outcome]) from exc


def _merged(first: FlushResult, second: FlushResult) -> FlushResult:
    return FlushResult(first.applied + second.applied, first.lost + second.lost)


def _refusal(outcome: Outcome, exc: BaseException) -> ErrorInfo:
    reason = ErrorInfo.from_exception(exc)
    cause = getattr(exc, "orig", None) or exc.__cause__ or exc
    detail = ErrorInfo.from_exception(cause).message.strip().splitlines()
    return ErrorInfo(
        "jobqueue.errors.OutcomeRefused",
        f"the database refused to store this job's {outcome.state.public} outcome: "
        f"{reason.type}: {detail[0] if detail else ''}"[:2000],
    )


def refused_outcome(outcome: Outcome, exc: BaseException) -> Outcome:
    """A bare FAILED outcome in place of one the database refused: no result, the stored checkpoint."""
    return Outcome(
        message=outcome.message,
        kind=OutcomeKind.ARCHIVE,
        state=MessageState.FAILED,
        finished_at=outcome.finished_at or utcnow(),
        started_at=outcome.started_at,
        error=_refusal(outcome, exc),
        checkpoint=outcome.message.checkpoint,
        retain=True,
    )


def refused_retry(outcome: Outcome, exc: BaseException) -> Outcome:
    """The last resort when the archive refuses even a bare failure: back to the queue, later."""
    return Outcome(
        message=outcome.message,
        kind=OutcomeKind.RETRY,
        state=MessageState.RETRYABLE,
        finished_at=outcome.finished_at or utcnow(),
        started_at=outcome.started_at,
        error=_refusal(outcome, exc),
        checkpoint=outcome.message.checkpoint,
        next_attempt_at=utcnow() + timedelta(seconds=REFUSED_RETRY_SECONDS),
    )
