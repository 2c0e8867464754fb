"""jobqueue behind PgBouncer in transaction mode: workers, enqueues and the CLI through the pooler.

The database URL goes through the pooler (a pool of a few server connections that every client
shares); the supervisor LISTENs on a direct connection (--listen-database-url) unless a test says
otherwise.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.storage.dialects import postgresql_session
from jobqueue.storage.engine import create_engine
from jobqueue.storage.tables import build_tables
from tests.acceptance.cli import jobqueue
from tests.acceptance.test_upgrade import PREFIX as OLD_PREFIX
from tests.acceptance.test_upgrade import schema_1
from tests.apps import basic
from tests.conftest import only
from tests.runtime.harness import REPORTS, Worker, start, wait_for
from tests.servers import PgBouncer

APP = "tests.apps.basic:app"
REFUSED = "refuses connection options"
UNPREPARED = "runs its statements unprepared"


@pytest.fixture
def pooled(db_url: str, pgbouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test database's URL through the pooler; JOBQUEUE_DATABASE_URL for subprocesses."""
    url = pgbouncer.url(db_url)
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", url)
    return url


@pytest.fixture
def app(pooled: str) -> Iterator[JobQueue]:
    """The acceptance app (tests/apps/basic.py), enqueueing through the pooler."""
    basic.app.configure(database_url=pooled)
    yield basic.app
    basic.app.close()


def archived(db_url: str) -> dict[int, tuple[str, int, int]]:
    """Every archived job: id -> (state, attempts, deliveries), read on a direct connection."""
    tables = build_tables()
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            a, m = tables.archive, tables.message
            left = conn.execute(sa.select(sa.func.count()).select_from(m)).scalar()
            assert left == 0, f"{left} message(s) not finished"
            rows = conn.execute(sa.select(a.c.id, a.c.state, a.c.attempts_count, a.c.deliveries_count))
            return {row.id: (row.state, row.attempts_count, row.deliveries_count) for row in rows}
    finally:
        engine.dispose()


@only("postgresql")
def test_a_worker_behind_the_pooler_runs_every_job_once(app: JobQueue, db_url: str) -> None:
    singles = [basic.add.delay(i, 1) for i in range(100)]
    bulk = basic.add.bulk([(i, 2) for i in range(200)])
    soon = utcnow() + timedelta(seconds=0.5)
    scheduled = [basic.add.apply_at(soon, i, 3) for i in range(20)]
    flaky = [basic.flaky.delay(2) for _ in range(5)]  # fails twice, then succeeds
    failing = [basic.fail.delay(f"no {i}") for i in range(3)]

    run = jobqueue("worker", "--burst", "-c", "2", "--fetch-batch-size", "20", "--listen-database-url", db_url)
    assert REFUSED in run.stderr  # said once per process tree, with what to do
    assert run.stderr.count(REFUSED) == 1, run.stderr[-3000:]

    assert [h.get(timeout=5) for h in singles] == [i + 1 for i in range(100)]
    assert [h.get(timeout=5) for h in bulk] == [i + 2 for i in range(200)]
    assert [h.get(timeout=5) for h in scheduled] == [i + 3 for i in range(20)]
    assert [h.get(timeout=5) for h in flaky] == [3] * 5
    for handle in failing:
        with pytest.raises(Exception, match="no "):
            handle.get(timeout=5)
    jobs = archived(db_url)
    adds = [h.id for h in singles + bulk + scheduled]
    assert {jobs[i] for i in adds} == {("COMPLETED", 1, 1)}  # each delivered and run once
    assert {jobs[h.id] for h in flaky} == {("COMPLETED", 3, 1)}  # a retry is a new delivery count
    assert {jobs[h.id] for h in failing} == {("FAILED", 1, 1)}
    assert len(jobs) == 328


@only("postgresql")
def test_enqueue_in_an_application_transaction_through_the_pooler(app: JobQueue, pooled: str, db_url: str) -> None:
    engine = sa.create_engine(pooled)  # the application's own engine, through the pooler
    try:
        with engine.begin() as conn:
            kept = basic.add.apply_async((1, 2), connection=conn)
            assert conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar() == 1
        assert kept.status() == "pending"
        with engine.connect() as conn:
            with conn.begin() as transaction:
                basic.add.apply_async((3, 4), connection=conn)
                basic.add.bulk([(5, 6), (7, 8)], connection=conn)
                transaction.rollback()
    finally:
        engine.dispose()
    direct = sa.create_engine(db_url)
    try:
        with direct.connect() as conn:
            ids = conn.execute(sa.select(app.tables.message.c.id)).scalars().all()
    finally:
        direct.dispose()
    assert ids == [kept.id]
    jobqueue("worker", "--burst", "-c", "1", "--listen-database-url", db_url)
    assert kept.get(timeout=5) == 3


