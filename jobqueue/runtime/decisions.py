"""What a job's end makes of it: its outcome decided from the handler's explicit decision, else
the task's ack policy and retry strategy, and the signal that announces it.

A job that returned or raised, or that its supervisor killed for passing its hard time limit, is
completed, retried, deferred or failed here; a message refused without running is failed with
the attempt its acquisition counted given back.
"""

from __future__ import annotations

import logging
import traceback
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobqueue import signals
from jobqueue.ack import AckPolicy
from jobqueue.clock import utcnow
from jobqueue.context import Decision, JobContext
from jobqueue.errors import Rejected, SerializationError
from jobqueue.job import ErrorInfo, Message, MessageState, Outcome, OutcomeKind
from jobqueue.retry import RetryStrategy, strategy_from_dict

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.serialization import JSONSerializer, PickleSerializer
    from jobqueue.settings import Settings
    from jobqueue.task import Task

logger = logging.getLogger("jobqueue.worker")


class OutcomeDecisions:
    """The Executor's decisions, on the state it keeps (declared here, set by the Executor)."""

    app: JobQueue
    settings: Settings
    serializer: JSONSerializer | PickleSerializer
    default_strategy: RetryStrategy
    retain: dict[MessageState, bool]
    wake_at: datetime | None  # set by a deferral: when the process should look for work again

    def _after_return(
        self, task: Task, policy: AckPolicy, context: JobContext, message: Message, started: datetime, result: Any
    ) -> Outcome:
        decision = context.decision
        if decision is None and result is None:  # most jobs: nothing returned, nothing decided
            if policy is AckPolicy.MANUAL:
                logger.warning("job %s %s returned without ack/nack/reject (MANUAL); acked", message.id, task.name)
            return self._outcome(message, started, MessageState.COMPLETED, context=context)
        if decision is Decision.DEFER:
            return self._deferred(message, started, context)
        if decision is Decision.NACK:
            return self._nacked(task, message, started, context, None)
        if decision is Decision.REJECT:
            return self._failed(message, started, Rejected(context.reject_reason or "rejected by the handler"), context)
        if decision is None and policy is AckPolicy.MANUAL:
            logger.warning("job %s %s returned without ack/nack/reject (MANUAL); acked", message.id, task.name)
        try:
            data = None if result is None else self.serializer.dumps(result, path="result")
        except SerializationError as exc:
            return self._failed(
                message,
                started,
                SerializationError(f"task {task.name} returned a value that cannot be stored: {exc}"),
                context,
            )
        if data is not None and len(data) > self.settings.max_payload_bytes:
            return self._failed(
                message,
                started,
                SerializationError(
                    f"task {task.name} returned {len(data)} bytes, over max_payload_bytes="
                    f"{self.settings.max_payload_bytes}; store large results elsewhere and return a reference"
                ),
                context,
            )
        outcome = self._outcome(message, started, MessageState.COMPLETED, context=context)
        outcome.result = data
        return outcome

    def _after_error(
        self,
        task: Task,
        policy: AckPolicy,
        context: JobContext,
        message: Message,
        started: datetime,
        exc: BaseException,
        error: ErrorInfo,
    ) -> Outcome:
        decision = context.decision
        if decision is Decision.DEFER:
            # The first decision stands; the error is kept as the job's last, and said.
            logger.warning(
                "job %s %s raised %s after it deferred: deferred as it asked, the error kept as its last",
                message.id,
                message.task_name,
                error.type,
            )
            return self._deferred(message, started, context, error)
        if decision is Decision.ACK or (decision is None and policy is AckPolicy.ACK):
            return self._outcome(message, started, MessageState.COMPLETED, error, context=context)
        if decision is Decision.REJECT or (decision is None and policy is AckPolicy.REJECT_ON_ERROR):
            return self._failed(message, started, error, context)
        retry_on = task.options.retry_on
        if decision is None and retry_on is not None and not isinstance(exc, retry_on):
            return self._failed(message, started, error, context)
        return self._nacked(task, message, started, context, error, exc)

    def strategy_for(self, task: Task | None, message: Message) -> RetryStrategy:
        """The per-call override stored with the message, else the task's, else the default."""
        stored = (message.options or {}).get("retry")
        if stored:
            return strategy_from_dict(stored)
        if task is not None and task.options.retry_strategy is not None:
            return task.options.retry_strategy
        return self.default_strategy

    def _nacked(
        self,
        task: Task | None,
        message: Message,
        started: datetime,
        context: JobContext | None,
        error: ErrorInfo | None,
        exception: BaseException | None = None,
    ) -> Outcome:
        now = utcnow()
        strategy: RetryStrategy | None = None
        try:
            # A strategy stored with the job may not be rebuilt (written by an older release).
            strategy = self.strategy_for(task, message)
            next_at = strategy.decide(message.attempts_count, self._first_attempt_here(message, started), now)
        except Exception as exc:
            # The job is failed, and its own error stays the one archived: the strategy's fault is
            # added to it, not put in its place.
            outcome = self._failed(message, started, strategy_fault(strategy, exc, error), context)
            outcome.exception = exception
            return outcome
        if next_at is None:
            error = error or ErrorInfo(
                "Nacked", f"nacked by the handler with no retry left after attempt {message.attempts_count}"
            )
            return self._failed(message, started, error, context)
        if context is not None and context.nack_delay_seconds is not None:
            next_at = now + timedelta(seconds=max(0.0, context.nack_delay_seconds))
            # The delay asked for still answers to the strategy's limit on the time since the first attempt.
            limit = getattr(strategy, "max_total_delay_seconds", None)
            first = self._first_attempt_here(message, started)
            if limit is not None and (next_at - first).total_seconds() > limit:
                error = error or ErrorInfo(
                    "Nacked",
                    f"nacked by the handler with a delay of {context.nack_delay_seconds} s, which would run it "
                    f"past max_total_delay_seconds={limit} after its first attempt",
                )
                return self._failed(message, started, error, context)
        outcome = self._outcome(message, started, MessageState.RETRYABLE, error, context=context)
        outcome.kind, outcome.next_attempt_at = OutcomeKind.RETRY, next_at
        return outcome

    def _first_attempt_here(self, message: Message, started: datetime) -> datetime:
        """When the job's first attempt was, on this host's clock, the one its retry's time is read from.

        Where leases are stamped by the database server's clock, ``first_attempt_at`` and
        ``acquired_at`` are the server's times, and ``started`` (when this delivery started) is this
        host's (corrected to the server's when it is a second or more off, but only from its next
        reading of the server's clock): the time from the first attempt to this delivery is counted
        on the server's clock, and moved to this host's. Compared as they are, a host whose clock
        runs an hour ahead would find every ``max_total_delay_seconds`` under an hour spent at the
        first failure, and one behind would retry an hour longer than the strategy allows.
        """
        first = message.first_attempt_at
        if first is None:
            return started
        if self.app.store.dialect.client_clock or message.acquired_at is None:
            return first
        try:
            return started - (message.acquired_at - first)
        except OverflowError:  # a time edited by hand to the edge of the calendar
            return first

    def nack_for_timeout(self, message: Message, exc: BaseException, started: datetime | None = None) -> Outcome:
        """The outcome of a job killed for passing its hard ``timeout`` (recorded by the supervisor);
        ``started``: when it started, on this host's clock (else its acquisition's time).

        Decided as for an exception the job raised: retried by its strategy under NACK_ON_ERROR
        (unless ``retry_on`` leaves the time limit out), failed under REJECT_ON_ERROR, completed
        with the error under ACK.
        """
        task = self.app.registry.get(message.task_name)
        started = started or message.acquired_at or utcnow()
        error = ErrorInfo.from_exception(exc)
        context = JobContext(message, self.serializer)
        context.end()  # the job is over: its receivers read the context, and decide nothing
        if task is None:
            outcome = self._nacked(None, message, started, None, error, exc)
        else:
            policy = task.options.ack_policy or AckPolicy.NACK_ON_ERROR
            outcome = self._after_error(task, policy, context, message, started, exc, error)
        outcome.exception = exc
        return announce(task, context, outcome)

    def _deferred(
        self, message: Message, started: datetime, context: JobContext, error: ErrorInfo | None = None
    ) -> Outcome:
        until = context.defer_until or utcnow()
        outcome = self._outcome(message, started, MessageState.PENDING, error, context=context)
        outcome.kind, outcome.next_attempt_at = OutcomeKind.DEFER, until
        self.wake_at = until
        return outcome

    def _refused(self, message: Message, started: datetime, error: Exception) -> Outcome:
        """Fail a message without running it; the attempt its acquisition counted never started."""
        message.attempts_count -= 1
        outcome = self._failed(message, started, error)
        outcome.ran = False
        context = JobContext(message, self.serializer)
        context.end()
        return announce(self.app.registry.get(message.task_name), context, outcome)

    def _failed(
        self, message: Message, started: datetime, error: Exception | ErrorInfo, context: JobContext | None = None
    ) -> Outcome:
        info = error if isinstance(error, ErrorInfo) else ErrorInfo.from_exception(error)
        outcome = self._outcome(message, started, MessageState.FAILED, info, context=context)
        if isinstance(error, BaseException):
            outcome.exception = error
        return outcome

    def _outcome(
        self,
        message: Message,
        started: datetime,
        state: MessageState,
        error: ErrorInfo | None = None,
        context: JobContext | None = None,
    ) -> Outcome:
        retain = self.retain.get(state, True)
        return Outcome(
            message=message,
            kind=OutcomeKind.ARCHIVE,
            state=state,
            finished_at=utcnow(),
            started_at=started,
            error=error,
            retain=retain,
            checkpoint=context.checkpoint_bytes if context is not None else message.checkpoint,
        )


