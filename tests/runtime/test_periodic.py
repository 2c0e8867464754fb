"""Periodic tasks under real supervisors: exactly one job per fire time, however many workers run."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from jobqueue import JobQueue, periodic
from jobqueue.clock import utcnow
from tests.acceptance.cli import jobqueue
from tests.apps import periodic as periodic_app
from tests.conftest import only
from tests.runtime.harness import REPORTS, Worker, wait_for


def fire_times(app: JobQueue, *tasks: str) -> list[datetime]:
    """The fire times of the jobs of ``tasks`` (of the every-second schedule's task by default)."""
    times = []
    with app.engine.connect() as conn:
        for table in (app.tables.message, app.tables.archive):
            query = sa.select(table.c.headers).where(table.c.task_name.in_(tasks or ("pd.tick",)))
            for (headers,) in conn.execute(query):
                times.append(datetime.fromisoformat(headers["fire_time"]).replace(tzinfo=None))  # UTC
    return sorted(times)


def test_three_supervisors_one_job_per_fire_time(db_url: str, backend: str, tmp_path: Path) -> None:
    app = JobQueue(db_url)
    supervisors = [
        Worker(tmp_path, "--concurrency", "2", app="tests.apps.periodic:app", name=f"sup{i}") for i in range(3)
    ]
    try:
        wait_for(lambda: len(fire_times(app)) >= 10, 40, "ten fires of the every-second schedule")
        for supervisor in supervisors:
            supervisor.signal(signal.SIGTERM)
        assert [s.wait(30) for s in supervisors] == [0, 0, 0]
    finally:
        for supervisor in supervisors:
            supervisor.close()
    times = fire_times(app)
    assert len(times) == len(set(times)), "two jobs for one fire time"
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    assert gaps and all(gap == 1.0 for gap in gaps), f"gaps between fire times: {gaps}"
    created = [
        name
        for s in supervisors
        for line in s.text().splitlines()
        if "schedules created: " in line
        for name in line.split("schedules created: ", 1)[1].split(", ")
    ]
    # Each schedule was created by exactly one supervisor (not always the same one); the others found it.
    assert sorted(created) == sorted(periodic_app.app.schedules)
    REPORTS.append(
        f"periodic[{backend}]: 3 supervisors, {len(times)} fires of an every-second schedule, "
        "0 duplicates, no gap over 1 s"
    )
    app.close()


def test_periodic_list_and_an_edit_after_restart(db_url: str, tmp_path: Path) -> None:
    jobqueue("worker", "--burst", "--concurrency", "1", app="tests.apps.periodic:app")
    listed = {
        s["name"]: s for s in json.loads(jobqueue("periodic", "list", "--json", app="tests.apps.periodic:app").stdout)
    }
    assert listed["pd.tick"]["expression"] == "every 1 s"
    assert (
        listed["morning-report"]["timezone"] == "Europe/Paris" and listed["morning-report"]["expression"] == "0 7 * * *"
    )
    next_report = datetime.fromisoformat(listed["morning-report"]["next_fire"]).replace(tzinfo=None)
    assert next_report.minute == 0 and next_report.hour in (5, 6)  # 07:00 in Paris is 05:00 or 06:00 UTC
    table = jobqueue("periodic", "list", app="tests.apps.periodic:app").stdout
    assert "morning-report" in table and "07:00:00 CE" in table  # shown in the schedule's own timezone

    # A restart with the edited code: the new expression and its next fire; the deleted one retired.
    run = jobqueue("worker", "--burst", "--concurrency", "1", app="tests.apps.periodic_edited:app")
    assert "schedules updated: pd.tick" in run.stderr and "schedules retired: morning-report" in run.stderr
    edited = {
        s["name"]: s
        for s in json.loads(jobqueue("periodic", "list", "--json", app="tests.apps.periodic_edited:app").stdout)
    }
    assert set(edited) == {"pd.tick"} and edited["pd.tick"]["expression"] == "*/15 * * * *"
    next_fire = datetime.fromisoformat(edited["pd.tick"]["next_fire"]).replace(tzinfo=None)
    assert next_fire.minute % 15 == 0 and next_fire.second == 0
    assert next_fire - utcnow() <= timedelta(minutes=15)


def test_a_renamed_tasks_old_schedule_says_how_to_retire_it(db_url: str) -> None:
    """No worker knows the old task any more, so none retires its schedule (it could be another
    app's): it keeps firing jobs that fail as unknown. The listing names the command that stops it."""
    jobqueue("worker", "--burst", "--concurrency", "1", app="tests.apps.periodic:app")
    run = jobqueue("worker", "--burst", "--concurrency", "1", app="tests.apps.periodic_renamed:app")
    assert "schedules retired" not in run.stderr
    listed = {
        s["name"]: s
        for s in json.loads(jobqueue("periodic", "list", "--json", app="tests.apps.periodic_renamed:app").stdout)
    }
    old = listed["morning-report"]
    assert old["task"] == "pd.report" and isinstance(old["id"], int)
    assert f"`jobqueue jobs cancel {old['id']}` retires it" in old["status"]
    renamed = "tests.apps.periodic_renamed:app"
    assert f"jobqueue jobs cancel {old['id']}" in jobqueue("periodic", "list", app=renamed).stdout
    jobqueue("jobs", "cancel", str(old["id"]), app=renamed)
    after = json.loads(jobqueue("periodic", "list", "--json", app=renamed).stdout)
    assert {s["name"] for s in after} == {"pd.tick", "morning-report-v2"}


def worker_ahead(tmp_path: Path, seconds: int) -> Worker:
    """A worker of the periodic app on a host whose clock runs ``seconds`` ahead of the server's."""
    return Worker(
        tmp_path,
        "--concurrency",
        "1",
        app="tests.apps.periodic_skewed:app",
        name="ahead",
        env={"JOBQUEUE_TEST_SKEW_SECONDS": str(seconds)},
    )


@only("postgresql", "mysql")
def test_a_host_whose_clock_runs_90_s_ahead_skips_no_fire(db_url: str, tmp_path: Path) -> None:
    """The schedule is fired on time by a host with the right clock; then a host 90 s ahead (more than
    the catch-up grace) joins, and takes over when the first stops. No worker was ever down for
    longer than the grace: it must fire the next time, not skip to its own idea of now as after an
    outage. (It counts on the server's clock, which it measures when it starts.)"""
    app = JobQueue(db_url)
    honest = Worker(tmp_path, "--concurrency", "1", app="tests.apps.periodic:app", name="honest")
    ahead = None
    try:
        wait_for(lambda: len(fire_times(app)) >= 3, 30, "the honest host's first fires")
        ahead = worker_ahead(tmp_path, 90)
        wait_for(lambda: "s ahead of the database server's" in ahead.text(), 30, "the host ahead up")
        honest.signal(signal.SIGTERM)
        assert honest.wait(30) == 0
        wait_for(lambda: "fired pd.tick" in ahead.text(), 30, "the host ahead firing the schedule")
        count = len(fire_times(app))
        wait_for(lambda: len(fire_times(app)) >= count + 3, 30, "three more fires")
        ahead.signal(signal.SIGTERM)
        assert ahead.wait(30) == 0
    finally:
        for worker in (honest, ahead):
            if worker is not None:
                worker.close()
    times = fire_times(app)
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    assert gaps and all(gap == 1.0 for gap in gaps), f"gaps between fire times: {gaps}"
    assert "missed its fires" not in ahead.text()
    app.close()


@only("postgresql", "mysql")
def test_a_schedule_first_created_by_a_host_an_hour_ahead_fires_on_time(db_url: str, tmp_path: Path) -> None:
    """The first worker ever, on a host whose clock runs an hour ahead, creates the every-second
    schedule: its first fire is a second from the server's now, not from the host's (an hour away)."""
    app = JobQueue(db_url)
    ahead = worker_ahead(tmp_path, 3600)
    try:
        wait_for(lambda: len(fire_times(app)) >= 3, 30, "three fires")
        ahead.signal(signal.SIGTERM)
        assert ahead.wait(30) == 0
    finally:
        ahead.close()
    app.close()


def schedule_state(app: JobQueue) -> tuple[str, datetime]:
    """The every-second schedule message's state and next fire time (naive UTC)."""
    rows = [row for row in periodic.schedule_rows(app.store).values() if row.name == "pd.tick"]
    assert len(rows) == 1, rows
    return rows[0].state, rows[0].next_fire


# Where each kill lands, in seconds from the next fire time: before it, on it, and when the schedule
# message is first seen held (None: between its acquisition and the commit of its fire, if the poll
# catches that moment), twice.
KILL_MOMENTS = (-0.03, 0.0, None, None, 0.05)


def kill_around_the_next_fire(app: JobQueue, worker: Worker, offset: float | None) -> None:
    """SIGKILL ``worker``'s supervisor at ``offset`` seconds from the schedule's next fire time, or
    as soon as the schedule message is seen PROCESSING (None); wait for its whole tree to die."""
    _, next_fire = schedule_state(app)
    if offset is not None:
        time.sleep(max(0.0, (next_fire - utcnow()).total_seconds() + offset))
    else:
        time.sleep(max(0.0, (next_fire - utcnow()).total_seconds() - 0.02))
        deadline = time.monotonic() + 0.5
        while schedule_state(app)[0] != "PROCESSING" and time.monotonic() < deadline:
            pass
    tree = worker.children()
    worker.signal(signal.SIGKILL)
    worker.process.wait(10)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in tree), 5, "the killed tree to die")


