"""Schedule messages on every database: created once, fired fenced, edited, retired, caught up."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from freezegun import freeze_time

from jobqueue import JobQueue, periodic, schedule_sync
from jobqueue.clock import utcnow
from jobqueue.periodic import SCHEDULE_TASK
from jobqueue.runtime.executor import Executor, StoreDeliveryWriter
from jobqueue.storage import jobs, migrations
from jobqueue.storage import schedules as stored
from tests.conftest import only
from tests.storage.test_lifecycle import WORKER, run_due

T0 = datetime(2030, 6, 1, 12, 0, 0)


def make_app(db_url: str, every: int | None = 10, cron: str | None = None) -> JobQueue:
    app = JobQueue(db_url)

    @app.periodic(every=every, cron=cron, args=(7,))
    @app.task(name="report")
    def report(n: int) -> int:
        return n

    return app


def sync(app: JobQueue) -> schedule_sync.SyncReport:
    return schedule_sync.sync(app.store, app.schedules, set(app.registry), utcnow())


def jobs_of(app: JobQueue, task: str = "report") -> list[dict]:
    out: list[dict] = []
    with app.engine.connect() as conn:
        for table in (app.tables.message, app.tables.archive):
            rows = conn.execute(sa.select(table.c.id, table.c.headers, table.c.state).where(table.c.task_name == task))
            out.extend(dict(r._mapping) for r in rows)
    return sorted(out, key=lambda r: r["headers"]["fire_time"])


def test_sync_creates_one_message_per_schedule_however_often_it_runs(db_url: str) -> None:
    apps = [make_app(db_url) for _ in range(3)]
    with freeze_time(T0):
        reports = [sync(app) for app in apps]
    assert reports[0].created == ["report"] and not reports[1].created and not reports[2].created
    rows = periodic.schedule_rows(apps[0].store)
    assert list(rows) == ["report"] and rows["report"].next_fire == T0 + timedelta(seconds=10)
    for app in apps:
        app.close()


def test_firing_enqueues_one_job_per_fire_time_and_defers(db_url: str) -> None:
    app = make_app(db_url)
    with freeze_time(T0) as clock:
        sync(app)
        for _ in range(3):
            clock.tick(10)
            run_due(app, now=utcnow())  # fires the schedule: enqueues a job
            run_due(app, now=utcnow())  # runs the job
    fired = jobs_of(app)
    expected = [(T0 + timedelta(seconds=s)).isoformat() + "+00:00" for s in (10, 20, 30)]
    assert [r["headers"]["fire_time"] for r in fired] == expected  # UTC, saying so
    assert {r["state"] for r in fired} == {"COMPLETED"}
    row = periodic.schedule_rows(app.store)["report"]
    assert row.state == "PENDING" and row.next_fire == T0 + timedelta(seconds=40)  # never acked
    app.close()


def test_a_stale_delivery_cannot_fire_twice(db_url: str) -> None:
    app = make_app(db_url)
    with freeze_time(T0) as clock:
        sync(app)
        clock.tick(10)
        (message,) = app.store.acquire(WORKER, None, 10, 30.0, now=utcnow())
        assert message.task_name == SCHEDULE_TASK
        schedule = app.schedules["report"]
        fire = message.next_attempt_at
        assert periodic.fire(app.store, message, schedule, fire, schedule.next_fire(fire), utcnow())
        assert not periodic.fire(
            app.store, message, schedule, fire, schedule.next_fire(fire), utcnow()
        )  # the token changed: fenced
    assert len(jobs_of(app)) == 1
    app.close()


def test_after_an_hour_down_one_catch_up_run(db_url: str) -> None:
    app = make_app(db_url, every=60)
    with freeze_time(T0) as clock:
        sync(app)
        clock.tick(timedelta(hours=1, seconds=30))  # no worker for an hour: 60 fires missed
        run_due(app, now=utcnow())
        run_due(app, now=utcnow())
    fired = jobs_of(app)
    assert [r["headers"]["fire_time"] for r in fired] == [(T0 + timedelta(hours=1)).isoformat() + "+00:00"]
    assert periodic.schedule_rows(app.store)["report"].next_fire == T0 + timedelta(hours=1, minutes=1)
    app.close()


def test_an_edited_schedule_gets_its_new_next_fire_at_the_next_start(db_url: str) -> None:
    with freeze_time(T0):
        sync(make_app(db_url, every=10))
    edited = make_app(db_url, every=None, cron="0 * * * *")
    with freeze_time(T0 + timedelta(minutes=5)):
        assert sync(edited).updated == ["report"]
    row = periodic.schedule_rows(edited.store)["report"]
    assert row.next_fire == datetime(2030, 6, 1, 13, 0) and row.schedule.cron == "0 * * * *"
    edited.close()


def test_a_schedule_removed_from_code_is_retired(db_url: str) -> None:
    with freeze_time(T0):
        sync(make_app(db_url))
    other_app = JobQueue(db_url)  # does not know the task at all: must not retire its schedule
    with freeze_time(T0):
        assert schedule_sync.sync(other_app.store, {}, {"unrelated"}, utcnow()).retired == []
    without = JobQueue(db_url)
    without.task(name="report")(lambda n: n)  # same task, schedule deleted from code
    with freeze_time(T0 + timedelta(seconds=5)):
        assert schedule_sync.sync(without.store, {}, set(without.registry), utcnow()).retired == ["report"]
    with freeze_time(T0 + timedelta(minutes=5)):
        assert run_due(without, now=utcnow()) == []  # it fires no more
    assert periodic.schedule_rows(without.store) == {}
    without.close()
    other_app.close()


def test_schedule_messages_are_not_work(db_url: str) -> None:
    app = make_app(db_url)
    with freeze_time(T0):
        sync(app)
    assert not app.store.has_work(None, T0 + timedelta(days=1))  # --burst does not wait for them
    from jobqueue.storage import jobs

    assert jobs.queue_counts(app.store) == []
    app.close()


@pytest.mark.parametrize("bad", [b"not json", b'{"name": "x"}'])
def test_an_unreadable_schedule_message_is_listed_not_fired(db_url: str, bad: bytes) -> None:
    app = make_app(db_url)
    with freeze_time(T0):
        sync(app)
        with app.engine.begin() as conn:
            m = app.tables.message
            conn.execute(sa.update(m).where(m.c.task_name == SCHEDULE_TASK).values(payload=bad))
        assert periodic.schedule_rows(app.store)["report"].schedule is None
        assert sync(app).updated == ["report"]  # a worker start repairs it from the code
    app.close()


@pytest.mark.parametrize("limits", [{"concurrency_limit": 1}, {"concurrency_key": lambda n: f"n{n}"}])
def test_a_periodic_tasks_jobs_keep_its_flow_control(db_url: str, limits: dict) -> None:
    """A periodic job that outlives its interval must not run beside the next one when its task
    says so (concurrency_limit=1 is the usual guard against overlapping runs)."""
    app = JobQueue(db_url)

    @app.periodic(every=10, args=(7,))
    @app.task(name="report", **{"concurrency_limit": 1, **limits})
    def report(n: int) -> int:
        return n

    executor = Executor(app, writes=StoreDeliveryWriter(app.store), ack_first=lambda o: True)
    with freeze_time(T0) as clock:
        sync(app)
        for _ in range(2):  # two fires, their jobs left waiting
            clock.tick(10)
            (message,) = app.store.acquire(WORKER, None, 1, 30.0, now=utcnow())  # the schedule comes first
            assert message.task_name == SCHEDULE_TASK and executor.execute(message) is None
        started = app.store.acquire(WORKER, None, 10, 30.0, now=utcnow(), flow=True)
    assert [m.task_name for m in started] == ["report"]  # the second waits for the first to end
    app.close()


def test_a_schedule_fired_by_a_release_without_its_task_keeps_its_flow_control(db_url: str) -> None:
    """Two releases at once: the new one defines a periodic task with concurrency_limit=1, the old
    one's workers, which do not know the task, fire its schedule too. Their fires had no flow
    columns, and the new release's workers ran two of them at once."""
    new = JobQueue(db_url)

    @new.periodic(every=10, args=(7,))
    @new.task(name="report", concurrency_key=lambda n: f"n{n}", concurrency_limit=1)
    def report(n: int) -> int:
        return n

    old = JobQueue(db_url)  # the release before: no such task
    executor = Executor(old, writes=StoreDeliveryWriter(old.store), ack_first=lambda o: True)
    with freeze_time(T0) as clock:
        sync(new)
        for _ in range(2):
            clock.tick(10)
            (message,) = old.store.acquire(WORKER, None, 1, 30.0, now=utcnow())
            assert message.task_name == SCHEDULE_TASK and executor.execute(message) is None
        started = new.store.acquire(WORKER, None, 10, 30.0, now=utcnow(), flow=True)
    assert [(m.task_name, m.flow_key, m.concurrency_limit) for m in started] == [("report", "n7", 1)]
    new.close()
    old.close()


