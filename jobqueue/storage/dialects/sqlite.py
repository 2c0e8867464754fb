"""SQLite: UPDATE ... RETURNING inside BEGIN IMMEDIATE (set up by storage.engine), WAL journal.

SQLite has one writer at a time, so there is nothing to skip: the IMMEDIATE transaction makes the
select-and-mark atomic, and busy_timeout makes the other processes wait their turn.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from jobqueue.storage.dialects.base import ENQUEUE_COLUMNS, Dialect, json_text

SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"  # what SQLAlchemy's DateTime stores on SQLite


def sqlite_values(row: dict[str, Any]) -> tuple[Any, ...]:
    values = []
    for column in ENQUEUE_COLUMNS:
        value = row[column]
        if column in ("headers", "options"):
            value = json_text(value)
        elif column in ("created_at", "next_attempt_at"):
            value = value.strftime(SQLITE_DATETIME)
        values.append(value)
    return tuple(values)


class SQLiteDialect(Dialect):
    name = "sqlite"
    autocommit = False
    insert_on_conflict = staticmethod(sqlite.insert)

    def insert_many(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[int] | None:
        # One executemany in one write transaction: with AUTOINCREMENT and the write lock held, the
        # ids are the consecutive run ending at last_insert_rowid().
        connection.exec_driver_sql(self.plain_insert("?"), [sqlite_values(row) for row in rows])
        last = connection.exec_driver_sql("SELECT last_insert_rowid()").scalar_one()
        return list(range(last - len(rows) + 1, last + 1))

    def check_server(self, connection: sa.Connection) -> None:
        self._require(sqlite3.sqlite_version_info, (3, 35), "SQLite")

    def build_acquire(self, queues: str) -> Any:
        m = self.message
        ready = self.ready_select([m.c.id], queues != "all").scalar_subquery()
        return sa.update(m).where(m.c.id.in_(ready)).values(self.acquired_values()).returning(*self.returned)
