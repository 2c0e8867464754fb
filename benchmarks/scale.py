"""Many worker processes on one PostgreSQL: idle load, wake-ups and latency, directly and through
PgBouncer, and the throughput of I/O-bound jobs.

The scenario starts its own PostgreSQL cluster (``max_connections`` 600: two supervisors of 64
processes each hold more connections than a default server allows) and a PgBouncer in transaction
mode in front of it, both on free loopback ports, and stops them at the end. For each route:

- two workers of ``SCALE_PROCESSES`` processes each (64 by default) idle for ``SCALE_SECONDS``
  (60): statements per second, all processes together, against one worker of 2 processes and
  against two workers of 1 process each, idling as long in the same run;
- then a trickle of 20 jobs per second for ``SCALE_SECONDS``: acquires per job, enqueue-to-start
  latency p50/p99, and the most server connections seen;
- ``--jobs`` no-op jobs processed by one worker of ``--processes`` processes (the throughput
  through the pooler against the direct connection).

Then 10 ms sleeping jobs on one worker of 16 processes, directly: jobs per second against the ideal
of 16 / 10 ms = 1,600.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import sqlalchemy as sa

from benchmarks import counting
from benchmarks.common import Measure, report
from benchmarks.worker import BenchWorker, fresh_app, queue_empty, wait_until

PROCESSES = int(os.environ.get("SCALE_PROCESSES", "64"))
SECONDS = float(os.environ.get("SCALE_SECONDS", "60"))
TRICKLE_PER_SECOND = 20
IO_PROCESSES = 16
IO_JOB_SECONDS = 0.01
IO_JOBS = 16_000
ACTIVITY = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"


def scale(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    if backend != "postgresql":
        print(f"scale: PostgreSQL only, skipped on {backend}", file=sys.stderr)
        return {}
    from jobqueue.storage.dialects.postgresql_session import SESSION_SETTINGS
    from tests.servers import PgBouncer, PrivatePostgres

    # The settings jobqueue sends at connect, on the server itself: PgBouncer refuses them at connect.
    server = PrivatePostgres(settings={"max_connections": "600", "shared_buffers": "256MB", **SESSION_SETTINGS})
    bouncer: PgBouncer | None = None
    try:
        server.start()
        direct = server.url
        bouncer = PgBouncer(direct, pool_size=20, max_clients=1000)
        bouncer.start()
        routes = {"direct": direct, "PgBouncer": bouncer.url(direct)}
        measures: list[Measure] = []
        extra: dict[str, Any] = {"processes": 2 * PROCESSES, "seconds": SECONDS}
        for _ in range(runs):
            for route, route_url in routes.items():
                _many(direct, route, route_url, measures)
                _throughput(direct, route, route_url, jobs, processes, measures)
            _io_bound(direct, measures)
        by_name: dict[str, Measure] = {}
        for measure in measures:  # one Measure per name, values of every run
            by_name.setdefault(measure.name, Measure(measure.name, measure.unit, [], measure.higher_is_better))
            by_name[measure.name].values.extend(measure.values)
        merged = list(by_name.values())
        ratios = {
            f"idle statements/s, {2 * PROCESSES} / 2 processes ({route})": (
                f"{route}: idle statements/s, {2 * PROCESSES} processes",
                f"{route}: idle statements/s, 2 processes",
            )
            for route in routes
        }
        for route in routes:
            ratios[f"idle statements/s, 2 workers: {PROCESSES} / 1 process each ({route})"] = (
                f"{route}: idle statements/s, {2 * PROCESSES} processes",
                f"{route}: idle statements/s, 2 workers of 1 process",
            )
        ratios["no-op jobs/s, PgBouncer / direct"] = ("PgBouncer: no-op jobs/s", "direct: no-op jobs/s")
        ratios["I/O-bound / ideal"] = ("I/O-bound jobs/s", "I/O-bound ideal")
        return report(f"{2 * PROCESSES} worker processes", backend, merged, ratios, extra, json_path)
    finally:
        if bouncer is not None:
            bouncer.close()
        server.close()


def _many(direct: str, route: str, url: str, measures: list[Measure]) -> None:
    """Idle statements of 2 and of 2 x PROCESSES processes, then the trickle, on ``url``."""
    listen = ("--listen-database-url", direct) if url != direct else ()
    app = fresh_app(url)
    few = _idle_statements(url, [("--concurrency", "2", *listen)])
    measures.append(Measure(f"{route}: idle statements/s, 2 processes", "statements/s", [few], False))
    # As many supervisors as below, one process each: what the number of processes alone costs.
    pair = _idle_statements(url, [("--concurrency", "1", *listen)] * 2)
    measures.append(Measure(f"{route}: idle statements/s, 2 workers of 1 process", "statements/s", [pair], False))
    directory = tempfile.mkdtemp(prefix="jobqueue-bench-scale-")
    workers = [
        BenchWorker(url, "--concurrency", str(PROCESSES), *listen, env={"JOBQUEUE_BENCH_COUNT": directory})
        for _ in range(2)
    ]
    try:
        _wait_started(app, 2 * PROCESSES)
        before = sum(counting.counts(directory).values())
        time.sleep(SECONDS)
        many = (sum(counting.counts(directory).values()) - before) / SECONDS
        measures.append(
            Measure(f"{route}: idle statements/s, {2 * PROCESSES} processes", "statements/s", [many], False)
        )
        acquires_before = sum(counting.counts(directory, "ACQUIRE").values())
        connections = _Sampler(direct)
        count = _trickle(app)
        wait_until(queue_empty(app), timeout=120)
        connections.stop()
        acquires = sum(counting.counts(directory, "ACQUIRE").values()) - acquires_before
    finally:
        for worker in workers:
            worker.stop()
    p50, p99 = _latencies(app)
    app.close()
    measures += [
        Measure(f"{route}: acquires per job", "acquires", [acquires / count], False),
        Measure(f"{route}: latency p50", "ms", [p50], False),
        Measure(f"{route}: latency p99", "ms", [p99], False),
        Measure(f"{route}: server connections, most", "connections", [connections.most], False),
    ]


def _idle_statements(url: str, options: list[tuple[str, ...]]) -> float:
    directory = tempfile.mkdtemp(prefix="jobqueue-bench-scale-")
    app = fresh_app(url)
    workers = [BenchWorker(url, *args, env={"JOBQUEUE_BENCH_COUNT": directory}) for args in options]
    try:
        _wait_started(app, sum(int(args[1]) for args in options))
        before = sum(counting.counts(directory).values())
        time.sleep(SECONDS)
        return (sum(counting.counts(directory).values()) - before) / SECONDS
    finally:
        for worker in workers:
            worker.stop()
        app.close()


def _wait_started(app: Any, processes: int) -> None:
    """Every process registered, and a few seconds more for their first (empty) fetches."""
    w = app.tables.worker
    with app.engine.connect() as conn:
        wait_until(lambda: conn.execute(sa.select(sa.func.count()).select_from(w)).scalar_one() >= processes, 300, 0.5)
    time.sleep(5.0)


def _trickle(app: Any) -> int:
    """TRICKLE_PER_SECOND jobs a second for SECONDS, one delay() each; how many."""
    from benchmarks.tasks import noop

    count = int(SECONDS * TRICKLE_PER_SECOND)
    started = time.perf_counter()
    for n in range(count):
        noop.delay()
        pause = started + (n + 1) / TRICKLE_PER_SECOND - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return count


def _latencies(app: Any) -> tuple[float, float]:
    a = app.tables.archive
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(a.c.created_at, a.c.last_attempt_at)).all()
    samples = sorted((started - created).total_seconds() * 1000 for created, started in rows)
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


class _Sampler:
    """The most connections to the database the server saw, sampled every 0.5 s."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.most = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.engine.connect() as conn:
            while not self.done.wait(0.5):
                count = conn.exec_driver_sql(ACTIVITY).scalar_one()
                self.most = max(self.most, count)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self.engine.dispose()


