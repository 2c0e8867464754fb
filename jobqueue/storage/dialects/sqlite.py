"""SQLite: UPDATE ... RETURNING inside BEGIN IMMEDIATE (set up by storage.engine), WAL journal.

SQLite has one writer at a time, so there is nothing to skip: the IMMEDIATE transaction makes the
select-and-mark atomic, and busy_timeout makes the other processes wait their turn.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from jobqueue.storage.dialects.base import Dialect


class SQLiteDialect(Dialect):
    name = "sqlite"
    insert_on_conflict = staticmethod(sqlite.insert)

    def check_server(self, connection: sa.Connection) -> None:
        self._require(sqlite3.sqlite_version_info, (3, 35), "SQLite")

    def build_acquire(self, queues: str) -> Any:
        m = self.message
        ready = self.ready_select([m.c.id], queues != "all").scalar_subquery()
        return sa.update(m).where(m.c.id.in_(ready)).values(self.acquired_values()).returning(*self.returned)
