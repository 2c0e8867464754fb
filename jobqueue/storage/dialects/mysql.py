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

from jobqueue.storage.dialects.base import AcquireParams, Dialect


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

    def acquire(self, connection: sa.Connection, params: AcquireParams) -> list[dict[str, Any]]:
        rows = super().acquire(connection, params)
        if not rows:
            return rows
        binds = params.binds()
        binds["ids"] = [row["id"] for row in rows]
        connection.execute(self.mark_acquired, binds)
        for row in rows:
            row.update(
                attempts_count=row["attempts_count"] + 1,
                deliveries_count=row["deliveries_count"] + 1,
                lease_token=params.token,
                acquired_at=params.now,
                first_attempt_at=row["first_attempt_at"] or params.now,
            )
        return rows

    def insert_messages(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        if connection.dialect.insert_returning:  # MariaDB
            return super().insert_messages(connection, rows)
        m = self.message
        if len(rows) > 1 and self._consecutive_ids(connection):
            first = connection.execute(sa.insert(m).values(rows)).lastrowid
            return list(range(first, first + len(rows)))
        return [int(connection.execute(sa.insert(m).values(row)).lastrowid) for row in rows]

    @staticmethod
    def _consecutive_ids(connection: sa.Connection) -> bool:
        # A multi-row INSERT gets consecutive ids unless innodb_autoinc_lock_mode is 2 (interleaved).
        mode = connection.exec_driver_sql("SELECT @@innodb_autoinc_lock_mode").scalar()
        return mode is not None and int(mode) < 2

    def insert_unique(self, connection: sa.Connection, row: dict[str, Any]) -> int | None:
        m = self.message
        # On a duplicate key, LAST_INSERT_ID(id) makes lastrowid the existing row's id.
        stmt = mysql.insert(m).values(row).on_duplicate_key_update(id=sa.func.last_insert_id(m.c.id))
        result = connection.execute(stmt)
        return int(result.lastrowid) if result.rowcount == 1 else None