@only("postgresql")
def test_the_cli_through_the_pooler(app: JobQueue, db_url: str, tmp_path: Path) -> None:
    marker = str(tmp_path / "marker")
    enqueued = json.loads(jobqueue("enqueue", "basic.fail_once", "--args", json.dumps([marker]), "--json").stdout)
    job = str(enqueued["id"])
    jobqueue("worker", "--burst", "-c", "1", "--listen-database-url", db_url)
    assert "FAILED" in jobqueue("jobs", "show", job).stdout
    listed = json.loads(jobqueue("jobs", "list", "--state", "failed", "--json").stdout)
    assert [row["id"] for row in listed] == [int(job)]
    assert "failed 1" in jobqueue("status").stdout
    assert f"retried 1 job(s): {job}" in jobqueue("jobs", "retry", job).stdout
    jobqueue("worker", "--burst", "-c", "1", "--listen-database-url", db_url)
    assert json.loads(jobqueue("jobs", "show", job, "--json").stdout)["state"] == "completed"
    assert "up to date" in jobqueue("db", "init").stdout
    assert jobqueue("db", "check").returncode == 0

    # An old schema, upgraded through the pooler (inspection, ALTER TABLE, the trigger).
    old = "tests.apps.upgrade:app"
    schema_1(db_url)
    try:
        check = jobqueue("db", "check", app=old, check=False)
        assert check.returncode == 1 and "schema version 1" in check.stderr
        jobqueue("db", "upgrade", app=old)
        assert jobqueue("db", "check", app=old).returncode == 0
    finally:
        engine = sa.create_engine(db_url)
        with engine.begin() as conn:
            build_tables(OLD_PREFIX).metadata.drop_all(conn, checkfirst=True)
        engine.dispose()


@only("postgresql")
def test_prepared_statements_missing_on_fresh_server_connections(
    app: JobQueue, db_url: str, pgbouncer: PgBouncer, workers: list[Worker], tmp_path: Path
) -> None:
    """The pooler closes its server connections again and again (RECONNECT): statements prepared on
    one are missing on the next. A miss runs the statement plain; three give up preparing."""
    handles = basic.sleep.bulk([(0.005,)] * 200)
    database = sa.make_url(db_url).database
    worker = start(
        workers, tmp_path, "--burst", "-c", "1", "--fetch-batch-size", "2", "--listen-database-url", db_url, app=APP
    )
    finished = sa.select(sa.func.count()).select_from(app.tables.archive)
    direct = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
    reconnects = 0
    try:
        with direct.connect() as conn:
            done = 0
            while worker.process.poll() is None and UNPREPARED not in worker.text():
                pgbouncer.admin(f"RECONNECT {database}")  # each server connection closes once released
                reconnects += 1

                # The worker finishes a batch on the fresh server connections before the next
                # RECONNECT: closing them faster than the server starts sessions would starve it.
                def progressed(before: int = done) -> bool:
                    return worker.process.poll() is not None or conn.execute(finished).scalar_one() > before

                wait_for(progressed, 30, "the worker to finish a batch")
                done = conn.execute(finished).scalar_one()
    finally:
        direct.dispose()
    assert worker.wait(60) == 0
    log = worker.text()
    assert log.count(UNPREPARED) == 1, log[-3000:]  # once for every statement of the process
    assert [h.get(timeout=5) for h in handles] == [0.005] * 200
    assert set(archived(db_url).values()) == {("COMPLETED", 1, 1)}  # none lost, none run twice
    REPORTS.append(f"pgbouncer: prepared statements given up after {reconnects} RECONNECTs")


def _started_after(db_url: str, job_id: int) -> float:
    """Seconds from a job's enqueue to its start, both on the database server's clock."""
    a = build_tables().archive
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.select(a.c.created_at, a.c.first_attempt_at).where(a.c.id == job_id)).one()
    finally:
        engine.dispose()
    return float((row.first_attempt_at - row.created_at).total_seconds())


@only("postgresql")
def test_without_a_listen_url_the_supervisor_polls_and_never_listens_through_the_pooler(
    app: JobQueue, db_url: str, pgbouncer: PgBouncer, workers: list[Worker], tmp_path: Path
) -> None:
    worker = start(workers, tmp_path, "-c", "1", "--max-fetch-interval", "0.3", app=APP)
    wait_for(lambda: "does not LISTEN there" in worker.text(), 30, "the supervisor to say it polls")
    handles = []
    for i in range(3):
        handles.append(basic.add.delay(i, i))
        assert handles[-1].get(timeout=10) == 2 * i
    latencies = [_started_after(db_url, h.id) for h in handles]
    assert max(latencies) < 5, latencies  # a poll every 0.3 s, on a loaded machine
    # A LISTEN through the pooler would have left a server connection listening: the notifications
    # of these enqueues would have reached other clients, or PgBouncer, which logs them.
    assert "when not linked" not in pgbouncer.log()


