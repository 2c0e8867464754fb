"""Run one delivered message and turn what happened into an Outcome.

Order of checks: readable row, registered task, max_deliveries (poison), readable payload, then the
handler. The outcome follows the context's explicit decision if the handler made one, else the ack
policy. Whatever the job does (raise SystemExit, return a value that cannot be stored, pass a bad
argument to ``nack``) ends that job with the real cause recorded, never the worker process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from inspect import iscoroutine
from typing import TYPE_CHECKING, Any, NoReturn

from jobqueue import logs, signals
from jobqueue.ack import AckPolicy
from jobqueue.clock import utcnow
from jobqueue.context import Decision, DeliveryWriter, JobContext, activate, deactivate
from jobqueue.errors import (
    CorruptMessage,
    LeaseLost,
    MaxDeliveriesExceeded,
    Rejected,
    SerializationError,
    SoftTimeLimitExceeded,
    UnknownTaskError,
)
from jobqueue.flow import NO_FLOW
from jobqueue.job import ErrorInfo, Message, MessageState, Outcome, OutcomeKind
from jobqueue.periodic import SCHEDULE_TASK, fire, flow_columns
from jobqueue.retry import RetryStrategy, default_strategy, strategy_from_dict
from jobqueue.runtime.aio import CoroutineRunner
from jobqueue.runtime.resilience import GaveUp
from jobqueue.schedule_times import CATCH_UP_GRACE_SECONDS, Schedule
from jobqueue.serialization import loads_call

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store
    from jobqueue.task import Task

logger = logging.getLogger("jobqueue.worker")


class StoreDeliveryWriter:
    """Writes a running job's checkpoint and lease extension through to the store, fenced by its token."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def save_checkpoint(self, message: Message, data: bytes | None) -> bool:
        return self.store.save_checkpoint(message.id, message.lease_token, data)

    def extend_lease(self, message: Message, seconds: float) -> bool:
        return self.store.extend_lease(message.id, message.lease_token, seconds)


class TaskPlan:
    """What a worker makes of one task's options, worked out once instead of for every job."""

    __slots__ = ("task", "options", "fn", "bind", "soft_timeout", "policy", "max_deliveries")

    def __init__(self, task: Task, max_deliveries: int) -> None:
        options = task.options
        self.task = task
        self.options = options  # the plan holds while the task keeps these options
        self.fn = task.fn
        self.bind = options.bind
        self.soft_timeout = options.soft_timeout
        self.policy = options.ack_policy or AckPolicy.NACK_ON_ERROR
        self.max_deliveries = options.max_deliveries or max_deliveries


