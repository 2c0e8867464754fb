"""An application for the acceptance tests; the database comes from JOBQUEUE_DATABASE_URL."""

from __future__ import annotations

import os
import time

from jobqueue import JobQueue, current_job
from jobqueue.retry import ConstantRetryStrategy, NoRetryStrategy

app = JobQueue()


@app.task(name="basic.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="basic.partner_call", concurrency_key="partner", concurrency_limit=1)
def partner_call(n: int) -> int:
    return n


@app.task(name="basic.notify", rate_limit="2/m")
def notify(n: int) -> int:
    return n


@app.task(name="basic.fail", retry_strategy=NoRetryStrategy())
def fail(message: str) -> None:
    raise ValueError(message)


@app.task(name="basic.flaky", retry_strategy=ConstantRetryStrategy(delay_seconds=0.2, max_attempts=3))
def flaky(failures: int) -> int:
    attempt = current_job().attempt
    if attempt <= failures:
        raise ConnectionError(f"attempt {attempt} fails")
    return attempt


@app.task(name="basic.sleep")
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.task(name="basic.pid")
def pid() -> int:
    return os.getpid()


@app.task(name="basic.fail_once", retry_strategy=NoRetryStrategy())
def fail_once(marker: str) -> str:
    """Fails while the marker file is missing, creating it: a retry from the archive then succeeds."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first run fails")
    return "second run works"
