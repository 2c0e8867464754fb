"""Flow control's cost: keyed jobs against the same jobs without keys, on a small and a big backlog.

Each variant enqueues a backlog, starts a worker, and measures how fast its first ``jobs`` jobs are
processed (from the first start to the ``jobs``-th end, read from the archive), so a backlog of a
million costs only its enqueueing, not its processing.

- no keys: ``noop`` jobs;
- partition keys: ``noop`` jobs over 100 partition keys, enqueued key after key in turns of a
  hundredth of a key's jobs (at least 10), as jobs of many customers arrive interleaved;
- concurrency keys: ``keyed`` jobs over 100 concurrency keys (no limit: the keys take turns).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from benchmarks.common import interleave, report
from benchmarks.worker import BenchWorker, fresh_app, wait_until

KEYS = 100
BIG_BACKLOG = 100  # times ``jobs``


def _plain(app: Any, backlog: int) -> None:
    from benchmarks.tasks import noop

    noop.bulk([()] * backlog)


def _partitioned(app: Any, backlog: int) -> None:
    from benchmarks.tasks import noop

    turn = max(10, backlog // (KEYS * 100))
    for _ in range(0, backlog, turn * KEYS):
        for key in range(KEYS):
            noop.bulk([()] * turn, partition_key=f"p{key}")


def _keyed(app: Any, backlog: int) -> None:
    from benchmarks.tasks import keyed

    keyed.bulk([(n % KEYS,) for n in range(backlog)])


def first_done_rate(app: Any, jobs: int) -> Callable[[], bool]:
    a = app.tables.archive
    count = sa.select(sa.func.count()).select_from(a)

    def check() -> bool:
        with app.engine.connect() as conn:
            return conn.execute(count).scalar_one() >= jobs

    return check


def rate_of_first(app: Any, jobs: int) -> float:
    """Jobs per second from the first start to the ``jobs``-th end."""
    a = app.tables.archive
    with app.engine.connect() as conn:
        first = conn.execute(sa.select(sa.func.min(a.c.last_attempt_at))).scalar_one()
        last = conn.execute(sa.select(a.c.finished_at).order_by(a.c.finished_at).offset(jobs - 1).limit(1)).scalar_one()
    return jobs / max((last - first).total_seconds(), 1e-6)


def flow(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    """The first ``jobs`` of a backlog of ``jobs`` and of ``100 * jobs``, with and without keys."""

    def variant(fill: Callable[[Any, int], None], backlog: int) -> Callable[[], float]:
        def run() -> float:
            app = fresh_app(url)
            fill(app, backlog)
            app.close()
            worker = BenchWorker(url, "--concurrency", str(processes))
            try:
                wait_until(first_done_rate(app, jobs), timeout=1800, interval=0.05)
            finally:
                worker.stop()
            rate = rate_of_first(app, jobs)
            app.close()
            return rate

        return run

    big = jobs * BIG_BACKLOG
    kinds = {"no keys": _plain, "100 partition keys": _partitioned, "100 concurrency keys": _keyed}
    variants: dict[str, Callable[[], float]] = {}
    for kind, fill in kinds.items():
        variants[f"{kind}, backlog {jobs:,}"] = variant(fill, jobs)
    for kind, fill in kinds.items():
        variants[f"{kind}, backlog {big:,}"] = variant(fill, big)
    measures = interleave(runs, variants, units=dict.fromkeys(variants, "jobs/s"))
    ratios = {}
    for kind in list(kinds)[1:]:
        ratios[f"{kind} / no keys, backlog {jobs:,}"] = (f"{kind}, backlog {jobs:,}", f"no keys, backlog {jobs:,}")
    for kind in kinds:
        ratios[f"{kind}: backlog {big:,} / {jobs:,}"] = (f"{kind}, backlog {big:,}", f"{kind}, backlog {jobs:,}")
    return report(
        f"flow control: the first {jobs:,} jobs of a backlog, {processes} processes",
        backend,
        measures,
        ratios,
        {"jobs": jobs, "processes": processes, "keys": KEYS},
        json_path,
    )
