"""PostgreSQL's bulk enqueue by COPY: parsed as data, several times cheaper on the server than
multi-row VALUES. Plain batches go in COPY's binary format straight into the message table; keyed
batches go through a temporary table and one INSERT ... SELECT that skips the keys already taken.
"""

from __future__ import annotations

import io
import itertools
import json
import struct
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from jobqueue.job import Batch
from jobqueue.storage.dialects.common import BATCH_COLUMNS


def _copy_text(value: Any) -> str:
    """A value in COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        return "\\\\x" + value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        value = json.dumps(value, separators=(",", ":"))
    text = str(value)
    if any(c in text for c in "\\\t\n\r"):
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def copy_batch(connection: sa.Connection, table: sa.Table, batch: Batch) -> list[int]:
    """Bulk-insert with COPY: ids reserved from the sequence first (one round trip), then the rows.

    COPY is parsed as data, not as SQL: several times cheaper on the server than multi-row VALUES.
    In its binary format the server reads each value as stored, with no text of timestamps,
    numbers or hex-encoded payloads to parse. The columns the rows share are encoded once.
    """
    ids = [
        row[0]
        for row in connection.exec_driver_sql(
            f"SELECT nextval('{table.name}_id_seq') FROM generate_series(1, {len(batch)})"
        ).all()
    ]
    encoding = _python_encoding(connection)
    shared = b"".join(
        _binary_field(table.c[column].type, batch.common.get(column), encoding) for column in BATCH_COLUMNS
    )
    # Per row: the field count, the id (8 bytes), the payload's length; then the payload, then the rest.
    head = struct.Struct(">hiqi").pack
    fields = 2 + len(BATCH_COLUMNS)
    rows = (
        head(fields, 8, job_id, len(payload)) + payload + shared
        for job_id, payload in zip(ids, batch.payloads, strict=True)
    )
    _copy(
        connection,
        f"COPY {table.name} (id, payload, {', '.join(BATCH_COLUMNS)}) FROM STDIN WITH (FORMAT binary)",
        itertools.chain((BINARY_HEADER,), rows, (BINARY_TRAILER,)),
    )
    return ids


# COPY's binary format: a signature, flags and header-extension length (both 0); a row count of -1 ends it.
BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
BINARY_TRAILER = struct.pack(">h", -1)
_POSTGRES_EPOCH = datetime(2000, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def _python_encoding(connection: sa.Connection) -> str:
    """The codec of the connection's client encoding: binary COPY takes text in it, as text COPY does."""
    from psycopg2.extensions import encodings  # type: ignore[import-untyped]

    raw: Any = connection.connection.driver_connection
    return str(encodings.get(raw.encoding, "utf-8"))


