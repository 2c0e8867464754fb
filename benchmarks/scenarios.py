"""The scenarios: each measures jobqueue and, where one exists, the raw-SQL reference, interleaved."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from benchmarks import raw
from benchmarks.common import Measure, interleave, report
from benchmarks.worker import BenchWorker, fresh_app, queue_empty, wait_until, worker_command

WORKER_OPTIONS: list[str] = []  # extra `jobqueue worker` options (--worker-option on the command line)


def enqueue(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """Enqueue one by one (a commit each) and in bulk, against the raw single and multi-row inserts."""
    references = raw.references(url, runs, jobs, processes)

    def single() -> float:
        from benchmarks.tasks import noop

        fresh_app(url)
        n = max(500, jobs // 10)
        started = time.perf_counter()
        for _ in range(n):
            noop.delay()
        return n / (time.perf_counter() - started)

    def bulk() -> float:
        from benchmarks.tasks import noop

        fresh_app(url)
        started = time.perf_counter()
        noop.bulk([()] * (jobs * 2))
        return jobs * 2 / (time.perf_counter() - started)

    names = ["raw single insert", "raw bulk insert", "raw bulk insert, 1,000 rows"]
    measures = interleave(
        runs,
        {**{name: references[name] for name in names}, "delay()": single, "bulk()": bulk},
        units=dict.fromkeys([*names, "delay()", "bulk()"], "jobs/s"),
    )
    return report(
        "enqueue",
        backend,
        measures,
        {
            "delay() / raw single": ("delay()", "raw single insert"),
            "bulk() / raw bulk": ("bulk()", "raw bulk insert"),
            "bulk() / raw bulk, 1,000 rows": ("bulk()", "raw bulk insert, 1,000 rows"),
        },
        {"jobs": jobs},
        json_path,
    )


def processing(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """No-op jobs enqueued beforehand, processed by a worker with ``processes`` processes."""
    references = raw.references(url, runs, jobs, processes)

    walls: list[float] = []
    cpu = Measure("jobqueue, worker CPU per job (supervisor and processes)", "µs", higher_is_better=False)

    def ours() -> float:
        from benchmarks.tasks import noop

        app = fresh_app(url)
        noop.bulk([()] * jobs)
        app.close()
        cpu_before = children_cpu()
        started = time.perf_counter()
        worker = BenchWorker(url, "--concurrency", str(processes), *WORKER_OPTIONS)
        try:
            wait_until(queue_empty(app))
            walls.append(jobs / (time.perf_counter() - started))
        finally:
            worker.stop()
        # CPU time is steadier than throughput on a shared machine: another tenant's load slows
        # the clock, not the work done per job.
        cpu.values.append((children_cpu() - cpu_before) / jobs * 1e6)
        return jobs / processing_span(app)

    units = dict.fromkeys(["raw cycle", "raw claim+archive", "jobqueue"], "jobs/s")
    measures = interleave(
        runs,
        {"raw cycle": references["raw cycle"], "raw claim+archive": references["raw claim+archive"], "jobqueue": ours},
        units,
    )
    measures.append(Measure("jobqueue, wall clock incl. start-up", "jobs/s", walls))
    measures.append(cpu)
    return report(
        f"processing {jobs} no-op jobs, {processes} processes",
        backend,
        measures,
        {
            "jobqueue / raw cycle": ("jobqueue", "raw cycle"),
            "jobqueue / raw claim+archive": ("jobqueue", "raw claim+archive"),
        },
        {"jobs": jobs, "processes": processes},
        json_path,
    )


def children_cpu() -> float:
    """User and system seconds of the child processes waited for so far (the worker and its forks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def processing_span(app: Any) -> float:
    """Seconds from the first job's start to the last job's end, from the archive."""
    a = app.tables.archive
    with app.engine.connect() as conn:
        first, last = conn.execute(sa.select(sa.func.min(a.c.last_attempt_at), sa.func.max(a.c.finished_at))).one()
    return max((last - first).total_seconds(), 1e-6)


def latency(
    url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None, later: int = 0
) -> dict[str, Any]:
    """Enqueue-to-start latency on an idle worker: jobs enqueued one at a time, 20 ms apart; with
    ``later``, behind a backlog of that many jobs due tomorrow."""
    from benchmarks.tasks import noop

    count = min(jobs, 200)
    p50 = Measure("p50", "ms", higher_is_better=False)
    p99 = Measure("p99", "ms", higher_is_better=False)
    for _ in range(runs):
        app = fresh_app(url)
        tomorrow = datetime.now(timezone.utc) + timedelta(days=1)
        for start in range(0, later, 20_000):
            noop.bulk([()] * min(20_000, later - start), eta=tomorrow)
        worker = BenchWorker(url, "--concurrency", str(processes))
        try:
            time.sleep(2.0)  # the worker is up and idle
            handles = []
            for _ in range(count):
                handles.append(noop.delay())
                time.sleep(0.02)
            wait_until(archived(app, count) if later else queue_empty(app))
        finally:
            worker.stop()
        a = app.tables.archive
        with app.engine.connect() as conn:
            rows = conn.execute(sa.select(a.c.created_at, a.c.last_attempt_at)).all()
        samples = sorted((started - created).total_seconds() * 1000 for created, started in rows)
        p50.values.append(statistics.median(samples))
        p99.values.append(samples[min(len(samples) - 1, int(len(samples) * 0.99))])
        app.close()
    title = "enqueue-to-start latency on an idle worker"
    if later:
        title += f", behind {later:,} jobs due tomorrow"
    return report(title, backend, [p50, p99], {}, {"jobs": count, "later": later}, json_path)


def archived(app: Any, count: int) -> Callable[[], bool]:
    """Whether ``count`` jobs have reached the archive."""
    a = app.tables.archive
    counted = sa.select(sa.func.count()).select_from(a)

    def check() -> bool:
        with app.engine.connect() as conn:
            return int(conn.execute(counted).scalar_one()) >= count

    return check


def later(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """The latency scenario behind a backlog due tomorrow (``BENCH_LATER`` jobs, 100,000 by
    default): what each fetch and each idle check costs when most of the queue is not due."""
    return latency(url, backend, runs, jobs, processes, json_path, later=int(os.environ.get("BENCH_LATER", "100000")))


SCENARIOS = {"enqueue": enqueue, "processing": processing, "latency": latency, "later": later}
__all__ = ["SCENARIOS", "datetime"]


def jobqueue_like_peers(url: str, jobs: int, processes: int) -> dict[str, float]:
    """jobqueue measured exactly as the peers are: polled from outside, wall clock and 10%-90% steady rate."""
    from benchmarks.peers import _common
    from benchmarks.tasks import noop

    app = fresh_app(url)
    noop.bulk([()] * jobs)
    a = app.tables.archive
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    conn = engine.connect()
    count_stmt = sa.select(sa.func.count()).select_from(a)

    def done() -> int:
        value = int(conn.execute(count_stmt).scalar_one())
        conn.commit()
        return value

    command = worker_command("--concurrency", str(processes), *WORKER_OPTIONS)
    try:
        return _common.run_processing(
            jobs, lambda: _common.Workers("jobqueue", [command], env={"JOBQUEUE_DATABASE_URL": url}), done
        )
    finally:
        conn.close()
        engine.dispose()
        app.close()


def compare(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """jobqueue next to pgqueuer, procrastinate and huey (those installed in PEERS_PYTHON's environment)."""
    peers_python = os.environ.get("PEERS_PYTHON", sys.executable)
    names = [n for n in ("pgqueuer", "procrastinate", "huey") if backend == "postgresql" or n == "huey"]
    raw_cycle = raw.references(url, runs, jobs, processes)["raw cycle"]
    measures: dict[str, Measure] = {}

    def add(name: str, unit: str, value: float) -> None:
        measures.setdefault(name, Measure(name, unit)).values.append(value)

    for round_number in range(runs):
        add("raw cycle", "jobs/s", raw_cycle())
        ours = jobqueue_like_peers(url, jobs, processes)
        add("jobqueue steady", "jobs/s", ours["steady"])
        add("jobqueue wall", "jobs/s", ours["wall"])
        for name in names:
            out = subprocess.run(
                [peers_python, "-m", "benchmarks.peers", name],
                capture_output=True,
                text=True,
                env=dict(os.environ, PEERS_JOBS=str(jobs), PEERS_PROCESSES=str(processes), PYTHONPATH=os.getcwd()),
            )
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if not lines:
                print(f"  {name}: not available ({out.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
                continue
            result = json.loads(lines[-1])
            label = result["peer"]
            add(f"{label} steady", "jobs/s", result["processing"]["steady"])
            add(f"{label} wall", "jobs/s", result["processing"]["wall"])
            add(f"{label} enqueue single", "jobs/s", result["enqueue_single"])
            add(f"{label} enqueue bulk", "jobs/s", result["enqueue_bulk"])
            add(f"{label} latency p50", "ms", result["latency_p50_ms"])
            add(f"{label} latency p99", "ms", result["latency_p99_ms"])
        print(f"  round {round_number + 1}/{runs} done", file=sys.stderr)
    ratios = {"jobqueue steady / raw cycle": ("jobqueue steady", "raw cycle")}
    for name in list(measures):
        if name.endswith(" steady") and not name.startswith("jobqueue"):
            ratios[f"jobqueue steady / {name}"] = ("jobqueue steady", name)
            ratios[f"jobqueue wall / {name[:-7]} wall"] = ("jobqueue wall", name[:-7] + " wall")
    return report(
        f"compare: {jobs} no-op jobs, {processes} processes",
        backend,
        list(measures.values()),
        ratios,
        {"jobs": jobs, "processes": processes},
        json_path,
    )


SCENARIOS["compare"] = compare

from benchmarks.operations import OPERATIONS  # noqa: E402

SCENARIOS.update(OPERATIONS)


def _spark(*args: Any) -> dict[str, Any]:
    from benchmarks.spark import spark_enqueue  # needs jobqueue[spark]

    return spark_enqueue(*args)


SCENARIOS["spark"] = _spark

from benchmarks.flow import flow  # noqa: E402

SCENARIOS["flow"] = flow

from benchmarks.topics import topics  # noqa: E402

SCENARIOS["topics"] = topics

from benchmarks.scale import scale  # noqa: E402

SCENARIOS["scale"] = scale
