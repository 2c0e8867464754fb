"""SQLite: the values a row is written with, and acquired rows read back as messages, a
hand-edited value failing only its own message.

SQLite stores any value in any column, so a row edited by hand may hold text where a timestamp or
JSON belongs. The common case is read in one go; a row that does not fit is read column by column,
each unreadable value replaced by a stand-in and named in the message's ``corrupt``, so that the
message fails alone with that cause.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from jobqueue.clock import utcnow
from jobqueue.job import Message
from jobqueue.storage.dialects.common import ACQUIRED_COLUMNS, json_text

SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"  # what SQLAlchemy's DateTime stores on SQLite

DATETIME_COLUMNS = {
    "created_at",
    "next_attempt_at",
    "first_attempt_at",
    "last_attempt_at",
    "finished_at",
    "archived_at",
}


def stamp(value: datetime) -> str:
    # The text SQLAlchemy's DateTime stores (SQLITE_DATETIME), by isoformat's C fast path.
    return value.isoformat(" ", "microseconds")


def insert_one_params(row: dict[str, Any]) -> tuple[Any, ...]:
    """The values of ``Dialect.insert_one_sql`` for one row: ``sqlite_value`` of each, inlined
    (the per-column calls cost as much as the rest of a delay()'s Python)."""
    get = row.get
    headers, options = get("headers"), get("options")
    created, due = get("created_at"), get("next_attempt_at")
    return (
        row["payload"],
        get("unique_key"),
        get("task_name"),
        get("queue"),
        get("priority"),
        get("state"),
        None if headers is None else json_text(headers),
        get("partition_key"),
        get("flow_key"),
        get("concurrency_limit"),
        get("rate_interval_us"),
        None if options is None else json_text(options),
        get("attempts_count"),
        get("deliveries_count"),
        None if created is None else stamp(created),
        None if due is None else stamp(due),
    )


def sqlite_value(column: str, value: Any) -> Any:
    if column in ("headers", "options"):
        return json_text(value)
    if column in DATETIME_COLUMNS:
        # The text SQLAlchemy's DateTime stores (SQLITE_DATETIME), by isoformat's C fast path.
        return None if value is None else value.isoformat(" ", "microseconds")
    return value


def _timestamp(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise TypeError(f"a {type(value).__name__}, not a timestamp")
    return datetime.fromisoformat(value)


def _json(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, (str, bytes)):
        raise TypeError(f"a {type(value).__name__}, not JSON text")
    return json.loads(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{type(value).__name__} {value!r}, not an integer")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{type(value).__name__} {value!r}, not text")
    return value


def _blob(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if not isinstance(value, bytes):
        raise TypeError(f"{type(value).__name__} {value!r}, not bytes")
    return value


def _optional(decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else decode(value)


# How each acquired column is read back, and what stands in for a value that cannot be.
_READERS: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]] = {
    "id": (_integer, lambda: 0),
    "task_name": (_text, lambda: "?"),
    "queue": (_text, lambda: "?"),
    "priority": (_integer, lambda: 0),
    "payload": (_blob, lambda: b""),
    "headers": (_json, lambda: None),
    "attempts_count": (_integer, lambda: 1),
    "deliveries_count": (_integer, lambda: 1),
    "lease_token": (_integer, lambda: 0),
    "created_at": (_timestamp, utcnow),
    "first_attempt_at": (_optional(_timestamp), lambda: None),
    "next_attempt_at": (_timestamp, utcnow),
    "acquired_at": (_optional(_timestamp), utcnow),
    "unique_key": (_optional(_text), lambda: None),
    "partition_key": (_optional(_text), lambda: None),
    "checkpoint": (_optional(_blob), lambda: None),
    "options": (_json, lambda: None),
    "history": (_json, lambda: None),
    "flow_key": (_optional(_text), lambda: None),
    "concurrency_limit": (_optional(_integer), lambda: 1),
    "rate_interval_us": (_optional(_integer), lambda: None),
}


def read_message(row: Sequence[Any]) -> Message:
    """An acquired row as a Message; a column that cannot be read is replaced and the message
    marked ``corrupt`` with what was wrong, so that it fails alone with that cause."""
    try:
        return _read_fast(*row)
    except Exception:
        return _read_carefully(row)


_parse = datetime.fromisoformat
_loads = json.loads


def _read_fast(
    id: Any,
    task_name: Any,
    queue: Any,
    priority: Any,
    payload: Any,
    headers: Any,
    attempts: Any,
    deliveries: Any,
    token: Any,
    created: Any,
    first: Any,
    next_at: Any,
    acquired: Any,
    unique_key: Any,
    partition_key: Any,
    checkpoint: Any,
    options: Any,
    history: Any,
    flow_key: Any,
    concurrency_limit: Any,
    rate_interval_us: Any,
) -> Message:
    """The common case in one go: every column of the type it should be (else it raises)."""
    if not (
        type(id) is int
        and type(priority) is int
        and type(attempts) is int
        and type(deliveries) is int
        and type(token) is int
        and type(task_name) is str
        and type(queue) is str
        and type(payload) is bytes
        and (unique_key is None or type(unique_key) is str)
        and (partition_key is None or type(partition_key) is str)
        and (checkpoint is None or type(checkpoint) is bytes)
        and (flow_key is None or type(flow_key) is str)
        and (concurrency_limit is None or type(concurrency_limit) is int)
        and (rate_interval_us is None or type(rate_interval_us) is int)
    ):
        raise TypeError("a column of an unexpected type")
    return Message(
        id,
        task_name,
        queue,
        priority,
        payload,
        None if headers is None else _loads(headers),
        attempts,
        deliveries,
        token,
        _parse(created),
        None if first is None else _parse(first),
        _parse(next_at),
        None if acquired is None else _parse(acquired),
        unique_key,
        partition_key,
        checkpoint,
        None if options is None else _loads(options),
        None if history is None else _loads(history),
        flow_key,
        concurrency_limit,
        rate_interval_us,
    )


def _read_carefully(row: Sequence[Any]) -> Message:
    values: list[Any] = []
    problems: list[str] = []
    for column, value in zip(ACQUIRED_COLUMNS, row, strict=True):
        read, stand_in = _READERS[column]
        try:
            values.append(read(value))
        except Exception as exc:
            problems.append(f"{column} {str(value)[:200]!r} cannot be read ({exc})")
            values.append(stand_in())
    message = Message(*values)
    if problems:
        message.corrupt = "; ".join(problems)
    return message