def _binary_field(column_type: Any, value: Any, encoding: str) -> bytes:
    """One value in COPY's binary format (its length, then its bytes; -1 for NULL) for a column
    of ``column_type`` (the types of the columns a bulk's rows share)."""
    if value is None:
        return _NULL
    if isinstance(column_type, sa.BigInteger):
        data = struct.pack(">q", value)
    elif isinstance(column_type, sa.Integer):
        data = struct.pack(">i", value)
    elif isinstance(column_type, sa.DateTime):
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        data = struct.pack(">q", (value - _POSTGRES_EPOCH) // _MICROSECOND)  # timestamp: µs since 2000
    elif isinstance(column_type, sa.JSON):
        data = json.dumps(value, separators=(",", ":")).encode(encoding)  # json: its text
    elif isinstance(column_type, sa.String):
        data = str(value).encode(encoding)
    else:
        raise TypeError(f"no binary COPY format for a {column_type!r} column")
    return struct.pack(">i", len(data)) + data


_NULL = struct.pack(">i", -1)


class UnseenStatements:
    """The statements of copy_unseen, built once per dialect.

    A keyed batch is copied into a temporary table (``staged``: unique_key, payload), which
    ``insert`` reads: the rows whose key no archived job of the task has, with the columns they
    all share bound once (as BATCH_COLUMNS), a key an active message holds skipped by ON
    CONFLICT; it returns (id, unique_key). Rows go in key order, so that two runs with
    overlapping keys lock index entries in one order. ``archived`` finds, afterwards, the staged
    keys the archive has by then.
    """

    def __init__(self, m: sa.Table, a: sa.Table) -> None:
        self.staged = sa.table(
            f"{m.name}_staged", sa.column("unique_key", sa.String), sa.column("payload", sa.LargeBinary)
        )
        self.create = (
            f"CREATE TEMPORARY TABLE {self.staged.name} (unique_key text NOT NULL, payload bytea NOT NULL) "
            "ON COMMIT DROP"
        )
        self.copy = f"COPY {self.staged.name} (unique_key, payload) FROM STDIN"
        shared = {column: sa.bindparam(column, type_=m.c[column].type) for column in BATCH_COLUMNS}
        # Cast: an untyped parameter in a SELECT list is text, which no JSON or integer column takes.
        values = [sa.cast(shared[column], m.c[column].type) for column in BATCH_COLUMNS]
        archived = sa.exists().where(a.c.task_name == shared["task_name"], a.c.unique_key == self.staged.c.unique_key)
        rows = sa.select(self.staged.c.payload, self.staged.c.unique_key, *values).where(~archived)
        self.insert = (
            postgresql.insert(m)
            .from_select(["payload", "unique_key", *BATCH_COLUMNS], rows.order_by(self.staged.c.unique_key))
            .on_conflict_do_nothing(
                index_elements=[m.c.task_name, m.c.unique_key], index_where=m.c.unique_key.isnot(None)
            )
            .returning(m.c.id, m.c.unique_key)
        )
        self._archived = sa.select(self.staged.c.unique_key).where(archived)

    def archived(self, connection: sa.Connection, batch: Batch) -> set[str]:
        """The staged keys an archived job of the batch's task has now."""
        return set(connection.execute(self._archived, {"task_name": batch.common["task_name"]}).scalars())


def copy_unseen(connection: sa.Connection, statements: UnseenStatements, batch: Batch) -> list[tuple[int, str]]:
    """Insert the rows of a keyed ``batch`` (no key twice) whose key no job of the task holds,
    active or archived, and return the (id, unique_key) of those inserted: COPY into a temporary
    table, then one INSERT ... SELECT that checks the archive and skips active keys.

    The temporary table goes at COMMIT, so a pooler in transaction mode is no trouble, and this
    runs once per transaction.
    """
    connection.exec_driver_sql(statements.create)
    lines = (
        f"{_copy_text(key)}\t\\\\x{payload.hex()}\n"
        for key, payload in zip(batch.unique_keys, batch.payloads, strict=True)
    )
    _copy(connection, statements.copy, lines)
    shared = {column: batch.common.get(column) for column in BATCH_COLUMNS}
    return [(row[0], row[1]) for row in connection.execute(statements.insert, shared)]


def _copy(connection: sa.Connection, statement: str, lines: Iterator[Any]) -> None:
    """Run ``COPY ... FROM STDIN`` on the connection's driver, fed ``lines`` as they are made."""
    stream = _CopyStream(lines)
    raw = connection.connection.driver_connection
    cursor = raw.cursor()  # type: ignore[union-attr]
    try:
        cursor.copy_expert(statement, stream, size=COPY_CHUNK)
    except Exception as exc:
        if stream.error is not None:  # psycopg2 reports a failed read() as a cancelled COPY: say what failed
            raise stream.error from None
        dbapi = connection.dialect.loaded_dbapi
        if isinstance(exc, dbapi.Error):  # as SQLAlchemy reports every other statement's errors
            invalidated = connection.dialect.is_disconnect(exc, raw, cursor)
            raise sa.exc.DBAPIError.instance(
                statement, None, exc, dbapi.Error, connection_invalidated=invalidated
            ) from exc
        raise
    finally:
        cursor.close()


COPY_CHUNK = 1 << 16


class _CopyStream(io.TextIOBase):
    """COPY's data (text, or bytes for the binary format), made as psycopg2 reads it: the server
    parses one chunk while the next is built (and, for a streamed bulk(), while its payloads are
    serialized)."""

    def __init__(self, lines: Iterator[Any]) -> None:
        self.lines = lines
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> Any:
        parts: list[Any] = []
        length = 0
        try:
            for line in self.lines:
                parts.append(line)
                length += len(line)
                if size is not None and 0 <= size <= length:
                    break
        except BaseException as exc:  # a payload that cannot be serialized: the COPY is abandoned
            self.error = exc
            raise
        if parts and isinstance(parts[0], bytes):
            return b"".join(parts)
        return "".join(parts)