def test_a_schedule_stored_without_its_flow_columns_keeps_its_next_fire(db_url: str) -> None:
    """Stored by a release that kept no flow columns with a schedule: the first start of one that
    does took the definition for changed, said so, and put the next fire back a whole interval."""
    app = JobQueue(db_url)

    @app.periodic(every=3600, args=(7,))
    @app.task(name="report", concurrency_limit=1)
    def report(n: int) -> int:
        return n

    with freeze_time(T0):
        sync(app)
    (row,) = periodic.schedule_rows(app.store).values()
    earlier = json.loads(row.payload)
    assert earlier.pop("flow")["concurrency_limit"] == 1
    with app.engine.begin() as conn:
        m = app.tables.message
        conn.execute(sa.update(m).where(m.c.id == row.id).values(payload=json.dumps(earlier).encode()))
    with freeze_time(T0 + timedelta(minutes=30)):
        report_ = sync(app)
    assert not report_.updated and not report_.contested
    (after,) = periodic.schedule_rows(app.store).values()
    assert after.next_fire == row.next_fire and after.schedule is not None and after.schedule.flow
    app.close()


def named_app(db_url: str, *names: str) -> JobQueue:
    app = JobQueue(db_url)
    task = app.task(name="report")(lambda n: n)
    for n, name in enumerate(names):
        app.periodic(every=10, name=name, args=(n,))(task)
    return app


