"""The benchmark application; the database comes from JOBQUEUE_DATABASE_URL."""

from __future__ import annotations

import time

from jobqueue import JobQueue

app = JobQueue()


@app.task(name="bench.noop")
def noop() -> None:
    return None


@app.task(name="bench.sleep")
def sleep(seconds: float) -> None:
    time.sleep(seconds)
