"""Print the query plans of the acquire statements on a large backlog.

    python -m benchmarks.plans [--backend B ...] [--jobs N]

The backlog: ``N`` jobs without a key, ``N`` over 100 concurrency keys and ``N`` over 100
partition keys (default 100,000 each), statistics refreshed. The plans are those of a worker
serving one queue: the ready walk of the one-statement acquire of jobs without a key, then the
flow acquire's statements that read (which keys have ready jobs; the next jobs of a partition and
of a concurrency key) and, where the database takes partitions' runs in one statement, that one.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.common import BACKENDS, database_url
from benchmarks.worker import fresh_app
from jobqueue.clock import utcnow
from jobqueue.storage.dialects.common import AcquireParams, LeaseClock
from jobqueue.storage.dialects.flow import FlowAcquirer

KEYS = 100


def fill(backend: str, jobs: int) -> Any:
    from benchmarks.tasks import keyed, noop

    app = fresh_app(database_url(backend))
    noop.bulk([()] * jobs)
    keyed.bulk([(n % KEYS,) for n in range(jobs)])
    for key in range(KEYS):
        noop.bulk([()] * (jobs // KEYS), partition_key=f"p{key}")
    with app.engine.begin() as conn:
        for table in ("message", "flow"):
            name = f"{app.settings.table_prefix}{table}"
            conn.exec_driver_sql({"postgresql": "ANALYZE ", "mysql": "ANALYZE TABLE "}.get(backend, "ANALYZE ") + name)
    return app


def explain(app: Any, backend: str, statement: Any, binds: dict[str, Any]) -> list[str]:
    compiled = statement.compile(dialect=app.engine.dialect)
    state = compiled.construct_expanded_state(compiled.construct_params(binds))
    values: Any = state.parameters
    if state.positiontup:  # SQLite's "?" parameters
        values = tuple(values[name] for name in state.positiontup)
    prefix = {"postgresql": "EXPLAIN (COSTS OFF) ", "mysql": "EXPLAIN "}.get(backend, "EXPLAIN QUERY PLAN ")
    with app.engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        if backend == "postgresql":  # the planner settings of the worker's connections
            cursor.execute(
                "SET enable_seqscan = off; SET enable_sort = off; SET enable_bitmapscan = off; SET jit = off"
            )
        cursor.execute(prefix + state.statement, values)
        rows = cursor.fetchall()
        cursor.close()
    if backend == "postgresql":
        return [row[0] for row in rows]
    if backend == "mysql":
        return ["id select_type table type key rows Extra"] + [
            f"{r[0]} {r[1]} {r[2]} {r[3]} {r[5]} {r[8]} {r[9] or ''}" for r in rows
        ]
    return [f"{row[0]} {row[1]} {row[3]}" for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plans", description=__doc__)
    parser.add_argument("--backend", action="append", choices=BACKENDS)
    parser.add_argument("--jobs", type=int, default=100_000)
    options = parser.parse_args()
    for backend in options.backend or BACKENDS:
        app = fill(backend, options.jobs)
        dialect = app.store.dialect
        params = AcquireParams("w" * 32, 1, ("default",), 100, utcnow(), LeaseClock(utcnow(), 30.0))
        binds = params.binds()
        flow = FlowAcquirer(dialect, params.shape)
        two = {"key0": "partition:p7", "share0": 50, "key1": "k8", "share1": 50}
        statements = {
            "acquire, jobs without a key (the ready walk of its one statement)": (
                dialect.ready_select([dialect.message.c.id], True, True),
                binds,
            ),
            "flow acquire: the keys with ready jobs": (flow.keys, binds),
            "flow acquire: the next jobs of a partition and of a concurrency key": (
                flow.candidates(1, 1),
                {**binds, **two},
            )
            if flow.lateral is None
            else (
                flow.lateral,
                {**binds, "partition_keys": ["partition:p7"], "other_keys": ["k8"], "share": 50, "partition_share": 51},
            ),
        }
        if flow.runs is not None:
            runs = {
                "partition_keys": ["partition:p7", "partition:p8"],
                "share": 50,
                "partition_share": 51,
                "served": utcnow(),
            }
            statements["flow acquire: the runs of two partitions, chosen and taken"] = (flow.runs, {**binds, **runs})
        print(f"\n# {backend}, {options.jobs:,} jobs of each kind")
        for title, (statement, values) in statements.items():
            print(f"\n## {title}\n")
            print("\n".join(explain(app, backend, statement, values)))
        app.close()


if __name__ == "__main__":
    main()
