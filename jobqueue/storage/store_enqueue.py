"""Enqueueing: message rows inserted one by one, as a batch or as a whole bulk, keyed rows finding
the active job that holds their key, and flow keys held while their jobs go in."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.job import Batch
from jobqueue.storage.store_base import StoreBase

T = TypeVar("T")

# An enqueue in a transaction of ours that the database ends as a deadlock's victim runs again
# this many times in all, after a pause of up to this long times the tries so far.
DEADLOCK_TRIES = 5
DEADLOCK_PAUSE_SECONDS = 0.01


class EnqueueOperations(StoreBase):
    """The store's inserts of new messages."""

    def enqueue(self, rows: list[dict[str, Any]], connection: Any = None, found: list[int] | None = None) -> list[int]:
        """Insert message rows and return their ids in input order.

        Rows with a ``unique_key`` return the id of the active message holding that key, if any;
        the indexes of those rows (nothing inserted for them) are appended to ``found``.
        """
        if connection is None and len(rows) == 1:
            row = rows[0]
            if row.get("unique_key") is None and row.get("flow_key") is None:
                # Every delay() outside a transaction: no context manager on the way (schema_errors'
                # and enqueue_errors' work, inlined), this path being a few microseconds of Python in all.
                try:
                    return [self.dialect.enqueue_one(row)]
                except sa.exc.DBAPIError as exc:
                    self._raise_if_missing_tables(exc)
                    refused = self.enqueue_refused(exc)
                    if refused is not None:
                        raise refused from exc
                    raise
        with self.enqueue_errors():
            return self._writing_again_after_deadlock(connection, found, lambda conn: self._enqueue(conn, rows, found))

    def _enqueue(self, conn: sa.Connection, rows: list[dict[str, Any]], found: list[int] | None) -> list[int]:
        flow_keys = {row["flow_key"] for row in rows if row.get("flow_key") is not None}
        ids: list[int] = [0] * len(rows)
        if flow_keys:
            self.dialect.hold_flow_keys(conn, flow_keys, utcnow())
        plain = [i for i, row in enumerate(rows) if row.get("unique_key") is None]
        if plain:
            for i, new_id in zip(plain, self.dialect.insert_messages(conn, [rows[i] for i in plain]), strict=True):
                ids[i] = new_id
        for i, row in enumerate(rows):
            if row.get("unique_key") is not None:
                ids[i], inserted = self.dialect.insert_keyed(conn, row)
                if not inserted and found is not None:
                    found.append(i)
        return ids

    def _writing_again_after_deadlock(
        self, connection: Any, found: list[int] | None, work: Callable[[sa.Connection], T]
    ) -> T:
        """``work`` in the caller's transaction, or in one of ours, run again when the database
        ends ours as a deadlock's victim: keyed inserts racing for one key deadlock on MariaDB and
        MySQL under load, and the victim's whole transaction is rolled back, so running it again
        writes each row once. In the caller's transaction the deadlock is the caller's to retry."""
        if connection is not None:
            with self.writing(connection) as conn:
                return work(conn)
        mark = len(found) if found is not None else 0
        for attempt in range(1, DEADLOCK_TRIES + 1):
            try:
                with self.writing() as conn:
                    return work(conn)
            except sa.exc.DBAPIError as exc:
                if attempt == DEADLOCK_TRIES or not self.dialect.deadlocked(exc):
                    raise
                if found is not None:
                    del found[mark:]  # what the rolled-back try found
                time.sleep(random.uniform(0, DEADLOCK_PAUSE_SECONDS * attempt))
        raise AssertionError("unreachable")

    def enqueue_batch(self, batch: Batch, connection: Any = None) -> list[int]:
        """Insert a batch (one round trip for its unkeyed rows) and return the ids in order."""
        with self.enqueue_errors():
            return self._writing_again_after_deadlock(connection, None, lambda conn: self._insert_batch(conn, batch))

    def _insert_batch(
        self, conn: sa.Connection, batch: Batch, found: list[int] | None = None, start: int = 0
    ) -> list[int]:
        ids: list[int] = [0] * len(batch)
        self.dialect.bulk_holding_flow_key(conn, batch)
        plain = [i for i, key in enumerate(batch.unique_keys) if key is None]
        if plain:
            for i, new_id in zip(plain, self.dialect.insert_batch(conn, batch.take(plain)), strict=True):
                ids[i] = new_id
        for i, key in enumerate(batch.unique_keys):
            if key is not None:
                ids[i], inserted = self.dialect.insert_keyed(conn, batch.row(i))
                if not inserted and found is not None:
                    found.append(start + i)
        return ids

    def enqueue_bulk(
        self, batch: Batch, batch_size: int, connection: Any = None, found: list[int] | None = None
    ) -> list[int]:
        """Insert a whole bulk() all or nothing, ``batch_size`` rows a round trip; ids in order.

        Outside the caller's transaction the dialect runs it in one of its own (PostgreSQL streams
        one COPY, serializing each payload as it is read); otherwise every payload is serialized
        first, so that a bad item writes nothing. The indexes of keyed rows that found an active
        job holding their key (and inserted nothing) are appended to ``found``.
        """
        if connection is None and not any(key is not None for key in batch.unique_keys):
            with self.enqueue_errors(), self.schema_errors():
                return self.dialect.bulk(batch, batch_size)
        payloads = list(batch.payloads)

        def insert(conn: sa.Connection) -> list[int]:
            ids: list[int] = []
            for start in range(0, len(payloads), batch_size):
                end = start + batch_size
                part = Batch(batch.common, payloads[start:end], batch.unique_keys[start:end])
                ids.extend(self._insert_batch(conn, part, found, start))
            return ids

        with self.enqueue_errors():
            return self._writing_again_after_deadlock(connection, found, insert)

    def enqueue_new(self, batch: Batch) -> int:
        """Insert the rows of a keyed batch (one task) whose key no job holds, active or archived.

        For pipelines that run again: a key seen before, even that of a job long finished, adds
        nothing. Returns how many rows were inserted; a key repeated within the batch counts once
        (its first row goes in).
        """
        first: dict[str, int] = {}
        for index, key in enumerate(batch.unique_keys):
            if key is None:
                raise ConfigurationError(f"row {index} of a keyed batch has no unique_key")
            first.setdefault(key, index)
        unseen = batch.take(list(first.values()))
        with self.enqueue_errors():
            return self._writing_again_after_deadlock(None, None, lambda conn: self.dialect.insert_unseen(conn, unseen))
