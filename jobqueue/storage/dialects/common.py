"""What the dialects share: column lists, literal states, and the parameters of an acquisition."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.flow import rate_horizon
from jobqueue.job import READY_STATES, Message

# Literal states (not bind parameters) so that PostgreSQL and SQLite can prove a query matches the
# partial indexes' predicates at planning time.
READY_LITERALS: list[sa.ColumnClause[Any]] = [sa.literal_column(f"'{state}'") for state in READY_STATES]
PROCESSING: sa.ColumnClause[Any] = sa.literal_column("'PROCESSING'")


# The counters (attempts, deliveries) are 32-bit integers on PostgreSQL and MySQL. A row whose
# counter was set to the largest one (by hand, or by a bad migration) stays there when counted:
# adding one would fail the whole fetch, and every fetch after it, for all the messages it takes.
COUNTER_MAX = 2**31 - 1


def counted(column: Any) -> Any:
    """``column + 1``, except at COUNTER_MAX, which stays (the job is then failed as poison)."""
    return sa.case((column < COUNTER_MAX, column + 1), else_=column)


def count_up(value: int) -> int:
    """What :func:`counted` makes of ``value``, in Python."""
    return value + 1 if value < COUNTER_MAX else value


def delivery_order(message: Any) -> tuple[int, datetime, int]:
    """The sort key of delivery order (of a message, or a row with the same columns)."""
    return -message.priority, message.next_attempt_at, message.id


def readable_times(message: Message) -> Message:
    """``message`` as read, unless a time of its row holds none that Python can read: a year
    past 9999 or before 1 on PostgreSQL (its driver gives such a value as an ``Unreadable``), a
    zero date in a column that must hold a time on MySQL (read as None). That time is then replaced
    and the message marked ``corrupt``, naming the column and what it holds, so that it fails
    alone with CorruptMessage instead of failing the fetch of every message taken with it."""
    first = message.first_attempt_at
    if (
        type(message.created_at) is datetime
        and type(message.next_attempt_at) is datetime
        and not isinstance(first, str)
    ):
        return message
    problems = []
    for column, required in (("created_at", True), ("next_attempt_at", True), ("first_attempt_at", False)):
        value = getattr(message, column)
        if isinstance(value, datetime) or (value is None and not required):
            continue
        held = "no time (a zero date?)" if value is None else str(value)
        problems.append(f"{column} holds {held}")
        setattr(message, column, utcnow() if required else None)
    if problems:  # else only its type differed: a datetime subclass (a frozen clock's, in tests)
        message.corrupt = "; ".join(filter(None, [message.corrupt, *problems]))
    return message


def first_of_partition(message: sa.Table) -> sa.ColumnElement[bool]:
    """The condition "no older active message shares this message's partition key".

    Messages of one key run one at a time in enqueue (id) order: only the oldest active one may be
    acquired, and it holds the key while it runs, waits to retry or is deferred, until its final
    outcome moves it to the archive. One probe of the (partition_key, id) index per candidate.
    """
    earlier = message.alias("earlier")
    older = sa.exists().where(earlier.c.partition_key == message.c.partition_key, earlier.c.id < message.c.id)
    return sa.or_(message.c.partition_key.is_(None), ~older)


# The columns a worker needs from an acquired message, in the order of Message's fields.
ACQUIRED_COLUMNS = (
    "id",
    "task_name",
    "queue",
    "priority",
    "payload",
    "headers",
    "attempts_count",
    "deliveries_count",
    "lease_token",
    "created_at",
    "first_attempt_at",
    "next_attempt_at",
    "acquired_at",
    "unique_key",
    "partition_key",
    "checkpoint",
    "options",
    "history",
    "flow_key",
    "concurrency_limit",
    "rate_interval_us",
)

# The columns every row of a bulk batch has in common (all the enqueued columns but payload and
# unique_key), in the order the driver-level insert paths send them.
BATCH_COLUMNS = (
    "task_name",
    "queue",
    "priority",
    "state",
    "headers",
    "partition_key",
    "flow_key",
    "concurrency_limit",
    "rate_interval_us",
    "options",
    "attempts_count",
    "deliveries_count",
    "created_at",
    "next_attempt_at",
)


def json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class LeaseClock:
    """The binds of a statement that reads the lease clock: :meth:`Dialect.clock` and ``clock_plus``.

    ``now`` pins the clock (tests); None reads the database server's clock where the dialect can.
    ``seconds`` is the offset ``clock_plus`` adds (a lease, or minus a staleness limit).
    """

    now: datetime | None
    seconds: float

    def binds(self) -> dict[str, Any]:
        return {
            "lease_now": self.now,
            "lease_us": int(self.seconds * 1_000_000),
            "lease_until": None if self.now is None else self.now + timedelta(seconds=self.seconds),
        }


@dataclass(frozen=True)
class WorkerState:
    """What a heartbeat says of one worker process."""

    id: str
    running_job_id: int | None = None
    running_since: datetime | None = None
    jobs_done: int = 0


def queue_shape(queues: tuple[str, ...] | None) -> str:
    """Which statements serve a worker of ``queues``: "all" (None or none), "one" or "many"."""
    return "all" if not queues else "one" if len(queues) == 1 else "many"


@dataclass(frozen=True)
class AcquireParams:
    worker_id: str
    token: int
    queues: tuple[str, ...] | None
    limit: int
    now: datetime  # what is due: messages whose next_attempt_at is not after it
    lease: LeaseClock
    rated: bool = False  # whether to ask when a key held back by its rate may start again
    # Only messages of this priority: acquired level by level, each walk ending at its first
    # message not due yet, behind which a backlog due later may wait (see Store.acquire).
    level: int | None = None

    @property
    def shape(self) -> str:
        """Which acquire statement serves these queues: "all", "one" or "many"."""
        return queue_shape(self.queues)

    @property
    def statement(self) -> tuple[str, bool]:
        """Which plain acquire statement serves these params: the shape, and whether of one level."""
        return self.shape, self.level is not None

    def binds(self) -> dict[str, Any]:
        binds: dict[str, Any] = {
            "now": self.now,
            "rate_horizon": rate_horizon(self.now),
            "limit": self.limit,
            "token": self.token,
            "worker_id": self.worker_id,
            **self.lease.binds(),
        }
        if self.queues:
            binds["queues"] = list(self.queues)
            binds["only_queue"] = self.queues[0]
        if self.level is not None:
            binds["level"] = self.level
        return binds