@only("postgresql")
def test_with_a_direct_listen_url_an_idle_worker_starts_a_new_job_at_once(
    app: JobQueue, db_url: str, pgbouncer: PgBouncer, workers: list[Worker], tmp_path: Path
) -> None:
    # Polling once a minute: only the notification can start these jobs in time.
    worker = start(workers, tmp_path, "-c", "2", "--max-fetch-interval", "60", "--listen-database-url", db_url, app=APP)
    wait_for(lambda: "started worker process 1" in worker.text(), 30, "the worker processes")
    time.sleep(0.5)  # idle
    handles = []
    for i in range(5):
        handles.append(basic.add.delay(i, i))
        assert handles[-1].get(timeout=10) == 2 * i
    latencies = [_started_after(db_url, h.id) for h in handles]
    median = statistics.median(latencies) * 1000
    assert max(latencies) < 2, latencies  # about 10 ms; the bound is for a loaded machine

    # The host's connections: through the pooler the supervisor's one and each process's two at
    # most (a process woken for no job yet holds one), and the one LISTEN connection direct.
    app.close()  # the test's own, through the pooler
    database = sa.make_url(db_url).database
    clients = [c for c in pgbouncer.admin("SHOW CLIENTS") if c["database"] == database]
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            query = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
            )
            listening = conn.exec_driver_sql(query).scalar()
    finally:
        engine.dispose()
    assert 3 <= len(clients) <= 1 + 2 * 2 and listening == 1, (clients, listening)
    REPORTS.append(
        f"pgbouncer: new job to start on an idle worker (LISTEN direct): median {median:.0f} ms; "
        f"-c 2: {len(clients)} client connections through the pooler, {listening} direct (LISTEN)"
    )


@only("postgresql")
def test_settings_the_pooler_refuses_are_named_until_the_role_has_them(
    db_url: str, pooled: str, pgbouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def connect() -> dict[str, str]:
        monkeypatch.setattr(postgresql_session, "_refused", set())  # as a new process would
        caplog.clear()
        engine = create_engine(pooled)
        try:
            with engine.connect() as conn:
                names = list(postgresql_session.SESSION_SETTINGS)
                query = sa.text("SELECT name, setting FROM pg_settings WHERE name IN :names")
                rows = conn.execute(query.bindparams(sa.bindparam("names", expanding=True)), {"names": names})
                return {row.name: row.setting for row in rows}
        finally:
            engine.dispose()

    caplog.set_level("INFO", "jobqueue.storage")
    assert connect()["enable_seqscan"] == "on"
    assert "not in effect: lock_timeout=30000" in caplog.text
    database = sa.make_url(db_url).database
    direct = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with direct.connect() as conn:
            for name, value in postgresql_session.SESSION_SETTINGS.items():
                conn.exec_driver_sql(f"ALTER ROLE CURRENT_USER IN DATABASE {database} SET {name} = '{value}'")
        pgbouncer.admin(f"RECONNECT {database}")  # role settings apply to new server sessions
        assert connect() == postgresql_session.SESSION_SETTINGS
        assert "not in effect" not in caplog.text and "settings already" in caplog.text
    finally:
        with direct.connect() as conn:
            conn.exec_driver_sql(f"ALTER ROLE CURRENT_USER IN DATABASE {database} RESET ALL")
        direct.dispose()
        pgbouncer.admin(f"RECONNECT {database}")


@only("postgresql")
@pytest.mark.parametrize("refusal", ["database", "user"])
def test_a_login_the_pooler_refuses_stops_the_worker_at_start_naming_the_fix(
    pooled: str, refusal: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """PgBouncer words its refusals its own way (a user missing from its auth_file: '"trust"
    authentication failed' here, "no such user" under other auth types; a database the server
    lacks, the server's own words passed on): either is no outage to wait out, so the worker says
    what to fix and exits."""
    url = sa.make_url(pooled)
    if refusal == "database":
        url, fix = url.set(database=f"{url.database}_not_created"), "CREATE DATABASE"
    else:
        url, fix = url.set(username="jobqueue_no_such_role"), "list the user in the pooler's auth_file"
    url_text = url.render_as_string(hide_password=False)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", env={"JOBQUEUE_DATABASE_URL": url_text})
    assert worker.wait(30) == 1, worker.text()[-3000:]
    assert "refuses this login" in worker.text() and fix in worker.text(), worker.text()[-3000:]
