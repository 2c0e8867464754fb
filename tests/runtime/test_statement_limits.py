"""A statement time limit set on the server: PostgreSQL's statement_timeout, MariaDB's max_statement_time.

Neither is an outage. A worker refuses to start under a limit that would cancel its quickest
statements, naming the limit and the fix; a statement the limit cancels while the worker runs is
named in the log with the fix, tried again with backoff, and nothing is lost. Each test sets the
limit on a database (PostgreSQL) or in the sessions (MariaDB, which has no per-database setting) of
its own, never on the shared ones.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from tests import servers
from tests.acceptance.cli import jobqueue
from tests.apps import runtime as rt
from tests.conftest import only
from tests.runtime.harness import Worker, runs, wait_for


@pytest.fixture
def own_database(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database of this test's, with the jobqueue tables."""
    url = servers.create_database(backend, str(tmp_path))
    try:
        app = JobQueue(url)
        app.init_schema()
        app.close()
        yield url
    finally:
        servers.drop_database(backend, url)


def limited(backend: str, url: str, milliseconds: int) -> str:
    """The URL of ``url``'s database, whose new connections get a statement time limit of
    ``milliseconds``: PostgreSQL's set for the database, as a DBA does; MariaDB's for the session."""
    if backend == "postgresql":
        name = sa.make_url(url).database
        engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {name} SET statement_timeout = '{milliseconds}ms'")
        engine.dispose()
        return url
    command = f"SET SESSION max_statement_time = {milliseconds / 1000}"
    return sa.make_url(url).update_query_dict({"init_command": command}).render_as_string(hide_password=False)


LIMIT = {"postgresql": "statement_timeout", "mysql": "max_statement_time"}
FIX = {"postgresql": "ALTER ROLE", "mysql": "ALTER USER"}
NAMED = {"postgresql": "statement_timeout of 500 ms (set for this database)", "mysql": "max_statement_time of 0.5 s"}


@only("postgresql", "mysql")
def test_a_worker_refuses_to_start_under_a_limit_that_cancels_every_statement(backend: str, own_database: str) -> None:
    """It took the cancelled statements for a database outage and retried for ever."""
    url = limited(backend, own_database, 1)
    result = jobqueue("--database-url", url, "worker", "--burst", "-c", "1", check=False, timeout=60)
    assert result.returncode == 1, result.stderr[-3000:]
    said = result.stderr
    assert LIMIT[backend] in said and "is too short for a worker" in said and FIX[backend] in said, said[-3000:]
    assert "Traceback" not in said and "unavailable" not in said, said[-3000:]
    assert "started worker process" not in said
    if backend == "postgresql" and "of 1 ms" not in said:  # the reading itself may have been cancelled
        assert "statement_timeout (set for this database or role)" in said, said[-3000:]


@only("postgresql", "mysql")
def test_a_statement_the_limit_cancels_is_named_with_the_fix_and_nothing_is_lost(
    backend: str, own_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock held longer than the limit makes the worker's write of the outcome run into it."""
    url = limited(backend, own_database, 500)
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", url)
    monkeypatch.setenv("JOBQUEUE_TEST_RUNS", str(tmp_path / "runs.txt"))
    rt.app.configure(database_url=url)
    handle = rt.slow.delay(1.0)
    worker = Worker(tmp_path, "--concurrency", "1")
    blocker = sa.create_engine(own_database, poolclass=sa.pool.NullPool)
    try:
        wait_for(lambda: runs(tmp_path / "runs.txt"), 60, "the job to start")
        with blocker.connect() as conn:
            # Held while the job ends: its outcome waits for the row lock, past the limit.
            conn.exec_driver_sql(f"SELECT id FROM jobqueue_message WHERE id = {handle.id} FOR UPDATE")
            wait_for(lambda: "a statement was cancelled" in worker.text(), 60, "the worker to say what happened")
            conn.rollback()
        wait_for(lambda: handle.status() == "completed", 60, "the job to complete once the lock is gone")
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        worker.close()
        blocker.dispose()
        rt.app.close()
    log = worker.text()
    assert NAMED[backend] in log and FIX[backend] in log and "nothing is lost" in log, log[-4000:]
    assert "unavailable" not in log and "Traceback" not in log and "refused" not in log, log[-4000:]
    assert [event for event, _, _ in runs(tmp_path / "runs.txt")] == ["start", "end"]  # ran once


@only("postgresql")
def test_a_limit_the_url_sets_is_to_be_removed_from_the_url_not_the_role(own_database: str) -> None:
    """The advice was ALTER ROLE ... SET statement_timeout, which the connection's own option outranks."""
    url = sa.make_url(own_database).update_query_dict({"options": "-c statement_timeout=20"})
    result = jobqueue(
        "--database-url", url.render_as_string(hide_password=False), "worker", "--burst", "-c", "1", check=False
    )
    said = result.stderr
    assert result.returncode == 1 and "statement_timeout of 20 ms (set by the client)" in said, said[-3000:]
    assert "remove statement_timeout from the connection's options" in said and "ALTER ROLE" not in said, said
