"""How an outcome becomes column values, written once for every dialect.

An archived outcome (COMPLETED or FAILED) fills its archive row from two sources: the columns
``COPIED`` from its message row (the database copies them, so payloads never travel back), and the
``ARCHIVED`` fields the outcome supplies. A requeued outcome (a retry, a deferral, a hand-back)
updates its message row with the ``REQUEUED`` fields. Each dialect builds its statements from these
lists: SQLite and MySQL bind the values, PostgreSQL sends them as a JSON recordset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobqueue.job import Outcome, OutcomeKind

# The columns a delivery's lease occupies, cleared whenever a message leaves PROCESSING.
RELEASED: dict[str, None] = {"worker_id": None, "lease_token": None, "acquired_at": None, "lease_expires_at": None}

# Archive columns copied from the message row.
COPIED = (
    "id",
    "task_name",
    "queue",
    "priority",
    "payload",
    "headers",
    "unique_key",
    "partition_key",
    "flow_key",
    "concurrency_limit",
    "rate_interval_us",
    "options",
    "history",
    "created_at",
)


@dataclass(frozen=True)
class Field:
    """One column an outcome writes: its name, its kind ("text", "bytes", "integer", "timestamp")
    and how its value comes from the outcome (and the time of the flush)."""

    column: str
    kind: str
    value: Callable[[Outcome, datetime], Any]
    keep_if_null: bool = False  # a requeue without an error keeps the last one recorded
    per_flush: bool = False  # the same for every outcome of a flush (a dialect may bind it once)


def _error(part: str) -> Callable[[Outcome, datetime], Any]:
    return lambda o, now: getattr(o.error, part) if o.error is not None else None


def _unstarted(outcome: Outcome) -> bool:
    return outcome.kind is OutcomeKind.RETURN


def _first_attempt(outcome: Outcome, now: Any) -> datetime | None:
    m = outcome.message
    return None if _unstarted(outcome) and m.attempts_count <= 1 else m.first_attempt_at


ARCHIVED = (
    Field("state", "text", lambda o, now: o.state.value),
    Field("checkpoint", "bytes", lambda o, now: o.checkpoint),
    Field("attempts_count", "integer", lambda o, now: o.message.attempts_count),
    Field("deliveries_count", "integer", lambda o, now: o.message.deliveries_count),
    Field("first_attempt_at", "timestamp", lambda o, now: o.message.first_attempt_at or o.started_at),
    Field("last_attempt_at", "timestamp", lambda o, now: o.started_at or o.message.acquired_at),
    Field("finished_at", "timestamp", lambda o, now: o.finished_at),
    Field("archived_at", "timestamp", lambda o, now: now, per_flush=True),
    Field("result", "bytes", lambda o, now: o.result),
    Field("error_type", "text", _error("type")),
    Field("error_message", "text", _error("message")),
    Field("error_traceback", "text", _error("traceback")),
)

ARCHIVED_COLUMNS = tuple(field.column for field in ARCHIVED)

REQUEUED = (
    Field("state", "text", lambda o, now: o.state.value),
    Field("next_attempt_at", "timestamp", lambda o, now: o.next_attempt_at or o.message.next_attempt_at),
    # A recorded outcome resets deliveries; handing back unstarted uncounts both.
    Field("attempts_count", "integer", lambda o, now: o.message.attempts_count - (1 if _unstarted(o) else 0)),
    Field("deliveries_count", "integer", lambda o, now: o.message.deliveries_count - 1 if _unstarted(o) else 0),
    # Handed back before its first attempt started: it has had none yet (its fetch set the time).
    Field("first_attempt_at", "timestamp", _first_attempt),
    Field("checkpoint", "bytes", lambda o, now: o.checkpoint),
    Field("last_error_type", "text", _error("type"), keep_if_null=True),
    Field("last_error_message", "text", _error("message"), keep_if_null=True),
    Field("last_error_traceback", "text", _error("traceback"), keep_if_null=True),
)


NO_ERROR = (None, None, None)  # the error columns of an outcome without one


def archived_values(outcome: Outcome, now: Any, stamp: Callable[[datetime], Any] | None = None) -> tuple[Any, ...]:
    """The ARCHIVED values of a COMPLETED or FAILED outcome, in ARCHIVED order.

    What the ARCHIVED fields say, in one pass: a flush builds one such row per job. ``stamp``, if
    given, turns the outcome's own timestamps into what the driver takes; ``now`` (the time of the
    flush) is used as given, so that a dialect converts it once per flush.
    """
    m = outcome.message
    started = outcome.started_at
    first = m.first_attempt_at or started
    last = started or m.acquired_at
    finished = outcome.finished_at
    if stamp is not None:
        first = None if first is None else stamp(first)
        last = None if last is None else stamp(last)
        finished = None if finished is None else stamp(finished)
    error = outcome.error
    failure = NO_ERROR if error is None else (error.type, error.message, error.traceback)
    return (
        outcome.state.value,
        outcome.checkpoint,
        m.attempts_count,
        m.deliveries_count,
        first,
        last,
        finished,
        now,
        outcome.result,
        *failure,
    )


def archive_row(outcome: Outcome, now: datetime) -> dict[str, Any]:
    """A whole archive row built from what the worker holds (where the message row is not copied)."""
    m = outcome.message
    copied = {
        "id": m.id,
        "task_name": m.task_name,
        "queue": m.queue,
        "priority": m.priority,
        "payload": m.payload,
        "headers": m.headers,
        "unique_key": m.unique_key,
        "partition_key": m.partition_key,
        "flow_key": m.flow_key,
        "concurrency_limit": m.concurrency_limit,
        "rate_interval_us": m.rate_interval_us,
        "options": m.options,
        "history": m.history,
        "created_at": m.created_at,
    }
    return {**copied, **{field.column: field.value(outcome, now) for field in ARCHIVED}}


def requeue_binds(outcome: Outcome, now: datetime) -> dict[str, Any]:
    """The bind values of a requeue: ``b_id``, ``b_token`` and ``b_<column>`` for each REQUEUED field."""
    m = outcome.message
    binds = {f"b_{field.column}": field.value(outcome, now) for field in REQUEUED}
    binds.update(b_id=m.id, b_token=m.lease_token)
    return binds
