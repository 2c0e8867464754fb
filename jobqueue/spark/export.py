"""``export_archive``: the archive to Parquet, partitioned by date and queue; then, if asked, purge
exactly the rows whose export was read back and checked."""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError, ExportError
from jobqueue.spark.archive import WERE_TEXT, read_archive
from jobqueue.spark.enqueue import executor_url
from jobqueue.storage.engine import create_engine
from jobqueue.storage.store import schema_errors
from jobqueue.storage.tables import build_tables


@dataclass(frozen=True)
class ExportResult:
    path: str
    batch: str  # the export_batch column of the rows this export wrote
    cutoff: datetime  # rows archived before this (naive UTC) were exported
    exported: int
    purged: int


def export_archive(
    spark: SparkSession,
    database_url: str,
    path: str,
    *,
    older_than: timedelta | None = None,
    purge: bool = False,
    table_prefix: str = "jobqueue_",
    batch_size: int = 1000,
    progress: Callable[[int], None] | None = None,
    on_verified: Callable[[int], None] | None = None,
) -> ExportResult:
    """Append the archive's rows (those archived more than ``older_than`` ago; all without it) to
    Parquet files under ``path``, partitioned by ``date`` (of ``archived_at``, UTC) and ``queue``.

    Every row gets an ``export_batch`` column naming this export. The files are read back and the
    batch's ids compared with the ids read from the database (``on_verified`` is called with the
    count); only then, with ``purge=True``, are those rows deleted from the archive, ``batch_size``
    per transaction (``progress`` is called with each batch's count). A mismatch raises
    :class:`ExportError` and deletes nothing.
    """
    if batch_size < 1:
        raise ConfigurationError("batch_size must be at least 1")
    cutoff = utcnow() - (older_than or timedelta(0))
    batch = f"{cutoff:%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"
    archive = read_archive(spark, database_url, until=cutoff, table_prefix=table_prefix)
    archive = archive.persist(StorageLevel.MEMORY_AND_DISK)  # written and checked from one read
    try:
        exported = archive.count()
        if not exported:
            return ExportResult(path, batch, cutoff, 0, 0)
        zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
        rows = archive.withColumn(
            "date", F.date_format(F.to_utc_timestamp("archived_at", zone), "yyyy-MM-dd")
        ).withColumn("export_batch", F.lit(batch))
        rows = _in_types_of_files_there(spark, path, rows)
        previous = spark.conf.get("spark.sql.parquet.outputTimestampType")
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        try:
            rows.write.mode("append").partitionBy("date", "queue").parquet(path)
        except (Py4JJavaError, PySparkException) as exc:  # a path that cannot be written: say why, in a line
            raise ExportError(f"cannot write the export to {path}: {_reason(exc)}; nothing was purged") from exc
        finally:
            spark.conf.set("spark.sql.parquet.outputTimestampType", previous or "INT96")
        try:
            written = spark.read.parquet(path).where(F.col("export_batch") == batch).select("id", "archived_at")
            # Compared inside Spark, so that no list of ids has to fit on the driver.
            missing = archive.select("id").exceptAll(written.select("id")).count()
            unexpected = written.select("id").exceptAll(archive.select("id")).count()
        except (Py4JJavaError, PySparkException) as exc:  # other files there, that are not Parquet
            raise ExportError(
                f"cannot read the export back from {path} to check it: {_reason(exc)}; nothing was purged; "
                f"remove the rows with export_batch = '{batch}' (and any file there that is not this "
                "export's) before exporting again"
            ) from exc
    finally:
        archive.unpersist()
    if missing or unexpected:
        raise ExportError(
            f"export {batch} to {path} does not match the archive: of {exported} rows read, "
            f"{missing} are missing from the files and {unexpected} ids there are extra or "
            f"repeated; nothing was purged. Remove that batch's rows (export_batch = '{batch}') "
            "from the files before exporting again"
        )
    if on_verified is not None:
        on_verified(exported)
    purged = _purge(written, database_url, table_prefix, batch_size, progress) if purge else 0
    return ExportResult(path, batch, cutoff, exported, purged)


def _in_types_of_files_there(spark: SparkSession, path: str, rows: DataFrame) -> DataFrame:
    """``rows`` with the columns that exports before this release wrote as strings (the flow
    control's limit and rate) cast to strings again where ``path`` holds such files already: files
    of one column in two types cannot be read together."""
    if not _exists(spark, path):  # a first export: reading would log Spark's stack trace for nothing
        return rows
    try:
        there = {field.name: field.dataType for field in spark.read.parquet(path).schema.fields}
    except (Py4JJavaError, PySparkException):  # nothing there yet (or no Parquet: the checks say so)
        return rows
    for name in WERE_TEXT:
        if isinstance(there.get(name), StringType):
            rows = rows.withColumn(name, F.col(name).cast("string"))
    return rows


def _purge(
    written: DataFrame, database_url: str, prefix: str, batch_size: int, progress: Callable[[int], None] | None
) -> int:
    """Delete the exported rows, one short transaction per batch, streamed from the files in id
    order. Each row goes only if its ``archived_at`` is still the exported one: a job retried and
    archived again since keeps its new row."""
    archive = build_tables(prefix).archive
    key = sa.tuple_(archive.c.id, archive.c.archived_at)
    engine = create_engine(executor_url(database_url))
    deleted = 0
    try:
        # A time that reads as none, or as the year 1 (a row edited by hand, on SQLite), cannot be
        # matched, nor turned back into Python: such a row is exported, and left in the archive.
        readable = F.col("archived_at").isNotNull() & (F.year("archived_at") > 1)
        rows = written.where(readable).orderBy("id").toLocalIterator()
        while chunk := [(row.id, _naive_utc(row.archived_at)) for row in itertools.islice(rows, batch_size)]:
            with schema_errors(engine, build_tables(prefix)), engine.begin() as conn:
                deleted += conn.execute(sa.delete(archive).where(key.in_(chunk))).rowcount
            if progress is not None:
                progress(len(chunk))
    finally:
        engine.dispose()
    return deleted


def _reason(exc: Py4JJavaError | PySparkException) -> str:
    """The first line of what Spark says went wrong, without the JVM's stack trace."""
    reason = exc.java_exception.toString() if isinstance(exc, Py4JJavaError) else str(exc)
    return (reason.strip().splitlines() or ["?"])[0]


def _naive_utc(value: datetime) -> datetime:
    """A TIMESTAMP as PySpark returns it (naive local time) as the database stores it (naive UTC)."""
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def _exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, on whatever file system Spark writes it to (True if that cannot be
    told: the read that follows then finds out)."""
    try:
        jvm: Any = spark.sparkContext._jvm
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        return bool(hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(hadoop_path))
    except Exception:
        return True
