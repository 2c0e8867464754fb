"""Topics: how fast messages are published, and how fast three consumer groups get through them
against a plain queue of the same jobs.

- publish: ``publish()`` one message at a time, and ``publish_many()`` in batches of 1,000, each
  message keyed (100 keys), to a topic with three groups (so each message is four rows);
- consume: ``jobs`` messages over 100 keys, consumed by three groups, against ``jobs`` ``noop`` jobs
  over 100 partition keys and ``jobs`` without keys, each by a worker of ``processes`` processes,
  timed from the first start to the last end (read from the archive).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from benchmarks.common import interleave, report, timed
from benchmarks.worker import BenchWorker, fresh_app, wait_until

KEYS = 100
GROUPS = ("billing", "email", "analytics")
SINGLE_PUBLISHES = 1000


def _groups(app: Any) -> None:
    for group in GROUPS:
        app.topic_store.register("bench-orders", group, "earliest")


def _messages(jobs: int) -> list[dict[str, Any]]:
    return [{"order": n, "key": f"c{n % KEYS}"} for n in range(jobs)]


def _archived_rate(app: Any, total: int) -> Callable[[], float]:
    a = app.tables.archive
    count = sa.select(sa.func.count()).select_from(a)

    def done() -> bool:
        with app.engine.connect() as conn:
            return conn.execute(count).scalar_one() >= total

    def rate() -> float:
        with app.engine.connect() as conn:
            first = conn.execute(sa.select(sa.func.min(a.c.last_attempt_at))).scalar_one()
            last = conn.execute(sa.select(sa.func.max(a.c.finished_at))).scalar_one()
        return total / max((last - first).total_seconds(), 1e-6)

    def run() -> float:
        wait_until(done, timeout=1800, interval=0.05)
        return rate()

    return run


def topics(url: str, backend: str, runs: int, jobs: int, processes: int, json_path: str | None) -> dict[str, Any]:
    def publish_many() -> float:
        app = fresh_app(url)
        _groups(app)
        messages = _messages(jobs)
        seconds = timed(lambda: app.topic("bench-orders").publish_many(messages, key=lambda m: m["key"]))
        app.close()
        return jobs / seconds

    def publish_one() -> float:
        app = fresh_app(url)
        _groups(app)
        topic = app.topic("bench-orders")
        messages = _messages(SINGLE_PUBLISHES)
        seconds = timed(lambda: [topic.publish(m, key=m["key"]) for m in messages])
        app.close()
        return SINGLE_PUBLISHES / seconds

    def consume(fill: Callable[[Any], int]) -> Callable[[], float]:
        def run() -> float:
            app = fresh_app(url)
            total = fill(app)
            app.close()
            worker = BenchWorker(url, "--concurrency", str(processes))
            try:
                rate = _archived_rate(app, total)()
            finally:
                worker.stop()
            app.close()
            return rate

        return run

    def groups_fill(app: Any) -> int:
        _groups(app)
        app.topic("bench-orders").publish_many(_messages(jobs), key=lambda m: m["key"])
        return len(GROUPS) * jobs

    def keyed_fill(app: Any) -> int:
        from benchmarks.tasks import noop

        for key in range(KEYS):
            noop.bulk([()] * (jobs // KEYS), partition_key=f"c{key}")
        return KEYS * (jobs // KEYS)

    def plain_fill(app: Any) -> int:
        from benchmarks.tasks import noop

        noop.bulk([()] * jobs)
        return jobs

    variants = {
        "publish_many, 3 groups": publish_many,
        "publish one by one, 3 groups": publish_one,
        "3 groups, 100 keys (deliveries)": consume(groups_fill),
        "plain queue, 100 partition keys": consume(keyed_fill),
        "plain queue, no keys": consume(plain_fill),
    }
    units = {name: "messages/s" if name.startswith("publish") else "jobs/s" for name in variants}
    measures = interleave(runs, variants, units)
    ratios = {
        "3 groups' deliveries / plain keyed jobs": (
            "3 groups, 100 keys (deliveries)",
            "plain queue, 100 partition keys",
        ),
        "3 groups' deliveries / plain jobs": ("3 groups, 100 keys (deliveries)", "plain queue, no keys"),
    }
    return report(
        f"topics: {jobs:,} messages to 3 groups, {processes} processes",
        backend,
        measures,
        ratios,
        {"jobs": jobs, "processes": processes, "keys": KEYS, "groups": len(GROUPS)},
        json_path,
    )
