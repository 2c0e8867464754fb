"""Statistics of archived jobs, computed by Spark: per task and queue, and per minute.

Definitions (the report and docs/spark.md use the same):
- failure rate: failed / (completed + failed); cancelled jobs neither failed nor succeeded.
- queue wait: ``first_attempt_at - created_at``, how long a job waited before its first run.
- run time: ``finished_at - last_attempt_at``, how long its last attempt took.
Percentiles are exact, interpolated linearly between the two nearest values (SQL's percentile_cont).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

PERCENTILES = (0.5, 0.95, 0.99)
STATES = ("COMPLETED", "FAILED", "CANCELLED")


def seconds_between(start: str, end: str) -> Column:
    """``end - start`` in seconds (a double, microsecond precision; null if either is null)."""
    return (F.unix_micros(F.col(end)) - F.unix_micros(F.col(start))) / 1e6


def archive_stats(archive: DataFrame, by: Sequence[str] = ("task_name", "queue")) -> DataFrame:
    """One row per group of ``by`` (``by=()``: one row for everything), sorted by the group.

    Columns: the group's, ``total``, ``completed``, ``failed``, ``cancelled``, ``failure_rate``
    (null without completed or failed jobs), ``attempts_avg``, ``attempts_max``,
    ``wait_p50/p95/p99`` and ``run_p50/p95/p99`` in seconds, ``first_finished``, ``last_finished``.
    """

    def count_state(state: str) -> Column:
        return F.sum(F.when(F.col("state") == state, 1).otherwise(0)).cast("long").alias(state.lower())

    def percentiles(name: str, values: Column) -> list[Column]:
        found = F.percentile(values, list(PERCENTILES))
        return [found[i].alias(f"{name}_p{int(p * 100)}") for i, p in enumerate(PERCENTILES)]

    finished = F.coalesce(F.col("finished_at"), F.col("archived_at"))
    stats = archive.groupBy(*by).agg(
        F.count(F.lit(1)).alias("total"),
        *[count_state(state) for state in STATES],
        F.avg("attempts_count").alias("attempts_avg"),
        F.max("attempts_count").alias("attempts_max"),
        *percentiles("wait", seconds_between("created_at", "first_attempt_at")),
        *percentiles("run", seconds_between("last_attempt_at", "finished_at")),
        F.min(finished).alias("first_finished"),
        F.max(finished).alias("last_finished"),
    )
    decided = F.col("completed") + F.col("failed")
    stats = stats.withColumn("failure_rate", F.when(decided > 0, F.col("failed") / decided))
    return stats.orderBy(*by) if by else stats


def throughput(archive: DataFrame, by: Sequence[str] = ("state",)) -> DataFrame:
    """Jobs finished per minute (UTC, by ``finished_at``, else ``archived_at``), per group of ``by``.

    Columns: ``minute`` (a timestamp, the minute's start), the group's, ``jobs``; sorted. A job with
    neither time (a cancelled one whose ``archived_at`` could not be read) has no minute to count in.
    """
    finished = F.coalesce(F.col("finished_at"), F.col("archived_at"))
    minute = F.timestamp_seconds(F.floor(F.unix_seconds(finished) / 60) * 60).alias("minute")
    placed = archive.where(finished.isNotNull())
    return placed.groupBy(minute, *by).agg(F.count(F.lit(1)).alias("jobs")).orderBy("minute", *by)
