"""procrastinate (psycopg 3) as a benchmark peer; its worker side is ``benchmarks.peers.procrastinate_tasks``.

Each worker process is ``python -m procrastinate --app=benchmarks.peers.procrastinate_tasks.app worker``
with procrastinate's defaults: concurrency 1 (one job at a time per process), LISTEN/NOTIFY on, polling
every 5 s as a fallback, finished jobs kept (status ``succeeded``). Enqueueing is synchronous:
``task.defer()`` / ``task.batch_defer()`` on the app opened synchronously (a psycopg_pool pool).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from benchmarks.peers import _common

if TYPE_CHECKING:
    import procrastinate

DATABASE = "jobqueue_test_peer_procrastinate"
CONCURRENCY = 1  # procrastinate's default: jobs in flight per worker process
_url: str | None = None  # the server setup() was given; None until then (then PEERS_POSTGRES_URL or the default)


__getattr__ = _common.name_attribute("procrastinate")  # NAME, from the installed distribution


def available() -> bool:
    """Whether procrastinate (and psycopg) import."""
    return _common.importable("procrastinate", "psycopg")


def dsn() -> str:
    """The peer's own database on the server given to setup()."""
    return _common.database_url(_url, DATABASE)


@contextmanager
def _opened_app() -> Iterator[procrastinate.App]:
    """The tasks module's app, on the peer database, opened synchronously (as sync code uses it)."""
    import procrastinate

    from benchmarks.peers.procrastinate_tasks import app

    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn())) as opened:
        opened.open()
        try:
            yield opened
        finally:
            opened.close()


def setup(url: str | None = None) -> None:
    """Recreate the peer database on the server ``url`` and apply procrastinate's schema to it."""
    global _url
    _url = url
    _common.recreate_database(dsn())
    with _opened_app() as app:
        app.schema_manager.apply_schema()


def _fresh() -> None:
    """An empty queue before each measurement (a new database, as setup() makes it)."""
    setup(_url)


def enqueue_single(n: int) -> float:
    """Jobs/s enqueueing ``n`` no-op jobs with one ``noop.defer()`` each."""
    from benchmarks.peers.procrastinate_tasks import noop

    _fresh()
    with _opened_app():
        noop.defer()  # opens the pool's connections outside the timing
        started = time.perf_counter()
        for _ in range(n):
            noop.defer()
        elapsed = time.perf_counter() - started
    return n / elapsed


def enqueue_bulk(n: int) -> float:
    """Jobs/s enqueueing ``n`` no-op jobs with one ``noop.batch_defer(...)`` call (one statement)."""
    from benchmarks.peers.procrastinate_tasks import noop

    _fresh()
    with _opened_app():
        noop.defer()
        started = time.perf_counter()
        noop.batch_defer(*({} for _ in range(n)))
        elapsed = time.perf_counter() - started
    return n / elapsed


def _workers(name: str, processes: int) -> _common.Workers:
    command = _common.python_command(
        "-m",
        "procrastinate",
        "--app=benchmarks.peers.procrastinate_tasks.app",
        "--log-level=warning",
        "worker",
        f"--concurrency={CONCURRENCY}",
    )
    return _common.Workers(name, [command] * processes, env={"PEERS_PROCRASTINATE_DSN": dsn()})


def processing(jobs: int, processes: int) -> dict[str, float]:
    """``jobs`` no-op jobs enqueued in bulk, then ``processes`` worker processes; wall and steady jobs/s.

    A job is done once its ``procrastinate_jobs`` row has status ``succeeded``.
    """
    from benchmarks.peers.procrastinate_tasks import noop

    _fresh()
    with _opened_app():
        noop.batch_defer(*({} for _ in range(jobs)))
    count, close = _common.pg_counter(dsn(), "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
    try:
        return _common.run_processing(jobs, lambda: _workers("procrastinate-processing", processes), count)
    finally:
        close()


def latency(n: int) -> tuple[float, float]:
    """p50 and p99 ms from just before ``probe.defer(key=...)`` to the start of the job, one idle worker process."""
    from benchmarks.peers.procrastinate_tasks import probe

    _fresh()
    with _opened_app():
        return _common.run_latency(
            "procrastinate", n, lambda: _workers("procrastinate-latency", 1), lambda key: probe.defer(key=key)
        )
