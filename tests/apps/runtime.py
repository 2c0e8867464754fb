"""Tasks for the runtime tests. Each records its runs in $JOBQUEUE_TEST_RUNS ("event job_id pid")."""

from __future__ import annotations

import os
import time

from jobqueue import JobQueue, SoftTimeLimitExceeded, current_job
from jobqueue.retry import ConstantRetryStrategy

app = JobQueue()

_ballast: list[bytes] = []


def record(event: str) -> None:
    path = os.environ.get("JOBQUEUE_TEST_RUNS")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{event} {current_job().id} {os.getpid()}\n".encode())  # one write: atomic append
        finally:
            os.close(fd)


@app.task(name="rt.short")
def short(seconds: float = 0.002) -> int:
    record("run")
    time.sleep(seconds)
    return os.getpid()


@app.task(name="rt.noop", priority=10)
def noop() -> None:
    return None


@app.task(name="rt.slow")
def slow(seconds: float) -> int:
    record("start")
    time.sleep(seconds)
    record("end")
    return os.getpid()


@app.task(name="rt.crash", max_deliveries=2)
def crash() -> None:
    record("start")
    os._exit(1)


@app.task(name="rt.hang", timeout=1, retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=2))
def hang() -> None:
    record("start")
    time.sleep(60)


@app.task(name="rt.soft", soft_timeout=0.5)
def soft() -> str:
    started = time.monotonic()
    try:
        time.sleep(10)
    except SoftTimeLimitExceeded:
        return f"caught after {time.monotonic() - started:.1f} s"
    return "not interrupted"


@app.task(name="rt.grow")
def grow(megabytes: int) -> int:
    _ballast.append(b"x" * (megabytes * 1024 * 1024))
    return os.getpid()


@app.task(name="rt.resumable", bind=True)
def resumable(job, steps: int, die_at: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Checkpoints after every step; the first delivery SIGKILLs its own process after step ``die_at``."""
    done = job.state or []
    for step in range(len(done), steps):
        record(f"step{step}")
        done = done + [step]
        job.checkpoint(done)
        if step == die_at and job.attempt == 1:
            os.kill(os.getpid(), 9)
    return done