def test_supervisors_sigkilled_around_fire_times_skip_none_and_fire_none_twice(
    db_url: str, backend: str, tmp_path: Path
) -> None:
    """SIGKILL the whole supervisor at moments around a fire (its processes die with it, possibly
    inside the firing transaction) and start a new one each time: every fire time still gets
    exactly one job, the schedule is neither lost, doubled nor stuck, and fires resume."""
    app = JobQueue(db_url)
    lease = ("--concurrency", "1", "--release-stuck-timeout", "1", "--release-stuck-interval", "0.2")
    started: list[Worker] = []
    held = 0  # kills that left the schedule message held by the dead delivery, to come back by lease expiry
    try:
        for round_, offset in enumerate(KILL_MOMENTS):
            worker = Worker(tmp_path, *lease, app="tests.apps.periodic:app", name=f"sup{round_}")
            started.append(worker)
            wait_for(lambda: "fired pd.tick" in worker.text(), 30, "the new supervisor to fire the schedule")  # noqa: B023
            kill_around_the_next_fire(app, worker, offset)
            held += schedule_state(app)[0] == "PROCESSING"
        count = len(fire_times(app))
        last = Worker(tmp_path, *lease, app="tests.apps.periodic:app", name="last")
        started.append(last)
        wait_for(lambda: len(fire_times(app)) >= count + 3, 30, "three more fires after the last kill")
        last.signal(signal.SIGTERM)
        assert last.wait(30) == 0, last.text()[-3000:]
    finally:
        for worker in started:
            worker.close()
    times = fire_times(app)
    assert len(times) == len(set(times)), "two jobs for one fire time"
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    assert gaps and all(gap == 1.0 for gap in gaps), f"gaps between fire times: {gaps}"
    state, next_fire = schedule_state(app)
    assert state == "PENDING" and next_fire == times[-1] + timedelta(seconds=1)
    assert "missed its fires" not in "".join(w.text() for w in started)
    REPORTS.append(
        f"periodic kills[{backend}]: {len(KILL_MOMENTS)} supervisors SIGKILLed around fire times "
        f"({held} while it held the schedule), {len(times)} fires, 0 duplicates, no gap over 1 s"
    )
    app.close()


