"""The benchmark application; the database comes from JOBQUEUE_DATABASE_URL."""

from __future__ import annotations

import os
import time

from jobqueue import JobQueue

if os.environ.get("JOBQUEUE_BENCH_COUNT"):
    from benchmarks.counting import install

    install(os.environ["JOBQUEUE_BENCH_COUNT"])

app = JobQueue()

if os.environ.get("JOBQUEUE_BENCH_PROFILE"):
    # cProfile in each worker process, written to <directory>/<pid>.prof as it stops.
    from benchmarks.profiling import install as install_profiler

    install_profiler(os.environ["JOBQUEUE_BENCH_PROFILE"])


@app.task(name="bench.noop")
def noop() -> None:
    return None


@app.task(name="bench.noop_arg")
def noop_arg(value: object) -> None:
    """A no-op of one argument, for scenarios that enqueue a value per job."""
    return None


@app.task(name="bench.sleep")
def sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


@app.task(name="bench.keyed", concurrency_key=lambda key: f"k{key}")
def keyed(key: int) -> None:
    return None


# Three consumer groups of one topic (the topics scenario); from the earliest message, so that a
# benchmark can publish before its worker adds them.
orders = app.topic("bench-orders")
for _group in ("billing", "email", "analytics"):
    app.consumer("bench-orders", group=_group, start="earliest")(lambda payload: None)
