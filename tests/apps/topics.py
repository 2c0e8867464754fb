"""Consumer groups for the topic tests. Each handler records its runs in $JOBQUEUE_TEST_RUNS
("event group key seq pid monotonic_ns"); the "broken" group always fails, without retries."""

from __future__ import annotations

import os
import time
from typing import Any

from jobqueue import JobQueue
from jobqueue.retry import ConstantRetryStrategy, NoRetryStrategy

app = JobQueue()
orders = app.topic("orders")


def record(event: str, group: str, payload: dict[str, Any]) -> None:
    path = os.environ.get("JOBQUEUE_TEST_RUNS")
    if path:
        line = f"{event} {group} {payload['key']} {payload['seq']} {os.getpid()} {time.monotonic_ns()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write: an atomic append
        finally:
            os.close(fd)


def handler(group: str) -> Any:
    def handle(payload: dict[str, Any]) -> None:
        record("start", group, payload)
        record("end", group, payload)

    handle.__qualname__ = f"handle_{group}"
    return handle


for name in ("billing", "email", "analytics"):
    app.consumer("orders", group=name, start="earliest")(handler(name))


@app.consumer("orders", group="broken", start="earliest", retry_strategy=NoRetryStrategy())
def broken(payload: dict[str, Any]) -> None:
    record("fail", "broken", payload)
    raise RuntimeError(f"broken cannot take order {payload['seq']}")


@app.consumer("orders", group="late")  # started by name only (--groups late) in the tests that want it
def late(payload: dict[str, Any]) -> None:
    record("end", "late", payload)


def wait_for_go() -> None:
    """Block until the test creates $JOBQUEUE_TEST_RUNS.go (or for a minute)."""
    go = os.environ.get("JOBQUEUE_TEST_RUNS", "") + ".go"
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)


# Started by name only (--groups stuck / --groups retried), in the tests that drop them while they run.
@app.consumer("orders", group="stuck", start="earliest")
def stuck(payload: dict[str, Any]) -> None:
    record("start", "stuck", payload)
    time.sleep(600)  # until its process is killed


RETRY_SOON = ConstantRetryStrategy(delay_seconds=0.1, max_attempts=5)


@app.consumer("orders", group="retried", start="earliest", retry_strategy=RETRY_SOON)
def retried(payload: dict[str, Any]) -> None:
    record("start", "retried", payload)
    wait_for_go()
    raise RuntimeError("retried fails, to be retried")


@app.task(name="topics.noop")
def noop() -> None:
    pass
