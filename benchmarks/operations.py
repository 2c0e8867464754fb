"""Scenarios about how the worker behaves over time: idle cost, backlog scaling, memory, prefetch."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

import sqlalchemy as sa

from benchmarks import counting
from benchmarks.common import Measure, report
from benchmarks.worker import BenchWorker, fresh_app, queue_empty, wait_until

IDLE_WARMUP_SECONDS = 5.0
IDLE_WINDOW_SECONDS = 20.0
SMALL_REPEATS = 3  # 10,000-backlog measurements per backlog round


def idle(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """Statements per second of an idle worker: its supervisor and each worker process."""
    per_process = Measure("per worker process", "statements/s", higher_is_better=False)
    supervisor = Measure("supervisor", "statements/s", higher_is_better=False)
    server = Measure("server transactions (PostgreSQL)", "xacts/s", higher_is_better=False)
    for _ in range(runs):
        app = fresh_app(url)
        directory = tempfile.mkdtemp(prefix="jobqueue-bench-count-")
        worker = BenchWorker(url, "--concurrency", str(processes), env={"JOBQUEUE_BENCH_COUNT": directory})
        try:
            time.sleep(IDLE_WARMUP_SECONDS)
            before, xacts = counting.counts(directory), _xacts(app)
            time.sleep(IDLE_WINDOW_SECONDS)
            after, xacts_after = counting.counts(directory), _xacts(app)
        finally:
            worker.stop()
        rates = {pid: (after.get(pid, 0) - before.get(pid, 0)) / IDLE_WINDOW_SECONDS for pid in after}
        supervisor.values.append(rates.pop(worker.process.pid, 0.0))
        per_process.values.append(statistics.mean(rates.values()) if rates else 0.0)
        if xacts is not None and xacts_after is not None:
            server.values.append((xacts_after - xacts - 1) / IDLE_WINDOW_SECONDS)  # minus our own query
        app.close()
    measures = [per_process, supervisor] + ([server] if server.values else [])
    return report(
        f"idle worker, {processes} processes", backend, measures, {}, {"window_seconds": IDLE_WINDOW_SECONDS}, json_path
    )


def _xacts(app: Any) -> int | None:
    if app.engine.dialect.name != "postgresql":
        return None
    with app.engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
            ).scalar_one()
        )


def _rate_over(app: Any, url: str, processes: int, start_at: int, count: int) -> float:
    """Jobs/s between the ``start_at``-th and the ``start_at + count``-th job to finish.

    Read from the archive's ``finished_at`` once the worker is done with them; while it runs, a
    count every half second is all the benchmark asks (counting every few milliseconds was a
    full scan of a growing table on InnoDB, which slowed the very run it measured).
    """
    a = app.tables.archive
    count_stmt = sa.select(sa.func.count()).select_from(a)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    worker = BenchWorker(url, "--concurrency", str(processes))
    try:
        with engine.connect() as conn:

            def archived() -> int:
                value = int(conn.execute(count_stmt).scalar_one())
                conn.commit()
                return value

            wait_until(lambda: archived() >= start_at + count, interval=0.5)
    finally:
        worker.stop()
    try:
        with engine.connect() as conn:

            def nth(n: int) -> Any:
                return conn.execute(
                    sa.select(a.c.finished_at).order_by(a.c.finished_at).offset(n).limit(1)
                ).scalar_one()

            first, last = nth(start_at), nth(start_at + count - 1)
        return (count - 1) / max((last - first).total_seconds(), 1e-6)
    finally:
        engine.dispose()


def backlog(
    url: str,
    backend: str,
    runs: int,
    jobs: int,
    processes: int,
    json_path: str | None,
    big: int = int(os.environ.get("BENCH_BACKLOG", "1000000")),
) -> dict[str, Any]:
    """Processing speed with a 1,000,000-message backlog against a 10,000-message one.

    A 10,000 backlog gives a short window (8,000 jobs, well under a second), so each round
    measures it ``SMALL_REPEATS`` times and takes the median; the figure reported is the median of
    the rounds' own ratios, each measured minutes apart at most."""
    from benchmarks.tasks import noop

    small_rate = Measure("10,000 backlog", "jobs/s")
    big_rate = Measure(f"{big:,} backlog", "jobs/s")
    ratio = Measure("1M / 10k, per round", "x")
    extra: dict[str, Any] = {}
    for _ in range(runs):
        smalls = []
        for _repeat in range(SMALL_REPEATS):
            app = fresh_app(url)
            noop.bulk([()] * 10_000, batch_size=5000)
            smalls.append(_rate_over(app, url, processes, 1000, 8000))
        small_rate.values.append(statistics.median(smalls))
        app = fresh_app(url)
        started = time.perf_counter()
        for _chunk in range(big // 50_000):
            noop.bulk([()] * 50_000, batch_size=5000)
        extra["enqueue_seconds"] = round(time.perf_counter() - started, 1)
        big_rate.values.append(_rate_over(app, url, processes, 10_000, 50_000))
        ratio.values.append(big_rate.values[-1] / small_rate.values[-1])
        print(f"  round: 10k {small_rate.values[-1]:,.0f}, 1M {big_rate.values[-1]:,.0f}, {ratio.values[-1]:.2f}x")
        if app.engine.dialect.name == "postgresql":
            with app.engine.connect() as conn:
                row = conn.exec_driver_sql(
                    "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
                    f"WHERE relname = '{app.tables.message.name}'"
                ).one()
            extra["message_table"] = dict(zip(("live", "dead", "autovacuums", "autoanalyzes"), row, strict=True))
        app.close()
    return report(
        "backlog scaling",
        backend,
        [small_rate, big_rate, ratio],
        {"1M / 10k, medians": (big_rate.name, small_rate.name)},
        extra,
        json_path,
    )


def _memory_kib(pid: int) -> tuple[int, int, int]:
    """RSS, PSS and USS of a process, in KiB (Linux smaps_rollup)."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1])
    return fields["Rss"], fields["Pss"], fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def memory(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """Worker process memory over ``jobs`` no-op jobs (use --jobs 1000000 for the documented figure)."""
    from benchmarks.tasks import noop

    warm_rss = Measure("RSS after 10% of the jobs", "MiB", higher_is_better=False)
    end_rss = Measure("RSS at the end", "MiB", higher_is_better=False)
    end_uss = Measure("USS at the end", "MiB", higher_is_better=False)
    growth = Measure("RSS growth after warm-up", "%", higher_is_better=False)
    for _ in range(runs):
        app = fresh_app(url)
        for start in range(0, jobs, 50_000):
            noop.bulk([()] * min(50_000, jobs - start), batch_size=5000)
        a = app.tables.archive
        stmt = sa.select(sa.func.count()).select_from(a)
        worker = BenchWorker(url, "--concurrency", str(processes))
        samples: list[tuple[int, list[tuple[int, int, int]]]] = []
        try:
            with app.engine.connect() as conn:
                while True:
                    done = int(conn.execute(stmt).scalar_one())
                    conn.commit()
                    samples.append((done, [_memory_kib(pid) for pid in worker.children()]))
                    if done >= jobs:
                        break
                    time.sleep(1.0)
        finally:
            worker.stop()
        warm = next(s for done, s in samples if done >= jobs // 10 and s)
        last = [s for _, s in samples if s][-1]
        warm_rss.values.append(max(r for r, _, _ in warm) / 1024)
        end_rss.values.append(max(r for r, _, _ in last) / 1024)
        end_uss.values.append(max(u for _, _, u in last) / 1024)
        growth.values.append((end_rss.values[-1] / warm_rss.values[-1] - 1) * 100)
        app.close()
    return report(
        f"worker memory over {jobs:,} no-op jobs, {processes} processes (largest process)",
        backend,
        [warm_rss, end_rss, end_uss, growth],
        {},
        {"jobs": jobs},
        json_path,
    )


def prefetch(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """Batch sizes for no-op jobs, and one-second jobs spread over the processes (no hoarding)."""
    from benchmarks.tasks import noop, sleep

    per_acquire = Measure("no-op jobs per acquire", "jobs", higher_is_better=True)
    slow_wall = Measure("8 one-second jobs after 30 quick ones", "s", higher_is_better=False)
    spread = Measure("processes that ran one-second jobs", "processes")
    for _ in range(runs):
        app = fresh_app(url)
        noop.bulk([()] * jobs)
        directory = tempfile.mkdtemp(prefix="jobqueue-bench-count-")
        worker = BenchWorker(url, "--concurrency", str(processes), env={"JOBQUEUE_BENCH_COUNT": directory})
        try:
            wait_until(queue_empty(app))
        finally:
            worker.stop()
        acquires = _acquire_count(directory, backend)
        per_acquire.values.append(jobs / max(acquires, 1))
        app = fresh_app(url)
        noop.bulk([()] * 30)
        handles = sleep.bulk([(1.0,)] * 8)
        started = time.perf_counter()
        worker = BenchWorker(url, "--concurrency", str(processes))
        try:
            wait_until(queue_empty(app))
        finally:
            worker.stop()
        slow_wall.values.append(time.perf_counter() - started)
        spread.values.append(len({h.get(timeout=10) for h in handles}))
        app.close()
    return report("prefetch", backend, [per_acquire, slow_wall, spread], {}, {"jobs": jobs}, json_path)


def _acquire_count(directory: str, backend: str) -> int:
    """Acquisitions: the statements with SKIP LOCKED on PostgreSQL and MySQL; SQLite's are UPDATEs."""
    import pathlib

    total = 0
    for path in pathlib.Path(directory).glob("*"):
        words = path.read_text().split()
        total += words.count("UPDATE" if backend == "sqlite" else "ACQUIRE")
    return total


OPERATIONS = {"idle": idle, "backlog": backlog, "memory": memory, "prefetch": prefetch}