def test_schedules_edited_while_a_dead_worker_held_them_change_once_its_lease_runs_out(
    db_url: str, tmp_path: Path
) -> None:
    """A supervisor was killed while firing schedules, and the new code changes one and removes the
    other: their messages are held by the dead deliveries until their leases run out, so the new
    worker can neither update nor retire them at start. It must do so once they are free, not fire
    the old schedules on until some later restart."""
    app = JobQueue(db_url)
    jobqueue("worker", "--burst", "--concurrency", "1", app="tests.apps.periodic:app")
    m = app.tables.message
    now = utcnow()
    with app.engine.begin() as conn:  # what the killed supervisor left: held, its lease running out
        conn.execute(
            sa.update(m)
            .where(m.c.task_name == periodic.SCHEDULE_TASK, m.c.unique_key.in_(["pd.tick", "morning-report"]))
            .values(
                state="PROCESSING",
                worker_id="killed",
                lease_token=1,
                acquired_at=now,
                lease_expires_at=now + timedelta(seconds=2),
            )
        )
    edited = "tests.apps.periodic_edited:app"
    lease = ("--concurrency", "1", "--release-stuck-timeout", "1", "--release-stuck-interval", "0.2")
    worker = Worker(tmp_path, *lease, app=edited, name="edited")
    try:
        wait_for(
            lambda: "busy being fired: morning-report, pd.tick" in worker.text(), 30, "the new worker to find both held"
        )
        wait_for(lambda: "schedules updated: pd.tick" in worker.text(), 20, "the change once the lease ran out")
        wait_for(lambda: "schedules retired: morning-report" in worker.text(), 5, "the removal, never busy")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.text()[-3000:]
    finally:
        worker.close()
    listed = {s["name"]: s for s in json.loads(jobqueue("periodic", "list", "--json", app=edited).stdout)}
    assert set(listed) == {"pd.tick"} and listed["pd.tick"]["expression"] == "*/15 * * * *"
    next_fire = datetime.fromisoformat(listed["pd.tick"]["next_fire"]).replace(tzinfo=None)
    assert next_fire.minute % 15 == 0 and next_fire.second == 0
    app.close()


