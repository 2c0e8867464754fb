"""The data pipeline on Spark: bulk enqueue from DataFrames, the archive as a DataFrame, reports
and Parquet exports (``pip install "jobqueue[spark]"``).

The same code runs on ``local[*]`` and on a cluster: executors connect to the database with the
URL and write or read their own partition, so on a cluster that URL must reach the database from
every executor, and jobqueue must be installed there too.
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('jobqueue.spark needs PySpark: pip install "jobqueue[spark]" (and Java 17 or later)') from exc

from jobqueue.spark.archive import ARCHIVE_SCHEMA, read_archive
from jobqueue.spark.enqueue import enqueue_dataframe
from jobqueue.spark.export import ExportResult, export_archive
from jobqueue.spark.session import get_session
from jobqueue.spark.stats import archive_stats, throughput


def __getattr__(name: str) -> object:
    # The report needs matplotlib, which executors (they import this package) need not have.
    if name in ("render_report", "write_report"):
        from jobqueue.spark import report

        return getattr(report, name)
    raise AttributeError(f"module 'jobqueue.spark' has no attribute {name!r}")


__all__ = [
    "ARCHIVE_SCHEMA",
    "ExportResult",
    "archive_stats",
    "enqueue_dataframe",
    "export_archive",
    "get_session",
    "read_archive",
    "render_report",
    "throughput",
    "write_report",
]
