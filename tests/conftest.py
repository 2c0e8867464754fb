"""Fixtures shared by every test directory.

``backend`` parametrizes a test over SQLite, PostgreSQL and MariaDB; ``db_url`` is a database of
this session with the jobqueue tables, emptied before each test; ``app`` a JobQueue on it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from tests import servers

_URLS: dict[str, str] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        backends = servers.selected_backends()
        wanted = getattr(metafunc.function, "backends", None)
        if wanted:
            backends = tuple(b for b in backends if b in wanted)
        metafunc.parametrize("backend", backends, scope="session")


def only(*names: str):
    """Decorator: run a backend-parametrized test only on these backends."""

    def mark(fn):
        fn.backends = names
        return fn

    return mark


@pytest.fixture(scope="session")
def session_db(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = servers.create_database(backend, str(tmp_path_factory.mktemp(backend)))
    app = JobQueue(url)
    app.init_schema()
    app.close()
    _URLS[backend] = url
    yield url
    servers.drop_database(backend, url)


def empty_tables(url: str, prefix: str = "jobqueue_") -> None:
    app = JobQueue(url, table_prefix=prefix)
    with app.engine.begin() as conn:
        tables = app.tables
        for table in (
            tables.archive,
            tables.message,
            tables.worker,
            tables.flow,
            tables.topic_message,
            tables.topic_group,
            tables.topic,
        ):
            conn.execute(sa.delete(table))
    app.close()


@pytest.fixture
def db_url(session_db: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session database, emptied; JOBQUEUE_DATABASE_URL points at it for subprocesses."""
    empty_tables(session_db)
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", session_db)
    return session_db


@pytest.fixture
def app(db_url: str) -> Iterator[JobQueue]:
    queue = JobQueue(db_url)
    yield queue
    queue.close()


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[servers.PgBouncer]:
    """PgBouncer in transaction mode in front of the PostgreSQL server, for the whole session.

    Skipped where pgbouncer is not installed, unless JOBQUEUE_TEST_REQUIRE_ALL is set (as
    scripts/test.sh, which installs it, sets it): then that is a failure.
    """
    try:
        bouncer = servers.PgBouncer()
    except FileNotFoundError as exc:
        if os.environ.get("JOBQUEUE_TEST_REQUIRE_ALL"):
            raise
        pytest.skip(str(exc))
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOBQUEUE_APP",):
        monkeypatch.delenv(name, raising=False)
    if "JOBQUEUE_DATABASE_URL" in os.environ:
        monkeypatch.delenv("JOBQUEUE_DATABASE_URL")


@pytest.fixture(autouse=True)
def _host_clock_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a test does to this process's measure of its clock against the server's (a skewed
    clock measured, a supervisor run in this process) ends with the test."""
    import jobqueue.clock

    monkeypatch.setattr(jobqueue.clock, "_offset", jobqueue.clock._offset)
    monkeypatch.setattr(jobqueue.clock, "_base", jobqueue.clock._base)
    monkeypatch.setattr(jobqueue.clock, "_next_check", jobqueue.clock._next_check)


# The test command runs the suite in several pytest processes (pytest-xdist). Tests that share an
# expensive session fixture run in one of them: the Spark tests (a standalone cluster and two
# SparkSessions), the tests of a virtualenv with Django alone, and the browser tests.
GROUPS = {
    "spark": "spark",
    "spark_cluster": "spark",
    "master": "spark",
    "django_alone": "django-alone",
    "browser": "browser",
}
REPORTS_FILE = "PYTEST_JOBQUEUE_REPORTS"  # where each pytest process leaves its runtime reports


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        for fixture, group in GROUPS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
                break


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and REPORTS_FILE not in os.environ:
        handle, path = tempfile.mkstemp(prefix="jobqueue-reports-", suffix=".txt")
        os.close(handle)
        os.environ[REPORTS_FILE] = path  # the pytest-xdist workers, started later, inherit it
        config.add_cleanup(lambda: os.unlink(path))


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.runtime.harness import REPORTS

    path = os.environ.get(REPORTS_FILE)
    if hasattr(session.config, "workerinput") and REPORTS and path:
        with open(path, "a", encoding="utf-8") as reports:
            reports.write("".join(f"{line}\n" for line in REPORTS))


def pytest_terminal_summary(terminalreporter) -> None:
    from tests.runtime.harness import REPORTS

    path = os.environ.get(REPORTS_FILE)
    lines = list(REPORTS)
    if path and os.path.exists(path) and not hasattr(terminalreporter.config, "workerinput"):
        with open(path, encoding="utf-8") as reports:
            lines += reports.read().splitlines()
    if lines:
        terminalreporter.section("runtime reports")
        for line in lines:
            terminalreporter.write_line(line)