@pytest.mark.parametrize("other", ["digest", "dígest", "Digest "])
def test_schedules_whose_names_differ_only_in_case_accents_or_spaces_are_two(db_url: str, other: str) -> None:
    """Both are created and fire, on MariaDB too (whose default collation would take the second
    for the first)."""
    app = named_app(db_url, "Digest", other)
    with freeze_time(T0):
        report = sync(app)
    assert sorted(report.created) == sorted(["Digest", other]) and not report.clashing
    assert sorted(periodic.schedule_rows(app.store)) == sorted(["Digest", other])
    app.close()


def test_a_schedule_renamed_in_case_only_takes_the_old_ones_place(db_url: str) -> None:
    """On MariaDB the new spelling could not be created while the old one existed, and the old one
    was then retired: the schedule was gone until the next worker start."""
    with freeze_time(T0):
        sync(named_app(db_url, "Digest"))
    renamed = named_app(db_url, "digest")
    with freeze_time(T0 + timedelta(seconds=5)):
        report = sync(renamed)
    assert (report.retired, report.created) == (["Digest"], ["digest"])
    assert list(periodic.schedule_rows(renamed.store)) == ["digest"]
    renamed.close()


def test_a_catch_up_in_the_repeated_hour_of_a_dst_change_is_one_run(db_url: str) -> None:
    """Down from before Saturday's 02:30 (Paris) until 02:05 on the night clocks go back, after the
    first 02:30 of that night: one catch-up run, for that 02:30. It was two: one for Saturday's, then
    at once one for the night's."""
    app = JobQueue(db_url)

    @app.periodic(cron="30 2 * * *", timezone="Europe/Paris")
    @app.task(name="report")
    def report() -> None: ...

    with freeze_time(datetime(2026, 10, 23, 12, 0)) as clock:
        sync(app)  # next fire: Saturday 2026-10-24 02:30 CEST, 00:30 UTC
        clock.move_to(datetime(2026, 10, 25, 1, 5))  # 02:05 CET, the second time 02:05 comes that night
        for _ in range(3):
            run_due(app, now=utcnow())
    assert [r["headers"]["fire_time"] for r in jobs_of(app)] == ["2026-10-25T00:30:00+00:00"]  # 02:30 CEST
    assert periodic.schedule_rows(app.store)["report"].next_fire == datetime(2026, 10, 26, 1, 30)  # 02:30 CET
    app.close()


