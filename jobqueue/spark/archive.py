"""``read_archive``: the archive table as a DataFrame, read in parallel by ranges of ids."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

from jobqueue.clock import to_naive_utc, utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.spark.enqueue import executor_url
from jobqueue.storage.engine import create_engine
from jobqueue.storage.readable import stored_time
from jobqueue.storage.store import schema_errors
from jobqueue.storage.tables import build_tables

ROWS_PER_RANGE = 50_000  # at most this many ids per read task, so that big archives spread out

_TYPES = {
    "id": LongType(),
    "priority": IntegerType(),
    "concurrency_limit": IntegerType(),
    "rate_interval_us": LongType(),
    "attempts_count": IntegerType(),
    "deliveries_count": IntegerType(),
    "payload": BinaryType(),
    "checkpoint": BinaryType(),
    "result": BinaryType(),
}
_JSON = ("headers", "options", "history")
_TIMES = ("created_at", "first_attempt_at", "last_attempt_at", "finished_at", "archived_at")
# Columns that ARCHIVE_SCHEMA typed as strings before: an export appending to files written then
# keeps their type (see export_archive).
WERE_TEXT = ("concurrency_limit", "rate_interval_us")

# Every archive column: JSON columns as their JSON text, blobs as binary, numbers as numbers, times
# as TIMESTAMP (UTC). Every column may be null: SQLite holds any value in any column, and a cell
# edited by hand into something that is not of its column's type reads as null (times: as text
# that is no time), instead of stopping the read.
ARCHIVE_SCHEMA = StructType(
    [
        StructField(
            column.name, _TYPES.get(column.name, TimestampType() if column.name in _TIMES else StringType()), True
        )
        for column in build_tables().archive.columns
    ]
)


def read_archive(
    spark: SparkSession,
    database_url: str,
    since: datetime | timedelta | None = None,
    until: datetime | timedelta | None = None,
    *,
    table_prefix: str = "jobqueue_",
    partitions: int | None = None,
) -> DataFrame:
    """The archive (completed, failed and cancelled jobs) as a DataFrame with :data:`ARCHIVE_SCHEMA`.

    ``since``/``until`` bound ``archived_at`` (a datetime, naive meaning UTC, or a timedelta meaning
    that long ago): ``since <= archived_at < until``. The id span is cut into ``partitions`` ranges
    (default: one per core, more for big archives, about 50,000 rows each on average), each read
    by one task over its own connection.
    """
    now = utcnow()
    window = _Window(instant(since, now), instant(until, now))
    spec = _ReadSpec(executor_url(database_url), table_prefix, window)
    low, high, rows = spec.id_span()
    if low is None or high is None:
        return spark.createDataFrame([], ARCHIVE_SCHEMA)
    span = high - low + 1
    if partitions is None:  # by rows, not ids: a window's ids can be far apart (retried jobs keep theirs)
        partitions = max(spark.sparkContext.defaultParallelism, -(-rows // ROWS_PER_RANGE))
    if partitions < 1:
        raise ConfigurationError(f"partitions must be at least 1, got {partitions}")
    partitions = min(partitions, span)
    step = -(-span // partitions)
    # Bounds included: the largest id a column holds (2**63 - 1) has no id past it to bound by.
    ranges = [(start, min(start + step - 1, high)) for start in range(low, high + 1, step)]
    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(spec.read_range)
    return spark.createDataFrame(rdd, ARCHIVE_SCHEMA)


def instant(value: datetime | timedelta | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return now - value
    if isinstance(value, datetime):
        return to_naive_utc(value)
    raise ConfigurationError(f"since and until take a datetime or a timedelta, got {type(value).__name__}")


@dataclass(frozen=True)
class _Window:
    since: datetime | None
    until: datetime | None

    def where(self, archived_at: Any) -> list[Any]:
        clauses = []
        if self.since is not None:
            clauses.append(archived_at >= self.since)
        if self.until is not None:
            clauses.append(archived_at < self.until)
        return clauses


@dataclass(frozen=True)
class _ReadSpec:
    url: str = field(repr=False)  # holds the password
    prefix: str
    window: _Window

    def id_span(self) -> tuple[int | None, int | None, int]:
        """The lowest and highest id in the window, and how many rows it holds."""
        archive = build_tables(self.prefix).archive
        engine = create_engine(self.url)
        try:
            with schema_errors(engine, build_tables(self.prefix)), engine.connect() as conn:
                low, high, rows = conn.execute(
                    sa.select(sa.func.min(archive.c.id), sa.func.max(archive.c.id), sa.func.count()).where(
                        *self.window.where(archive.c.archived_at)
                    )
                ).one()
        finally:
            engine.dispose()
        return low, high, int(rows)

    def read_range(self, bounds: tuple[int, int]) -> Iterator[tuple[Any, ...]]:
        archive = build_tables(self.prefix).archive
        engine = create_engine(self.url)
        # JSON columns as the database's text, not parsed: Spark gets text anyway, and a row edited
        # by hand into text that does not parse (SQLite takes any) must not stop the whole read.
        # SQLite holds times as text too, parsed here: a time that does not parse is read as null.
        columns = [_read_as(c, engine.dialect.name) for c in archive.columns]
        readers = [_cell_reader(field, engine.dialect.name) for field in ARCHIVE_SCHEMA.fields]
        stmt = (
            sa.select(*columns)
            .where(archive.c.id >= bounds[0], archive.c.id <= bounds[1], *self.window.where(archive.c.archived_at))
            .order_by(archive.c.id)
        )
        try:
            with engine.connect() as conn:
                if engine.dialect.name == "sqlite":  # text that is not UTF-8 (edited by hand) reads, mended
                    conn.connection.dbapi_connection.text_factory = _text_of  # type: ignore[union-attr]
                result = conn.execution_options(stream_results=True, yield_per=2000).execute(stmt)
                for row in result:
                    yield tuple(
                        value if read is None else read(value) for value, read in zip(row, readers, strict=True)
                    )
        finally:
            engine.dispose()


def _read_as(column: sa.Column[Any], dialect: str) -> Any:
    """What a read selects of ``column``: the JSON columns cast to text by the database, SQLite's
    times as the text it holds (parsed by :func:`_spark_time`), the rest as they are."""
    if column.name in _JSON:
        return sa.cast(column, sa.Text).label(column.name)
    if column.name in _TIMES and dialect == "sqlite":
        return sa.type_coerce(column, sa.Text).label(column.name)
    return column


def _cell_reader(field: StructField, dialect: str) -> Callable[[Any], Any] | None:
    """What turns a cell of ``field``'s column into a value Spark takes, None where the cell is
    taken as it is: times always (see :func:`_spark_time`); on SQLite, which keeps any value in any
    column, every cell, read as null where it is not of its column's type."""
    if isinstance(field.dataType, TimestampType):
        return _spark_time
    if dialect != "sqlite":  # the other databases hold only values of the column's type
        return None
    if isinstance(field.dataType, IntegerType):
        return _int32
    if isinstance(field.dataType, LongType):
        return _int64
    if isinstance(field.dataType, BinaryType):
        return _bytes
    return _text


