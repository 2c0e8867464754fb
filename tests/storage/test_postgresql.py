"""What only PostgreSQL does: a prepared acquire, and plans that stay on the ready index."""

from __future__ import annotations

import itertools
import re

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.storage.dialects import AcquireParams, LeaseClock
from jobqueue.storage.dialects.postgresql_sql import Prepared, build_apply_outcomes, outcome_binds
from tests.conftest import only
from tests.storage.test_store import LEASE, WORKER, outcome, rows


def _forget_prepared(app: JobQueue) -> None:
    """Make the server forget its prepared statements while we think they are prepared. Acquires
    one at a time reuse the one pooled connection, so it is the one they prepared on."""
    app.store.dialect.run_on_driver(lambda cursor, info: cursor.execute("DEALLOCATE ALL"), "DEALLOCATE ALL")


@only("postgresql")
def test_prepared_acquire_survives_a_server_that_forgets_it(app: JobQueue, add, caplog) -> None:
    """As behind a pooler in transaction mode: a missing prepared statement costs a retry, never a job."""
    add.bulk([(1, 1)] * 10)

    def take(limit: int) -> list[int]:
        return [m.id for m in app.store.acquire(WORKER, None, limit, LEASE)]

    taken = take(1)
    for _ in range(6):  # a miss re-prepares on the next call, so every other call misses
        _forget_prepared(app)
        taken += take(1)
    assert len(taken) == len(set(taken)) == 7
    assert "runs its statements unprepared" in caplog.text
    taken += take(10)  # plain from now on
    assert sorted(taken) == [r["id"] for r in rows(app)]


@only("postgresql")
def test_prepared_acquire_when_our_bookkeeping_is_lost(app: JobQueue, add) -> None:
    add.bulk([(1, 1)] * 3)
    assert len(app.store.acquire(WORKER, None, 1, LEASE)) == 1
    # The statement is still prepared on the server: PREPARE fails as a duplicate.
    app.store.dialect.run_on_driver(lambda cursor, info: info.clear(), "forget")
    assert len(app.store.acquire(WORKER, None, 5, LEASE)) == 2


@only("postgresql")
def test_prepared_acquire_keeps_the_ordered_index_walk(app: JobQueue, add) -> None:
    """PostgreSQL may switch a prepared statement to its generic plan: that must walk a ready index
    too, and the walk of one priority level must not sort either."""
    add.bulk([(1, 1)] * 20, queue="a")
    for queues, level in itertools.product((None, ("a",), ("a", "b")), (None, 0)):
        now = utcnow()
        params = AcquireParams(WORKER, 1, queues, 1, now, LeaseClock(now, 1.0), level=level)
        dialect = app.store.dialect
        prepared = dialect._acquire_for(params.statement)  # type: ignore[attr-defined]
        own = app.store.dialect.checkout()
        cursor = own.cursor()
        binds = params.binds()
        cursor.execute("BEGIN")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(prepared.prepare.replace(prepared.name, "jobqueue_test_plan", 1))
        cursor.execute(
            "EXPLAIN " + prepared.execute.replace(prepared.name, "jobqueue_test_plan", 1),
            [{**prepared.defaults, **binds}[n] for n in prepared.names],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK")
        cursor.execute("DEALLOCATE jobqueue_test_plan")  # prepared statements outlive transactions
        own.close()
        assert "Index Scan using ix_jobqueue_message_ready" in plan and "Sort" not in plan, plan


@only("postgresql")
def test_a_flush_finds_its_rows_by_id_however_many_are_processing(app: JobQueue, add) -> None:
    """Statistics taken while few rows were PROCESSING must not have a flush walk all of them."""
    add.bulk([(1, 1)] * 3000)
    with app.engine.begin() as conn:
        conn.exec_driver_sql(f"ANALYZE {app.tables.message.name}")  # nothing PROCESSING yet
    taken = app.store.acquire(WORKER, None, 3000, LEASE)
    prepared = Prepared.compile(build_apply_outcomes(app.tables.message, app.tables.archive))
    binds = {**prepared.defaults, **outcome_binds([outcome(m) for m in taken[:20]], utcnow())}
    own = app.store.dialect.checkout()
    cursor = own.cursor()
    cursor.execute("BEGIN")
    # The plan of a prepared flush after its first executions: generic, whatever the values.
    cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    cursor.execute(prepared.prepare.replace(prepared.name, "jobqueue_test_flush", 1))
    execute = prepared.execute.replace(prepared.name, "jobqueue_test_flush", 1)
    cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + execute, [binds[n] for n in prepared.names])
    plan = "\n".join(row[0] for row in cursor.fetchall())
    cursor.execute("ROLLBACK")
    cursor.execute("DEALLOCATE jobqueue_test_flush")
    own.close()
    assert "message_lease" not in plan and "Index Scan using jobqueue_message_pkey" in plan, plan
    assert "rows=20 loops=1" in plan.split("Delete on")[1], plan
    # Each scan of the primary key reads the flushed rows only, never a walk of the whole table
    # (which the planner chose, joined by hash, when it thought few rows were PROCESSING).
    for read, loops in re.findall(r"Index Scan using jobqueue_message_pkey .*?rows=(\d+) loops=(\d+)", plan):
        assert int(read) * int(loops) <= 20, plan


@only("postgresql")
def test_prepared_flush_survives_a_server_that_forgets_it(app: JobQueue, add) -> None:
    """As behind a pooler in transaction mode: a missing prepared flush is run again, unprepared."""
    add.bulk([(1, 1)] * 8)
    taken = app.store.acquire(WORKER, None, 8, LEASE)
    applied = []
    for pair in zip(taken[::2], taken[1::2], strict=True):
        for _ in range(3):  # the driver's pool hands back the connection it just had: forget there
            own = app.store.dialect.checkout()
            own.cursor().execute("DEALLOCATE ALL")
            own.close()
        applied += app.store.flush([outcome(m) for m in pair]).applied
    assert len(applied) == 8 and rows(app) == []
    assert app.store.dialect._prepared_flush.misses.count == 2  # type: ignore[attr-defined]  # every other flush


@only("postgresql")
def test_binary_copy_stores_each_kind_of_column_as_an_insert_does(app: JobQueue) -> None:
    from datetime import datetime, timedelta, timezone

    from jobqueue.job import Batch

    common = {
        "task_name": "t.é",
        "queue": "q\ttab",
        "priority": -3,
        "state": "PENDING",
        "headers": {"h": "ü\n"},
        "partition_key": "p\\x",
        "flow_key": None,
        "concurrency_limit": 2,
        "rate_interval_us": 2**40,
        "options": {"retry": [1, 2.5]},
        "attempts_count": 0,
        "deliveries_count": 0,
        "created_at": datetime(2026, 1, 2, 3, 4, 5, 678901),
        # An aware time is stored in UTC, as every other path stores it.
        "next_attempt_at": datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=timezone(timedelta(hours=-5))),
    }
    dialect = app.store.dialect
    payloads = [b"\x00\xff\\x", b""]
    copied = dialect.bulk(Batch(common, payloads, [None, None]), 1000)
    with app.engine.begin() as conn:  # in a transaction of the caller's: the same COPY
        copied += dialect.insert_batch(conn, Batch(common, payloads, [None, None]))
    stored = rows(app)
    assert [r["id"] for r in stored] == copied
    assert [r["payload"] for r in stored] == payloads * 2
    expected = {**common, "next_attempt_at": datetime(2000, 1, 1, 4, 59, 59, 1)}
    for r in stored:
        assert {column: r[column] for column in common} == expected
