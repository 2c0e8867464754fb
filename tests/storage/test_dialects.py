"""The driver contract: every dialect runs each operation of the interface to the same effect.

One suite, run against SQLite, PostgreSQL and MariaDB over real connections, on the dialect's own
methods (``tests/storage/test_store.py`` covers the same operations through the Store that wraps
them). A new dialect passes this file before anything else.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from freezegun import freeze_time

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.job import Batch, Message, MessageState, OutcomeKind
from jobqueue.storage.dialects import AcquireParams, Dialect, LeaseClock, WorkerState
from tests.acceptance.cli import ROOT
from tests.conftest import only
from tests.servers import free_port
from tests.storage.test_store import LEASE, outcome, rows

WORKER = "w" * 32


@pytest.fixture
def dialect(app: JobQueue) -> Dialect:
    return app.store.dialect


def row(task: str = "t.x", key: str | None = None, priority: int = 0, due: datetime | None = None) -> dict:
    now = utcnow()
    return {
        "task_name": task,
        "queue": "default",
        "priority": priority,
        "state": "PENDING",
        "payload": b"[[],{}]",
        "headers": None,
        "unique_key": key,
        "partition_key": None,
        "options": None,
        "attempts_count": 0,
        "deliveries_count": 0,
        "created_at": now,
        "next_attempt_at": due or now,
    }


def acquire(
    dialect: Dialect,
    limit: int = 10,
    queues: tuple[str, ...] | None = None,
    token: int = 7,
    now: datetime | None = None,
) -> list[Message]:
    now = now or utcnow()
    return dialect.acquire(
        AcquireParams(WORKER, token, queues, limit, now, LeaseClock(None if not dialect.client_clock else now, 30.0))
    )


# -- enqueue -----------------------------------------------------------------------------------------


def test_enqueue_one_and_batches_return_ids_in_order(app: JobQueue, dialect: Dialect) -> None:
    first = dialect.enqueue_one(row())
    with app.engine.begin() as conn:
        batch = dialect.insert_batch(conn, Batch(row(), [b"[[1],{}]", b"[[2],{}]", b"[[3],{}]"], [None] * 3))
        many = dialect.insert_messages(conn, [row(), row()])
    ids = [first, *batch, *many]
    assert ids == sorted(ids) and len(set(ids)) == 6
    assert [r["id"] for r in rows(app)] == ids
    assert [r["payload"] for r in rows(app)][1:4] == [b"[[1],{}]", b"[[2],{}]", b"[[3],{}]"]


def test_bulk_reads_each_payload_once_in_order_and_commits_once(app: JobQueue, dialect: Dialect) -> None:
    reads: list[int] = []

    class Lazy(list):
        def __iter__(self):
            for index, payload in enumerate(list.__iter__(self)):
                reads.append(index)
                yield payload

    ids = dialect.bulk(Batch(row(), Lazy([f"[[{i}],{{}}]".encode() for i in range(2500)]), [None] * 2500), 1000)
    assert reads == list(range(2500))
    assert ids == sorted(ids) and len(ids) == 2500
    assert [r["payload"] for r in rows(app)][2499] == b"[[2499],{}]"


def test_unique_keys_insert_once_and_new_rows_skip_active_keys(app: JobQueue, dialect: Dialect) -> None:
    with app.engine.begin() as conn:
        first = dialect.insert_or_existing(conn, row(key="k1"))
        assert dialect.insert_or_existing(conn, row(key="k1")) == first
        assert dialect.insert_unique(conn, row(key="k1")) is None
        inserted = dialect.insert_new(conn, [row(key="k1"), row(key="k2"), row(key="k3")])
    assert sorted(key for _, key in inserted) == ["k2", "k3"]
    assert sorted(r["unique_key"] for r in rows(app)) == ["k1", "k2", "k3"]


ARCHIVE_IDS = itertools.count(1_000_000)


def archived(app: JobQueue, task: str, *keys: str) -> None:
    """Archive rows of ``task`` with these unique keys, as if their jobs had finished."""
    now = utcnow()
    with app.engine.begin() as conn:
        conn.execute(
            sa.insert(app.tables.archive),
            [{**row(task, key), "id": next(ARCHIVE_IDS), "state": "COMPLETED", "archived_at": now} for key in keys],
        )


def test_a_keyed_batch_adds_only_keys_no_job_holds(app: JobQueue) -> None:
    archived(app, "t.x", "done")
    archived(app, "t.other", "theirs")  # another task's key is not ours
    live = app.store.enqueue([{**row(key="live"), "payload": b"live"}])[0]
    common = {**row(priority=4), "headers": {"trace": "t1"}, "options": {"retries": 2}}
    keys = ["b", "done", "live", "b", "tab\there\nnew line\\", "theirs", "ü", "b"]
    payloads = [b"\x00first", b"x", b"x", b"second", b"\xff", b"t", b"u", b"third"]
    # b repeats (its first row goes in), done is archived, live is active: 4 of 8 rows go in.
    assert app.store.enqueue_new(Batch(common, payloads, keys)) == 4
    found = {r["unique_key"]: r for r in rows(app)}
    assert sorted(found) == sorted(["b", "live", "tab\there\nnew line\\", "theirs", "ü"])
    assert found["b"]["payload"] == b"\x00first" and found["tab\there\nnew line\\"]["payload"] == b"\xff"
    assert found["live"]["id"] == live and found["live"]["payload"] == b"live"  # untouched
    new = found["theirs"]
    assert (new["task_name"], new["queue"], new["priority"], new["state"]) == ("t.x", "default", 4, "PENDING")
    assert (new["headers"], new["options"]) == ({"trace": "t1"}, {"retries": 2})
    assert new["created_at"] == common["created_at"] and new["next_attempt_at"] == common["next_attempt_at"]
    assert app.store.enqueue_new(Batch(common, payloads, keys)) == 0  # a re-run adds nothing
    assert app.store.enqueue_new(Batch(common, [b"n", b"n"], ["done", "new"])) == 1


def test_a_key_archived_while_its_batch_is_inserted_is_dropped(app: JobQueue) -> None:
    """A job holding a key of the batch may be archived between the archive check and the insert:
    the row that then went in is dropped before the batch commits."""
    m = app.tables.message
    raced: list[str] = []

    def archive_b_meanwhile(conn, cursor, statement, parameters, context, executemany) -> None:
        # Right after the batch's insert, on its own connection: what a commit by another
        # connection looks like to the statements that follow.
        if not raced and statement.lstrip().upper().startswith("INSERT") and m.name in statement.split("(")[0]:
            raced.append(statement)
            other = conn.connection.dbapi_connection.cursor()
            other.execute(
                f"INSERT INTO {app.tables.archive.name} (id, task_name, queue, priority, state, payload, unique_key, "
                "attempts_count, deliveries_count, created_at, archived_at) VALUES (999, 't.x', 'default', 0, "
                "'COMPLETED', '', 'b', 1, 1, '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
            )
            other.close()

    sa.event.listen(app.engine, "after_cursor_execute", archive_b_meanwhile)
    try:
        assert app.store.enqueue_new(Batch(row(), [b"a", b"b", b"c"], ["a", "b", "c"])) == 2
    finally:
        sa.event.remove(app.engine, "after_cursor_execute", archive_b_meanwhile)
    assert raced, "the batch's insert was not seen"
    assert sorted(r["unique_key"] for r in rows(app)) == ["a", "c"]


# -- acquire, flush ----------------------------------------------------------------------------------


def test_acquire_takes_ready_messages_in_delivery_order_under_one_token(app: JobQueue, dialect: Dialect) -> None:
    later = utcnow() + timedelta(hours=1)
    with app.engine.begin() as conn:
        ids = dialect.insert_messages(conn, [row(), row(priority=5), row(due=later), row()])
    taken = acquire(dialect, limit=10)
    assert [m.id for m in taken] == [ids[1], ids[0], ids[3]]  # priority first; the delayed one waits
    assert {m.lease_token for m in taken} == {7}
    assert {(m.attempts_count, m.deliveries_count) for m in taken} == {(1, 1)}
    assert acquire(dialect) == []


def test_acquire_serves_one_or_many_queues(app: JobQueue, dialect: Dialect) -> None:
    with app.engine.begin() as conn:
        dialect.insert_messages(conn, [{**row(), "queue": q} for q in ("a", "b", "c", "a")])
    assert [m.queue for m in acquire(dialect, queues=("a",))] == ["a", "a"]
    assert sorted(m.queue for m in acquire(dialect, queues=("b", "c"))) == ["b", "c"]


@only("sqlite")
def test_sqlite_acquires_on_the_driver_for_all_queues_and_for_one(app: JobQueue, dialect: Dialect) -> None:
    # Inside the write lock SQLAlchemy's own execution cost as much as some of SQLite's work: a
    # worker serving every queue or one queue acquires with a statement compiled once, on the driver.
    statements = []
    for queues in (None, ("a",), ("a", "b")):
        params = AcquireParams("w", 7, queues, 10, utcnow(), LeaseClock(None, 60))
        statements.append(dialect._driver_acquire(params))  # type: ignore[attr-defined]
    assert statements[0] is not None and statements[1] is not None
    assert statements[2] is None  # a list of queues is expanded per call: SQLAlchemy runs it
    assert "queue = ?" in statements[1][0] and statements[1][1].count("a") == 1


def test_concurrent_acquires_never_share_a_message(app: JobQueue, dialect: Dialect) -> None:
    dialect.bulk(Batch(row(), [b"[[],{}]"] * 400, [None] * 400), 400)
    seen: list[int] = []
    lock = threading.Lock()

    def take(token: int) -> None:
        while got := acquire(dialect, limit=20, token=token):
            with lock:
                seen.extend(m.id for m in got)

    threads = [threading.Thread(target=take, args=(token,)) for token in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == len(set(seen)) == 400


def test_flush_applies_every_kind_of_outcome_fenced_by_the_token(app: JobQueue, dialect: Dialect) -> None:
    dialect.bulk(Batch(row(), [b"[[],{}]"] * 5, [None] * 5), 5)
    done_, failed, retried, returned, stale = acquire(dialect)
    stale.lease_token = 999  # another delivery's outcome: fenced out
    later = utcnow() + timedelta(minutes=5)
    applied = dialect.flush(
        [
            outcome(done_, result=b"42"),
            outcome(failed, state=MessageState.FAILED),
            outcome(retried, OutcomeKind.RETRY, MessageState.RETRYABLE, next_attempt_at=later),
            outcome(returned, OutcomeKind.RETURN, MessageState.PENDING),
            outcome(stale),
        ],
        utcnow(),
    )
    assert applied == {(m.id, 7) for m in (done_, failed, retried, returned)}
    archive = {r["id"]: r for r in rows(app, "archive")}
    assert (archive[done_.id]["state"], archive[done_.id]["result"]) == ("COMPLETED", b"42")
    assert archive[failed.id]["state"] == "FAILED"
    messages = {r["id"]: r for r in rows(app)}
    assert (messages[retried.id]["state"], messages[retried.id]["deliveries_count"]) == ("RETRYABLE", 0)
    assert (messages[returned.id]["attempts_count"], messages[returned.id]["deliveries_count"]) == (0, 0)
    assert messages[stale.id]["state"] == "PROCESSING"


def test_a_large_flush_archives_exactly_the_deliveries_it_still_holds(app: JobQueue, dialect: Dialect) -> None:
    # More outcomes than one statement copies, with lost leases in several of its parts: the held
    # ones are archived, the lost ones stay as their current holder left them.
    dialect.bulk(Batch(row(), [b"[[],{}]"] * 600, [None] * 600), 600)
    taken = acquire(dialect, limit=600)
    lost = {taken[n].id for n in (0, 255, 256, 300, 599)}
    for message in taken:
        if message.id in lost:
            message.lease_token = 999
    applied = dialect.flush([outcome(m) for m in taken], utcnow())
    assert applied == {(m.id, 7) for m in taken if m.id not in lost}
    assert {r["id"] for r in rows(app, "archive")} == {m.id for m in taken} - lost
    assert {r["id"]: r["state"] for r in rows(app)} == dict.fromkeys(lost, "PROCESSING")


def test_a_partition_serves_its_oldest_active_message_only(app: JobQueue, dialect: Dialect) -> None:
    keys = ("a", "a", "b", None, "a")
    ids = [dialect.enqueue_one({**row(priority=9 if n == 1 else 0), "partition_key": k}) for n, k in enumerate(keys)]
    assert app.store.has_ready(None, utcnow())
    first = acquire(dialect)
    # The second "a" waits behind the first whatever its priority; other keys and no key run in parallel.
    assert sorted(m.id for m in first) == [ids[0], ids[2], ids[3]]
    assert acquire(dialect) == [] and not app.store.has_ready(None, utcnow())  # held while their first runs
    a, b, _ = sorted(first, key=lambda m: m.id)
    # A retry keeps the key, even when another message of the key is due before it.
    later = utcnow() + timedelta(minutes=5)
    dialect.flush([outcome(a, OutcomeKind.RETRY, MessageState.RETRYABLE, next_attempt_at=later), outcome(b)], utcnow())
    assert acquire(dialect) == []
    (again,) = acquire(dialect, now=later)
    assert again.id == ids[0]
    dialect.flush([outcome(again)], utcnow())
    assert [m.id for m in acquire(dialect)] == [ids[1]]  # archived: the next of the key, in enqueue order
    assert not app.store.has_ready(None, utcnow())


def test_fire_schedule_is_fenced_and_enqueues_once(app: JobQueue, dialect: Dialect) -> None:
    dialect.enqueue_one(row(task="jobqueue.schedule"))
    (message,) = acquire(dialect)
    job = row(task="t.report", key="report@1")
    assert dialect.fire_schedule(message, job, utcnow() + timedelta(hours=1), b"{}")
    assert not dialect.fire_schedule(message, job, utcnow() + timedelta(hours=1), b"{}")  # the token moved on
    assert sorted(r["task_name"] for r in rows(app)) == ["jobqueue.schedule", "t.report"]


# -- leases ----------------------------------------------------------------------------------------------


def test_renew_moves_leases_forward_and_release_returns_them(app: JobQueue, dialect: Dialect) -> None:
    dialect.bulk(Batch(row(), [b"[[],{}]"] * 2, [None] * 2), 2)
    held = acquire(dialect)
    app.store.register_worker(
        {
            "id": WORKER,
            "supervisor_id": "s" * 32,
            "hostname": "h",
            "pid": 1,
            "queues": None,
            "started_at": utcnow(),
            "heartbeat_at": utcnow(),
            "version": "test",
        }
    )
    now = utcnow()
    state = WorkerState(WORKER, running_job_id=held[0].id, running_since=now, jobs_done=5)
    assert dialect.renew([state], LeaseClock(now, 3600.0)) == 2
    assert dialect.renew([WorkerState(WORKER, jobs_done=6)], LeaseClock(now, 60.0)) == 0  # never shortened
    with app.store.reading() as connection:
        worker = connection.execute(sa.select(app.tables.worker)).mappings().one()
    assert (worker["running_job_id"], worker["jobs_done"]) == (None, 6)  # the heartbeat says what runs now
    m = app.tables.message
    assert dialect.release([m.c.worker_id == WORKER], attempts=sa.literal(1), deliveries=sa.literal(1)) == 2
    assert {(r["state"], r["attempts_count"], r["worker_id"]) for r in rows(app)} == {("PENDING", 0, None)}


# -- wake-ups ------------------------------------------------------------------------------------------


def test_an_idle_worker_hears_of_new_work(app: JobQueue, dialect: Dialect) -> None:
    waker = dialect.waker(lambda: app.store.has_ready(None, utcnow()), 0.0, 3600.0, None)
    try:
        waker.check(time.monotonic())  # the first reading counts as news: nothing was seen before it
        acquire(dialect)
        assert waker.check(time.monotonic()) == 0, "news of nothing"
        dialect.enqueue_one(row())
        deadline = time.monotonic() + 5
        while not waker.check(time.monotonic()):  # a notification arrives a moment after COMMIT
            assert time.monotonic() < deadline, "the waker saw nothing"
            time.sleep(0.01)
    finally:
        waker.close()


def test_a_supervisor_hears_of_delayed_jobs_coming_due(app: JobQueue, dialect: Dialect) -> None:
    """A delayed job makes no commit as it comes due: the supervisor asks every due interval."""
    now = utcnow()
    with freeze_time(now) as frozen:
        dialect.enqueue_one(row(due=now + timedelta(seconds=30)))
        waker = dialect.waker(lambda: app.store.has_ready(None, utcnow()), 3600.0, 1.0, None)
        try:
            waker.check(time.monotonic())  # the first reading counts as news: nothing was seen before it
            assert waker.check(time.monotonic() + 1.0) == 0, "the job is not due yet"
            frozen.tick(31)
            assert waker.check(time.monotonic() + 1.0) == 1, "the due job went unnoticed"
        finally:
            waker.close()


@only("postgresql")
def test_supervisors_share_out_notifications(app: JobQueue, dialect: Dialect) -> None:
    """Two supervisors serving the same queues: each new job is news at once for one of them; the
    other looks a moment later, and wakes a process only if the job still waits."""
    wakers = [app.store.waker(None, 0.0, 3600.0) for _ in range(2)]
    for rank, waker in enumerate(wakers):
        waker.set_peers(rank, 2)
    try:
        for waker in wakers:
            waker.check(time.monotonic())  # the first reading counts as news
        for taken_meanwhile in (True, False):
            dialect.enqueue_one(row())
            heard = [0, 0]
            deadline = time.monotonic() + 5
            while not any(heard):
                assert time.monotonic() < deadline, "nobody heard the job"
                time.sleep(0.01)
                heard = [waker.check(time.monotonic()) for waker in wakers]
            assert sorted(heard) == [0, 1], heard
            if taken_meanwhile:
                assert len(acquire(dialect)) == 1  # the owner's process took it
            other = heard.index(0)
            time.sleep(0.05)  # past the other's deferral
            assert wakers[other].check(time.monotonic()) == (0 if taken_meanwhile else 1)
            acquire(dialect)
    finally:
        for waker in wakers:
            waker.close()


def test_listen_database_url_is_refused_off_postgresql(app: JobQueue, backend: str) -> None:
    if backend == "postgresql":
        app.store.waker(None, 1.0, 1.0, app.database_url).close()
        with pytest.raises(ConfigurationError, match="not a PostgreSQL URL") as info:
            app.store.waker(None, 1.0, 1.0, "mysql://root:secret@127.0.0.1/test")
        assert "secret" not in str(info.value)
    else:
        with pytest.raises(ConfigurationError, match="listen_database_url is for PostgreSQL"):
            app.store.waker(None, 1.0, 1.0, "postgresql://root@127.0.0.1/test")


@only("postgresql")
def test_a_listen_database_url_that_reaches_another_database_is_refused(app: JobQueue) -> None:
    """A LISTEN connection to another database (a typo, a replica) was accepted: it heard of no new
    job, and every one waited for a poll."""
    other = sa.make_url(app.database_url).set(database="postgres").render_as_string(hide_password=False)
    with pytest.raises(ConfigurationError, match="reaches database 'postgres', but the jobs are in ") as info:
        app.store.waker(None, 1.0, 1.0, other)
    assert ":***@127.0.0.1" in str(info.value), info.value


@only("postgresql")
def test_a_listen_database_url_reached_only_after_the_start_is_checked_then(
    app: JobQueue, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unreachable as the supervisor started (the server down), its target went unchecked: once
    reachable, a LISTEN on another database heard of no new job without a word."""
    from jobqueue.storage.dialects.postgresql_listen import ListeningWaker

    monkeypatch.setattr(ListeningWaker, "RECONNECT_SECONDS", 0.0)  # try again at every look
    late = f"{app.database_url.rsplit('/', 1)[1]}_late"
    other = sa.make_url(app.database_url).set(database=late).render_as_string(hide_password=False)
    with caplog.at_level(logging.WARNING, logger="jobqueue"):
        waker = app.store.waker(None, 1.0, 1.0, other)  # the database does not exist yet
    try:
        assert "cannot LISTEN for new jobs" in caplog.text
        with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{late}"')
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jobqueue"):
            assert waker.fileno() is None  # its next try reaches the database: nothing LISTENs
            assert waker.fileno() is None and waker.check(time.monotonic()) == 0  # nor ever will
        assert f"reaches database '{late}', but the jobs are in " in caplog.text
        assert caplog.text.count("reaches database") == 1 and "polling every max_fetch_interval instead" in caplog.text
    finally:
        waker.close()
        with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{late}" WITH (FORCE)')


