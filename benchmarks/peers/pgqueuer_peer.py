"""pgqueuer (asyncpg driver) as a benchmark peer; its worker side is ``benchmarks.peers.pgqueuer_tasks``.

Each worker process is ``python -m benchmarks.peers.pgqueuer_tasks 10`` (what ``pgq run ... --batch-size
10`` does; see that module): one asyncio event loop on one asyncpg connection, dequeuing 10 jobs at a time, with
no cap on concurrent tasks (pgqueuer's defaults). Enqueueing uses ``Queries.enqueue`` on an asyncpg
connection outside any transaction (so every call commits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from benchmarks.peers import _common

if TYPE_CHECKING:
    from pgqueuer import Queries

DATABASE = "jobqueue_test_peer_pgqueuer"
BATCH_SIZE = 10
T = TypeVar("T")
_url: str | None = None  # the server setup() was given; None until then (then PEERS_POSTGRES_URL or the default)


__getattr__ = _common.name_attribute("pgqueuer")  # NAME, from the installed distribution


def available() -> bool:
    """Whether pgqueuer and asyncpg import."""
    return _common.importable("asyncpg", "pgqueuer")


def dsn() -> str:
    """The peer's own database on the server given to setup()."""
    return _common.database_url(_url, DATABASE)


def setup(url: str | None = None) -> None:
    """Recreate the peer database on the server ``url`` and install pgqueuer's schema in it."""
    global _url
    _url = url
    _common.recreate_database(dsn())
    asyncio.run(_with_queries(_install))


async def _install(queries: Queries) -> None:
    await queries.install()


async def _with_queries(body: Callable[[Queries], Awaitable[T]]) -> T:
    """Run ``await body(queries)`` with pgqueuer's Queries on a fresh asyncpg connection."""
    import asyncpg
    from pgqueuer import Queries

    connection = await asyncpg.connect(dsn())
    try:
        return await body(Queries.from_asyncpg_connection(connection))
    finally:
        await connection.close()


def _fresh() -> None:
    """An empty queue before each measurement (a new database, as setup() makes it)."""
    setup(_url)


def enqueue_single(n: int) -> float:
    """Jobs/s enqueueing ``n`` no-op jobs with one ``Queries.enqueue(entrypoint, None)`` call each."""
    from benchmarks.peers.pgqueuer_tasks import NOOP

    _fresh()

    async def body(queries: Queries) -> float:
        started = time.perf_counter()
        for _ in range(n):
            await queries.enqueue(NOOP, None)
        return n / (time.perf_counter() - started)

    return asyncio.run(_with_queries(body))


def enqueue_bulk(n: int) -> float:
    """Jobs/s enqueueing ``n`` no-op jobs with one ``Queries.enqueue`` call given lists (one statement)."""
    _fresh()
    started = time.perf_counter()
    _enqueue_many(n)
    return n / (time.perf_counter() - started)


def _enqueue_many(n: int) -> None:
    from benchmarks.peers.pgqueuer_tasks import NOOP

    async def body(queries: Queries) -> None:
        await queries.enqueue([NOOP] * n, [None] * n, [0] * n)

    asyncio.run(_with_queries(body))


def _workers(name: str, processes: int) -> _common.Workers:
    command = _common.python_command("-m", "benchmarks.peers.pgqueuer_tasks", str(BATCH_SIZE))
    return _common.Workers(name, [command] * processes, env={"PEERS_PGQUEUER_DSN": dsn()})


def processing(jobs: int, processes: int) -> dict[str, float]:
    """``jobs`` no-op jobs enqueued in bulk, then ``processes`` pgqueuer worker processes; wall and steady jobs/s.

    A job is done once pgqueuer has deleted it from its ``pgqueuer`` table (it logs it in ``pgqueuer_log``).
    """
    _fresh()
    _enqueue_many(jobs)
    count, close = _common.pg_counter(dsn(), "SELECT count(*) FROM pgqueuer")
    try:
        result = _common.run_processing(
            jobs, lambda: _workers("pgqueuer-processing", processes), lambda: jobs - count()
        )
    finally:
        close()
    succeeded = _common.scalar(dsn(), "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    if succeeded != jobs:
        raise RuntimeError(f"pgqueuer logged {succeeded} successful jobs out of {jobs}")
    return result


def latency(n: int) -> tuple[float, float]:
    """p50 and p99 ms from just before ``Queries.enqueue`` to the start of the job, on one idle worker process."""
    import asyncpg
    from pgqueuer import Queries

    from benchmarks.peers.pgqueuer_tasks import PROBE

    _fresh()
    loop = asyncio.new_event_loop()
    connection = loop.run_until_complete(asyncpg.connect(dsn()))
    queries = Queries.from_asyncpg_connection(connection)
    try:
        return _common.run_latency(
            "pgqueuer",
            n,
            lambda: _workers("pgqueuer-latency", 1),
            lambda key: loop.run_until_complete(queries.enqueue(PROBE, str(key).encode())),
        )
    finally:
        loop.run_until_complete(connection.close())
        loop.close()
