"""Upgrading a database of schema 1, with jobs in every state, to this release's schema.

The schema-1 tables come from the frozen layout in tests/storage/schema_v1.py; the jobs are written
as a schema-1 release wrote them (this release's enqueue writes columns schema 1 lacks).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue, periodic
from jobqueue.clock import utcnow
from jobqueue.errors import SchemaError
from jobqueue.handle import JobHandle
from jobqueue.serialization import dumps_call
from jobqueue.storage import migrations
from jobqueue.storage.tables import SCHEMA_VERSION, Name, Names, build_tables
from tests.acceptance.cli import ROOT, jobqueue
from tests.apps import upgrade
from tests.conftest import only
from tests.storage import schema_v1

APP = "tests.apps.upgrade:app"
PREFIX = "jqup_"


def schema_1(url: str) -> None:
    """Tables of schema 1 (dropping any left over), as the last release of it created them."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        build_tables(PREFIX).metadata.drop_all(conn, checkfirst=True)
        old = schema_v1.build_tables(PREFIX)
        old.metadata.create_all(conn)
        if conn.dialect.name == "postgresql":
            for statement in schema_v1.postgresql_notify_ddl(PREFIX):
                conn.exec_driver_sql(statement)
        conn.execute(sa.insert(old.schema_version), {"version": 1, "applied_at": utcnow()})
    engine.dispose()


def columns(url: str, prefix: str) -> dict[str, set[tuple[str, bool, str | None]]]:
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        return {
            table[len(prefix) :]: {
                (c["name"], bool(c["nullable"]), getattr(c["type"], "collation", None))
                for c in inspector.get_columns(table)
            }
            for table in inspector.get_table_names()
            if table.startswith(prefix)
        }
    finally:
        engine.dispose()


@pytest.fixture
def old_database(db_url: str) -> Iterator[str]:
    upgrade.app.configure(database_url=db_url)
    schema_1(db_url)
    yield db_url
    upgrade.app.close()
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        build_tables(PREFIX).metadata.drop_all(conn, checkfirst=True)
    engine.dispose()


def test_an_upgraded_schema_is_the_schema_a_new_database_gets(old_database: str) -> None:
    fresh = build_tables("jqnew_")
    engine = sa.create_engine(old_database)
    try:
        with engine.begin() as conn:
            fresh.metadata.create_all(conn)
        done = migrations.upgrade(engine, build_tables(PREFIX))
        assert done and done[0].startswith("-- 2:")
        assert columns(old_database, PREFIX) == columns(old_database, "jqnew_")
        assert migrations.upgrade(engine, build_tables(PREFIX)) == []  # nothing left to do
    finally:
        with engine.begin() as conn:
            fresh.metadata.drop_all(conn)
        engine.dispose()


def schema_6(url: str) -> None:
    """Tables of schema 6 (dropping any left over): this release's, with the names of tasks,
    queues, topics and groups in the database's default collation."""
    tables = build_tables(PREFIX)
    for column in (c for table in tables.metadata.sorted_tables for c in table.columns):
        if column.type is Names:
            column.type = sa.Text()
        elif isinstance(column.type, Name):
            column.type = sa.String(column.type.length)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        tables.metadata.drop_all(conn, checkfirst=True)
        tables.metadata.create_all(conn)
        conn.execute(sa.insert(tables.schema_version), {"version": 6, "applied_at": utcnow()})
    engine.dispose()


def test_an_upgrade_from_schema_6_compares_names_exactly(old_database: str) -> None:
    """Schema 7 gives the name columns of every table, topics' included, the collation a new
    database gets; after it a worker of the queue 'emails' leaves the jobs of 'Emails'."""
    schema_6(old_database)
    wanted = fresh_layout(old_database)
    assert (layout(old_database, PREFIX) == wanted) == (not old_database.startswith("mysql"))
    engine = sa.create_engine(old_database)
    try:
        done = migrations.upgrade(engine, build_tables(PREFIX))
    finally:
        engine.dispose()
    assert done[0].startswith("-- 7:") and len(done) == (7 if old_database.startswith("mysql") else 1)
    assert layout(old_database, PREFIX) == wanted
    app = upgrade.app
    ours, theirs = (upgrade.double.apply_async((1,), queue=queue) for queue in ("emails", "Emails"))
    assert [m.id for m in app.store.acquire("w" * 32, ("emails",), 10, 30.0)] == [ours.id]
    assert theirs.status() == "pending"


