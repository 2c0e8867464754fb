"""The enqueue side of a dialect: the INSERTs of jobs, one, a batch, with unique keys, and of
the flow rows their keys hold. Every method but ``enqueue_one`` and ``bulk`` runs in the
transaction the caller gives (an enqueue in the application's own); the dialects override what
their database does faster (COPY, multi-row statements on the driver, INSERT IGNORE).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import JobQueueError
from jobqueue.job import Batch
from jobqueue.storage.dialects.common import BATCH_COLUMNS, json_text
from jobqueue.storage.dialects.connector import Connector
from jobqueue.storage.tables import Tables

UNIQUE_RETRIES = 10


class Inserts(Connector):
    """What most databases do the same way when jobs are enqueued."""

    tables: Tables
    message: sa.Table

    def enqueue_one(self, row: dict[str, Any]) -> int:
        """Insert one unkeyed row in its own transaction, on the driver with a precompiled
        statement; return its id.

        The path every ``delay()`` outside a transaction takes: straight to the driver, without
        SQLAlchemy's per-statement machinery, which cost more client CPU than the insert itself.
        """
        return self.run_on_driver(lambda cursor, info: self.insert_one(cursor, row), self.insert_one_sql())

    def insert_one(self, cursor: Any, row: dict[str, Any]) -> int:
        params = (row["payload"], row["unique_key"], *[self.format_value(c, row.get(c)) for c in BATCH_COLUMNS])
        cursor.execute(self.insert_one_sql(), params)
        return int(cursor.fetchone()[0] if self.returning_id else cursor.lastrowid)

    _insert_one_sql: str | None = None
    returning_id = " RETURNING id"  # "" where the driver's lastrowid gives the id
    marker = "%s"  # the driver's parameter marker

    def insert_one_sql(self) -> str:
        if self._insert_one_sql is None:
            values = "(" + ", ".join([self.marker] * (len(BATCH_COLUMNS) + 2)) + ")"
            self._insert_one_sql = self.batch_insert_sql(values, with_key=True) + self.returning_id
        return self._insert_one_sql

    def format_value(self, column: str, value: Any) -> Any:
        """A column value as the driver takes it without SQLAlchemy's type processing."""
        return json_text(value) if column in ("headers", "options") else value

    def batch_insert_sql(self, values: str, with_key: bool = False) -> str:
        """``INSERT INTO message (payload[, unique_key], BATCH_COLUMNS) VALUES <values>`` for exec_driver_sql."""
        key = ", unique_key" if with_key else ""
        return f"INSERT INTO {self.message.name} (payload{key}, {', '.join(BATCH_COLUMNS)}) VALUES {values}"

    def bulk(self, batch: Batch, batch_size: int) -> list[int]:
        """Insert an unkeyed bulk in one transaction of its own (which holds its flow key), in
        batches of ``batch_size``; return the ids in order. Every payload is serialized (read from
        ``batch.payloads``) before anything is sent, so a bad item writes nothing."""
        payloads = list(batch.payloads)
        ids: list[int] = []
        with self.engine.begin() as connection:
            self.bulk_holding_flow_key(connection, batch)
            for start in range(0, len(payloads), batch_size):
                part = Batch(
                    batch.common, payloads[start : start + batch_size], batch.unique_keys[start : start + batch_size]
                )
                ids.extend(self.insert_batch(connection, part))
        return ids

    def insert_messages(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        """Insert ``rows`` in one round trip per page and return their ids in input order."""
        m = self.message
        if len(rows) == 1:
            return [connection.execute(sa.insert(m).returning(m.c.id), rows[0]).scalar_one()]
        result = connection.execute(sa.insert(m).returning(m.c.id, sort_by_parameter_order=True), rows)
        return list(result.scalars())

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        """Insert a batch of unkeyed rows in one round trip and return their ids in order.

        This generic version lets SQLAlchemy process every value of every row; the dialects
        override it with driver-level paths that format the columns the rows share once.
        """
        return self.insert_messages(connection, batch.rows())

    # The dialect's INSERT with ON CONFLICT (PostgreSQL and SQLite share the syntax).
    insert_on_conflict: Any = None

    def insert_unique(self, connection: sa.Connection, row: dict[str, Any]) -> int | None:
        """Insert ``row`` unless an active message has its (task_name, unique_key); None if one has."""
        m = self.message
        stmt = (
            self.insert_on_conflict(m)
            .values(row)
            .on_conflict_do_nothing(
                index_elements=[m.c.task_name, m.c.unique_key], index_where=m.c.unique_key.isnot(None)
            )
            .returning(m.c.id)
        )
        return connection.execute(stmt).scalar()

    def hold_flow_keys(self, connection: sa.Connection, keys: set[str], now: datetime) -> None:
        """Make sure the flow rows of ``keys`` exist and stay until this transaction ends.

        Jobs of a flow key are acquired through its row, and the sweep of idle keys deletes a row
        once no job has its key: a row must not go while jobs of its key are being enqueued and
        are not committed yet. Here one INSERT adds the missing rows and does that too: SQLite has
        one writer at a time, so no sweep runs before this transaction ends, and MySQL's INSERT
        IGNORE share-locks each row it finds, which a sweep's delete waits for. Keys go in order:
        concurrent enqueues of the same new keys then wait for each other instead of deadlocking.
        """
        connection.execute(self.insert_flow_rows(), self.flow_rows(keys, now))

    def insert_flow_rows(self) -> Any:
        """An INSERT of flow rows that leaves existing ones alone."""
        f = self.tables.flow
        return self.insert_ignoring(f, [f.c.flow_key])

    def insert_ignoring(self, table: sa.Table, key: list[Any]) -> Any:
        """An INSERT into ``table`` that leaves alone a row whose ``key`` (its primary key) exists."""
        return self.insert_on_conflict(table).on_conflict_do_nothing(index_elements=key)

    def insert_unless_present(self, table: sa.Table, key: list[Any]) -> Any:
        """Like :meth:`insert_ignoring`, but any other error (a value too long) is still raised."""
        return self.insert_ignoring(table, key)

    def row_pages(self, connection: sa.Connection, rows: list[dict[str, Any]], most: int = 1000) -> Iterator[list[Any]]:
        """``rows`` (with a ``payload``) in pages of at most ``most``, each one statement's worth."""
        for start in range(0, len(rows), most):
            yield rows[start : start + most]

    def insert_rows(self, connection: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> list[int]:
        """Insert ``rows`` into a table with an auto-increment ``id``; their ids in input order."""
        if not connection.dialect.insert_returning:  # MySQL: one statement per row
            return [int(connection.execute(sa.insert(table).values(row)).lastrowid) for row in rows]
        stmt = sa.insert(table).returning(table.c.id, sort_by_parameter_order=True)
        return [int(i) for i in connection.execute(stmt, rows).scalars()]

    @staticmethod
    def flow_rows(keys: Iterable[str], now: datetime) -> list[dict[str, Any]]:
        return [{"flow_key": key, "served_at": now, "next_start_at": None} for key in sorted(keys)]

    def bulk_holding_flow_key(self, connection: sa.Connection, batch: Batch) -> None:
        """At the start of a bulk's own transaction: hold its flow key, if it has one."""
        key = batch.common.get("flow_key")
        if key is not None:
            self.hold_flow_keys(connection, {key}, utcnow())

    def insert_or_existing(self, connection: sa.Connection, row: dict[str, Any]) -> int:
        """Insert ``row`` or return the id of the active message holding its (task_name, unique_key)."""
        return self.insert_keyed(connection, row)[0]

    def insert_keyed(self, connection: sa.Connection, row: dict[str, Any]) -> tuple[int, bool]:
        """Insert ``row`` and return (its id, True), or (the id of the active message holding its
        (task_name, unique_key), False) when one does."""
        m = self.message
        existing = self.holder_of_key(
            sa.select(m.c.id).where(m.c.task_name == row["task_name"], m.c.unique_key == row["unique_key"])
        )
        for _ in range(UNIQUE_RETRIES):
            new_id = self.insert_unique(connection, row)
            if new_id is not None:
                return new_id, True
            found = connection.execute(existing).scalar()
            if found is not None:
                return int(found), False
            # The holder was archived between our insert and our select: try again.
        raise JobQueueError(
            f"could not enqueue unique key {row['unique_key']!r} after {UNIQUE_RETRIES} tries: the job holding "
            "it was archived each time before it could be read"
        )

    def holder_of_key(self, select: sa.Select[Any]) -> sa.Select[Any]:
        """The read of the active message an insert found holding a unique key: it must see the
        latest committed rows, as the insert did (not an older snapshot of the caller's transaction)."""
        return select

    def insert_new(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
        """Insert keyed ``rows`` (all of one task), skipping those whose unique_key an active message
        holds; return the (id, unique_key) of the rows inserted. One round trip per page of rows."""
        m = self.message
        stmt = (
            self.insert_on_conflict(m)
            .on_conflict_do_nothing(
                index_elements=[m.c.task_name, m.c.unique_key], index_where=m.c.unique_key.isnot(None)
            )
            .returning(m.c.id, m.c.unique_key)
        )
        return [(row[0], row[1]) for row in connection.execute(stmt, rows)]

    def insert_unseen(self, connection: sa.Connection, batch: Batch) -> int:
        """Insert the rows of a keyed ``batch`` (one task, no key twice) whose unique_key no job of
        the task holds, active or archived; return how many went in. The batch's flow key is held
        if anything is to go in."""
        task = batch.common["task_name"]
        seen = self.archived_keys(connection, task, batch.unique_keys)
        # In key order, so that two runs with overlapping keys lock index entries in one order.
        fresh = sorted((key, i) for i, key in enumerate(batch.unique_keys) if key not in seen)
        if not fresh:
            return 0
        self.bulk_holding_flow_key(connection, batch)
        inserted = self.insert_new(connection, [batch.row(i) for _, i in fresh])
        return len(inserted) - self.drop_archived(
            connection, inserted, self.archived_keys(connection, task, [key for _, key in inserted])
        )

    def drop_archived(self, connection: sa.Connection, inserted: list[tuple[int, str]], archived: set[str]) -> int:
        """Delete the rows just ``inserted`` (id, key) whose key is in ``archived``; return how many.

        A job holding one of the keys may have been archived between the archive check and the
        insert, letting ours in. ``archived`` comes from a statement run after the insert (our
        engines run READ COMMITTED, so it sees that commit); our rows are still uncommitted.
        """
        drop = [row_id for row_id, key in inserted if key in archived]
        if drop:
            connection.execute(sa.delete(self.message).where(self.message.c.id.in_(drop)))
        return len(drop)

    def archived_keys(self, connection: sa.Connection, task: str, keys: Sequence[str | None]) -> set[str]:
        """Which of ``keys`` an archived job of ``task`` has."""
        a = self.tables.archive
        found: set[str] = set()
        for start in range(0, len(keys), 1000):
            stmt = sa.select(a.c.unique_key).where(
                a.c.task_name == task, a.c.unique_key.in_(keys[start : start + 1000])
            )
            found.update(connection.execute(stmt).scalars())
        return found
