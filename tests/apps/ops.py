"""An application for the operations tests: jobs that succeed, fail, retry once, or block until
their process is killed; and signal receivers that write what they receive to OPS_SIGNAL_LOG.

The lease is 3 s, so a worker process whose supervisor was killed is stale after 3 s."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobqueue import JobQueue, signals
from jobqueue.retry import ConstantRetryStrategy, NoRetryStrategy

app = JobQueue(release_stuck_timeout=3)


@app.task(name="ops.ok")
def ok(n: int) -> int:
    return n


@app.task(name="ops.fail", retry_strategy=NoRetryStrategy())
def fail(n: int) -> None:
    raise ValueError(f"job {n} fails")


@app.task(name="ops.fail_saying", retry_strategy=NoRetryStrategy())
def fail_saying(text: str) -> None:
    raise ValueError(text)


@app.task(name="ops.retry_saying", retry_strategy=ConstantRetryStrategy(delay_seconds=60, max_attempts=2))
def retry_saying(text: str) -> None:
    raise ValueError(text)


@app.task(name="ops.flaky", bind=True, retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=3))
def flaky(job: Any, n: int) -> int:
    if job.attempt == 1:
        raise ConnectionError(f"attempt 1 of job {n} fails")
    return n


@app.task(name="ops.block", bind=True)
def block(job: Any) -> str:
    """Blocks on its first delivery (until its process is killed); returns at once after that."""
    if job.deliveries == 1:
        time.sleep(300)
    return "unblocked"


@app.task(name="ops.complain")
def complain() -> str:
    return "done"


def _record(kind: str, **kwargs: Any) -> None:
    path = os.environ.get("OPS_SIGNAL_LOG")
    if not path:
        return
    job = kwargs.get("job")
    entry = {
        "signal": kind,
        "pid": os.getpid(),
        "job_id": job.id if job is not None else None,
        "task": kwargs["sender"].name if kind.startswith("job") and kwargs.get("sender") is not None else None,
        "exception": type(kwargs["exception"]).__name__ if kwargs.get("exception") is not None else None,
        "traceback": bool(kwargs.get("traceback")),
        "result": kwargs.get("result"),
        "process_name": kwargs.get("process_name"),
    }
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


for _signal in (
    signals.job_started,
    signals.job_succeeded,
    signals.job_retrying,
    signals.job_failed,
    signals.worker_process_init,
    signals.worker_process_shutdown,
):
    _signal.connect(lambda name=_signal.name, **kwargs: _record(name, **kwargs))


@signals.job_succeeded.connect
def _raises(sender: Any, job: Any, **kwargs: Any) -> None:
    """A receiver that raises: logged, and the job stays completed."""
    if sender is not None and sender.name == "ops.complain":
        raise RuntimeError("a receiver that raises")