def test_schedules_whose_names_differ_only_in_case_are_two_on_every_database(db_url: str) -> None:
    """On MariaDB too, whose default collation would take 'Digest' for 'digest' (a worker then
    refused to start): schedule names are keys, compared exactly."""
    app = "tests.apps.periodic_clash:app"
    run = jobqueue("worker", "--burst", "--concurrency", "1", app=app, check=False)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    listed = json.loads(jobqueue("periodic", "list", "--json", app=app).stdout)
    assert sorted(s["name"] for s in listed) == ["Digest", "digest"]


def test_jobs_show_of_a_schedule_message_shows_the_schedule_and_its_arguments(db_url: str) -> None:
    """`periodic list` points at schedule messages by id; `jobs show` of one reads as a schedule,
    not as a corrupt payload."""
    jobqueue("worker", "--burst", "--concurrency", "1", app="tests.apps.periodic:app")
    listed = json.loads(jobqueue("periodic", "list", "--json", app="tests.apps.periodic:app").stdout)
    report = next(s for s in listed if s["name"] == "morning-report")
    shown = jobqueue("jobs", "show", str(report["id"]), app="tests.apps.periodic:app").stdout
    assert "cannot decode" not in shown and "corrupt" not in shown, shown
    assert "schedule     morning-report: pd.report, 0 7 * * * (Europe/Paris)" in shown, shown
    assert 'kwargs       {"kind": "daily"}' in shown, shown
    detail = json.loads(jobqueue("jobs", "show", str(report["id"]), "--json", app="tests.apps.periodic:app").stdout)
    assert detail["kwargs"] == {"kind": "daily"} and detail["schedule"]["expression"] == "0 7 * * *"


def schedule_messages(app: JobQueue) -> dict[str, list[int]]:
    """The ids of the active schedule messages, by schedule name (every row, duplicates included)."""
    m = app.tables.message
    found: dict[str, list[int]] = {}
    with app.engine.connect() as conn:
        for name, message_id in conn.execute(
            sa.select(m.c.unique_key, m.c.id).where(m.c.task_name == periodic.SCHEDULE_TASK).order_by(m.c.id)
        ):
            found.setdefault(name, []).append(message_id)
    return found


