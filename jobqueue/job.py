"""The message model: states, a fetched message, and the outcomes a delivery can end with.

Lifecycle::

    PENDING --acquired--> PROCESSING --ack--> COMPLETED            (archive)
    RETRYABLE --acquired--> PROCESSING --reject / over max_deliveries / no retry left--> FAILED (archive)
    PROCESSING --nack, retry allowed--> RETRYABLE
    PROCESSING --defer / lease expired / holder died / handed back unstarted--> PENDING
    PENDING, RETRYABLE --cancel--> CANCELLED                      (archive)

PENDING, PROCESSING and RETRYABLE rows live in the message table; COMPLETED, FAILED and CANCELLED
rows in the archive table.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class MessageState(str, enum.Enum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    RETRYABLE = "RETRYABLE"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def public(self) -> str:
        """The lower-case name ``JobHandle.status()`` returns."""
        return self.value.lower()


# The task name of the never-completing messages that drive periodic tasks (one per schedule).
SCHEDULE_TASK = "jobqueue.schedule"
SCHEDULE_PRIORITY = 32767  # a due schedule message goes before any backlog: it only enqueues

ACTIVE_STATES = (MessageState.PENDING, MessageState.PROCESSING, MessageState.RETRYABLE)
READY_STATES = (MessageState.PENDING.value, MessageState.RETRYABLE.value)
FINAL_STATES = (MessageState.COMPLETED, MessageState.FAILED, MessageState.CANCELLED)


ERROR_TYPE_LENGTH = 255
ERROR_MESSAGE_LENGTH = 10_000
ERROR_TRACEBACK_LENGTH = 60_000


@dataclass(slots=True)
class ErrorInfo:
    """An exception as stored: type name, message and formatted traceback.

    Built so that any exception can be stored: a ``str()`` that raises is replaced by the
    exception's repr (or a note), NUL characters (which PostgreSQL text cannot hold) are written
    as ``\\x00``, and each part is cut to what its column holds.
    """

    type: str
    message: str
    traceback: str | None = None

    def __post_init__(self) -> None:
        self.type = storable_text(self.type)[:ERROR_TYPE_LENGTH]
        self.message = storable_text(self.message)[:ERROR_MESSAGE_LENGTH]
        if self.traceback is not None:
            self.traceback = storable_text(self.traceback)[-ERROR_TRACEBACK_LENGTH:]

    @classmethod
    def from_exception(cls, exc: BaseException, traceback: str | None = None) -> ErrorInfo:
        kind = type(exc)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        return cls(type=name, message=safe_str(exc), traceback=traceback)


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` raises (anything, even
    SystemExit: that is the job's code, and the exception it raised is the cause to record)."""
    try:
        return str(exc)
    except BaseException:
        try:
            return f"<str() of this {type(exc).__name__} raised; repr: {object.__repr__(exc)}>"
        except BaseException:
            return "<unprintable exception>"


def storable_text(text: object) -> str:
    """Text every database can store: NUL written as ``\\x00``, unpaired surrogates escaped."""
    value = text if isinstance(text, str) else str(text)
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


@dataclass(slots=True)
class Message:
    """One acquired message, as a worker holds it during a delivery."""

    id: int
    task_name: str
    queue: str
    priority: int
    payload: bytes
    headers: dict[str, Any] | None
    attempts_count: int
    deliveries_count: int
    lease_token: int
    created_at: datetime
    first_attempt_at: datetime | None
    next_attempt_at: datetime
    acquired_at: datetime | None = None
    unique_key: str | None = None
    partition_key: str | None = None
    checkpoint: bytes | None = None
    options: dict[str, Any] | None = None
    history: list[Any] | None = None
    flow_key: str | None = None  # its concurrency key (or "task:<name>"), where its task has limits
    concurrency_limit: int | None = None
    rate_interval_us: int | None = None
    corrupt: str | None = None  # why its row could not be read back (it is failed without running)
    # Taken in a partition's run: the partition's key as the database spells it in its flow row.
    # Keys the database compares as equal (none that differ, unless a key column's collation was
    # changed by hand) are one partition, whatever their spelling here.
    run_key: str | None = None

    @property
    def partition(self) -> str | None:
        """The partition this message runs in turn with (None: none)."""
        return self.run_key or self.partition_key


class OutcomeKind(enum.Enum):
    ARCHIVE = "archive"  # COMPLETED or FAILED: moved to the archive table
    RETRY = "retry"  # RETRYABLE at next_attempt_at
    DEFER = "defer"  # PENDING at next_attempt_at, keeping (or replacing) the checkpoint
    RETURN = "return"  # handed back unstarted: PENDING, its delivery and attempt not counted


@dataclass(slots=True)
class Outcome:
    """What a delivery ended with; applied by the store only while the lease is still held."""

    message: Message
    kind: OutcomeKind
    state: MessageState
    finished_at: datetime
    started_at: datetime | None = None
    result: bytes | None = None
    error: ErrorInfo | None = None
    next_attempt_at: datetime | None = None
    checkpoint: bytes | None = None
    retain: bool = True
    duration_seconds: float | None = None  # how long the handler ran, for the log line
    ran: bool = True  # False: failed without running (its attempt is not counted)
    # The exception behind ``error``, for signal receivers and the log in this process; never stored.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """What logs and metrics call it: completed, failed, retrying, deferred (pending: handed back)."""
        if self.kind is OutcomeKind.RETRY:
            return "retrying"
        if self.kind is OutcomeKind.DEFER:
            return "deferred"
        return self.state.public


@dataclass
class Batch:
    """The rows of one bulk enqueue: the columns they all share, and per row a payload and a key.

    Every column but ``payload`` and ``unique_key`` is the same for all rows of a ``bulk()`` call,
    so the fast insert paths format those once per batch instead of once per row.
    """

    common: dict[str, Any]
    payloads: Sequence[bytes]  # a list, or serialized as read (Task.bulk's streamed path)
    unique_keys: list[str | None]

    def __len__(self) -> int:
        return len(self.payloads)

    def row(self, index: int) -> dict[str, Any]:
        return {**self.common, "payload": self.payloads[index], "unique_key": self.unique_keys[index]}

    def rows(self) -> list[dict[str, Any]]:
        return [self.row(i) for i in range(len(self))]

    def take(self, indexes: list[int]) -> Batch:
        return Batch(self.common, [self.payloads[i] for i in indexes], [self.unique_keys[i] for i in indexes])
