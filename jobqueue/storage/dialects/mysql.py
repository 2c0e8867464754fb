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

from jobqueue.errors import ConfigurationError
from jobqueue.job import Batch, Message, Outcome, OutcomeKind
from jobqueue.storage.dialects.base import SHARED_COLUMNS, AcquireParams, Dialect
from jobqueue.storage.outcomes import COPIED, SUPPLIED, requeue_binds, supplied_values


class MySQLDialect(Dialect):
    name = "mysql"
    returning_id = ""  # MySQL 8 has no INSERT ... RETURNING; lastrowid gives the id

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        m = self.message
        self.mark_acquired = sa.update(m).where(m.c.id.in_(sa.bindparam("ids", expanding=True))).values(
            self.acquired_values())

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome],
                       now: datetime) -> set[tuple[int, int]]:
        # After lock_held (SELECT ... FOR UPDATE), one INSERT ... SELECT copies the archive rows
        # from the message rows on the server (payloads never travel back), joined to the outcome
        # fields sent as a UNION ALL derived table, which MySQL and MariaDB both read.
        held = self.lock_held(connection, [(o.message.id, o.message.lease_token) for o in outcomes])
        applied = [o for o in outcomes if (o.message.id, o.message.lease_token) in held]
        finals = [o for o in applied if o.kind is OutcomeKind.ARCHIVE]
        kept = [o for o in finals if o.retain]
        if kept:
            params: list[Any] = []
            for outcome in kept:
                params.append(outcome.message.id)
                params.extend(supplied_values(outcome, now))
            connection.exec_driver_sql(self._archive_copy_sql(len(kept)), tuple(params))
        if finals:
            connection.execute(self.delete_ids, {"ids": [o.message.id for o in finals]})
        updates = [requeue_binds(o) for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        if updates:
            connection.execute(self.requeue, updates)
        return held

    def _archive_copy_sql(self, rows: int) -> str:
        message, archive = self.message.name, self.tables.archive.name
        first = "SELECT %s AS id, " + ", ".join(f"%s AS {column}" for column in SUPPLIED)
        other = "SELECT " + ", ".join(["%s"] * (len(SUPPLIED) + 1))
        values = " UNION ALL ".join([first] + [other] * (rows - 1))
        copied = ", ".join(f"m.{column}" for column in COPIED)
        supplied = ", ".join(f"v.{column}" for column in SUPPLIED)
        return (f"INSERT INTO {archive} ({', '.join(COPIED + SUPPLIED)}) SELECT {copied}, {supplied} "
                f"FROM {message} m JOIN ({values}) v ON v.id = m.id")

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
        if connection.dialect.insert_returning:  # MariaDB: INSERT ... RETURNING
            return super().insert_messages(connection, rows)
        return [int(connection.execute(sa.insert(self.message).values(row)).lastrowid) for row in rows]

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        # One multi-row INSERT whose ids are consecutive from lastrowid, unless
        # innodb_autoinc_lock_mode is 2 (interleaved). Built here rather than by mysqlclient's
        # executemany, which splits long batches into several statements. The values the rows
        # share are bound once, into session variables, so only the payloads are bound per row:
        # escaping every shared value again for each row took twice as long as the insert.
        if not self._consecutive_ids(connection):
            return super().insert_batch(connection, batch)
        connection.exec_driver_sql(
            "SET " + ", ".join(f"@jobqueue_{column} = %s" for column in SHARED_COLUMNS),
            tuple(self.format_value(column, batch.common[column]) for column in SHARED_COLUMNS))
        row = "(%s, " + ", ".join(f"@jobqueue_{column}" for column in SHARED_COLUMNS) + ")"
        first = connection.exec_driver_sql(self.batch_insert_sql(", ".join([row] * len(batch))),
                                           tuple(batch.payloads)).lastrowid
        return list(range(first, first + len(batch)))

    def _consecutive_ids(self, connection: sa.Connection) -> bool:
        # A server setting that cannot change while the server runs: asked once per dialect object.
        if self._lock_mode is None:
            self._lock_mode = int(connection.exec_driver_sql("SELECT @@innodb_autoinc_lock_mode").scalar() or 0)
        return self._lock_mode < 2

    _lock_mode: int | None = None

    def insert_new(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
        # IGNORE skips the duplicate keys (it would turn other errors into warnings too, but every
        # value is checked before it gets here). MariaDB returns the inserted rows. MySQL has no
        # RETURNING: with consecutive auto-increment, the ids of one multi-row INSERT lie in
        # [LAST_INSERT_ID(), + len(rows)), skipped rows leaving gaps, and no other row can be there.
        m = self.message
        insert = sa.insert(m).prefix_with("IGNORE")
        if connection.dialect.insert_returning:
            return [(row[0], row[1]) for row in connection.execute(insert.returning(m.c.id, m.c.unique_key), rows)]
        if not self._consecutive_ids(connection):
            raise ConfigurationError("keyed bulk inserts on MySQL without RETURNING need innodb_autoinc_lock_mode "
                                     "0 or 1 (this server runs 2); use MariaDB, or enqueue keyed jobs one by one")
        first = connection.execute(insert.values(rows)).lastrowid
        if not first:
            return []
        mine = sa.select(m.c.id, m.c.unique_key).where(m.c.id >= first, m.c.id < first + len(rows),
                                                       m.c.task_name == rows[0]["task_name"])
        return [(row[0], row[1]) for row in connection.execute(mine)]

    def insert_unique(self, connection: sa.Connection, row: dict[str, Any]) -> int | None:
        m = self.message
        # On a duplicate key, LAST_INSERT_ID(id) makes lastrowid the existing row's id.
        stmt = mysql.insert(m).values(row).on_duplicate_key_update(id=sa.func.last_insert_id(m.c.id))
        result = connection.execute(stmt)
        return int(result.lastrowid) if result.rowcount == 1 else None