def test_schedule_messages_deleted_by_hand_come_back_once_under_two_supervisors(
    db_url: str, backend: str, tmp_path: Path
) -> None:
    """An operator DELETEs one schedule message and cancels the other with `jobqueue jobs cancel`,
    while two supervisors run: each comes back within the maintenance interval, created by one of
    them only, with its fires counted from then (no catch-up), and the every-second schedule fires
    on. Before, both stayed gone until a worker restarted: the schedules silently never fired."""
    app = JobQueue(db_url)
    interval = ("--concurrency", "1", "--release-stuck-interval", "0.5")
    supervisors = [Worker(tmp_path, *interval, app="tests.apps.periodic:app", name=f"sup{i}") for i in range(2)]
    try:
        wait_for(lambda: len(fire_times(app)) >= 2, 30, "the first fires")
        before = schedule_messages(app)
        assert set(before) == {"pd.tick", "morning-report"}
        m = app.tables.message
        with app.engine.begin() as conn:
            conn.execute(sa.delete(m).where(m.c.id == before["pd.tick"][0]))
        deleted = time.monotonic()
        jobqueue("jobs", "cancel", str(before["morning-report"][0]), app="tests.apps.periodic:app")
        wait_for(lambda: set(schedule_messages(app)) == set(before), 10, "both schedule messages created again")
        took = time.monotonic() - deleted
        after = schedule_messages(app)
        assert all(len(ids) == 1 for ids in after.values()), after
        assert after["pd.tick"] != before["pd.tick"] and after["morning-report"] != before["morning-report"]
        count = len(fire_times(app))
        wait_for(lambda: len(fire_times(app)) >= count + 2, 30, "the every-second schedule firing again")
        for supervisor in supervisors:
            supervisor.signal(signal.SIGTERM)
        assert [s.wait(30) for s in supervisors] == [0, 0]
    finally:
        for supervisor in supervisors:
            supervisor.close()
    assert schedule_messages(app) == after  # nothing created twice meanwhile
    times = fire_times(app)
    assert len(times) == len(set(times)), "two jobs for one fire time"
    logs = "".join(s.text() for s in supervisors)
    created = [
        name
        for line in logs.splitlines()
        if "created again: " in line
        for name in line.split("created again: ", 1)[1].split(";")[0].split(", ")
    ]
    assert sorted(created) == ["morning-report", "pd.tick"], logs[-3000:]
    assert "missed its fires" not in logs  # counted from now: no catch-up run
    assert schedule_state(app)[0] == "PENDING"
    REPORTS.append(f"periodic keeper[{backend}]: 2 schedule messages deleted by hand, back in {took:.1f} s, once each")
    app.close()


def test_a_schedule_retired_by_a_newer_release_is_not_created_again_by_an_older_worker(
    db_url: str, tmp_path: Path
) -> None:
    """A rolling deploy: once the old release's worker that created the schedules has stopped, the new
    release's worker retires the one its code no longer has while another worker of the old release
    still runs. That one leaves it retired, rather than bringing it back for as long as it runs (and
    past it: nothing would retire it again)."""
    app = JobQueue(db_url)
    fast = ("--concurrency", "1", "--release-stuck-interval", "0.2")
    first = Worker(tmp_path, *fast, app="tests.apps.periodic:app", name="first")
    old = None
    try:
        wait_for(lambda: "schedules created" in first.text(), 30, "the old release creating the schedules")
        old = Worker(tmp_path, *fast, app="tests.apps.periodic:app", name="old")
        wait_for(lambda: supervisors(app) == 2, 30, "the second worker of the old release")
        first.signal(signal.SIGTERM)
        assert first.wait(30) == 0, first.text()[-3000:]
        run = jobqueue("worker", "--burst", "--concurrency", "1", app="tests.apps.periodic_edited:app")
        assert "schedules retired: morning-report" in run.stderr, run.stderr[-3000:]
        wait_for(lambda: "leaves them retired" in old.text(), 10, "the old worker to see the retirement")
        assert set(schedule_messages(app)) == {"pd.tick"}
        assert "created again" not in old.text()
        old.signal(signal.SIGTERM)
        assert old.wait(30) == 0, old.text()[-3000:]
    finally:
        first.close()
        if old is not None:
            old.close()
    app.close()


def supervisors(app: JobQueue) -> int:
    """How many supervisors have worker processes registered."""
    w = app.tables.worker
    with app.engine.connect() as conn:
        return len(set(conn.execute(sa.select(w.c.supervisor_id)).scalars()))


def stored_schedule(app: JobQueue, name: str) -> periodic.Schedule | None:
    row = periodic.schedule_rows(app.store).get(name)
    return None if row is None else row.schedule


def definition(app: JobQueue, name: str = "pd.tick") -> tuple[str, str] | None:
    """The stored definition of a schedule: (its task, its expression)."""
    schedule = stored_schedule(app, name)
    return None if schedule is None else (schedule.task_name, schedule.expression)