def strategy_fault(strategy: RetryStrategy | None, exc: Exception, error: ErrorInfo | None) -> ErrorInfo:
    """The error of a job not retried because its retry strategy raised (or, None, could not be
    rebuilt from what the job stored): the job's own error (if it raised one) with the strategy's
    fault added to its message and traceback."""
    fault = ErrorInfo.from_exception(exc)
    which = "the retry strategy stored with it" if strategy is None else f"its retry strategy {type(strategy).__name__}"
    note = f"not retried: {which} raised {fault.type}: {fault.message}"
    trace = traceback.format_exc()
    if error is None:
        return ErrorInfo(fault.type, note, trace)
    both = f"{error.traceback or ''}\nThen, deciding its retry:\n{trace}"
    return ErrorInfo(error.type, f"{error.message} ({note})", both)


def announce(task: Task | None, context: JobContext, outcome: Outcome, result: Any = None) -> Outcome:
    """Send the signal of ``outcome`` (succeeded, retrying or failed) and return it."""
    if not (signals.job_succeeded.receivers or signals.job_retrying.receivers or signals.job_failed.receivers):
        return outcome  # nobody listens: build none of the arguments
    error = outcome.error
    if outcome.kind is OutcomeKind.RETRY:
        signals.job_retrying.send(
            task,
            job=context,
            exception=outcome.exception,
            traceback=error.traceback if error else None,
            retry_at=outcome.next_attempt_at,
        )
    elif outcome.state is MessageState.FAILED:
        signals.job_failed.send(
            task, job=context, exception=outcome.exception, traceback=error.traceback if error else None
        )
    elif outcome.state is MessageState.COMPLETED and outcome.kind is OutcomeKind.ARCHIVE:
        signals.job_succeeded.send(task, job=context, result=result)
    return outcome
