"""Run a real ``jobqueue worker`` for a scenario and wait for conditions on the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import sqlalchemy as sa

from jobqueue import JobQueue


def worker_command(*args: str) -> list[str]:
    """``jobqueue worker`` on the benchmark tasks, logging warnings only."""
    return [
        sys.executable,
        "-m",
        "jobqueue",
        "--app",
        "benchmarks.tasks:app",
        "--log-level",
        "WARNING",
        "worker",
        *args,
    ]


class BenchWorker:
    def __init__(self, url: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            worker_command(*args),
            env=dict(os.environ, JOBQUEUE_DATABASE_URL=url, **(env or {})),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def children(self) -> list[int]:
        try:
            with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []


def wait_until(condition: Callable[[], bool], timeout: float = 600, interval: float = 0.01) -> float:
    """Poll until ``condition()``; return the time it took."""
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(interval)
    return time.perf_counter() - started


def fresh_app(url: str) -> JobQueue:
    """The benchmark app on ``url`` with empty tables."""
    from benchmarks.tasks import app

    app.configure(database_url=url)
    app.tables.metadata.drop_all(app.engine)
    app.init_schema()
    return app


def queue_empty(app: JobQueue) -> Callable[[], bool]:
    m = app.tables.message
    stmt = sa.select(m.c.id).limit(1)

    def check() -> bool:
        with app.engine.connect() as conn:
            return conn.execute(stmt).first() is None

    return check