def test_jobs_in_every_state_survive_the_upgrade_and_run_to_their_end(old_database: str, tmp_path: Path) -> None:
    app = upgrade.app
    old = schema_v1.build_tables(PREFIX)
    now = utcnow()
    gone = {"worker_id": "gone".ljust(32, "x"), "lease_token": 1, "acquired_at": now, "lease_expires_at": now}

    def job(x: int, **values: Any) -> JobHandle:
        """A job written as a schema-1 release wrote it."""
        row = {
            "task_name": "up.double",
            "queue": "default",
            "priority": 0,
            "state": "PENDING",
            "payload": dumps_call(app.serializer, (x,), {}),
            "attempts_count": 0,
            "deliveries_count": 0,
            "created_at": now,
            "next_attempt_at": now,
            **values,
        }
        table = old.archive if row["state"] in ("COMPLETED", "FAILED") else old.message
        if table is old.archive:
            row.setdefault("id", 10_000 + x)
            row["archived_at"] = now
            del row["next_attempt_at"]
        with app.engine.begin() as conn:
            new_id = row.get("id") or conn.execute(sa.insert(table).values(row)).inserted_primary_key[0]
            if table is old.archive:
                conn.execute(sa.insert(table).values(row))
        return JobHandle(app, int(new_id))

    running = {"state": "PROCESSING", "attempts_count": 1, "deliveries_count": 1, **gone}
    pending = [job(i, **running) for i in range(20)]  # fetched by a worker that died: their leases run out
    delayed = job(100, next_attempt_at=now + timedelta(seconds=1))
    running_job = job(200, **running)
    retrying = job(
        300,
        state="RETRYABLE",
        attempts_count=1,
        next_attempt_at=now + timedelta(seconds=1),
        last_error_type="OSError",
        last_error_message="flaky",
    )
    finished = job(400, state="COMPLETED", attempts_count=1, result=app.serializer.dumps(800), finished_at=now)
    failed = job(
        500,
        state="FAILED",
        attempts_count=1,
        error_type="ValueError",
        error_message="before the upgrade",
        finished_at=now,
    )
    schedule = app.schedules["up.hourly"]
    with app.engine.begin() as conn:
        conn.execute(sa.insert(old.message).values(periodic.message_row(schedule, schedule.first_fire(now), now)))
    app.close()

    refused = jobqueue("worker", "--burst", app=APP, check=False, timeout=60)
    assert refused.returncode == 1 and "jobqueue db upgrade" in refused.stderr, refused.stderr
    check = jobqueue("db", "check", app=APP, check=False)
    assert check.returncode == 1 and "schema version 1" in check.stderr
    dry = jobqueue("db", "upgrade", "--dry-run", app=APP)
    assert "ALTER TABLE jqup_worker ADD COLUMN running_job_id" in dry.stdout
    assert jobqueue("db", "check", app=APP, check=False).returncode == 1  # a dry run changes nothing

    jobqueue("db", "upgrade", app=APP)
    assert jobqueue("db", "check", app=APP).returncode == 0
    result = jobqueue(
        "worker", "--burst", "--concurrency", "2", "--release-stuck-interval", "0.2", app=APP, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [h.get(timeout=5) for h in pending] == [2 * i for i in range(20)]
    assert (delayed.get(timeout=5), running_job.get(timeout=5), retrying.get(timeout=5)) == (200, 400, 600)
    assert finished.get(timeout=5) == 800
    with pytest.raises(Exception, match="before the upgrade"):
        failed.get(timeout=5)
    rows = periodic.schedule_rows(app.store)
    assert rows["up.hourly"].schedule is not None and rows["up.hourly"].state == "PENDING"
    app.close()


def test_several_upgrades_at_once_take_turns(old_database: str) -> None:
    """As when each container of a deployment upgrades as it starts: each step runs once."""
    command = [sys.executable, "-m", "jobqueue", "--app", APP, "db", "upgrade"]
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    upgrades = [subprocess.Popen(command, cwd=ROOT, **output) for _ in range(4)]  # type: ignore[call-overload]
    results = [(run.wait(120), run.stdout.read()) for run in upgrades if run.stdout is not None]
    assert [code for code, _ in results] == [0] * 4, results
    assert jobqueue("db", "check", app=APP).returncode == 0
    engine = sa.create_engine(old_database)
    with engine.connect() as conn:
        versions = list(conn.execute(sa.text(f"SELECT version FROM {PREFIX}schema_version ORDER BY version")).scalars())
    engine.dispose()
    assert versions == list(range(1, SCHEMA_VERSION + 1))


def test_a_worker_refuses_a_schema_newer_than_its_release_and_names_the_one_to_install(old_database: str) -> None:
    engine = sa.create_engine(old_database)
    migrations.upgrade(engine, build_tables(PREFIX))
    with engine.begin() as conn:
        conn.execute(
            sa.insert(build_tables(PREFIX).schema_version),
            {"version": SCHEMA_VERSION + 1, "applied_at": utcnow(), "applied_by": "9.9.0"},
        )
    engine.dispose()
    refused = jobqueue("worker", "--burst", app=APP, check=False, timeout=60)
    assert refused.returncode == 1
    assert (
        "pip install 'jobqueue>=9.9.0'" in refused.stderr and f"schema version {SCHEMA_VERSION + 1}" in refused.stderr
    )


def test_manage_py_migrate_upgrades_a_schema_1_database(backend: str, tmp_path: Path) -> None:
    from tests import servers

    url = servers.create_database(backend, str(tmp_path))
    try:
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            old = schema_v1.build_tables("jobqueue_")
            old.metadata.create_all(conn)
            conn.execute(sa.insert(old.schema_version), {"version": 1, "applied_at": utcnow()})
        engine.dispose()
        env = dict(os.environ, SHOP_DATABASE_URL=url, DJANGO_SETTINGS_MODULE="shopsite.settings")
        env.pop("JOBQUEUE_DATABASE_URL", None)
        manage = [sys.executable, str(ROOT / "examples" / "django_app" / "manage.py")]

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            done = subprocess.run(
                [*manage, *args],
                cwd=ROOT / "examples" / "django_app",
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            return done

        run("migrate", "jobqueue", "0001", "--fake")  # as the last release left it: 0001 applied
        run("migrate")
        assert "running_job_id" in {column[0] for column in columns(url, "jobqueue_")["worker"]}
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert migrations.installed_version(conn, build_tables()) == SCHEMA_VERSION
        engine.dispose()
        run("migrate", "jobqueue", "0001")  # unapplying 0002 keeps the columns: older releases ignore them
        run("migrate")
    finally:
        servers.drop_database(backend, url)


@pytest.mark.parametrize(
    "command",
    [
        ("status",),
        ("workers",),
        ("jobs", "list"),
        ("jobs", "show", "1"),
        ("jobs", "cancel", "1"),
        ("jobs", "retry", "1"),
        ("topics",),
        ("enqueue", "up.double", "--args", "[1]"),
    ],
)
def test_commands_on_a_schema_behind_this_release_name_the_upgrade(old_database: str, command: tuple[str, ...]) -> None:
    """As when a new release is deployed before `jobqueue db upgrade` ran: each command says so."""
    result = jobqueue(*command, app=APP, check=False, timeout=60)
    assert result.returncode == 1
    assert result.stderr == (
        f"Error: the jobqueue tables ({PREFIX}*) are at schema version 1, this release needs "
        f"{SCHEMA_VERSION}; run `jobqueue db upgrade` (see docs/upgrading.md)\n"
    )
    engine = sa.create_engine(old_database)
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {PREFIX}message")).scalar_one() == 0
    engine.dispose()


def layout(
    url: str, prefix: str
) -> dict[str, tuple[set[tuple[str, bool, str | None]], set[tuple[str, tuple[str, ...], bool]]]]:
    """Each table's columns and indexes (their names without the prefix)."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        return {
            table[len(prefix) :]: (
                {
                    (c["name"], bool(c["nullable"]), getattr(c["type"], "collation", None))
                    for c in inspector.get_columns(table)
                },
                {
                    (str(i["name"]).replace(prefix, "", 1), tuple(i["column_names"]), bool(i["unique"]))
                    for i in inspector.get_indexes(table)
                },
            )
            for table in inspector.get_table_names()
            if table.startswith(prefix)
        }
    finally:
        engine.dispose()


def fresh_layout(
    url: str,
) -> dict[str, tuple[set[tuple[str, bool, str | None]], set[tuple[str, tuple[str, ...], bool]]]]:
    """The layout `db init` gives a new database, read from tables of another prefix."""
    fresh = build_tables("jqnew_")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            fresh.metadata.create_all(conn)
        return layout(url, "jqnew_")
    finally:
        with engine.begin() as conn:
            fresh.metadata.drop_all(conn)
        engine.dispose()


def run_each(url: str, statements: list[str]) -> None:
    """Run ``statements``, each committed by itself: what MySQL and MariaDB do with DDL."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
                conn.commit()
    finally:
        engine.dispose()


def test_an_upgrade_cut_short_between_two_statements_is_finished_by_the_next(old_database: str) -> None:
    """MariaDB commits each ALTER and CREATE by itself: an upgrade killed between two of them
    leaves what it did so far (a table without its index, say), and the next upgrade must finish
    it, whatever the database."""
    tables = build_tables(PREFIX)
    engine = sa.create_engine(old_database)
    statements = [s.rstrip(";") for s in migrations.upgrade(engine, tables, dry_run=True) if not s.startswith("--")]
    engine.dispose()
    wanted = fresh_layout(old_database)
    for done in range(1, len(statements)):
        schema_1(old_database)
        run_each(old_database, statements[:done])
        engine = sa.create_engine(old_database)
        migrations.upgrade(engine, tables)
        engine.dispose()
        assert layout(old_database, PREFIX) == wanted, f"cut after: {statements[done - 1]}"


def test_a_db_init_cut_short_between_two_statements_is_finished_by_the_next(old_database: str) -> None:
    tables = build_tables(PREFIX)
    engine = sa.create_engine(old_database)
    statements = []  # as create_all runs them: each table, then its indexes
    with engine.connect() as conn:  # the dialect knows the server (MariaDB's collations are not MySQL's)
        for table in tables.metadata.sorted_tables:
            statements.append(str(sa.schema.CreateTable(table).compile(dialect=conn.dialect)))
            statements.extend(
                str(sa.schema.CreateIndex(index).compile(dialect=conn.dialect)) for index in table.indexes
            )
    engine.dispose()
    wanted = fresh_layout(old_database)
    for done in range(1, len(statements)):
        engine = sa.create_engine(old_database)
        with engine.begin() as conn:
            tables.metadata.drop_all(conn, checkfirst=True)
        engine.dispose()
        run_each(old_database, statements[:done])
        upgrade.app.init_schema()
        assert layout(old_database, PREFIX) == wanted, f"cut after: {statements[done - 1]}"
    # On tables of the current version, it says what it had to add.
    run_each(
        old_database,
        [f"DROP INDEX uq_{PREFIX}message_unique" + (f" ON {PREFIX}message" if "mysql" in old_database else "")],
    )
    said = upgrade.app.init_schema()
    assert said.endswith(f"is up to date; created what it lacked: index uq_{PREFIX}message_unique"), said
    assert layout(old_database, PREFIX) == wanted


def offline_ddl(url: str, tables: Any) -> list[str]:
    """The statements that create ``tables``, compiled without a connection for ``url`` (as
    Alembic's --sql or a mock engine print them)."""
    statements: list[str] = []
    dialect = sa.make_url(url).get_dialect()()
    mock = sa.create_mock_engine(
        sa.make_url(url), lambda sql, *args, **kw: statements.append(str(sql.compile(dialect=dialect)))
    )
    tables.metadata.create_all(mock, checkfirst=False)
    return [s for s in statements if s.strip()]


@only("mysql")
@pytest.mark.parametrize("scheme", ["mysql+mysqldb", "mariadb+mysqldb"])
def test_ddl_printed_offline_runs_on_mariadb_and_compares_names_and_keys_exactly(db_url: str, scheme: str) -> None:
    """A mysql:// URL names MariaDB servers too, and offline nothing says which: the DDL it
    printed gave MySQL's collation, utf8mb4_0900_bin, which MariaDB before 11.4 refuses."""
    tables = build_tables("jqoff_")
    statements = offline_ddl(str(sa.make_url(db_url).set(drivername=scheme)), tables)
    try:
        run_each(db_url, statements)
        assert layout(db_url, "jqoff_") == fresh_layout(db_url)
    finally:
        engine = sa.create_engine(db_url)
        with engine.begin() as conn:
            tables.metadata.drop_all(conn, checkfirst=True)
        engine.dispose()


@only("postgresql")
def test_db_init_by_the_applications_own_login_on_a_current_schema_changes_nothing() -> None:
    """Every container may run `db init` as it starts, with the application's login, which may read
    and write the tables but create nothing: on a current schema it replaced the wake-up trigger's
    function every time, and was refused (no CREATE on the schema, then not the function's owner)."""
    from tests.servers import private_server

    with private_server("postgresql") as server:
        admin = sa.create_engine(server.url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        jobqueue("db", "init", app=None, env={"JOBQUEUE_DATABASE_URL": server.url})
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE ROLE jq_app LOGIN"))
            conn.execute(sa.text("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
            conn.execute(sa.text("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO jq_app"))
            conn.execute(sa.text("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO jq_app"))
        admin.dispose()
        own = sa.make_url(server.url).set(username="jq_app", password=None).render_as_string(hide_password=False)
        done = jobqueue("db", "init", app=None, env={"JOBQUEUE_DATABASE_URL": own}, check=False)
        assert done.returncode == 0 and "is up to date" in done.stdout, done.stderr


def test_a_table_index_or_column_dropped_by_hand_is_named_by_db_check(backend: str, db_url: str) -> None:
    """`db check` and `health` said the schema was current; the worker then refused with "the
    tables do not exist", or failed statement by statement on the missing column or index. (Tables
    of their own prefix: a dropped column is not put back by `db init`.)"""
    app = JobQueue(db_url, table_prefix=upgrade.app.settings.table_prefix)  # the CLI's app below
    app.init_schema()
    t = app.tables
    env = {"JOBQUEUE_DATABASE_URL": db_url}
    try:
        drop_index = f"DROP INDEX ix_{t.prefix}flow_served" + (f" ON {t.flow.name}" if backend == "mysql" else "")
        with app.engine.begin() as conn:
            conn.execute(sa.text(drop_index))
            conn.execute(sa.text(f"DROP TABLE {t.topic_group.name}"))
            conn.execute(sa.text(f"ALTER TABLE {t.topic_message.name} DROP COLUMN headers"))
        for command in (["db", "check"], ["health"]):
            refused = jobqueue(*command, app=APP, env=env, check=False)
            assert refused.returncode == 1, refused.stdout
            said = refused.stdout + refused.stderr
            assert f"lack index ix_{t.prefix}flow_served, table {t.topic_group.name}, column " in said, said
            assert "run `jobqueue db init`" in said and f"{t.topic_message.name}.headers back by hand" in said, said
        init = jobqueue("db", "init", app=APP, env=env, check=False)  # it said "up to date"
        assert init.returncode == 1 and f"created what it lacked: index ix_{t.prefix}flow_served" in init.stderr
        assert f"lack column(s) {t.topic_message.name}.headers (dropped by hand?)" in init.stderr, init.stderr
        still = jobqueue("db", "check", app=APP, env=env, check=False)
        assert still.returncode == 1 and "run `jobqueue db init`" not in still.stderr, still.stderr
    finally:
        with app.engine.begin() as conn:
            t.metadata.drop_all(conn)
        app.close()


def test_tables_whose_version_row_was_deleted_are_named_so_and_stamped_only_when_whole(
    backend: str, db_url: str
) -> None:
    """`db check` said the tables did not exist, though they held jobs; `db init` then said it had
    "created" schema 7 and stamped it on tables that lacked a column, which `db check` refused next."""
    app = JobQueue(db_url, table_prefix=upgrade.app.settings.table_prefix)  # the CLI's app below
    app.init_schema()
    t = app.tables
    env = {"JOBQUEUE_DATABASE_URL": db_url}
    try:
        with app.engine.begin() as conn:
            conn.execute(sa.delete(t.schema_version))
        checked = jobqueue("db", "check", app=APP, env=env, check=False)
        assert checked.returncode == 1 and "exist but record no schema version" in checked.stderr, checked.stderr
        with app.engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {t.worker.name} DROP COLUMN jobs_done"))
        refused = jobqueue("db", "init", app=APP, env=env, check=False)
        assert refused.returncode == 1 and f"lack column(s) {t.worker.name}.jobs_done" in refused.stderr
        with app.engine.connect() as conn:
            assert migrations.installed_version(conn, t) is None  # nothing stamped
        with app.engine.begin() as conn:
            t.worker.drop(conn)
        done = jobqueue("db", "init", app=APP, env=env)  # the table made again, whole: now it is schema 7
        assert f"recorded jobqueue schema {SCHEMA_VERSION} for the existing tables" in done.stdout, done.stdout
        assert f"created what they lacked: table {t.worker.name}" in done.stdout, done.stdout
        assert jobqueue("db", "check", app=APP, env=env).returncode == 0
    finally:
        with app.engine.begin() as conn:
            t.metadata.drop_all(conn)
        app.close()


def test_the_sql_of_a_dry_run_applied_by_hand_leaves_the_schema_current(old_database: str) -> None:
    """The dry run printed the steps but not the rows that record them: applied by hand (as a DBA
    reviews and runs it), the tables were current and said to be of schema 1, so workers refused,
    and the next upgrade ran every step again (rebuilding indexes, which blocks writes)."""
    tables = build_tables(PREFIX)
    engine = sa.create_engine(old_database)
    statements = [s.rstrip(";") for s in migrations.upgrade(engine, tables, dry_run=True) if not s.startswith("--")]
    engine.dispose()
    run_each(old_database, statements)
    upgrade.app.check_schema()
    engine = sa.create_engine(old_database)
    try:
        assert migrations.upgrade(engine, tables) == []  # nothing left to do
    finally:
        engine.dispose()


def test_an_upgrade_of_tables_whose_version_row_was_deleted_says_so(old_database: str) -> None:
    """It said the tables did not exist, where they hold the jobs."""
    upgrade.app.close()
    jobqueue("db", "init", app=APP)
    with upgrade.app.engine.begin() as conn:
        conn.execute(sa.delete(build_tables(PREFIX).schema_version))
    for args in (("db", "upgrade"), ("db", "upgrade", "--dry-run")):
        result = jobqueue(*args, app=APP, check=False)
        assert result.returncode == 1 and "exist but record no schema version" in result.stderr, result.stderr


def test_db_init_leaves_tables_of_the_same_names_that_are_not_its_own_and_creates_nothing(db_url: str) -> None:
    """Another application's table named like one of jobqueue's: `db init` said it created schema 7
    and stamped it, `db check` then told the user to add jobqueue's columns to that table, and
    `db init` said "up to date". With a prefix that another extends (jq_ and jq_topic_: the first's
    topic log is the second's message table) it failed on a column, telling the user to run the
    command that had just failed; MariaDB left some of the second's tables behind."""
    from jobqueue.errors import SchemaError

    theirs = JobQueue(db_url, table_prefix="theirs_")
    engine = theirs.engine
    mine = JobQueue(db_url, table_prefix="jqa_")
    extended = JobQueue(db_url, table_prefix="jqa_topic_")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE theirs_worker (id INTEGER PRIMARY KEY, name VARCHAR(20))"))
    try:
        with pytest.raises(SchemaError, match=r"table\(s\) theirs_worker already exist in this database and are none"):
            theirs.init_schema()
        assert sorted(n for n in sa.inspect(engine).get_table_names() if n.startswith("theirs_")) == ["theirs_worker"]
        mine.init_schema()
        before = sorted(sa.inspect(engine).get_table_names())
        with pytest.raises(SchemaError, match="table.s. jqa_topic_message already exist .* give this app another"):
            extended.init_schema()
        assert sorted(sa.inspect(engine).get_table_names()) == before  # nothing made
        mine.check_schema()
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE theirs_worker"))
            mine.tables.metadata.drop_all(conn)
        for app in (theirs, mine, extended):
            app.close()


@only("postgresql", "mysql")
def test_an_upgrade_waits_for_another_sessions_lock_a_moment_at_a_time(
    old_database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction left open on the tables (an application's that enqueued): the upgrade's ALTER
    waited for it (30 s on PostgreSQL, a day on MariaDB) with every enqueue queued behind it. Each
    try now waits a moment, and gives up after a number of them, naming the cause."""
    import logging
    import threading

    tables = build_tables(PREFIX)
    holder = sa.create_engine(old_database)
    conn = holder.connect()
    conn.execute(sa.text(f"SELECT count(*) FROM {PREFIX}message"))  # a lock until this transaction ends
    monkeypatch.setattr(migrations, "STEP_TRIES", 2)
    monkeypatch.setattr(migrations, "STEP_RETRY_PAUSE_SECONDS", 0.1)
    engine = sa.create_engine(old_database)
    try:
        with pytest.raises(SchemaError, match="found the jobqueue tables locked by another session 2 times"):
            migrations.upgrade(engine, tables)
        monkeypatch.setattr(migrations, "STEP_TRIES", 30)
        threading.Timer(3.0, conn.rollback).start()  # the application's transaction ends
        with caplog.at_level(logging.WARNING, "jobqueue.storage"):
            migrations.upgrade(engine, tables)
        assert any("locked by another session" in r.getMessage() for r in caplog.records)
        upgrade.app.check_schema()
    finally:
        conn.close()
        holder.dispose()
        engine.dispose()


@only("postgresql", "mysql")  # SQLite's upgrade waits for the write lock inside one step: see below
def test_ctrl_c_during_db_upgrade_says_to_run_it_again_and_the_next_one_finishes(old_database: str) -> None:
    """On MariaDB an interrupt inside a step left 119 lines of traceback, ending in the cleanup's own
    error; nowhere did it say that running the upgrade again was the fix."""
    holder = sa.create_engine(old_database)
    conn = holder.connect()
    conn.execute(sa.text(f"UPDATE {PREFIX}message SET priority = priority WHERE 1 = 0"))  # a lock the upgrade waits for
    command = [sys.executable, "-m", "jobqueue", "--app", APP, "db", "upgrade"]
    env = dict(os.environ, JOBQUEUE_DATABASE_URL=old_database)
    try:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        assert process.stderr is not None
        for line in process.stderr:  # it waits, saying so, a moment at a time
            if "locked by another session" in line:
                break
        process.send_signal(signal.SIGINT)
        said = process.stderr.read()
        assert process.wait(timeout=60) == 130
        assert "interrupted: the steps done so far are kept; run `jobqueue db upgrade` again" in said, said
        assert "Traceback" not in said, said
    finally:
        conn.close()
        holder.dispose()
    jobqueue("db", "upgrade", app=APP, env={"JOBQUEUE_DATABASE_URL": old_database})
    assert jobqueue("db", "check", app=APP, env={"JOBQUEUE_DATABASE_URL": old_database}).returncode == 0


@only("postgresql")
def test_a_missing_wake_up_trigger_is_named_by_db_check_and_made_again_by_db_init(db_url: str, tmp_path: Path) -> None:
    """`db check` said up to date and `db init` made it again without a word, while idle workers,
    hearing of no new job, took each one at their next poll (0.5 to 0.85 s instead of 0.02)."""
    app = JobQueue(db_url, table_prefix=upgrade.app.settings.table_prefix)  # the CLI's app below
    app.init_schema()
    p = app.tables.prefix
    env = {"JOBQUEUE_DATABASE_URL": db_url}
    try:
        with app.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TRIGGER {p}message_notify ON {p}message"))
        checked = jobqueue("db", "check", app=APP, env=env, check=False)
        assert checked.returncode == 1 and f"lack trigger {p}message_notify" in checked.stderr, checked.stderr
        # A worker runs (the trigger only speeds new jobs up), saying what it lacks and the fix;
        # so health holds it healthy (a liveness probe must not restart a worker that works).
        worker = jobqueue("worker", "--burst", "-c", "1", app=APP, env=env, timeout=60)
        assert f"lack trigger {p}message_notify" in worker.stderr and "`jobqueue db init`" in worker.stderr
        assert jobqueue("health", "--no-workers", app=APP, env=env, check=False).returncode == 0
        init = jobqueue("db", "init", app=APP, env=env)
        assert f"created what it lacked: trigger {p}message_notify" in init.stdout, init.stdout
        assert jobqueue("db", "check", app=APP, env=env).returncode == 0
    finally:
        with app.engine.begin() as conn:
            app.tables.metadata.drop_all(conn)
        app.close()
