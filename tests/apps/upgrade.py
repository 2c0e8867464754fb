"""An app on tables of its own prefix, for the upgrade tests (they start from schema 1)."""

from __future__ import annotations

from datetime import timedelta

from jobqueue import JobQueue
from jobqueue.retry import ConstantRetryStrategy

app = JobQueue(table_prefix="jqup_")


@app.task(name="up.double", retry_strategy=ConstantRetryStrategy(delay_seconds=0.2, max_attempts=3))
def double(x: int) -> int:
    return 2 * x


@app.periodic(every=timedelta(hours=1))
@app.task(name="up.hourly")
def hourly() -> str:
    return "tick"