def test_the_keeper_creates_deleted_schedule_messages_again_once(db_url: str) -> None:
    """Deleted (by a DELETE or by `jobs cancel`), a schedule message comes back at the next look of
    any keeper, once however many look, its first fire counted from then."""
    app = make_app(db_url)
    keepers = [schedule_sync.Keeper(app.schedules, f"supervisor{i}") for i in range(2)]
    with freeze_time(T0) as clock:
        sync(app)
        assert all(keeper.check(app.store, utcnow()) == ([], []) for keeper in keepers)
        first = periodic.schedule_rows(app.store)["report"].id
        m = app.tables.message
        with app.engine.begin() as conn:
            conn.execute(sa.delete(m).where(m.c.id == first))
        clock.tick(3)
        assert [keeper.check(app.store, utcnow()) for keeper in keepers] == [(["report"], []), ([], [])]
        row = periodic.schedule_rows(app.store)["report"]
        assert row.id != first and row.next_fire == T0 + timedelta(seconds=13) and row.defined_by == "supervisor0"
        assert jobs.cancel(app.store, row.id)  # as `jobqueue jobs cancel` does
        assert keepers[1].check(app.store, utcnow()) == (["report"], [])
    assert len(periodic.schedule_rows(app.store)) == 1
    app.close()


def test_the_keeper_leaves_retired_a_schedule_a_worker_retired(db_url: str) -> None:
    app = make_app(db_url)
    newer = JobQueue(db_url)
    newer.task(name="report")(lambda n: n)  # the task without its schedule: a newer release
    keeper = schedule_sync.Keeper(app.schedules, "older")
    with freeze_time(T0):
        sync(app)
        keeper.check(app.store, utcnow())
        assert schedule_sync.sync(newer.store, newer.schedules, set(newer.registry), utcnow()).retired == ["report"]
        assert keeper.check(app.store, utcnow()) == ([], ["report"])
        assert keeper.check(app.store, utcnow()) == ([], [])  # said once
        assert periodic.schedule_rows(app.store) == {}
        sync(app)  # a worker of a release that has it again, starting
        assert keeper.check(app.store, utcnow()) == ([], []) and not keeper.retired
    for each in (app, newer):
        each.close()


def register_supervisor(app: JobQueue, supervisor_id: str, heartbeat: datetime) -> None:
    app.store.register_worker(
        {
            "id": f"w-{supervisor_id[:30]}",
            "supervisor_id": supervisor_id,
            "hostname": "web-2",
            "pid": 1,
            "queues": None,
            "started_at": heartbeat,
            "heartbeat_at": heartbeat,
            "version": "test",
        }
    )


