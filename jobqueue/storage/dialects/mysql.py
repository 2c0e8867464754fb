"""MySQL 8 and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one short transaction.

Neither has UPDATE ... RETURNING, so the acquired values are applied to the selected rows in Python;
the rows are locked by then, so nothing else can change them in between. MariaDB 10.5+ has
INSERT ... RETURNING; MySQL 8 has not, and bulk inserts there read the ids from LAST_INSERT_ID().
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from jobqueue.job import Message
from jobqueue.storage.dialects.base import ENQUEUE_COLUMNS, AcquireParams, Dialect, json_text


class MySQLDialect(Dialect):
    name = "mysql"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        m = self.message
        self.mark_acquired = sa.update(m).where(m.c.id.in_(sa.bindparam("ids", expanding=True))).values(
            self.acquired_values())

    def check_server(self, connection: sa.Connection) -> None:
        if getattr(connection.dialect, "is_mariadb", False):
            self._require(connection.dialect.server_version_info, (10, 6), "MariaDB")
        else:
            self._require(connection.dialect.server_version_info, (8, 0, 1), "MySQL")

    def build_acquire(self, queues: str) -> Any:
        stmt = self.ready_select(self.returned, queues != "all").with_for_update(skip_locked=True)
        if queues == "many":
            # With queue IN (a, b) InnoDB would sort every ready row of those queues, locking each one
            # it reads before LIMIT applies, and concurrent workers would skip everything and take
            # turns. Walking the priority-ordered index and filtering on queue stops at LIMIT rows.
            stmt = stmt.with_hint(self.message, f"FORCE INDEX (ix_{self.tables.prefix}message_ready)")
        return stmt

    def renew_leases(self, connection: sa.Connection, worker_ids: list[str], until: datetime) -> int:
        # Skip rows a worker is flushing right now instead of waiting on them (see PostgreSQL).
        m = self.message
        ids = list(connection.execute(
            sa.select(m.c.id).where(*self.renewable(worker_ids, until)).with_for_update(skip_locked=True)).scalars())
        if not ids:
            return 0
        return int(connection.execute(sa.update(m).where(m.c.id.in_(ids)).values(lease_expires_at=until)).rowcount)

    def acquire(self, connection: sa.Connection, params: AcquireParams) -> list[Message]:
        messages = super().acquire(connection, params)
        if not messages:
            return messages
        binds = params.binds()
        binds["ids"] = [m.id for m in messages]
        connection.execute(self.mark_acquired, binds)
        for m in messages:  # what the UPDATE just wrote, as RETURNING would have said
            m.attempts_count += 1
            m.deliveries_count += 1
            m.lease_token = params.token
            m.acquired_at = params.now
            m.first_attempt_at = m.first_attempt_at or params.now
        return messages

    def insert_messages(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        if connection.dialect.insert_returning or len(rows) > 1:  # MariaDB, or a bulk path below
            return super().insert_messages(connection, rows)
        return [int(connection.execute(sa.insert(self.message).values(rows[0])).lastrowid)]

    def insert_many(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[int] | None:
        # One multi-row INSERT statement: its ids are consecutive from lastrowid unless
        # innodb_autoinc_lock_mode is 2 (interleaved). Built here rather than by mysqlclient's
        # executemany, which splits long batches into several statements.
        if not self._consecutive_ids(connection):
            if connection.dialect.insert_returning:
                return None  # MariaDB: INSERT ... RETURNING with SQLAlchemy
            return [int(connection.execute(sa.insert(self.message).values(row)).lastrowid) for row in rows]
        params: list[Any] = []
        for row in rows:
            params.extend(json_text(row[c]) if c in ("headers", "options") else row[c] for c in ENQUEUE_COLUMNS)
        one = "(" + ", ".join(["%s"] * len(ENQUEUE_COLUMNS)) + ")"
        sql = self.plain_insert("%s").rsplit(" VALUES ", 1)[0] + " VALUES " + ", ".join([one] * len(rows))
        first = connection.exec_driver_sql(sql, tuple(params)).lastrowid
        return list(range(first, first + len(rows)))

    def _consecutive_ids(self, connection: sa.Connection) -> bool:
        # A server setting that cannot change while the server runs: asked once per dialect object.
        if self._lock_mode is None:
            self._lock_mode = int(connection.exec_driver_sql("SELECT @@innodb_autoinc_lock_mode").scalar() or 0)
        return self._lock_mode < 2

    _lock_mode: int | None = None

    def insert_unique(self, connection: sa.Connection, row: dict[str, Any]) -> int | None:
        m = self.message
        # On a duplicate key, LAST_INSERT_ID(id) makes lastrowid the existing row's id.
        stmt = mysql.insert(m).values(row).on_duplicate_key_update(id=sa.func.last_insert_id(m.c.id))
        result = connection.execute(stmt)
        return int(result.lastrowid) if result.rowcount == 1 else None
