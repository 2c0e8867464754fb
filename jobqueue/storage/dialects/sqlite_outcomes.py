"""SQLite: a flush's outcomes written inside the write lock, fenced by their lease tokens.

Archive rows are copied from the message rows by the database (payloads never travel back); the
values each copy adds are built before the write lock is taken, since the other processes wait for
it while it is held.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.job import MessageState, Outcome, OutcomeKind
from jobqueue.storage.dialects.sqlite_driver import COPY_ROWS_MOST, execute_on_driver, id_lists
from jobqueue.storage.dialects.sqlite_rows import stamp
from jobqueue.storage.outcomes import ARCHIVED_COLUMNS, COPIED, archive_row, archived_values, requeue_binds

Delivery = tuple[int, int]  # a message id and the lease token of one delivery of it


def archive_copies(outcomes: list[Outcome], now: datetime) -> dict[tuple[int, int], tuple[Any, ...]]:
    """The bind values of each archive copy (the message id and its lease token, then ARCHIVED
    values), by delivery."""
    archived_at = stamp(now)
    return {
        (o.message.id, o.message.lease_token): (
            o.message.id,
            o.message.lease_token,
            *archived_values(o, archived_at, stamp),
        )
        for o in outcomes
        if o.kind is OutcomeKind.ARCHIVE and o.retain and o.message.corrupt is None
    }


class OutcomeWriter:
    """Applies outcomes to the message and archive tables of one database."""

    def __init__(self, tables: Any, requeue: Any) -> None:
        self.tables = tables
        self.message = tables.message
        self.requeue = requeue  # the dialect's UPDATE that puts a message back in the queue
        self._archive_copies: dict[int, str] = {}

    def apply(
        self,
        connection: sa.Connection,
        outcomes: list[Outcome],
        now: datetime,
        copies: dict[tuple[int, int], tuple[Any, ...]],
    ) -> set[tuple[int, int]]:
        # Inside BEGIN IMMEDIATE: the write lock is ours, so nothing can change the rows meanwhile.
        # Archive rows are copied from the message rows by the database (payloads never travel
        # back), one INSERT ... SELECT for up to COPY_ROWS_MOST of them (a third cheaper than one
        # execution per row), then one DELETE. The copy checks its leases itself: it copies a
        # message only while it is PROCESSING under the outcome's token, and says which it copied;
        # the other outcomes (requeues, and jobs archived without a copy) are checked by lock_held.
        pairs = [(o.message.id, o.message.lease_token) for o in outcomes]
        if len({key[0] for key in copies}) == len(copies):
            held = self._copy(connection, list(copies.items()))
            held |= self.lock_held(connection, [pair for pair in pairs if pair not in copies])
        else:  # two deliveries of one message: a copied id would not say which of them holds it
            held = self.lock_held(connection, pairs)
            self._copy(connection, [(key, copy) for key, copy in copies.items() if key in held])
        applied = [o for o in outcomes if (o.message.id, o.message.lease_token) in held]
        finals = [o for o in applied if o.kind is OutcomeKind.ARCHIVE]
        if finals:
            # A corrupt row is archived from the values that could be read (its error message holds
            # the unreadable text), so that the archive never holds text it cannot read back.
            repaired = [archive_row(o, now) for o in finals if o.retain and o.message.corrupt is not None]
            if repaired:
                connection.execute(sa.insert(self.tables.archive), repaired)
            self.delete_messages(connection, [o.message.id for o in finals])
        updates = [requeue_binds(o, now) for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        if updates:
            connection.execute(self.requeue, updates)
        return held

    def _copy(
        self, connection: sa.Connection, copies: list[tuple[tuple[int, int], tuple[Any, ...]]]
    ) -> set[tuple[int, int]]:
        """Copy into the archive the messages of ``copies`` whose lease is still held; return
        those deliveries. When a statement copies fewer rows than it was given (a lease was lost),
        lock_held says which: the rows it copied are still PROCESSING under their tokens."""
        held: set[Delivery] = set()
        width = len(ARCHIVED_COLUMNS) + 2
        for start in range(0, len(copies), COPY_ROWS_MOST):
            chunk = copies[start : start + COPY_ROWS_MOST]
            size = 1 << (len(chunk) - 1).bit_length()
            values = [value for _key, copy in chunk for value in copy]
            values += [None] * ((size - len(chunk)) * width)
            keys = [key for key, _copy in chunk]
            if execute_on_driver(connection, self._archive_copy_sql(size), tuple(values)).rowcount == len(chunk):
                held.update(keys)
            else:
                held |= self.lock_held(connection, keys)
        return held

    def lock_held(self, connection: sa.Connection, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
        # The write lock is ours already; by id alone, the token compared here. Plain SQL: the
        # expanding IN list of the shared statement is compiled anew for every flush.
        if not pairs:
            return set()
        held: set[tuple[int, int]] = set()
        processing = MessageState.PROCESSING.value
        sql = f"SELECT id, lease_token FROM {self.message.name} WHERE state = '{processing}' AND id IN "
        for marks, ids in id_lists(sorted({pair[0] for pair in pairs})):
            held.update((row[0], row[1]) for row in execute_on_driver(connection, sql + marks, ids))
        return held & set(pairs)

    def delete_messages(self, connection: sa.Connection, ids: list[int]) -> None:
        sql = f"DELETE FROM {self.message.name} WHERE id IN "
        for marks, chunk in id_lists(ids):
            execute_on_driver(connection, sql + marks, chunk)

    def _archive_copy_sql(self, rows: int) -> str:
        """Copy ``rows`` messages into the archive, each joined to the values its outcome supplies
        (its id and lease token, then ARCHIVED_COLUMNS) while it is PROCESSING under that token; a
        row of NULLs joins no message and adds nothing. (No RETURNING: it made the copy a quarter
        slower, where the count of rows copied says whether all were.)"""
        sql = self._archive_copies.get(rows)
        if sql is None:
            message, archive = self.message.name, self.tables.archive.name
            columns = ", ".join(COPIED + ARCHIVED_COLUMNS)
            copied = ", ".join(f"m.{column}" for column in COPIED)
            # SQLite names the columns of a VALUES list column1, column2...
            supplied = ", ".join(f"v.column{number + 3}" for number in range(len(ARCHIVED_COLUMNS)))
            row = "(" + ", ".join("?" * (len(ARCHIVED_COLUMNS) + 2)) + ")"
            processing = MessageState.PROCESSING.value
            sql = self._archive_copies[rows] = (
                f"INSERT INTO {archive} ({columns}) SELECT {copied}, {supplied} "
                f"FROM (VALUES {', '.join([row] * rows)}) AS v JOIN {message} AS m "
                f"ON m.id = v.column1 AND m.lease_token = v.column2 AND m.state = '{processing}'"
            )
        return sql
