"""The storage contract: the same behaviour on SQLite, PostgreSQL and MariaDB, against real servers."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobqueue import JobQueue, SerializationError
from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError, CorruptMessage
from jobqueue.job import ErrorInfo, Message, MessageState, Outcome, OutcomeKind
from jobqueue.storage import jobs, store_acquire
from jobqueue.storage.dialects.due import PRIORITY_LEVELS_PROBED
from tests.conftest import only

WORKER = "w" * 32
LEASE = 30.0


def rows(app: JobQueue, table: str = "message") -> list[dict]:
    t = getattr(app.tables, table)
    with app.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(t).order_by(t.c.id)).mappings()]


def outcome(
    message: Message, kind: OutcomeKind = OutcomeKind.ARCHIVE, state: MessageState = MessageState.COMPLETED, **extra
) -> Outcome:
    return Outcome(
        message=message,
        kind=kind,
        state=state,
        finished_at=utcnow(),
        started_at=utcnow(),
        checkpoint=message.checkpoint,
        **extra,
    )


def test_enqueue_returns_ids_in_order_and_writes_rows(app: JobQueue, add) -> None:
    single = add.delay(1, 2)
    many = add.bulk([(i, i) for i in range(2500)], batch_size=1000)
    ids = [single.id] + [h.id for h in many]
    assert ids == sorted(ids) and len(set(ids)) == 2501
    stored = rows(app)
    assert [r["id"] for r in stored] == ids
    assert {r["state"] for r in stored} == {"PENDING"}
    assert stored[0]["task_name"] == "t.add" and stored[0]["queue"] == "default"
    # bulk keeps input order: item i was (i, i)
    payload = app.serializer.loads(stored[5]["payload"])
    assert payload == [[4, 4], {}]


def test_enqueue_options_are_stored(app: JobQueue, add) -> None:
    when = datetime(2030, 5, 6, 7, 8, 9, 123456)
    h = add.apply_async((1, 2), eta=when, queue="other", priority=7, headers={"trace": "abc"}, partition_key="p1")
    (row,) = rows(app)
    assert row["id"] == h.id
    assert (row["queue"], row["priority"], row["headers"], row["partition_key"]) == ("other", 7, {"trace": "abc"}, "p1")
    assert row["next_attempt_at"] == when  # microseconds survive on every backend
    assert h.status() == "pending"


def test_bulk_stores_the_same_rows_as_apply_async(app: JobQueue, add) -> None:
    # bulk() writes the values its rows share through each database's own fast path (COPY,
    # session variables, one shared tuple): the rows must equal what apply_async writes.
    when = datetime(2030, 5, 6, 7, 8, 9, 123456)
    options = dict(eta=when, queue="other", priority=-3, headers={"trace": "a%s'b\"", "n": [1, 2]}, partition_key="p'1")
    single = add.apply_async((1, 2), **options)
    many = add.bulk([(1, 2), (3, 4)], **options)
    stored = rows(app)
    assert [r["id"] for r in stored] == [single.id] + [h.id for h in many]
    ignore = {"id", "payload", "created_at"}
    first = {k: v for k, v in stored[0].items() if k not in ignore}
    for row in stored[1:]:
        assert {k: v for k, v in row.items() if k not in ignore} == first
    assert first["headers"] == {"trace": "a%s'b\"", "n": [1, 2]} and first["next_attempt_at"] == when
    assert app.serializer.loads(stored[2]["payload"]) == [[3, 4], {}]


def test_bulk_of_many_batches_keeps_order_and_a_bad_item_writes_nothing(app: JobQueue, add) -> None:
    # PostgreSQL streams the whole bulk in one COPY, serializing items as the server reads the rows
    # before them: a bad item far in must still leave nothing behind and name itself.
    items = [(i, i) for i in range(2500)]
    handles = add.bulk(items, batch_size=1000)
    stored = rows(app)
    assert [r["id"] for r in stored] == [h.id for h in handles] and len(handles) == 2500
    assert [app.serializer.loads(r["payload"])[0] for r in stored] == [list(item) for item in items]
    before = len(stored)
    with pytest.raises(SerializationError, match="item 2100"):
        add.bulk(items[:2100] + [(object(), 1)] + items[:10], batch_size=1000)
    with pytest.raises(SerializationError, match="bulk item 1500 is a str"):
        add.bulk(items[:1500] + ["not a tuple"], batch_size=1000)
    assert len(rows(app)) == before


def test_unique_key_returns_the_active_job(app: JobQueue, add) -> None:
    first = add.apply_async((1, 1), unique_key="k1")
    again = add.apply_async((2, 2), unique_key="k1")
    other = add.apply_async((3, 3), unique_key="k2")
    assert again.id == first.id and other.id != first.id
    assert len(rows(app)) == 2
    # The caller can tell the job it found from one it added, as Oban's unique conflict says.
    assert (first.existing, again.existing, other.existing) == (False, True, False)


def test_unique_keys_are_compared_exactly_on_every_database(app: JobQueue, add) -> None:
    """Keys that differ in case, accents, emoji or trailing spaces are different jobs, on MariaDB
    too: its default collation would take each for the first and drop the job."""
    keys = ["order-1", "Order-1", "order-1 ", "café", "cafe", "😀", "😁"]
    handles = [add.apply_async((n, n), unique_key=key) for n, key in enumerate(keys)]
    assert len({h.id for h in handles}) == len(keys) and not any(h.existing for h in handles)
    assert [add.apply_async((0, 0), unique_key=key).id for key in keys] == [h.id for h in handles]
    assert len(rows(app)) == len(keys)


def test_handles_say_which_unique_keys_found_an_active_job(app: JobQueue, add) -> None:
    held = add.apply_async((0, 0), unique_key="held")
    handles = add.bulk([(1, 1), (2, 2), (1, 1), (3, 3)], unique_key=["held", "new", "new", None], batch_size=2)
    assert [h.existing for h in handles] == [True, False, True, False]
    assert handles[0].id == held.id and handles[2].id == handles[1].id
    with app.engine.begin() as conn:  # in the caller's transaction too
        inside = add.apply_async((1, 1), unique_key="new", connection=conn)
        fresh = add.apply_async((1, 1), unique_key="fresh", connection=conn)
    assert (inside.id, inside.existing, fresh.existing) == (handles[1].id, True, False)


def test_a_unique_key_another_transaction_took_is_found_from_the_callers_older_snapshot(app: JobQueue, add) -> None:
    """The caller's own engine (REPEATABLE READ, MySQL's default) read before another transaction
    enqueued the key and committed: the insert met that job, the read of it saw the caller's older
    snapshot, and the enqueue failed with a bare RuntimeError after 10 tries."""
    engine = sa.create_engine(app.engine.url)  # not jobqueue's engine, which reads committed rows
    try:
        with engine.begin() as conn:
            conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar()  # the snapshot
            other = add.apply_async((1, 1), unique_key="taken")  # committed meanwhile
            mine = add.apply_async((2, 2), unique_key="taken", connection=conn)
        assert (mine.id, mine.existing) == (other.id, True)
        assert len(rows(app)) == 1
    finally:
        engine.dispose()


def test_unique_key_is_race_free_under_concurrent_enqueues(app: JobQueue, add) -> None:
    barrier = threading.Barrier(20)
    results: list[int] = []
    added: list[bool] = []
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            barrier.wait()
            handle = add.apply_async((1, 1), unique_key="same")
            results.append(handle.id)
            added.append(not handle.existing)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert len(rows(app)) == 1
    assert sum(added) == 1  # one call added the job, the other 19 found it


def test_acquire_order_priority_then_due_time_then_id(app: JobQueue, add) -> None:
    now = utcnow()
    low = add.apply_async((0, 0), priority=0)
    high = add.apply_async((0, 0), priority=9)
    older = add.apply_async((0, 0), priority=0, eta=now - timedelta(minutes=5))
    future = add.apply_async((0, 0), priority=100, eta=now + timedelta(hours=1))
    got = app.store.acquire(WORKER, None, 10, LEASE, now=now + timedelta(seconds=1))
    assert [m.id for m in got] == [high.id, older.id, low.id]
    assert future.id not in [m.id for m in got]


def test_acquire_marks_processing_and_counts(app: JobQueue, add) -> None:
    h = add.delay(1, 2)
    now = utcnow()
    (m,) = app.store.acquire(WORKER, None, 5, LEASE, now=now)
    assert (m.id, m.attempts_count, m.deliveries_count) == (h.id, 1, 1)
    assert m.first_attempt_at == now and m.lease_token > 0
    (row,) = rows(app)
    assert row["state"] == "PROCESSING" and row["worker_id"] == WORKER
    assert row["lease_token"] == m.lease_token
    assert row["lease_expires_at"] == now + timedelta(seconds=LEASE)
    assert app.store.acquire(WORKER, None, 5, LEASE, now=now) == []  # nothing twice


def test_a_counter_at_its_largest_value_does_not_fail_the_fetch(app: JobQueue, add) -> None:
    """A row whose counters were set to the largest 32-bit integer (by hand, by a bad migration)
    is fetched with the others, its counters kept there, rather than failing every fetch."""
    largest = 2**31 - 1
    before = add.delay(1, 1)
    bad = add.delay(2, 2)
    keyed = add.apply_async((3, 3), partition_key="acct-1")
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(
            sa.update(m).where(m.c.id.in_([bad.id, keyed.id])).values(attempts_count=largest, deliveries_count=largest)
        )
    taken = {msg.id: msg for msg in app.store.acquire(WORKER, None, 5, LEASE, flow=True)}
    taken.update({msg.id: msg for msg in app.store.acquire(WORKER, None, 5, LEASE, flow=True)})
    assert set(taken) == {before.id, bad.id, keyed.id}
    assert (taken[before.id].attempts_count, taken[before.id].deliveries_count) == (1, 1)
    for job in (bad, keyed):
        assert (taken[job.id].attempts_count, taken[job.id].deliveries_count) == (largest, largest)
    stored = {row["id"]: row for row in rows(app)}
    assert (stored[bad.id]["attempts_count"], stored[bad.id]["deliveries_count"]) == (largest, largest)
    app.store.flush([outcome(msg) for msg in taken.values()])
    assert {row["id"] for row in rows(app, "archive")} == set(taken)


def test_a_state_edited_by_hand_is_named_with_the_fix(app: JobQueue, add) -> None:
    bad, good = add.delay(1, 1), add.delay(2, 2)
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == bad.id).values(state="BOGUS"))
    with pytest.raises(CorruptMessage, match=f"job {bad.id} has the state 'BOGUS'.*set it to PENDING"):
        bad.status()
    assert good.status() == "pending"


def test_acquire_respects_queues_and_limit(app: JobQueue, add) -> None:
    for queue in ("a", "b", "c"):
        add.bulk([(1, 1)] * 3, queue=queue)
    got = app.store.acquire(WORKER, ("a", "c"), 4, LEASE)
    assert len(got) == 4 and {m.queue for m in got} <= {"a", "c"}
    got += app.store.acquire(WORKER, ("a", "c"), 10, LEASE)
    assert len(got) == 6
    assert {m.queue for m in app.store.acquire(WORKER, None, 10, LEASE)} == {"b"}
    add.bulk([(1, 1)] * 2, queue="a")
    add.bulk([(1, 1)] * 2, queue="b")
    assert [m.queue for m in app.store.acquire(WORKER, ("b",), 10, LEASE)] == ["b", "b"]


@pytest.mark.parametrize("by_level", [False, True], ids=["one walk", "level by level"])
def test_due_jobs_behind_a_backlog_due_later_are_taken_in_delivery_order(
    app: JobQueue, add, monkeypatch: pytest.MonkeyPatch, by_level: bool
) -> None:
    """Behind a backlog due later, acquire goes priority level by level once a walk of the ready
    index was slow to come back short; either way it takes what is due in delivery order."""
    now = utcnow()
    later = now + timedelta(hours=1)
    add.bulk([(0, 0)] * 300, eta=later)
    add.bulk([(0, 0)] * 50, eta=later, priority=7)
    add.bulk([(0, 0)] * 20, eta=later, priority=-3, queue="b")
    if by_level:
        monkeypatch.setattr(store_acquire, "LEVELS_AFTER_SECONDS", -1.0)  # every short walk is slow
        assert app.store.acquire(WORKER, ("nothing here",), 5, LEASE, flow=True) == []
        assert app.store._by_level_until > time.monotonic()
    d1 = add.apply_async((1, 0), priority=7)
    d2 = add.apply_async((2, 0), eta=now - timedelta(seconds=10))
    d3 = add.apply_async((3, 0))
    d4 = add.apply_async((4, 0), priority=-3, queue="b")
    d5 = add.apply_async((5, 0), priority=2, queue="c")
    at = utcnow() + timedelta(seconds=1)
    ids = [m.id for m in app.store.acquire(WORKER, None, 3, LEASE, now=at, flow=True)]
    ids += [m.id for m in app.store.acquire(WORKER, None, 10, LEASE, now=at, flow=True)]
    assert ids == [d1.id, d5.id, d2.id, d3.id, d4.id]
    assert app.store.acquire(WORKER, None, 10, LEASE, now=at, flow=True) == []
    e1, e2, e3 = (add.apply_async((6, 0), priority=p, queue=q) for p, q in ((-3, "b"), (9, "c"), (0, "a")))
    at = utcnow() + timedelta(seconds=1)
    assert [m.id for m in app.store.acquire(WORKER, ("b",), 10, LEASE, now=at, flow=True)] == [e1.id]
    assert [m.id for m in app.store.acquire(WORKER, ("a", "c"), 10, LEASE, now=at, flow=True)] == [e2.id, e3.id]
    # Whether anything is due, as an idle supervisor asks every second: on the same indexes.
    at = utcnow() + timedelta(seconds=1)
    for queues in (None, ("b",), ("a", "b"), ("default",)):
        assert not app.store.has_ready(queues, at)
    late = add.apply_async((7, 0), priority=-5, queue="b")
    at = utcnow() + timedelta(seconds=1)
    assert [app.store.has_ready(q, at) for q in (None, ("b",), ("a", "b"), ("c",))] == [True, True, True, False]
    assert [m.id for m in app.store.acquire(WORKER, None, 10, LEASE, now=at, flow=True)] == [late.id]
    keyed = add.apply_async((8, 0), partition_key="acct-1", queue="c")
    at = utcnow() + timedelta(seconds=1)
    assert [app.store.has_ready(q, at) for q in (None, ("c",), ("b",))] == [True, True, False]
    assert [m.id for m in app.store.acquire(WORKER, ("c",), 10, LEASE, now=at, flow=True)] == [keyed.id]


def test_a_due_job_below_many_priority_levels_due_later_is_found(
    app: JobQueue, add, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More priority levels than are probed one by one: one walk of them all answers instead."""
    later = utcnow() + timedelta(hours=1)
    levels = PRIORITY_LEVELS_PROBED + 8
    for level in range(levels):
        add.bulk([(0, 0)] * 3, eta=later, priority=level)
    monkeypatch.setattr(store_acquire, "LEVELS_AFTER_SECONDS", -1.0)
    assert app.store.acquire(WORKER, None, 5, LEASE) == []
    assert not app.store.has_ready(None, utcnow())
    low = add.apply_async((1, 1), priority=-1)
    high = add.apply_async((2, 2), priority=levels + 1)
    at = utcnow() + timedelta(seconds=1)
    assert app.store.has_ready(None, at)
    assert [m.id for m in app.store.acquire(WORKER, None, 5, LEASE, now=at)] == [high.id, low.id]