FORK_AND_EXIT = """
import os, sys
from jobqueue import JobQueue
app = JobQueue(sys.argv[1])
@app.task(name="t.echo")
def echo(tag):
    return tag
echo.delay("before fork")  # the pool holds an idle connection
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # an ordinary exit: the interpreter finalizes the connections it inherited
    os.waitpid(pid, 0)
    echo.delay("after the child's exit")
print("ok")
"""


def test_a_forked_child_that_exits_leaves_its_parents_connections_alone(app: JobQueue, tmp_path) -> None:
    """On MariaDB the child's exit closed the inherited connections, mysqlclient sending COM_QUIT
    down the socket it shares with its parent: the parent's next delay() failed with "Lost
    connection to server during query" (a pre-forking web server, a script's children)."""
    script = tmp_path / "fork_and_exit.py"
    script.write_text(FORK_AND_EXIT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(script), app.database_url], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@only("mysql")
def test_keyed_enqueues_that_deadlock_as_their_keys_holder_is_archived_are_run_again(app: JobQueue) -> None:
    """Enqueues of a few keys from several threads while the jobs holding them are archived (as a
    worker does): InnoDB makes some enqueues deadlock victims as they race for a key whose
    archived holders' index entries are not yet purged. That reached the caller as "Deadlock found
    when trying to get lock" (a dedup of web requests, under load)."""

    @app.task(name="t.keyed")
    def keyed() -> None:
        pass

    errors: list[str] = []
    done = threading.Event()

    def enqueue(seed: int) -> None:
        for n in range(150):
            try:
                keyed.apply_async(unique_key=f"k{(seed + n) % 3}")
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")

    def archive() -> None:  # a worker's fetch and acknowledgement, as fast as it can
        while not done.is_set():
            taken = app.store.acquire(WORKER, None, 10, LEASE)
            if taken:
                app.store.flush([outcome(message) for message in taken])

    archiver = threading.Thread(target=archive)
    archiver.start()
    threads = [threading.Thread(target=enqueue, args=(seed,)) for seed in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        done.set()
        archiver.join(30)
    assert errors == [], f"{len(errors)} of 600 enqueues failed, first: {errors[0]}"


# -- errors ----------------------------------------------------------------------------------------------


def test_a_missing_table_is_recognised(app: JobQueue, dialect: Dialect) -> None:
    with pytest.raises(sa.exc.DBAPIError) as info, app.engine.connect() as conn:
        conn.execute(sa.text("SELECT * FROM jobqueue_no_such_table"))
    assert dialect.missing_table(info.value)
    assert dialect.classify(info.value) is None  # retrying cannot fix it


def test_a_lock_wait_is_contention(app: JobQueue, dialect: Dialect, backend: str) -> None:
    dialect.enqueue_one(row())
    m = app.tables.message
    if backend == "sqlite":
        holder = sqlite3.connect(app.engine.url.database or "", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            impatient = sqlite3.connect(app.engine.url.database or "", timeout=0, isolation_level=None)
            with pytest.raises(sqlite3.OperationalError) as raw:
                impatient.execute("BEGIN IMMEDIATE")
            error: BaseException = sa.exc.OperationalError("BEGIN IMMEDIATE", {}, raw.value)
        finally:
            holder.execute("ROLLBACK")
    else:
        with app.engine.connect() as locker, app.engine.connect() as waiter:
            locker.begin()
            locker.execute(sa.update(m).values(priority=1))
            waiter.begin()
            waiter.exec_driver_sql(
                "SET lock_timeout = 100" if backend == "postgresql" else "SET SESSION innodb_lock_wait_timeout = 1"
            )
            with pytest.raises(sa.exc.DBAPIError) as info:
                waiter.execute(sa.update(m).values(priority=2))
            error = info.value
            locker.rollback()
    assert dialect.classify(error) == "contention"


def test_a_killed_connection_is_an_outage(
    app: JobQueue, dialect: Dialect, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "sqlite":
        monkeypatch.delenv("JOBQUEUE_DATABASE_URL")  # it would win over the URL given here
        broken = JobQueue(f"sqlite:////nonexistent-folder-{time.time_ns()}/x.sqlite3")
        with pytest.raises(sa.exc.DBAPIError) as info, broken.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        assert broken.store.dialect.classify(info.value) == "outage"
        return
    with app.engine.connect() as victim, app.engine.connect() as killer:
        own = victim.exec_driver_sql(
            "SELECT pg_backend_pid()" if backend == "postgresql" else "SELECT CONNECTION_ID()"
        ).scalar()
        killer.exec_driver_sql(f"SELECT pg_terminate_backend({own})" if backend == "postgresql" else f"KILL {own}")
        killer.commit()
        with pytest.raises(sa.exc.DBAPIError) as info:
            victim.exec_driver_sql("SELECT 1")
    assert dialect.classify(info.value) == "outage"


def end_other_sessions(app: JobQueue, backend: str) -> None:
    """The server ends every session of this test's database (its own) but the one asking."""
    killer = sa.create_engine(app.engine.url, poolclass=sa.pool.NullPool)
    with killer.connect() as conn:
        if backend == "postgresql":
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        else:
            others = conn.exec_driver_sql(
                "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            ).scalars()
            for other in list(others):
                with contextlib.suppress(sa.exc.DBAPIError):  # it ended meanwhile
                    conn.exec_driver_sql(f"KILL {other}")
        conn.commit()
    killer.dispose()


@only("postgresql", "mysql")
def test_waiting_for_a_result_outlasts_a_dropped_connection(
    app: JobQueue, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart during handle.get(timeout=60) raised "server closed the connection" at the next
    poll, while the job ran on and completed seconds later. A connection lost once is replaced at
    once, without a word: only a database that does not answer a new one is an outage."""

    @app.task(name="t.long")
    def long() -> None:
        pass

    waiting = long.delay()  # no worker: it stays pending for the whole wait
    ended = threading.Timer(0.3, end_other_sessions, (app, backend))
    ended.start()
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="jobqueue.handle"):
        with pytest.raises(TimeoutError, match=f"job {waiting.id} did not finish within 1.5 seconds"):
            waiting.get(timeout=1.5)
    ended.join()
    assert time.monotonic() - began >= 1.5
    assert caplog.records == []


def failing_reads(monkeypatch: pytest.MonkeyPatch, error: str, failing: Callable[[int], bool]) -> None:
    """Each read of a job's archive row whose number (from 1) ``failing`` picks raises SQLite's
    ``error``, as a database that does not answer would."""
    from jobqueue.storage import jobs

    read = getattr(jobs.archived_job, "original", jobs.archived_job)  # not an earlier call's
    calls = itertools.count(1)

    def archived_job(store: Any, job_id: int) -> Any:
        if failing(next(calls)):
            raise sa.exc.OperationalError("SELECT ... FROM jobqueue_archive", {}, sqlite3.OperationalError(error))
        return read(store, job_id)

    archived_job.original = read  # type: ignore[attr-defined]
    monkeypatch.setattr(jobs, "archived_job", archived_job)


@only("sqlite")
def test_waiting_for_a_result_through_an_outage_says_when_it_begins_and_ends(
    app: JobQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from jobqueue.testing import drain

    @app.task(name="t.answer")
    def answer() -> int:
        return 42

    waiting = answer.delay()
    failing_reads(monkeypatch, "disk I/O error", lambda call: 2 <= call <= 5)  # after one answered read
    later = threading.Timer(0.5, drain, (app,))
    later.start()
    with caplog.at_level(logging.WARNING, logger="jobqueue.handle"):
        assert waiting.get(timeout=10) == 42
    later.join()
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        f"job {waiting.id}: the database did not answer while waiting for its result (disk I/O error); still waiting",
        f"job {waiting.id}: the database answers again",
    ]


@only("sqlite")
def test_waiting_for_a_result_raises_the_databases_error_at_the_deadline_or_at_once(
    app: JobQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(name="t.never_ends")
    def never_ends() -> None:
        pass

    waiting = never_ends.delay()
    failing_reads(monkeypatch, "disk I/O error", lambda call: call >= 2)  # for good, after one answered read
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="jobqueue.handle"):
        with pytest.raises(sa.exc.OperationalError, match="disk I/O error"):
            waiting.get(timeout=1.0)
    assert time.monotonic() - began >= 1.0 and len(caplog.records) == 1  # said once, however many tries
    caplog.clear()
    for when in ("at the first read", "with timeout 0"):  # nothing answered yet (a wrong URL, say)
        failing_reads(monkeypatch, "disk I/O error", lambda call: True)
        began = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match="disk I/O error"):
            waiting.get(timeout=5 if when == "at the first read" else 0)
        assert time.monotonic() - began < 1, when
    failing_reads(monkeypatch, "no such column: bogus", lambda call: call >= 2)  # no outage: at once
    with pytest.raises(sa.exc.OperationalError, match="no such column"):
        waiting.get(timeout=5)
    failing_reads(monkeypatch, "database is locked", lambda call: 2 <= call <= 3)  # a lock: waited quietly
    with pytest.raises(TimeoutError):
        waiting.get(timeout=0.5)
    assert caplog.records == []


@only("postgresql", "mysql")
def test_a_pooled_connection_the_server_closed_while_idle_is_replaced_before_use(app: JobQueue, backend: str) -> None:
    """After a database restart, a failover or a proxy's idle timeout, the first delay() of each
    process failed on the connection its pool still held ("server closed the connection")."""

    @app.task(name="t.after_restart")
    def after_restart() -> None:
        pass

    with freeze_time() as frozen:
        first = after_restart.delay()
        assert first.status() == "pending"  # each of the app's two pools holds a connection now
        end_other_sessions(app, backend)  # as a restart would
        frozen.tick(2)  # idle that long, it is pinged as it is handed out, and replaced
        handle = after_restart.delay()
        assert handle.status() == "pending"
        with app.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar_one() == 2


@only("postgresql")
def test_a_listen_connection_that_cannot_be_made_is_said_once_and_its_return_once(
    dialect: Dialect, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """While the server was down a supervisor said "cannot LISTEN" at every try, once a second for
    the whole outage, with the driver's line breaks, and never that it listened again."""
    from jobqueue.storage.dialects.postgresql_listen import ListeningWaker

    monkeypatch.setattr(ListeningWaker, "RECONNECT_SECONDS", 0.0)
    nowhere = f"postgresql://jobqueue_test@127.0.0.1:{free_port()}/jobqueue"  # refuses connections
    with caplog.at_level(logging.WARNING, logger="jobqueue.storage"):
        waker = ListeningWaker(dialect, nowhere, lambda: False)
        for _ in range(5):
            assert waker.fileno() is None
        assert waker.engine is not None
        waker.engine.dispose()
        waker.engine = None  # the server is back (the jobs' own engine answers)
        assert waker.fileno() is not None
    waker.close()
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("cannot LISTEN for new jobs (") and "\n" not in said[0]
    assert re.fullmatch(r"listening for new jobs again after \d+\.\d s", said[1]), said


@only("mysql")
def test_an_upgrade_interrupted_on_mariadb_raises_the_interrupt_not_its_cleanup_error(
    app: JobQueue, dialect: Dialect
) -> None:
    """Ctrl-C inside a step left the connection unusable, and the cleanup's own error (restoring the
    lock waits, releasing the named lock) replaced the KeyboardInterrupt: 119 lines of traceback
    ending in PendingRollbackError, instead of the CLI's word on what to do."""
    with app.engine.connect() as conn:
        conn.begin()
        with pytest.raises(KeyboardInterrupt):
            with dialect.schema_lock(conn), dialect.brief_lock_waits(conn):
                conn.invalidate()  # as an interrupt inside a statement leaves it
                raise KeyboardInterrupt
    with app.engine.connect() as conn:  # the lock went with the session: the next upgrade gets it
        with dialect.schema_lock(conn):
            pass


# -- SQLite's one writer -----------------------------------------------------------------------------


@only("sqlite")
def test_a_sqlite_writer_waits_for_the_lock_then_gives_up_as_contention(
    app: JobQueue, dialect: Dialect, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobqueue.storage.dialects import sqlite_connection as sqlite_dialect

    class Counted:
        """A DB-API connection that counts the times it is asked for the write lock."""

        def __init__(self, connection: sqlite3.Connection) -> None:
            self.connection, self.tries = connection, 0

        def execute(self, sql: str) -> sqlite3.Cursor:
            self.tries += sql == "BEGIN IMMEDIATE"
            return self.connection.execute(sql)

    path = app.engine.url.database or ""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer = Counted(sqlite3.connect(path, isolation_level=None, timeout=12.345))
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, lambda: holder.execute("ROLLBACK"))
    released.start()
    # It waits for the write lock by trying again every few tenths of a millisecond (SQLite's own
    # wait, which sleeps 1, 2, 5, 10 ms... between tries, would ask once), and goes ahead once
    # the lock is free; the connection's own busy timeout is back afterwards.
    sqlite_dialect.begin_immediate(writer)
    released.join()
    assert writer.tries > 10
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 12_345
    writer.execute("ROLLBACK")
    # Held for longer than the busy timeout: SQLite's "database is locked", as SQLAlchemy reports a
    # statement's errors, which is contention (retried); the busy timeout is back all the same.
    monkeypatch.setattr(sqlite_dialect, "BUSY_TIMEOUT_SECONDS", 0.2)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sa.exc.OperationalError) as info:
            sqlite_dialect.begin_immediate(writer)
        assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 12_345
        # So does every transaction of the dialect's own.
        with pytest.raises(sa.exc.OperationalError) as through_engine:
            acquire(dialect, limit=1)
    finally:
        holder.execute("ROLLBACK")
    assert "database is locked" in str(info.value)
    assert dialect.classify(info.value) == "contention"
    assert dialect.classify(through_engine.value) == "contention"


@only("sqlite")
def test_a_sqlite_supervisor_takes_over_the_checkpoints(app: JobQueue) -> None:
    wal = (app.engine.url.database or "") + "-wal"

    def commits(count: int) -> None:
        for _ in range(count):
            app.store.dialect.enqueue_one(row())

    assert app.store.take_over_checkpoints()
    with app.engine.connect() as conn:  # its commits write the journal back only past 10,000 pages
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 10_000
    app.store.checkpoint()
    commits(300)
    # No commit wrote the journal back: it grew past the 1,000 pages where one would have.
    grown = os.path.getsize(wal)
    assert grown > 1000 * 4096
    commits(50)
    assert os.path.getsize(wal) > grown  # still growing
    app.store.checkpoint()
    grown = os.path.getsize(wal)
    commits(50)
    # Written back: the journal starts again from its beginning instead of growing.
    assert os.path.getsize(wal) == grown


def test_init_schema_any_number_of_times_adds_no_connect_listener(app: JobQueue) -> None:
    from jobqueue.storage.schema_manager import check_schema, init_schema

    tables = app.store.tables  # the store's own dialect is set up once, as an application does at start
    before = len(app.engine.pool.dispatch.connect)
    for _ in range(5):  # `db init` in-process, a test suite's setup: each makes a new dialect
        init_schema(app.engine, tables)
        check_schema(app.engine, tables)
    assert len(app.engine.pool.dispatch.connect) == before
    app.store.take_over_checkpoints()  # and the pool it makes anew keeps as many
    assert len(app.engine.pool.dispatch.connect) == before


@only("sqlite")
def test_sqlite_enqueue_one_sends_what_the_generic_path_sends(dialect: Dialect) -> None:
    from jobqueue.storage.dialects.common import BATCH_COLUMNS
    from jobqueue.storage.dialects.sqlite_rows import insert_one_params

    full = {
        **row(key="k"),
        "headers": {"h": 1},
        "options": {"retry": {"kind": "fixed"}},
        "partition_key": "p",
        "flow_key": "f",
        "concurrency_limit": 2,
        "rate_interval_us": 5,
    }
    for r in (row(), full):
        generic = (r["payload"], r["unique_key"], *[dialect.format_value(c, r.get(c)) for c in BATCH_COLUMNS])
        assert insert_one_params(r) == generic


@only("sqlite")
def test_sqlite_enqueue_one_keeps_its_connection_but_not_across_a_fork(app: JobQueue, dialect: Any) -> None:
    dialect.enqueue_one(row())
    (kept,) = dialect._spares
    dialect.enqueue_one(row())
    assert dialect._spares == [kept]  # used again, not one per call
    dialect._spares_pid = -1  # as in a forked child: the parent's connection is left alone
    dialect.enqueue_one(row())
    assert dialect._spares != [kept]
    kept.execute("SELECT 1")  # still open
    app.close()  # closes them
    assert len(rows(app)) == 3


def test_a_worker_registration_made_twice_keeps_the_row_and_a_bad_value_is_still_refused(app: JobQueue) -> None:
    """A registration tried again after its commit's reply was lost met its own row and ended the
    process; taken for a conflict, a value too long for its column was cut short without a word
    on MySQL (INSERT IGNORE)."""
    from jobqueue.runtime.process import worker_row

    row = worker_row("w-twice", "s-twice", 1234, ("emails",))
    app.store.register_worker(row)
    app.store.register_worker(row)  # again: kept, no error
    assert app.store.register_missing_workers([row]) == 0
    with app.engine.connect() as conn:
        w = app.tables.worker
        assert conn.execute(sa.select(sa.func.count()).select_from(w).where(w.c.id == "w-twice")).scalar_one() == 1
    if app.store.dialect.name != "sqlite":  # SQLite keeps any length in a column
        with pytest.raises(sa.exc.DBAPIError):
            app.store.register_worker({**row, "id": "w-long", "version": "v" * 40})