def _int32(value: Any) -> int | None:
    return value if type(value) is int and -(2**31) <= value < 2**31 else None


def _int64(value: Any) -> int | None:
    return value if type(value) is int else None  # SQLite's integers are 64-bit


def _bytes(value: Any) -> bytes | None:
    if type(value) is bytes or value is None:
        return value
    return value.encode() if type(value) is str else None


def _text(value: Any) -> str | None:
    if type(value) is str or value is None:
        return value
    return _text_of(value) if type(value) is bytes else str(value)


def _text_of(data: bytes) -> str:
    """SQLite text as a string, bytes that are not UTF-8 replaced rather than stopping the read."""
    return data.decode("utf-8", "replace")


def _spark_time(value: Any) -> datetime | None:
    """A time of the archive, stored as naive UTC (a datetime, or SQLite's text of one), as an aware
    UTC datetime: Spark keeps the instant whatever its session's time zone. None where it is null,
    its text is no time, or it falls in the year 1 or 9999 (a row edited by hand, PostgreSQL's
    -infinity and infinity): Python cannot turn such a time into local time, which PySpark does
    to every time it hands over, and a report's statistics then failed with "year 0 is out of
    range"."""
    at = stored_time(value)
    if at is None or not EARLIEST_YEAR <= at.year <= LATEST_YEAR:
        return None
    return at.replace(tzinfo=timezone.utc)


EARLIEST_YEAR, LATEST_YEAR = 2, 9998  # the times a read hands to Spark (see _spark_time)
