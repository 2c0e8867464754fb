"""Schedule messages on every database: created once, fired fenced, edited, retired, caught up."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from freezegun import freeze_time

from jobqueue import JobQueue, periodic
from jobqueue.clock import utcnow
from jobqueue.periodic import SCHEDULE_TASK
from jobqueue.runtime.executor import Executor, StoreDeliveryWriter
from tests.storage.test_lifecycle import WORKER, run_due

T0 = datetime(2030, 6, 1, 12, 0, 0)


def make_app(db_url: str, every: int | None = 10, cron: str | None = None) -> JobQueue:
    app = JobQueue(db_url)

    @app.periodic(every=every, cron=cron, args=(7,))
    @app.task(name="report")
    def report(n: int) -> int:
        return n

    return app


def sync(app: JobQueue) -> periodic.SyncReport:
    return periodic.sync(app.store, app.schedules, set(app.registry), utcnow())


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
    assert [r["headers"]["fire_time"] for r in fired] == [(T0 + timedelta(seconds=s)).isoformat() for s in (10, 20, 30)]
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
    assert [r["headers"]["fire_time"] for r in fired] == [(T0 + timedelta(hours=1)).isoformat()]
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
        assert periodic.sync(other_app.store, {}, {"unrelated"}, utcnow()).retired == []
    without = JobQueue(db_url)
    without.task(name="report")(lambda n: n)  # same task, schedule deleted from code
    with freeze_time(T0 + timedelta(seconds=5)):
        assert periodic.sync(without.store, {}, set(without.registry), utcnow()).retired == ["report"]
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


def named_app(db_url: str, *names: str) -> JobQueue:
    app = JobQueue(db_url)
    task = app.task(name="report")(lambda n: n)
    for n, name in enumerate(names):
        app.periodic(every=10, name=name, args=(n,))(task)
    return app


@pytest.mark.parametrize("other", ["digest", "dígest", "Digest "])
def test_schedules_the_database_takes_for_one_are_refused_not_dropped(db_url: str, backend: str, other: str) -> None:
    """MariaDB compares names regardless of case, accents and trailing spaces: there the second
    schedule was never created and never fired, without a word."""
    app = named_app(db_url, "Digest", other)
    with freeze_time(T0):
        report = sync(app)
    if backend == "mysql":
        assert report.created == ["Digest"] and report.clashing == {other: "Digest"}
        assert f"schedule {other!r} is the schedule 'Digest' on this database" in report.clash_message()
        assert "@app.periodic(name=...)" in report.clash_message()
    else:
        assert sorted(report.created) == sorted(["Digest", other]) and not report.clashing
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
    assert [r["headers"]["fire_time"] for r in jobs_of(app)] == ["2026-10-25T00:30:00"]  # 02:30 CEST
    assert periodic.schedule_rows(app.store)["report"].next_fire == datetime(2026, 10, 26, 1, 30)  # 02:30 CET
    app.close()
