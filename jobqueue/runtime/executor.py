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
from datetime import datetime
from inspect import iscoroutine
from typing import TYPE_CHECKING, Any, NoReturn

from jobqueue import signals
from jobqueue.ack import AckPolicy
from jobqueue.clock import utcnow
from jobqueue.context import DeliveryWriter, JobContext, activate, deactivate
from jobqueue.errors import (
    CorruptMessage,
    JobQueueError,
    LeaseLost,
    MaxDeliveriesExceeded,
    SerializationError,
    SoftTimeLimitExceeded,
    UnknownTaskError,
)
from jobqueue.flow import NO_FLOW
from jobqueue.job import ErrorInfo, Message, MessageState, Outcome
from jobqueue.periodic import SCHEDULE_TASK, fire, flow_columns
from jobqueue.retry import default_strategy
from jobqueue.runtime.aio import CoroutineRunner
from jobqueue.runtime.decisions import OutcomeDecisions, announce
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.runtime.soft_limit import SoftLimit
from jobqueue.schedule_times import CATCH_UP_GRACE_SECONDS, Schedule
from jobqueue.serialization import loads_call

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store
    from jobqueue.task import Task

logger = logging.getLogger("jobqueue.worker")


class StoreDeliveryWriter:
    """Writes a running job's checkpoint and lease extension through to the store, fenced by its token.

    With a ``guard``, a write the database does not take for an outage (a restart, a dropped
    connection, a pooler restarted) is tried again with backoff, for as long as the lease lasts
    (``lease_seconds``), a warm stop's last jobs included: past that, another worker may hold the
    job, and the write raises the job an error, as a failed write of its own would.
    """

    def __init__(self, store: Store, guard: DatabaseGuard | None = None, lease_seconds: float = 0.0) -> None:
        self.store = store
        self.guard = guard
        self.lease_seconds = lease_seconds

    def save_checkpoint(self, message: Message, data: bytes | None) -> bool:
        return self._write(
            "saving a checkpoint", lambda: self.store.save_checkpoint(message.id, message.lease_token, data)
        )

    def extend_lease(self, message: Message, seconds: float) -> bool:
        return self._write(
            "extending a lease", lambda: self.store.extend_lease(message.id, message.lease_token, seconds)
        )

    def _write(self, doing: str, write: Callable[[], bool]) -> bool:
        if self.guard is None:
            return write()
        began = time.monotonic()
        try:
            return self.guard.call(write, give_up=lambda: time.monotonic() - began > self.lease_seconds, doing=doing)
        except GaveUp as exc:
            # Not a lost lease (the database never said so): the job's error, retried by its strategy;
            # its outcome is written, fenced, once the database answers.
            raise JobQueueError(
                f"the database did not answer for {self.lease_seconds:g} s, the job's lease, while {doing} ({exc})"
            ) from exc


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


class Executor(OutcomeDecisions):
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
        self.soft_limit = SoftLimit(Executor._invoke.__code__)
        self.soft_fired = False  # the running job's soft limit went off
        self.ran_coroutine = False
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
        # time limit (inside a library's, at the job's next line; see SoftLimit). An alarm that
        # arrives after the handler returned is ignored.
        self.soft_fired = True
        if self.in_handler and self.soft_limit.raise_here(frame):
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
                    f"task {name!r} is not registered in this worker (registered: {known}): the job is "
                    f"failed. Deploy the code that defines it to every worker of queue {message.queue!r}, and "
                    "have the module --app names import the module that defines it, then run the job again: "
                    f"jobqueue jobs retry {message.id}"
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
        if not self.app.has_job_scope:
            return self._run(plan, message, args, kwargs, started)
        # A framework's per-job scope (Flask's app context, Django's connection upkeep) holds the
        # job's signals too: their receivers use the framework as the job does.
        with self.app.job_scope():
            return self._run(plan, message, args, kwargs, started)

    def _run(
        self, plan: TaskPlan, message: Message, args: list[Any], kwargs: dict[str, Any], started: datetime
    ) -> Outcome | None:
        task, name = plan.task, message.task_name
        policy = plan.policy
        if policy is AckPolicy.ACK_FIRST:
            self._ack_first(task, message, args, kwargs, started)
            return None
        context = JobContext(message, self.serializer, self.writes, self.settings.max_payload_bytes)
        if signals.job_started.receivers:
            signals.job_started.send(task, job=context)
        try:
            result = self._call(plan, context, args, kwargs)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from a job end the job, not the process
            if isinstance(exc, LeaseLost) and exc.delivery in (None, (message.id, message.lease_token)):
                logger.warning("job %s %s: %s; its outcome is dropped", message.id, name, exc)
                return None
            # Another job's lost lease (its context kept and used here) is this job's error.
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
        self.ran_coroutine = False  # a coroutine returned by a sync function: its loop keeps the limit
        if alarm and soft:
            self.soft_fired = False
            previous = signal.signal(signal.SIGALRM, self._on_soft_timeout)
            signal.setitimer(signal.ITIMER_REAL, soft)
        elif soft and not plan.task.is_async:
            self._unenforced(
                plan,
                f"soft_timeout={soft} s is not enforced outside the main thread (no signal reaches this "
                "thread); its jobs run here without it",
            )
        self.in_handler = True
        try:
            result = self._invoke(plan, context, args, kwargs, soft, began, alarm)
            if self.app.has_job_scope:
                self.app.job_returned()  # what the job left that its scope's end would lose: its error
            return result
        finally:
            self.in_handler = False
            if alarm:
                remaining = signal.setitimer(signal.ITIMER_REAL, 0)[0]
                self.soft_limit.reset()
                replaced = signal.signal(signal.SIGALRM, previous)
                # A sync job's own timer (signal.alarm, setitimer, a timeout helper) took the place
                # of its soft limit's: its handler replaced, or its timer cancelled before it was due.
                cancelled = not remaining and not self.soft_fired and time.monotonic() - began < (soft or 0) - 0.05
                lost = replaced != self._on_soft_timeout or cancelled
                if lost and not plan.task.is_async and not self.ran_coroutine:
                    self._unenforced(
                        plan,
                        "a job set a timer or SIGALRM handler of its own (signal.alarm, setitimer, a timeout "
                        f"helper), which took the place of its soft_timeout={soft} s: not enforced for it",
                    )
            context.end()  # a thread or a later job that kept it can decide or save nothing more
            deactivate(token)

    def _unenforced(self, plan: TaskPlan, why: str) -> None:
        """Say once per task why its soft time limit went unenforced."""
        if plan.task.name not in self.unenforced:
            self.unenforced.add(plan.task.name)
            logger.warning("task %s: %s", plan.task.name, why)

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
        self.ran_coroutine = True
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
        # Completed before it runs: its signals still say that it started, and how its function
        # ended (a failure is final, never retried).
        context = JobContext(message, self.serializer, None, acked_first=True)
        if signals.job_started.receivers:
            signals.job_started.send(task, job=context)
        try:
            result = self._call(TaskPlan(task, self.settings.max_deliveries), context, args, kwargs)
        except BaseException as exc:
            logger.exception("job %s %s raised after it was acked (ACK_FIRST: not retried)", message.id, task.name)
            if signals.job_failed.receivers:
                signals.job_failed.send(task, job=context, exception=exc, traceback=traceback.format_exc())
            return None
        if signals.job_succeeded.receivers:
            signals.job_succeeded.send(task, job=context, result=result)
        return None


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
