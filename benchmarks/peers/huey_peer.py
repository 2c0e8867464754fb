"""huey (SqliteHuey) as a benchmark peer; its worker side is ``benchmarks.peers.huey_tasks``.

The consumer is ``python -m huey.bin.huey_consumer benchmarks.peers.huey_tasks.huey -k process -w N``
with huey's other defaults: each worker process polls the ``task`` table, sleeping 0.1 s when it is
empty and backing off by x1.15 per empty poll up to 10 s. Storage is a SQLite file (WAL, huey's
defaults), not PostgreSQL: the ``url`` given to setup() is ignored. huey has no batch enqueue.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.peers import _common

if TYPE_CHECKING:
    from huey import SqliteHuey

DIRECTORY = Path("/tmp/peer-huey")
TASKS_MODULE = "benchmarks.peers.huey_tasks"


__getattr__ = _common.name_attribute("huey")  # NAME, from the installed distribution


def available() -> bool:
    """Whether huey imports."""
    return _common.importable("huey")


def _huey() -> SqliteHuey:
    """The tasks module's huey instance (importing it opens the SQLite file, creating its tables)."""
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    from benchmarks.peers.huey_tasks import huey

    return huey


def setup(url: str | None = None) -> None:
    """A fresh SQLite file under /tmp/peer-huey/ (``url`` is ignored): deleted if this process has not opened it
    yet, otherwise emptied with ``huey.flush()`` (queue, schedule, results)."""
    if TASKS_MODULE not in sys.modules and DIRECTORY.exists():
        for path in DIRECTORY.glob("huey.sqlite3*"):
            path.unlink()
    _huey().flush()


def enqueue_single(n: int) -> float:
    """Jobs/s enqueueing ``n`` no-op jobs by calling the task (``noop()``), each one insert, autocommitted."""
    setup()
    from benchmarks.peers.huey_tasks import noop

    noop()  # opens this thread's connection outside the timing
    started = time.perf_counter()
    for _ in range(n):
        noop()
    return n / (time.perf_counter() - started)


def enqueue_bulk(n: int) -> float:
    """huey has no batch enqueue API: NaN."""
    return float("nan")


def _workers(name: str, processes: int) -> _common.Workers:
    command = _common.python_command(
        "-m", "huey.bin.huey_consumer", f"{TASKS_MODULE}.huey", "-k", "process", "-w", str(processes), "--quiet"
    )
    return _common.Workers(name, [command])


def processing(jobs: int, processes: int) -> dict[str, float]:
    """``jobs`` no-op jobs enqueued one by one (``noop()``), then a consumer with ``processes`` worker processes.

    Done is counted as "no longer in the ``task`` table": huey deletes a task when a worker dequeues
    it and, the no-op returning None, writes nothing when it finishes; so up to ``processes`` of the
    jobs counted done may still be running (a no-op runs for microseconds).
    """
    setup()
    from benchmarks.peers.huey_tasks import noop

    for _ in range(jobs):
        noop()
    huey = _huey()
    huey.storage.close()
    connection = sqlite3.connect(huey.storage.filename, timeout=30)
    queue = huey.storage.name

    def done() -> int:
        return jobs - int(connection.execute("SELECT count(*) FROM task WHERE queue = ?", (queue,)).fetchone()[0])

    try:
        return _common.run_processing(jobs, lambda: _workers("huey-processing", processes), done)
    finally:
        connection.close()


def latency(n: int) -> tuple[float, float]:
    """p50 and p99 ms from just before ``probe(key)`` to the start of the job, on a consumer with one worker process."""
    setup()
    from benchmarks.peers.huey_tasks import probe

    return _common.run_latency("huey", n, lambda: _workers("huey-latency", 1), lambda key: probe(key))
