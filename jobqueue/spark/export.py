"""``export_archive``: the archive to Parquet, partitioned by date and queue; then, if asked, purge
exactly the rows whose export was read back and checked."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

import sqlalchemy as sa
from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError, ExportError
from jobqueue.spark.archive import read_archive
from jobqueue.spark.enqueue import executor_url
from jobqueue.storage.engine import create_engine
from jobqueue.storage.tables import build_tables


@dataclass(frozen=True)
class ExportResult:
    path: str
    batch: str        # the export_batch column of the rows this export wrote
    cutoff: datetime  # rows archived before this (naive UTC) were exported
    exported: int
    purged: int


def export_archive(spark: SparkSession, database_url: str, path: str, *, older_than: timedelta | None = None,
                   purge: bool = False, table_prefix: str = "jobqueue_", batch_size: int = 1000,
                   progress: Callable[[int], None] | None = None,
                   on_verified: Callable[[int], None] | None = None) -> ExportResult:
    """Append the archive's rows (those archived more than ``older_than`` ago; all without it) to
    Parquet files under ``path``, partitioned by ``date`` (of ``archived_at``, UTC) and ``queue``.

    Every row gets an ``export_batch`` column naming this export. The files are read back and the
    batch's ids compared with the ids read from the database; only then, with ``purge=True``, are
    those rows deleted from the archive, ``batch_size`` ids per transaction (``progress`` is called
    with each batch's count). A mismatch raises :class:`ExportError` and deletes nothing.
    """
    if batch_size < 1:
        raise ConfigurationError("batch_size must be at least 1")
    cutoff = utcnow() - (older_than or timedelta(0))
    batch = f"{cutoff:%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"
    archive = read_archive(spark, database_url, until=cutoff, table_prefix=table_prefix)
    archive = archive.persist(StorageLevel.MEMORY_AND_DISK)  # written and counted from one read
    try:
        expected = sorted(row.id for row in archive.select("id").collect())
        if not expected:
            return ExportResult(path, batch, cutoff, 0, 0)
        zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
        rows = (archive.withColumn("date", F.date_format(F.to_utc_timestamp("archived_at", zone), "yyyy-MM-dd"))
                .withColumn("export_batch", F.lit(batch)))
        previous = spark.conf.get("spark.sql.parquet.outputTimestampType")
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        try:
            rows.write.mode("append").partitionBy("date", "queue").parquet(path)
        finally:
            spark.conf.set("spark.sql.parquet.outputTimestampType", previous or "INT96")
    finally:
        archive.unpersist()
    written = sorted(row.id for row in spark.read.parquet(path).where(F.col("export_batch") == batch)
                     .select("id").collect())
    if written != expected:
        missing, extra = len(set(expected) - set(written)), len(written) - len(set(written))
        raise ExportError(f"export {batch} to {path} does not match the archive: {len(written)} rows read back "
                          f"for {len(expected)} exported ({missing} missing, {extra} duplicated); nothing purged")
    if on_verified is not None:
        on_verified(len(expected))
    purged = _purge(database_url, table_prefix, expected, cutoff, batch_size, progress) if purge else 0
    return ExportResult(path, batch, cutoff, len(expected), purged)


def _purge(database_url: str, prefix: str, ids: list[int], cutoff: datetime, batch_size: int,
           progress: Callable[[int], None] | None) -> int:
    """Delete exported rows, one short transaction per batch. ``archived_at < cutoff`` keeps a job
    that was retried and archived again since its export."""
    archive = build_tables(prefix).archive
    engine = create_engine(executor_url(database_url))
    deleted = 0
    try:
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size]
            with engine.begin() as conn:
                deleted += conn.execute(sa.delete(archive).where(archive.c.id.in_(chunk),
                                                                 archive.c.archived_at < cutoff)).rowcount
            if progress is not None:
                progress(len(chunk))
    finally:
        engine.dispose()
    return deleted
