"""The running job's context: what ``bind=True`` passes and ``current_job()`` returns."""

from __future__ import annotations

import enum
import math
import signal
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Protocol

from jobqueue.clock import to_naive_utc, utcnow
from jobqueue.errors import JobQueueError, LeaseLost, SerializationError
from jobqueue.job import Message
from jobqueue.serialization import Serializer

_current: ContextVar[JobContext | None] = ContextVar("jobqueue_current_job", default=None)


def running_job() -> JobContext | None:
    """The context of the job running in this process, None outside a job."""
    return _current.get()


def current_job() -> JobContext:
    """Return the context of the job running in this process; raise JobQueueError outside a job."""
    context = _current.get()
    if context is None:
        raise JobQueueError(
            "current_job() was called outside a running job (or in a thread the job started, which does not "
            "inherit it: pass the job's context to the thread, or run it with contextvars.copy_context().run, "
            "as asyncio.to_thread does)"
        )
    return context


class Decision(enum.Enum):
    ACK = "ack"
    NACK = "nack"
    REJECT = "reject"
    DEFER = "defer"


class DeliveryWriter(Protocol):
    """What a context needs from the worker to write through to the database at once."""

    def save_checkpoint(self, message: Message, data: bytes | None) -> bool: ...

    def extend_lease(self, message: Message, seconds: float) -> bool: ...