@pytest.mark.parametrize("question", ["due now", "work before the burst horizon"])
def test_asking_whether_anything_is_due_reads_no_backlog_due_later(
    app: JobQueue, add, backend: str, question: str
) -> None:
    """An idle supervisor asks every second whether anything is due, and a --burst one four times
    a second whether anything runs or comes due within 5 s: over a backlog due later, each of
    their statements reads an index range, never the whole message table."""
    later = utcnow() + timedelta(hours=1)
    for priority in (0, 5):
        add.bulk([(0, 0)] * 5000, eta=later, priority=priority)
        add.bulk([(0, 0)] * 500, eta=later, priority=priority, queue="b")
    for key in range(10):  # due, but behind their partition's oldest, which is due later
        add.apply_async((0, 0), partition_key=f"acct-{key}", eta=later)
        add.bulk([(0, 0)] * 300, partition_key=f"acct-{key}")
    if backend != "sqlite":  # statistics, as autovacuum and InnoDB gather them on a real backlog
        with app.engine.begin() as conn:
            conn.exec_driver_sql(f"ANALYZE {'TABLE ' if backend == 'mysql' else ''}{app.tables.message.name}")
    with statements_read(app) as seen:
        for queues in (None, ("b",), ("b", "c")):
            if question == "due now":
                assert not app.store.has_ready(queues, utcnow())
            else:
                assert not app.store.has_work(queues, utcnow() + timedelta(seconds=5))
    each_reads_a_range(app, backend, seen)