def test_two_apps_that_define_one_schedule_name_differently_take_it_at_each_start_with_a_warning(
    db_url: str, tmp_path: Path
) -> None:
    """Two services on one database both define a schedule "pd.tick", every second and every two
    seconds. A worker start applies its own code's definition, as every start does, and warns,
    naming the schedule, both definitions and the other worker; running workers never take it back
    (no ping-pong while both run), and no fire time runs twice."""
    app = JobQueue(db_url)
    fast = ("--concurrency", "1", "--release-stuck-interval", "0.2")
    ours, other = "tests.apps.periodic:app", "tests.apps.periodic_other:app"
    started: list[Worker] = []
    try:
        a1 = Worker(tmp_path, *fast, "-Q", "default", app=ours, name="a1")
        started.append(a1)
        wait_for(lambda: len(fire_times(app)) >= 2, 30, "the first app's fires")
        # The other app's start: its definition applies, with a warning naming both.
        b1 = Worker(tmp_path, *fast, "-Q", "other", app=other, name="b1")
        started.append(b1)
        wait_for(lambda: "schedules updated: pd.tick" in b1.text(), 30, "the other app's start applying its own")
        assert definition(app) == ("po.tick", "every 2 s")
        warning = next(line for line in b1.text().splitlines() if "defined differently" in line)
        assert "schedule 'pd.tick' is defined differently by a running worker (supervisor " in warning, warning
        assert (
            "it has every 1 s (UTC) for task pd.tick, this app's code has every 2 s (UTC) for task po.tick" in warning
        )
        assert "This worker's start applies this code's definition" in warning
        assert "that worker's next start will apply its own again" in warning and "@app.periodic(name=...)" in warning
        wait_for(lambda: len(fire_times(app, "po.tick")) >= 2, 30, "the other app's fires")
        time.sleep(1)  # five more looks of the first app's running worker: it does not take it back
        assert definition(app) == ("po.tick", "every 2 s")
        assert "schedules updated" not in a1.text() and "defined differently" not in a1.text()
        # A new start of the first app: its definition again, and the other app's running worker
        # leaves it so.
        a2 = Worker(tmp_path, *fast, "-Q", "default", app=ours, name="a2")
        started.append(a2)
        wait_for(lambda: "schedules updated: pd.tick" in a2.text(), 30, "the first app's new start")
        assert "it has every 2 s (UTC) for task po.tick, this app's code has every 1 s (UTC)" in a2.text()
        count = len(fire_times(app))
        wait_for(lambda: len(fire_times(app)) >= count + 3, 30, "three more fires of the first app's")
        assert definition(app) == ("pd.tick", "every 1 s")
        assert b1.text().count("schedules updated") == 1 and "schedules updated" not in a1.text()
        assert all(w.text().count("defined differently") <= 1 for w in started)  # once, at start
        for worker in started:
            worker.signal(signal.SIGTERM)
        assert [w.wait(30) for w in started] == [0, 0, 0]
    finally:
        for worker in started:
            worker.close()
    assert len(schedule_messages(app)["pd.tick"]) == 1
    times = fire_times(app, "pd.tick", "po.tick")
    assert len(times) == len(set(times)), "two jobs for one fire time"
    app.close()


def test_a_worker_killed_and_restarted_at_once_with_an_edited_schedule_applies_it_at_that_start(
    db_url: str, tmp_path: Path
) -> None:
    """A worker is SIGKILLed (its rows still beat as far as anyone can tell) and started again right
    away with edited code: that start applies the edited schedule and retires the deleted one, as
    every start does, rather than waiting for the killed worker's heartbeats to go stale."""
    app = JobQueue(db_url)
    fast = ("--concurrency", "1", "--release-stuck-interval", "0.2")
    old = Worker(tmp_path, *fast, app="tests.apps.periodic:app", name="old")
    new = None
    try:
        wait_for(lambda: len(fire_times(app)) >= 2, 30, "the first fires")
        count = len(fire_times(app))
        wait_for(lambda: len(fire_times(app)) > count, 10, "a fire, the next one a second away")
        old.kill()
        assert supervisors(app) == 1  # its worker rows are left, with fresh heartbeats
        new = Worker(tmp_path, *fast, app="tests.apps.periodic_edited:app", name="new")
        # The schedules are synced before the worker processes start: by then the edit is applied.
        wait_for(lambda: "started worker process" in new.text(), 30, "the restarted worker's processes")
        text = new.text()
        assert "schedules updated: pd.tick" in text, text[-3000:]
        assert "schedules retired: morning-report" in text, text[-3000:]
        assert "busy being fired" not in text, text[-3000:]
        assert definition(app) == ("pd.tick", "*/15 * * * *")
        assert stored_schedule(app, "morning-report") is None
        new.signal(signal.SIGTERM)
        assert new.wait(30) == 0, new.text()[-3000:]
    finally:
        old.close()
        if new is not None:
            new.close()
    times = fire_times(app)
    assert len(times) == len(set(times)), "two jobs for one fire time"
    app.close()
