"""Rows per second enqueued from a Spark DataFrame on local[2], next to bulk() from one process."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import interleave, report
from benchmarks.worker import fresh_app


def spark_enqueue(
    url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None
) -> dict[str, Any]:
    """``enqueue_dataframe`` of ``10 * jobs`` rows (one int column) against ``noop_arg.bulk`` of as many
    one-argument calls; the SparkSession is started once, before any timing."""
    from benchmarks.tasks import noop_arg
    from jobqueue.spark import enqueue_dataframe, get_session

    rows = jobs * 10
    spark = get_session(f"local[{processes}]")
    frame = spark.range(rows, numPartitions=processes * 2).withColumnRenamed("id", "n").cache()
    frame.count()

    def from_spark() -> float:
        fresh_app(url)
        started = time.perf_counter()
        assert enqueue_dataframe(frame, noop_arg, args=["n"], batch_size=1000) == rows
        return rows / (time.perf_counter() - started)

    def from_spark_keyed() -> float:
        fresh_app(url)
        keyed = frame.selectExpr("n", "concat('k', n) AS key")
        started = time.perf_counter()
        assert enqueue_dataframe(keyed, noop_arg, args=["n"], unique_key="key", batch_size=1000) == rows
        return rows / (time.perf_counter() - started)

    def bulk() -> float:
        fresh_app(url)
        items = [(n,) for n in range(rows)]
        started = time.perf_counter()
        noop_arg.bulk(items)
        return rows / (time.perf_counter() - started)

    names = ["bulk(), one process", f"Spark local[{processes}]", f"Spark local[{processes}], unique_key"]
    measures = interleave(
        runs, dict(zip(names, (bulk, from_spark, from_spark_keyed), strict=True)), dict.fromkeys(names, "rows/s")
    )
    return report(
        f"enqueue {rows} rows from Spark",
        backend,
        measures,
        {"Spark / bulk()": (names[1], names[0]), "Spark keyed / bulk()": (names[2], names[0])},
        {"rows": rows, "processes": processes},
        json_path,
    )
