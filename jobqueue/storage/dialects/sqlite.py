"""SQLite: UPDATE ... RETURNING inside BEGIN IMMEDIATE (set up by storage.engine), WAL journal.

SQLite has one writer at a time, so there is nothing to skip: the IMMEDIATE transaction makes the
select-and-mark atomic, and busy_timeout makes the other processes wait their turn.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Any, Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from jobqueue.clock import utcnow
from jobqueue.job import Batch, Message, Outcome, OutcomeKind
from jobqueue.storage.outcomes import COPIED, SUPPLIED, archive_row, requeue_binds, supplied_values
from jobqueue.storage.dialects.base import ACQUIRED_COLUMNS, SHARED_COLUMNS, AcquireParams, Dialect, json_text

SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"  # what SQLAlchemy's DateTime stores on SQLite


DATETIME_COLUMNS = {"created_at", "next_attempt_at", "first_attempt_at", "last_attempt_at", "finished_at",
                    "archived_at"}


def sqlite_value(column: str, value: Any) -> Any:
    if column in ("headers", "options"):
        return json_text(value)
    if column in DATETIME_COLUMNS:
        # The text SQLAlchemy's DateTime stores (SQLITE_DATETIME), by isoformat's C fast path.
        return None if value is None else value.isoformat(" ", "microseconds")
    return value


class SQLiteDialect(Dialect):
    name = "sqlite"
    autocommit = False
    marker = "?"

    def format_value(self, column: str, value: Any) -> Any:
        return sqlite_value(column, value)
    insert_on_conflict = staticmethod(sqlite.insert)

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        # One executemany in one write transaction: with AUTOINCREMENT and the write lock held, the
        # ids are the consecutive run ending at last_insert_rowid().
        shared = tuple(self.format_value(column, batch.common[column]) for column in SHARED_COLUMNS)
        sql = self.batch_insert_sql("(" + ", ".join(["?"] * (len(SHARED_COLUMNS) + 1)) + ")")
        connection.exec_driver_sql(sql, [(payload, *shared) for payload in batch.payloads])
        last = connection.exec_driver_sql("SELECT last_insert_rowid()").scalar_one()
        return list(range(last - len(batch) + 1, last + 1))

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome],
                       now: datetime) -> set[tuple[int, int]]:
        # Inside BEGIN IMMEDIATE: the write lock is ours, so after lock_held's check nothing can
        # change the rows. Archive rows are copied from the message rows by the database (payloads
        # never travel back), one executemany in SQLite's C loop, then one DELETE.
        held = self.lock_held(connection, [(o.message.id, o.message.lease_token) for o in outcomes])
        applied = [o for o in outcomes if (o.message.id, o.message.lease_token) in held]
        finals = [o for o in applied if o.kind is OutcomeKind.ARCHIVE]
        if finals:
            kept = [o for o in finals if o.retain and o.message.corrupt is None]
            if kept:
                connection.exec_driver_sql(self._archive_copy_sql(), [
                    tuple(self.format_value(c, v) for c, v in zip(SUPPLIED, supplied_values(o, now)))
                    + (o.message.id,) for o in kept])
            # A corrupt row is archived from the values that could be read (its error message holds
            # the unreadable text), so that the archive never holds text it cannot read back.
            repaired = [archive_row(o, now) for o in finals if o.retain and o.message.corrupt is not None]
            if repaired:
                connection.execute(sa.insert(self.tables.archive), repaired)
            connection.execute(self.delete_ids, {"ids": [o.message.id for o in finals]})
        updates = [requeue_binds(o) for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        if updates:
            connection.execute(self.requeue, updates)
        return held

    def _archive_copy_sql(self) -> str:
        message, archive = self.message.name, self.tables.archive.name
        columns = ", ".join(COPIED + SUPPLIED)
        copied = ", ".join(COPIED)
        supplied = ", ".join(["?"] * len(SUPPLIED))
        return f"INSERT INTO {archive} ({columns}) SELECT {copied}, {supplied} FROM {message} WHERE id = ?"

    def check_server(self, connection: sa.Connection) -> None:
        self._require(sqlite3.sqlite_version_info, (3, 35), "SQLite")

    def build_acquire(self, queues: str) -> Any:
        # Columns come back as stored, undecoded: a hand-edited row with text that is not JSON or
        # not a timestamp must fail alone (see read_message), not the whole acquire in every process.
        m = self.message
        ready = self.ready_select([m.c.id], queues != "all").scalar_subquery()
        raw = [sa.type_coerce(column, sa.types.NullType()).label(column.name) for column in self.returned]
        return sa.update(m).where(m.c.id.in_(ready)).values(self.acquired_values()).returning(*raw)

    def acquire(self, connection: sa.Connection, params: AcquireParams) -> list[Message]:
        queues = "all" if not params.queues else "one" if len(params.queues) == 1 else "many"
        stmt = self._acquire_cache.get(queues)
        if stmt is None:
            stmt = self._acquire_cache[queues] = self.build_acquire(queues)
        rows = [read_message(row) for row in connection.execute(stmt, params.binds()).all()]
        rows.sort(key=lambda r: (-r.priority, r.next_attempt_at, r.id))
        return rows


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
    "id": (_integer, lambda: 0), "task_name": (_text, lambda: "?"), "queue": (_text, lambda: "?"),
    "priority": (_integer, lambda: 0), "payload": (_blob, lambda: b""), "headers": (_json, lambda: None),
    "attempts_count": (_integer, lambda: 1), "deliveries_count": (_integer, lambda: 1),
    "lease_token": (_integer, lambda: 0), "created_at": (_timestamp, utcnow),
    "first_attempt_at": (_optional(_timestamp), lambda: None), "next_attempt_at": (_timestamp, utcnow),
    "acquired_at": (_optional(_timestamp), utcnow), "unique_key": (_optional(_text), lambda: None),
    "partition_key": (_optional(_text), lambda: None), "checkpoint": (_optional(_blob), lambda: None),
    "options": (_json, lambda: None), "history": (_json, lambda: None),
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


def _read_fast(id: Any, task_name: Any, queue: Any, priority: Any, payload: Any, headers: Any, attempts: Any,
               deliveries: Any, token: Any, created: Any, first: Any, next_at: Any, acquired: Any, unique_key: Any,
               partition_key: Any, checkpoint: Any, options: Any, history: Any) -> Message:
    """The common case in one go: every column of the type it should be (else it raises)."""
    if not (type(id) is int and type(priority) is int and type(attempts) is int and type(deliveries) is int
            and type(token) is int and type(task_name) is str and type(queue) is str and type(payload) is bytes
            and (unique_key is None or type(unique_key) is str) and (partition_key is None or type(partition_key) is str)
            and (checkpoint is None or type(checkpoint) is bytes)):
        raise TypeError("a column of an unexpected type")
    return Message(id, task_name, queue, priority, payload, None if headers is None else _loads(headers), attempts,
                   deliveries, token, _parse(created), None if first is None else _parse(first), _parse(next_at),
                   None if acquired is None else _parse(acquired), unique_key, partition_key, checkpoint,
                   None if options is None else _loads(options), None if history is None else _loads(history))


def _read_carefully(row: Sequence[Any]) -> Message:
    values: list[Any] = []
    problems: list[str] = []
    for column, value in zip(ACQUIRED_COLUMNS, row):
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
