"""Enqueueing: message rows inserted one by one, as a batch or as a whole bulk, keyed rows finding
the active job that holds their key, and flow keys held while their jobs go in."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.job import Batch
from jobqueue.storage.store_base import StoreBase


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
            return self._enqueue(rows, connection, found)

    def _enqueue(self, rows: list[dict[str, Any]], connection: Any, found: list[int] | None) -> list[int]:
        flow_keys = {row["flow_key"] for row in rows if row.get("flow_key") is not None}
        ids: list[int] = [0] * len(rows)
        with self.writing(connection) as conn:
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

    def enqueue_batch(self, batch: Batch, connection: Any = None) -> list[int]:
        """Insert a batch (one round trip for its unkeyed rows) and return the ids in order."""
        with self.enqueue_errors(), self.writing(connection) as conn:
            return self._insert_batch(conn, batch)

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
        ids: list[int] = []
        with self.enqueue_errors(), self.writing(connection) as conn:
            for start in range(0, len(payloads), batch_size):
                end = start + batch_size
                part = Batch(batch.common, payloads[start:end], batch.unique_keys[start:end])
                ids.extend(self._insert_batch(conn, part, found, start))
        return ids

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
        with self.enqueue_errors(), self.writing() as conn:
            return self.dialect.insert_unseen(conn, batch.take(list(first.values())))