def test_a_start_applies_its_definition_over_a_running_workers_and_says_so(db_url: str) -> None:
    """Two apps define the schedule "report" differently: the second's start applies its own all the
    same, as every start does, and reports the first's running worker and both definitions. A
    worker's later look at only its busy schedules leaves it; starts that come together with a stale
    view change it once."""
    first, second = make_app(db_url, every=10), make_app(db_url, every=60)
    with freeze_time(T0):
        assert schedule_sync.sync(first.store, first.schedules, {"report"}, utcnow(), writer="a" * 32).created
        register_supervisor(first, "a" * 32, utcnow())
        before = periodic.schedule_rows(first.store)["report"]
        report = schedule_sync.sync(second.store, second.schedules, {"report"}, utcnow(), writer="b" * 32)
        assert report.updated == ["report"] and list(report.contested) == ["report"]
        message = report.contested["report"].message()
        assert "schedule 'report' is defined differently by a running worker (supervisor aaaaaaaa on host web-2)" in (
            message
        )
        assert "it has every 10 s (UTC) for task report, this app's code has every 60 s (UTC) for task report" in (
            message
        )
        assert "This worker's start applies this code's definition" in message
        assert "@app.periodic(name=...)" in message
        row = periodic.schedule_rows(first.store)["report"]
        assert row.schedule == second.schedules["report"] and row.defined_by == "b" * 32
        # The first app's running worker looks again at its busy schedules only (none): left so.
        report = schedule_sync.sync(first.store, first.schedules, {"report"}, utcnow(), writer="a" * 32, only=set())
        assert not report.updated and periodic.schedule_rows(first.store)["report"].schedule == row.schedule
        # A start that read the definition before the second app changed it does not change it again.
        assert not stored.update_schedule(
            first.store,
            row.id,
            before.payload,
            "default",
            T0,
            periodic.message_headers(before.schedule, "c"),
            before.payload,
        )
        # Retired by an app that knows the task but not the schedule, with the same report.
        register_supervisor(second, "b" * 32, utcnow())
        bare = JobQueue(db_url)
        bare.task(name="report")(lambda n: n)
        report = schedule_sync.sync(bare.store, bare.schedules, {"report"}, utcnow(), writer="c" * 32)
        assert report.retired == ["report"]
        message = report.contested["report"].message()
        assert "is not in this app's code, but a running worker (supervisor bbbbbbbb on host web-2)" in message
        assert "This worker's start retires it" in message
    assert periodic.schedule_rows(first.store) == {}
    for each in (first, second, bare):
        each.close()


def test_schedule_messages_are_read_off_the_unique_index(db_url: str, backend: str) -> None:
    """Syncing and keeping the schedules costs the same whatever the backlog: no full scan. (MySQL has
    no partial indexes: its unique index serves task_name alone.)"""
    app = make_app(db_url)
    m = app.tables.message
    if backend == "mysql":
        pytest.skip("no partial indexes on MySQL")
    with app.engine.connect() as conn:
        if backend == "postgresql":
            conn.execute(sa.text("SET enable_seqscan = off"))  # a usable index is used, even on an empty table
        for stmt in (
            sa.select(m.c.id).where(m.c.task_name == SCHEDULE_TASK, m.c.unique_key.isnot(None)),
            sa.select(m.c.id).where(m.c.task_name == SCHEDULE_TASK, m.c.unique_key.in_(["a", "b"])),
        ):
            sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
            explain = "EXPLAIN QUERY PLAN " if backend == "sqlite" else "EXPLAIN "
            plan = " ".join(str(row) for row in conn.execute(sa.text(explain + sql)))
            assert f"{app.tables.prefix}message_unique" in plan, plan
    assert stored.schedule_ids(app.store, ["report"]) == {}
    app.close()


@only("mysql")
def test_a_unique_key_collation_changed_by_hand_is_named_when_two_schedules_become_one(db_url: str) -> None:
    """Only a collation changed by hand can make the database take one schedule for another now:
    the worker says so, and how to undo it."""
    app = named_app(db_url, "Digest", "digest")
    m = app.tables.message
    exact_keys = next(step for step in migrations.MIGRATIONS if step.version == 6)  # restores it
    with app.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {m.name} MODIFY COLUMN unique_key VARCHAR(255) COLLATE utf8mb4_general_ci")
    try:
        with freeze_time(T0):
            report = sync(app)
        assert len(report.clashing) == 1 and len(report.created) == 1
        message = report.clash_message()
        assert "regardless of case or accents" in message
        assert "give the column its binary collation back" in message
    finally:
        with app.engine.begin() as conn:
            for statement in exact_keys.statements(conn, app.tables):
                conn.exec_driver_sql(statement)
        app.close()