class Executor:
    """Turns messages into outcomes for one worker process."""

    def __init__(
        self,
        app: JobQueue,
        writes: DeliveryWriter | None = None,
        ack_first: Callable[[Outcome], bool] | None = None,
        writer: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self.app = app
        # Runs a database write the executor makes itself (firing a schedule); a worker process
        # passes its DatabaseGuard so the write retries through outages.
        self.writer = writer or (lambda operation: operation())
        # When the process should look for work again even if its queues look empty (a deferral).
        self.wake_at: datetime | None = None
        self.settings = app.settings
        self.serializer = app.serializer
        self.writes = writes
        self.ack_first = ack_first
        self.default_strategy = default_strategy()
        self.in_handler = False
        self.coroutines = CoroutineRunner()  # async def tasks run on this process's event loop
        # Decided once per task rather than once per job: what its options and the settings make of it.
        self.plans: dict[str, TaskPlan] = {}
        self.unenforced: set[str] = set()  # tasks whose soft time limit was said to go unenforced
        self.retain = {
            MessageState.COMPLETED: self.settings.retain_in_archive_on_ack,
            MessageState.FAILED: self.settings.retain_in_archive_on_reject,
        }

    def close(self) -> None:
        """Release what running jobs needed (the event loop of async tasks)."""
        self.coroutines.close()

    def _on_soft_timeout(self, signum: int, frame: Any) -> None:
        # The one signal handler that raises: interrupting the job's own code is the point of a soft
        # time limit. An alarm that arrives after the handler returned is ignored.
        if self.in_handler:
            raise SoftTimeLimitExceeded("soft time limit exceeded")

    def execute(self, message: Message) -> Outcome | None:
        """Run ``message``; return its outcome, or None when there is nothing left to record.

        Never raises for anything the job did: a fault while deciding its outcome fails the job.
        """
        started = utcnow()
        try:
            return self._execute(message, started)
        except GaveUp:
            raise  # the process is stopping during an outage
        except BaseException as exc:  # pickling a result can raise anything: it ends this job only
            logger.exception("job %s %s: could not decide its outcome", message.id, message.task_name)
            return self._failed(message, started, ErrorInfo.from_exception(exc, traceback.format_exc()))

    def _execute(self, message: Message, started: datetime) -> Outcome | None:
        if message.corrupt is not None:
            return self._refused(
                message,
                started,
                CorruptMessage(f"its row could not be read: {message.corrupt}; it is failed without running"),
            )
        name = message.task_name
        if name == SCHEDULE_TASK:
            return self._fire_schedule(message, started)
        task = self.app.registry.get(name)
        if task is None:
            known = ", ".join(sorted(self.app.registry)) or "none"
            return self._refused(
                message,
                started,
                UnknownTaskError(
                    f"task {name!r} is not registered in this worker (registered: {known}); "
                    "deploy the code that defines it, or cancel the job"
                ),
            )
        plan = self.plans.get(name)
        if plan is None or plan.task is not task or plan.options is not task.options:
            plan = self.plans[name] = TaskPlan(task, self.settings.max_deliveries)
        if message.deliveries_count > plan.max_deliveries:
            return self._refused(
                message,
                started,
                MaxDeliveriesExceeded(
                    f"delivered {message.deliveries_count} times without an outcome, over max_deliveries="
                    f"{plan.max_deliveries}: an earlier delivery probably killed its worker process (crash, "
                    "OOM kill, os._exit) or outlived its lease; not run again"
                ),
            )
        try:
            args, kwargs = loads_call(self.serializer, message.payload)
        except SerializationError as exc:
            return self._refused(message, started, exc)
        policy = plan.policy
        if policy is AckPolicy.ACK_FIRST:
            self._ack_first(task, message, args, kwargs, started)
            return None
        context = JobContext(message, self.serializer, self.writes, self.settings.max_payload_bytes)
        if signals.job_started.receivers:
            signals.job_started.send(task, job=context)
        try:
            result = self._call(plan, context, args, kwargs)
        except LeaseLost as exc:
            logger.warning("job %s %s: %s; its outcome is dropped", message.id, name, exc)
            return None
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from a job end the job, not the process
            error = ErrorInfo.from_exception(exc, traceback.format_exc())
            outcome = self._after_error(task, policy, context, message, started, exc, error)
            if outcome.exception is None and outcome.error is error:
                outcome.exception = exc
            return announce(task, context, outcome)
        return announce(task, context, self._after_return(task, policy, context, message, started, result), result)

    def _fire_schedule(self, message: Message, now: datetime) -> Outcome | None:
        """Fire a schedule message: enqueue the job for its fire time and defer it to the next one."""
        try:
            schedule = Schedule.decode(message.payload)
        except Exception as exc:  # unreadable: fail it; the next worker start creates it anew from code
            return self._refused(message, now, SerializationError(f"unreadable schedule message: {exc}"))
        grace = max(CATCH_UP_GRACE_SECONDS, 2 * self.settings.release_stuck_timeout)
        # Late by both clocks, this host's and the database's (when it acquired the message), or it is
        # not late: a host whose clock runs ahead finds a schedule overdue that other workers fire on
        # time, and must not skip fires as if workers had been down.
        late = min(now, message.acquired_at) if message.acquired_at is not None else now
        when = schedule.to_fire(message.next_attempt_at, late, grace)
        next_fire = schedule.next_fire(when)
        try:
            flow = flow_columns(self.app.registry.get(schedule.task_name), schedule)
        except Exception:  # a concurrency_key function that failed: the fire is not skipped for it
            logger.exception("schedule %s: the flow key of its job could not be computed; it has none", schedule.name)
            flow = NO_FLOW
        fired = self.writer(lambda: fire(self.app.store, message, schedule, when, next_fire, now, flow))
        if not fired:
            logger.warning("schedule %s: lease lost before it fired for %s; the holder fires it", schedule.name, when)
            return None
        if when != message.next_attempt_at:
            logger.warning(
                "schedule %s missed its fires from %s; one catch-up run for %s",
                schedule.name,
                message.next_attempt_at,
                when,
            )
        logger.info("schedule %s fired %s for %s; next at %s", schedule.name, schedule.task_name, when, next_fire)
        self.wake_at = next_fire
        return None

    def _call(self, plan: TaskPlan, context: JobContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
        token = activate(context)
        soft = plan.soft_timeout
        began = time.monotonic() if soft else 0.0
        # Signals reach the main thread only. A worker runs jobs there; drain() may be called from
        # another thread, where a sync job runs without its soft limit (an async job keeps it: its
        # event loop enforces it, with no signal).
        alarm = bool(soft) and threading.current_thread() is threading.main_thread()
        if alarm and soft:
            previous = signal.signal(signal.SIGALRM, self._on_soft_timeout)
            signal.setitimer(signal.ITIMER_REAL, soft)
        elif soft and not plan.task.is_async and plan.task.name not in self.unenforced:
            self.unenforced.add(plan.task.name)
            logger.warning(
                "task %s: soft_timeout=%s s is not enforced outside the main thread (no signal reaches "
                "this thread); its jobs run here without it",
                plan.task.name,
                soft,
            )
        self.in_handler = True
        try:
            if self.app.has_job_scope:
                with self.app.job_scope():  # a framework's per-job scope: Flask's app context, say
                    return self._invoke(plan, context, args, kwargs, soft, began, alarm)
            return self._invoke(plan, context, args, kwargs, soft, began, alarm)
        finally:
            self.in_handler = False
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            deactivate(token)

    def _invoke(
        self,
        plan: TaskPlan,
        context: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
        soft: float | None,
        began: float,
        alarm: bool,
    ) -> Any:
        """The task's function called, and an async def task's coroutine run to its end."""
        owner = os.getpid()
        try:
            result = plan.fn(context, *args, **kwargs) if plan.bind else plan.fn(*args, **kwargs)
            if result is not None and iscoroutine(result):
                result = self._run_coroutine(result, soft, began, alarm)
        except BaseException as exc:
            if os.getpid() != owner:
                leave_forked_child(exc)
            raise
        if os.getpid() != owner:
            leave_forked_child(None)
        return result

    def _run_coroutine(self, coroutine: Any, soft: float | None, began: float, alarm: bool) -> Any:
        """Run an async def task's coroutine on the process's loop, within its soft time limit."""
        if alarm:
            # The loop keeps its time limit itself: an alarm raising inside the loop's own code
            # would leave the loop broken for the next job.
            signal.setitimer(signal.ITIMER_REAL, 0)
        left = None if not soft else soft - (time.monotonic() - began)
        return self.coroutines.run(coroutine, left)

    def _ack_first(
        self, task: Task, message: Message, args: list[Any], kwargs: dict[str, Any], started: datetime
    ) -> None:
        outcome = self._outcome(message, started, MessageState.COMPLETED)
        if self.ack_first is not None and not self.ack_first(outcome):
            logger.warning("job %s %s: lease lost before it ran (ACK_FIRST); not run", message.id, task.name)
            return None
        try:
            self._call(
                TaskPlan(task, self.settings.max_deliveries), JobContext(message, self.serializer, None), args, kwargs
            )
        except BaseException:
            logger.exception("job %s %s raised after it was acked (ACK_FIRST: not retried)", message.id, task.name)
        return None

    # -- decisions ---------------------------------------------------------------------------------
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
            return self._deferred(message, started, context)
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
            next_at = strategy.decide(message.attempts_count, message.first_attempt_at or started, now)
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
        outcome = self._outcome(message, started, MessageState.RETRYABLE, error, context=context)
        outcome.kind, outcome.next_attempt_at = OutcomeKind.RETRY, next_at
        return outcome

    def nack_for_timeout(self, message: Message, exc: BaseException) -> Outcome:
        """The outcome of a job killed for passing its hard ``timeout`` (recorded by the supervisor).

        Decided as for an exception the job raised: retried by its strategy under NACK_ON_ERROR
        (unless ``retry_on`` leaves the time limit out), failed under REJECT_ON_ERROR, completed
        with the error under ACK.
        """
        task = self.app.registry.get(message.task_name)
        started = message.acquired_at or utcnow()
        error = ErrorInfo.from_exception(exc)
        context = JobContext(message, self.serializer)
        if task is None:
            outcome = self._nacked(None, message, started, None, error, exc)
        else:
            policy = task.options.ack_policy or AckPolicy.NACK_ON_ERROR
            outcome = self._after_error(task, policy, context, message, started, exc, error)
        outcome.exception = exc
        return announce(task, context, outcome)

    def _deferred(self, message: Message, started: datetime, context: JobContext) -> Outcome:
        until = context.defer_until or utcnow()
        outcome = self._outcome(message, started, MessageState.PENDING, context=context)
        outcome.kind, outcome.next_attempt_at = OutcomeKind.DEFER, until
        self.wake_at = until
        return outcome

    def _refused(self, message: Message, started: datetime, error: Exception) -> Outcome:
        """Fail a message without running it; the attempt its acquisition counted never started."""
        message.attempts_count -= 1
        outcome = self._failed(message, started, error)
        outcome.ran = False
        return announce(self.app.registry.get(message.task_name), JobContext(message, self.serializer), outcome)

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


def outcome_fields(outcome: Outcome) -> dict[str, Any]:
    """The structured fields of an outcome's log line (``--log-json`` writes them as keys)."""
    m = outcome.message
    return {
        "job_id": m.id,
        "task": m.task_name,
        "queue": m.queue,
        "attempt": m.attempts_count,
        "outcome": outcome.name,
        "duration_seconds": round(outcome.duration_seconds or 0.0, 6),
    }


# How much of a job's error message and traceback one log line carries: a job may fail with a
# message of megabytes, which a log pipeline should not have to carry (the archive keeps more:
# ``jobqueue jobs show``). A traceback keeps its start and its end, where the error is raised.
LOGGED_ERROR_CHARS = 2_000
LOGGED_TRACEBACK_HEAD_CHARS = 5_000
LOGGED_TRACEBACK_TAIL_CHARS = 15_000


def _clipped(text: str, outcome: Outcome, head: int, tail: int = 0) -> str:
    left_out = len(text) - head - tail
    if left_out <= 0:
        return text
    where = f": `jobqueue jobs show {outcome.message.id}` has more" if outcome.retain else ""
    end = text[-tail:] if tail else ""
    return f"{text[:head]}... ({left_out:,} characters left out{where}) ...{end}"


def log_outcome(outcome: Outcome) -> None:
    """One line per job outcome, once it is written: a success at INFO, a retry at WARNING and a
    final failure at ERROR with the job's traceback (whatever the level of the other lines)."""
    m = outcome.message
    error = outcome.error
    if outcome.kind is OutcomeKind.ARCHIVE and outcome.state is MessageState.FAILED:
        if logger.isEnabledFor(logging.ERROR):
            record = logger.makeRecord(
                logger.name,
                logging.ERROR,
                __file__,
                0,
                "job %s %s failed on attempt %s after %.1f ms: %s: %s",
                (
                    m.id,
                    m.task_name,
                    m.attempts_count,
                    (outcome.duration_seconds or 0.0) * 1000,
                    error.type if error else "?",
                    _clipped(error.message, outcome, LOGGED_ERROR_CHARS) if error else "",
                ),
                None,
                extra=outcome_fields(outcome),
            )
            # Formatters append exc_text as they would a traceback of exc_info: the job's own, as the
            # archive keeps it, though the exception itself is gone by the time the outcome is written.
            # The job's message written on one line in it (it is the job's text: see logs.OneLineFilter).
            traceback = error.traceback.rstrip() if error and error.traceback else ""
            traceback = logs.one_line_messages(traceback, [error.message]) if error else traceback
            record.exc_text = (
                _clipped(traceback, outcome, LOGGED_TRACEBACK_HEAD_CHARS, LOGGED_TRACEBACK_TAIL_CHARS) or None
            )
            logger.handle(record)
    elif outcome.kind is OutcomeKind.RETRY:
        logger.warning(
            "job %s %s failed on attempt %s (%s: %s); retry at %s",
            m.id,
            m.task_name,
            m.attempts_count,
            error.type if error else "nack",
            _clipped(error.message, outcome, LOGGED_ERROR_CHARS) if error else "",
            outcome.next_attempt_at,
            extra=outcome_fields(outcome),
        )
    elif not logger.isEnabledFor(logging.INFO):
        return  # the common case of a busy worker: build nothing for a line nobody reads
    elif outcome.kind is OutcomeKind.DEFER:
        logger.info(
            "job %s %s deferred to %s", m.id, m.task_name, outcome.next_attempt_at, extra=outcome_fields(outcome)
        )
    elif outcome.kind is OutcomeKind.ARCHIVE:
        logger.info(
            "job %s %s %s in %.1f ms",
            m.id,
            m.task_name,
            outcome.state.public,
            (outcome.duration_seconds or 0.0) * 1000,
            extra=outcome_fields(outcome),
        )


def leave_forked_child(exc: BaseException | None) -> NoReturn:
    """End a process the job forked that left the job function (returned, raised, or called
    sys.exit) instead of calling os._exit, as a Python program would end: exit status 0, the
    SystemExit's code, or 1 with the traceback on stderr.

    That process is a copy of the worker process: going on would run the jobs buffered behind
    this one a second time, write outcomes over the real ones and share the worker's database
    connections and its slot with the supervisor. Its exit runs nothing of the worker's.
    """
    code = 0
    if isinstance(exc, SystemExit):
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    elif exc is not None:
        traceback.print_exception(exc)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