class JobContext:
    """One delivery of one job, seen from inside the task.

    ``ack()``, ``nack()``, ``reject()`` and ``defer()`` decide the outcome (the first call wins);
    ``checkpoint()`` and ``extend()`` write to the database at once.
    """

    def __init__(
        self,
        message: Message | None,
        serializer: Serializer,
        writes: DeliveryWriter | None = None,
        max_state_bytes: int | None = None,
        acked_first: bool = False,
    ) -> None:
        self._message = message
        # Completed before the function ran (ack_policy=ACK_FIRST): there is no lease to write to,
        # and no outcome left to decide.
        self._acked_first = acked_first
        self._ended = False  # the function returned or raised: the delivery's outcome is taken
        self._serializer = serializer
        self._writes = writes
        self._max_state_bytes = max_state_bytes
        self._checkpoint = message.checkpoint if message else None
        self._state_cache: Any = None
        self._state_loaded = False
        self.decision: Decision | None = None
        self.nack_delay_seconds: float | None = None
        self.reject_reason: str | None = None
        self.defer_until: datetime | None = None

    @property
    def id(self) -> int | None:
        """The job id (None when the task was called inline)."""
        return self._message.id if self._message else None

    @property
    def attempt(self) -> int:
        """Executions started so far, this one included: 1 on the first run."""
        return self._message.attempts_count if self._message else 1

    @property
    def deliveries(self) -> int:
        """Acquisitions since the last recorded outcome: 1 on a first delivery."""
        return self._message.deliveries_count if self._message else 1

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self._message.headers or {}) if self._message else {}

    @property
    def task_name(self) -> str | None:
        return self._message.task_name if self._message else None

    @property
    def state(self) -> Any:
        """The checkpoint an earlier attempt saved, or None."""
        if not self._state_loaded:
            try:
                self._state_cache = None if self._checkpoint is None else self._serializer.loads(self._checkpoint)
            except SerializationError as exc:  # the loader speaks of payloads: name what was read
                said = str(exc).replace("corrupt payload", "corrupt checkpoint", 1)
                raise SerializationError(said.replace("unpickle the payload", "unpickle the checkpoint", 1)) from exc
            self._state_loaded = True
        return self._state_cache

    @property
    def checkpoint_bytes(self) -> bytes | None:
        return self._checkpoint

    def end(self) -> None:
        """The function returned or raised: what is called on this context now changes nothing."""
        self._ended = True

    def _check_running(self, what: str) -> None:
        if self._ended:
            raise JobQueueError(
                f"job {self.id} has ended: {what} is taken only while it runs (this context was kept by a "
                "thread or a later job); call it from the job, before it returns"
            )
        if self._acked_first and self._message is not None:
            raise JobQueueError(
                f"job {self.id} was completed before it ran (ack_policy=ACK_FIRST): {what} cannot change it, and "
                "it holds no lease to write to; give the task another ack_policy to decide its outcome or save "
                "checkpoints"
            )

    def _decide(self, decision: Decision) -> None:
        if decision is not Decision.ACK or self._ended:
            self._check_running(f"{decision.value}()")
        if self.decision is not None:
            raise JobQueueError(f"this job was already decided ({self.decision.value}); decide only once")
        self.decision = decision

    def ack(self) -> None:
        """Complete the job when the handler returns."""
        self._decide(Decision.ACK)

    def nack(self, delay_seconds: float | None = None) -> None:
        """Retry the job by its retry strategy (after ``delay_seconds`` if given), or fail it if none is left.

        Raises TypeError or ValueError, deciding nothing, for a delay that is not a number of seconds.
        """
        if delay_seconds is not None:
            from_now("nack(delay_seconds=...)", delay_seconds)
        self._decide(Decision.NACK)
        self.nack_delay_seconds = delay_seconds

    def reject(self, reason: str | None = None) -> None:
        """Fail the job at once, without retry; it goes to the archive as a dead letter."""
        self._decide(Decision.REJECT)
        self.reject_reason = reason

    def _dump_state(self, state: Any, what: str) -> bytes:
        data = self._serializer.dumps(state, path=what)
        if self._max_state_bytes is not None and len(data) > self._max_state_bytes:
            raise SerializationError(
                f"{what} serializes to {len(data)} bytes, over max_payload_bytes="
                f"{self._max_state_bytes}; keep large data elsewhere and save a reference"
            )
        return data

    def checkpoint(self, state: Any) -> None:
        """Save ``state`` durably now; the next delivery reads it back as ``state``, even after a crash."""
        self._check_running("checkpoint()")
        data = None if state is None else self._dump_state(state, "checkpoint state")
        # Saved and remembered as one step: a soft-timeout alarm between the two would make the
        # job's outcome write back the previous checkpoint over the one just saved.
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            if self._message is not None and self._writes is not None:
                if not self._writes.save_checkpoint(self._message, data):
                    raise LeaseLost(f"job {self.id}: lease lost, checkpoint not saved", self._delivery())
                self._message.checkpoint = data
            self._checkpoint, self._state_cache, self._state_loaded = data, state, True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)

    def defer(self, until: datetime | float | None = None, state: Any = None) -> None:
        """Release the job and run it again at ``until`` (a datetime, or seconds from now; default now).

        ``state``, when given, replaces the checkpoint the next run reads. The handler should
        return right after deferring; its return value is ignored.
        """
        if until is None:
            when = utcnow()
        elif isinstance(until, datetime):
            try:
                when = to_naive_utc(until)
            except OverflowError:
                raise ValueError(
                    f"defer(until=...): {until!r} is out of range once converted to UTC; give a time between "
                    "the years 1 and 9999 in UTC"
                ) from None
        elif isinstance(until, (int, float)) and not isinstance(until, bool):
            when = from_now("defer(until=...)", until)
        else:
            raise TypeError(
                f"defer(until=...) takes a datetime or a number of seconds from now, got "
                f"{type(until).__name__} {until!r}"
            )
        data = None if state is None else self._dump_state(state, "defer state")
        self._decide(Decision.DEFER)  # only once the arguments are known to be good
        self.defer_until = when
        if state is not None:
            self._checkpoint = data
            self._state_cache, self._state_loaded = state, True

    def extend(self, seconds: float) -> None:
        """Keep the lease for at least ``seconds`` more; raise LeaseLost if it was already taken."""
        from_now("extend(seconds=...)", seconds)
        if self._acked_first and not self._ended:
            return  # completed before it ran: no lease to keep (a receiver extending every job is no error)
        self._check_running("extend()")
        if self._message is not None and self._writes is not None:
            if not self._writes.extend_lease(self._message, seconds):
                raise LeaseLost(f"job {self.id}: lease lost, cannot extend", self._delivery())

    def _delivery(self) -> tuple[int, int | None] | None:
        m = self._message
        return None if m is None else (m.id, m.lease_token)

    def __repr__(self) -> str:
        return f"<JobContext id={self.id} task={self.task_name} attempt={self.attempt}>"


def from_now(what: str, seconds: Any) -> datetime:
    """``utcnow() + seconds``, refusing what is not a finite number of seconds that a date can hold."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} takes a number of seconds, got {type(seconds).__name__} {seconds!r}")
    try:
        finite = math.isfinite(seconds)
    except OverflowError:  # an integer past what a float holds: a time no date holds either way
        finite = True
    if not finite:
        raise ValueError(f"{what} must be a finite number of seconds, got {seconds!r}")
    if seconds < 0:
        seconds = 0.0  # now
    try:
        return utcnow() + timedelta(seconds=float(seconds))
    except OverflowError:
        raise ValueError(
            f"{what}: {seconds!r} seconds from now is past the year 9999, the last date a job can be given; "
            "give fewer seconds"
        ) from None


def activate(context: JobContext | None) -> Any:
    """Make ``context`` what current_job() returns; give the token to :func:`deactivate`."""
    return _current.set(context)


def deactivate(token: Any) -> None:
    _current.reset(token)
