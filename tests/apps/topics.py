"""Consumer groups for the topic tests. Each handler records its runs in $JOBQUEUE_TEST_RUNS
("event group key seq pid monotonic_ns"); the "broken" group always fails, without retries."""

from __future__ import annotations

import os
import time
from typing import Any

from jobqueue import JobQueue
from jobqueue.retry import NoRetryStrategy

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


@app.task(name="topics.noop")
def noop() -> None:
    pass
