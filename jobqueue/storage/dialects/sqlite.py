"""SQLite: UPDATE ... RETURNING inside BEGIN IMMEDIATE (set up by storage.engine), WAL journal.

SQLite has one writer at a time, so there is nothing to skip: the IMMEDIATE transaction makes the
select-and-mark atomic, and busy_timeout makes the other processes wait their turn.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from datetime import datetime

from jobqueue.job import Batch, Outcome, OutcomeKind
from jobqueue.storage.outcomes import COPIED, SUPPLIED, requeue_binds, supplied_values
from jobqueue.storage.dialects.base import SHARED_COLUMNS, Dialect, json_text

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
            kept = [o for o in finals if o.retain]
            if kept:
                connection.exec_driver_sql(self._archive_copy_sql(), [
                    tuple(self.format_value(c, v) for c, v in zip(SUPPLIED, supplied_values(o, now)))
                    + (o.message.id,) for o in kept])
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
        m = self.message
        ready = self.ready_select([m.c.id], queues != "all").scalar_subquery()
        return sa.update(m).where(m.c.id.in_(ready)).values(self.acquired_values()).returning(*self.returned)