@pytest.mark.parametrize("question", ["due now", "work before the burst horizon"])
def test_asking_whether_a_queue_has_work_reads_no_other_queues_ready_backlog(
    app: JobQueue, add, backend: str, question: str
) -> None:
    """A worker of one queue beside another queue's ready backlog: on MariaDB its supervisor's
    check walked every due job of the other queue (0.3 s over 200,000 of them, every 50 ms)."""
    add.bulk([(0, 0)] * 5000, queue="backlog")
    if backend != "sqlite":  # statistics, as autovacuum and InnoDB gather them on a real backlog
        with app.engine.begin() as conn:
            conn.exec_driver_sql(f"ANALYZE {'TABLE ' if backend == 'mysql' else ''}{app.tables.message.name}")
    with statements_read(app) as seen:
        for queues in (("live",), ("live", "other")):
            if question == "due now":
                assert not app.store.has_ready(queues, utcnow())
            else:
                assert not app.store.has_work(queues, utcnow() + timedelta(seconds=5))
    each_reads_a_range(app, backend, seen)


@contextmanager
def statements_read(app: JobQueue) -> Iterator[list[tuple[str, Any]]]:
    """The SELECT statements run on the app's engine meanwhile, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    sa.event.listen(app.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", record)


def each_reads_a_range(app: JobQueue, backend: str, seen: list[tuple[str, Any]]) -> None:
    """Each statement ``seen`` reads a range of an index, never the whole message table (MySQL:
    fewer than 100 index entries, counted, having no partial indexes)."""
    assert seen
    explain = {"sqlite": "EXPLAIN QUERY PLAN ", "postgresql": "EXPLAIN "}.get(backend, "EXPLAIN ")
    table = app.tables.message.name
    walked = "'Handler_read_next', 'Handler_read_prev', 'Handler_read_rnd_next'"
    entries = (
        f"SELECT SUM(VARIABLE_VALUE) FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME IN ({walked.upper()})"
    )
    with app.engine.connect() as conn:
        for statement, parameters in seen:
            if backend == "mysql":
                before = int(conn.exec_driver_sql(entries).scalar_one())
                conn.exec_driver_sql(statement, parameters).all()
                assert int(conn.exec_driver_sql(entries).scalar_one()) - before < 100, statement
                continue
            plan = [" ".join(str(v) for v in row) for row in conn.exec_driver_sql(explain + statement, parameters)]
            text = "\n".join(plan)
            if backend == "sqlite":
                assert f"SCAN {table}\n" not in text + "\n", text
            else:
                assert f"Seq Scan on {table}" not in text, f"{statement}\n{text}"


def test_concurrent_acquirers_never_share_a_message(app: JobQueue, add) -> None:
    add.bulk([(i, i) for i in range(600)])
    seen: list[list[int]] = [[] for _ in range(4)]

    def take(slot: int) -> None:
        while True:
            got = app.store.acquire(f"worker{slot}".ljust(32, "x"), None, 25, LEASE)
            if not got:
                return
            seen[slot].extend(m.id for m in got)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for ids in seen for i in ids]
    assert len(everything) == 600 and len(set(everything)) == 600


def test_flush_archives_completed_and_failed_in_one_go(app: JobQueue, add) -> None:
    add.bulk([(1, 1), (2, 2)])
    done, failed = app.store.acquire(WORKER, None, 5, LEASE)
    ok = outcome(done, result=app.serializer.dumps(3))
    bad = outcome(failed, state=MessageState.FAILED, error=ErrorInfo("ValueError", "boom", "Traceback..."))
    result = app.store.flush([ok, bad])
    assert len(result.applied) == 2 and not result.lost
    assert rows(app) == []
    archived = {r["id"]: r for r in rows(app, "archive")}
    assert archived[done.id]["state"] == "COMPLETED" and archived[done.id]["result"] == b"3"
    assert archived[failed.id]["state"] == "FAILED"
    assert (archived[failed.id]["error_type"], archived[failed.id]["error_message"]) == ("ValueError", "boom")
    assert archived[failed.id]["error_traceback"] == "Traceback..."
    assert archived[done.id]["attempts_count"] == 1 and archived[done.id]["payload"] == done.payload


def test_flush_retry_resets_deliveries_and_keeps_attempts(app: JobQueue, add) -> None:
    add.delay(1, 1)
    (m,) = app.store.acquire(WORKER, None, 5, LEASE)
    later = utcnow() + timedelta(minutes=1)
    app.store.flush(
        [
            outcome(
                m,
                kind=OutcomeKind.RETRY,
                state=MessageState.RETRYABLE,
                next_attempt_at=later,
                error=ErrorInfo("IOError", "try again"),
            )
        ]
    )
    (row,) = rows(app)
    assert row["state"] == "RETRYABLE" and row["next_attempt_at"] == later
    assert (row["attempts_count"], row["deliveries_count"]) == (1, 0)
    assert row["worker_id"] is None and row["lease_token"] is None
    assert row["last_error_type"] == "IOError"
    assert app.store.acquire(WORKER, None, 5, LEASE) == []  # not due yet
    (again,) = app.store.acquire(WORKER, None, 5, LEASE, now=later)
    assert (again.attempts_count, again.deliveries_count) == (2, 1)


def test_handing_back_unstarted_uncounts_the_delivery(app: JobQueue, add) -> None:
    add.delay(1, 1)
    (m,) = app.store.acquire(WORKER, None, 5, LEASE)
    app.store.flush([outcome(m, kind=OutcomeKind.RETURN, state=MessageState.PENDING)])
    (row,) = rows(app)
    assert (row["state"], row["attempts_count"], row["deliveries_count"]) == ("PENDING", 0, 0)


def test_fencing_drops_outcomes_of_a_lost_lease(app: JobQueue, add) -> None:
    add.delay(1, 1)
    now = utcnow()
    (first,) = app.store.acquire(WORKER, None, 5, 1.0, now=now)
    assert app.store.release_expired(now=now + timedelta(seconds=2)) == 1
    (second,) = app.store.acquire("other".ljust(32, "x"), None, 5, LEASE, now=now + timedelta(seconds=3))
    assert second.id == first.id and second.lease_token != first.lease_token
    assert second.deliveries_count == 2  # the expired delivery stays counted
    # The first delivery's late ack is rejected: nothing archived, the second still holds it.
    late = app.store.flush([outcome(first, result=b"1")])
    assert late.lost and not late.applied
    assert rows(app, "archive") == [] and rows(app)[0]["state"] == "PROCESSING"
    assert app.store.extend_lease(first.id, first.lease_token, 3600, now=now) is False
    assert app.store.save_checkpoint(first.id, first.lease_token, b"x") is False
    # The holder's ack applies, exactly once.
    assert app.store.flush([outcome(second, result=b"2")]).applied
    assert app.store.flush([outcome(second, result=b"2")]).lost
    assert [r["result"] for r in rows(app, "archive")] == [b"2"]


def test_same_message_twice_in_one_flush_only_the_current_token_applies(app: JobQueue, add) -> None:
    add.delay(1, 1)
    now = utcnow()
    (old,) = app.store.acquire(WORKER, None, 5, 1.0, now=now)
    app.store.release_expired(now=now + timedelta(seconds=2))
    (new,) = app.store.acquire(WORKER, None, 5, LEASE, now=now + timedelta(seconds=3))
    result = app.store.flush([outcome(old, result=b"old"), outcome(new, result=b"new")])
    assert [o.message.lease_token for o in result.applied] == [new.lease_token]
    assert [r["result"] for r in rows(app, "archive")] == [b"new"]


def test_heartbeat_renews_only_forward_and_only_its_own(app: JobQueue, add) -> None:
    add.bulk([(1, 1), (2, 2)])
    now = utcnow()
    (mine,) = app.store.acquire(WORKER, None, 1, 10.0, now=now)
    (theirs,) = app.store.acquire("other".ljust(32, "x"), None, 1, 10.0, now=now)
    assert app.store.extend_lease(mine.id, mine.lease_token, 3600, now=now)
    assert app.store.extend_lease(mine.id, mine.lease_token, 5, now=now)  # still held...
    assert app.store.heartbeat([WORKER], 30.0, now=now) == 0  # ...and neither shortens the extended lease
    leases = {r["id"]: r["lease_expires_at"] for r in rows(app)}
    assert leases[mine.id] == now + timedelta(hours=1) and leases[theirs.id] == now + timedelta(seconds=10)
    app.store.heartbeat(["other".ljust(32, "x")], 30.0, now=now)
    assert {r["id"]: r["lease_expires_at"] for r in rows(app)}[theirs.id] == now + timedelta(seconds=30)


def test_release_worker_charges_a_delivery_to_the_running_message_only(app: JobQueue, add) -> None:
    add.bulk([(i, i) for i in range(4)])
    held = app.store.acquire(WORKER, None, 4, LEASE)
    # held[0] finished (its outcome unwritten), held[1] was running, the others never started.
    assert app.store.release_worker(WORKER, running=held[1].id, finished=[held[0].id, held[1].id]) == 4
    by_id = {r["id"]: r for r in rows(app)}
    assert {r["state"] for r in by_id.values()} == {"PENDING"}
    counts = {i: (by_id[i]["attempts_count"], by_id[i]["deliveries_count"]) for i in by_id}
    assert counts[held[1].id] == (1, 1)  # running: attempt and delivery count (it may be the killer)
    assert counts[held[0].id] == (1, 0)  # finished: it ran, but its delivery is not charged
    assert counts[held[2].id] == counts[held[3].id] == (0, 0)  # never started: as if never fetched


def test_release_worker_that_lost_count_charges_only_the_running_one(app: JobQueue, add) -> None:
    add.bulk([(1, 1), (2, 2)])
    first, second = app.store.acquire(WORKER, None, 2, LEASE)
    assert app.store.release_worker(WORKER, running=first.id, finished=None) == 2
    counts = {r["id"]: (r["attempts_count"], r["deliveries_count"]) for r in rows(app)}
    assert counts == {first.id: (1, 1), second.id: (0, 0)}


def test_release_unstarted_returns_only_the_unstarted_messages_of_those_batches(app: JobQueue, add) -> None:
    add.bulk([(i, i) for i in range(5)])
    batch = app.store.acquire(WORKER, None, 3, LEASE, token=111)
    other = app.store.acquire(WORKER, None, 2, LEASE, token=222)
    assert app.store.release_unstarted(WORKER, [111], started=[batch[0].id]) == 2
    by_id = {r["id"]: (r["state"], r["attempts_count"], r["deliveries_count"]) for r in rows(app)}
    assert by_id[batch[0].id] == ("PROCESSING", 1, 1)
    assert by_id[batch[1].id] == by_id[batch[2].id] == ("PENDING", 0, 0)
    assert {by_id[m.id] for m in other} == {("PROCESSING", 1, 1)}
    assert app.store.release_unstarted(WORKER, [222], started=None) == 0  # lost count: leave them


def test_release_token_undoes_an_acquisition_whose_reply_was_lost(app: JobQueue, add) -> None:
    add.delay(1, 1)
    (m,) = app.store.acquire(WORKER, None, 1, LEASE, token=12345)
    assert app.store.release_token(12345) == 1
    (row,) = rows(app)
    assert (row["state"], row["attempts_count"], row["deliveries_count"]) == ("PENDING", 0, 0)


def test_cancel_archives_pending_but_not_processing(app: JobQueue, add) -> None:
    a, b = add.delay(1, 1), add.delay(2, 2)
    app.store.acquire(WORKER, None, 1, LEASE)  # takes a
    assert a.cancel() is False and a.status() == "processing"
    assert b.cancel() is True and b.status() == "cancelled"
    assert b.cancel() is False
    from jobqueue import JobCancelled

    with pytest.raises(JobCancelled):
        b.get(timeout=1)


def test_has_work_sees_processing_and_soon_due_messages(app: JobQueue, add) -> None:
    now = utcnow()
    assert not app.store.has_work(None, now)
    add.apply_async((1, 1), eta=now + timedelta(seconds=30))
    assert not app.store.has_work(None, now + timedelta(seconds=5))
    assert app.store.has_work(None, now + timedelta(seconds=31))
    add.apply_async((1, 1), queue="q2")
    assert app.store.has_work(("q2",), now + timedelta(seconds=1))
    assert not app.store.has_work(("q3",), now + timedelta(seconds=1))


def test_queue_counts(app: JobQueue, add) -> None:
    add.bulk([(1, 1)] * 3)
    add.delay(1, 1)
    add.apply_async((1, 1), queue="later", eta=utcnow() + timedelta(hours=1))
    app.store.acquire(WORKER, ("default",), 1, LEASE)
    counts = {c["queue"]: c for c in jobs.queue_counts(app.store)}
    assert (counts["default"]["ready"], counts["default"]["processing"]) == (3, 1)
    assert (counts["later"]["scheduled"], counts["later"]["ready"]) == (1, 0)
    assert counts["later"]["oldest_ready_seconds"] is None
    assert counts["default"]["oldest_ready_seconds"] >= 0


def test_a_job_due_before_it_was_enqueued_has_waited_only_since_it_was_enqueued(app: JobQueue, add) -> None:
    """An eta in the past (a job that should have run yesterday) runs at once; the age operators
    alert on counts from its enqueue, not from its eta."""
    add.apply_async((1, 1), eta=datetime(2000, 1, 1))
    counts = {c["queue"]: c for c in jobs.queue_counts(app.store, utcnow() + timedelta(seconds=10))}
    assert counts["default"]["ready"] == 1
    assert 9 <= counts["default"]["oldest_ready_seconds"] < 60


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(app: JobQueue, add) -> None:
    with app.engine.connect() as conn:
        with conn.begin() as tx:
            add.apply_async((1, 1), connection=conn)
            add.bulk([(2, 2), (3, 3)], connection=conn)
            tx.rollback()
    assert rows(app) == []
    with app.engine.begin() as conn:
        h = add.apply_async((1, 1), connection=conn)
    assert h.status() == "pending"


def test_bulk_unique_keys_per_item(app: JobQueue, add) -> None:
    first = add.bulk([(1, 1), (2, 2), (3, 3)], unique_key=lambda item: f"k{item[0] % 2}")
    assert first[0].id == first[2].id != first[1].id  # items 1 and 3 share key k1
    again = add.bulk([(9, 9), (8, 8)], unique_key=["k1", None])
    assert again[0].id == first[0].id and again[1].id not in {h.id for h in first}
    assert len(rows(app)) == 3
    from jobqueue import ConfigurationError

    with pytest.raises(ConfigurationError, match="one key per item"):
        add.bulk([(1, 1)], unique_key="same")
    with pytest.raises(ConfigurationError, match="2 keys for 1 items"):
        add.bulk([(1, 1)], unique_key=["a", "b"])


def test_enqueue_into_missing_tables_names_the_command(db_url: str) -> None:
    from jobqueue import SchemaError

    app = JobQueue(db_url, table_prefix="missing_")

    @app.task(name="t.missing")
    def job(x: int) -> None: ...

    for enqueue in (
        lambda: job.delay(1),
        lambda: job.bulk([(1,), (2,)]),
        lambda: job.apply_async((1,), unique_key="k"),
    ):
        with pytest.raises(SchemaError, match="jobqueue db init"):
            enqueue()
    # Every way of finding the tables missing says the same, naming jobqueue's own command.
    from jobqueue.testing import drain

    said = re.escape("the jobqueue tables (missing_*) do not exist in this database; run `jobqueue db init`")
    for use in (app.check_schema, app.upgrade_schema, lambda: drain(app), lambda: job.delay(1)):
        with pytest.raises(SchemaError, match=said):
            use()
    app.close()


def test_a_connection_to_another_database_of_the_same_kind_is_refused(
    app: JobQueue, add, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Another SQLite file, another database of the server: the job was committed there, where no
    worker of this queue looks, and its handle read this queue's database (JobNotFound, or another
    job of the same id)."""
    from tests import servers

    other_url = servers.create_database(backend, str(tmp_path_factory.mktemp("other")))
    other = JobQueue()
    other.configure(database_url=other_url)  # JOBQUEUE_DATABASE_URL, the session database's, outranks JobQueue(url)
    try:
        other.init_schema()
        with (
            pytest.raises(ConfigurationError, match=r"connection= is on another database \("),
            other.engine.begin() as conn,
        ):
            add.apply_async((1, 1), connection=conn)
        with pytest.raises(ConfigurationError, match="on another database"), Session(other.engine) as session:
            add.bulk([(1, 1)], connection=session)
            session.commit()
        with other.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(other.tables.message)).scalar() == 0
        assert rows(app) == []
    finally:
        other.close()
        servers.drop_database(backend, other_url)


@only("postgresql")
def test_a_connection_through_a_pooler_to_the_queues_database_is_taken(app: JobQueue, add, pgbouncer) -> None:
    """Its URL names another port than the queue's: the server says it is the same database."""
    pooled = sa.create_engine(pgbouncer.url(app.database_url), poolclass=sa.pool.NullPool)
    try:
        with pooled.begin() as conn:
            handle = add.apply_async((1, 1), connection=conn)
        assert handle.status() == "pending"
    finally:
        pooled.dispose()