def _throughput(direct: str, route: str, url: str, jobs: int, processes: int, measures: list[Measure]) -> None:
    """``jobs`` no-op jobs enqueued beforehand, processed by one worker of ``processes`` processes."""
    from benchmarks.scenarios import processing_span
    from benchmarks.tasks import noop

    app = fresh_app(url)
    noop.bulk([()] * jobs)
    listen = ("--listen-database-url", direct) if url != direct else ()
    worker = BenchWorker(url, "--concurrency", str(processes), *listen)
    try:
        wait_until(queue_empty(app), timeout=600)
    finally:
        worker.stop()
    measures.append(Measure(f"{route}: no-op jobs/s", "jobs/s", [jobs / processing_span(app)]))
    app.close()


def _io_bound(url: str, measures: list[Measure]) -> None:
    from benchmarks.scenarios import processing_span
    from benchmarks.tasks import sleep

    app = fresh_app(url)
    sleep.bulk([(IO_JOB_SECONDS,)] * IO_JOBS)
    worker = BenchWorker(url, "--concurrency", str(IO_PROCESSES))
    try:
        wait_until(queue_empty(app), timeout=600)
    finally:
        worker.stop()
    rate = IO_JOBS / processing_span(app)
    app.close()
    measures.append(Measure("I/O-bound jobs/s", "jobs/s", [rate]))
    measures.append(Measure("I/O-bound ideal", "jobs/s", [IO_PROCESSES / IO_JOB_SECONDS]))
