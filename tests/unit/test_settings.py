from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from jobqueue import ConfigurationError, JobQueue
from jobqueue.settings import DEFAULT_DATABASE_URL, Settings, parse_queues, resolve_database_url
from jobqueue.storage.engine import backend_name, create_engine, mask_in, mask_url


def test_defaults_follow_the_spec() -> None:
    s = Settings()
    assert (s.max_deliveries, s.release_stuck_timeout, s.graceful_timeout) == (10, 30.0, 30.0)
    assert s.queues is None and s.default_queue == "default"
    assert s.heartbeat_interval == pytest.approx(10.0)


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"fetch_batch_size": 0}, "fetch_batch_size"),
        ({"release_stuck_timeout": 0.5}, "release_stuck_timeout"),
        ({"min_fetch_interval": 5.0, "max_fetch_interval": 1.0}, "min_fetch_interval"),
        ({"overfetch_factor": 0.5}, "overfetch_factor"),
        ({"table_prefix": "Robert'); DROP TABLE x;--"}, "table_prefix"),
        ({"queues": ("ok", "not ok")}, "invalid queue name"),
        ({"queues": ("emails\n",)}, "invalid queue name"),
        ({"table_prefix": "jobqueue_\n"}, "table_prefix"),
        ({"concurrency": 0}, "concurrency"),
        # Not a number, or not a finite one: compared with anything, NaN is never too small.
        ({"release_stuck_timeout": float("nan")}, "release_stuck_timeout must be a finite number"),
        ({"release_stuck_timeout": float("inf")}, "release_stuck_timeout must be a finite number"),
        ({"graceful_timeout": 10**400}, "graceful_timeout must be a finite number"),  # too large for a float
        # Leases are dates: one past the year 9999 made every acquisition fail, worker after worker.
        ({"release_stuck_timeout": 3e11}, "release_stuck_timeout must be at most 31536000 seconds"),
        ({"fetch_batch_size": 10**11}, "fetch_batch_size must be at most 10000"),
        ({"overfetch_factor": 1e9}, "lower overfetch_factor"),
        ({"graceful_timeout": float("nan")}, "graceful_timeout"),
        ({"flush_interval": float("inf")}, "flush_interval"),
        ({"overfetch_factor": float("nan")}, "overfetch_factor must be a finite number"),
        ({"overfetch_factor": float("inf")}, "overfetch_factor"),
        # A typo such as -c 10000 forked ten thousand processes.
        ({"concurrency": 10_000}, "concurrency must be at most 1024 worker processes per supervisor"),
        ({"concurrency": 1025}, "run more supervisors"),
        # A loop paced by one of these looked again at once: an idle supervisor spun a CPU.
        ({"idle_poll_interval": 0}, "idle_poll_interval must be at least 0.01 seconds"),
        ({"max_fetch_interval": 0.0, "min_fetch_interval": 0.0}, "max_fetch_interval must be at least 0.01"),
        ({"release_stuck_interval": 1e-9}, "release_stuck_interval must be at least 0.01"),
        # Values of another kind, which Python would have read as something else: True forked one
        # process, the string "false" kept every completed job, 10.5 was a batch of ten.
        ({"concurrency": True}, "concurrency must be an integer or None, got bool True"),
        ({"max_tasks_per_child": True}, "max_tasks_per_child must be an integer or None"),
        ({"metrics_port": True}, "metrics_port must be an integer or None"),
        ({"retain_in_archive_on_ack": "false"}, "retain_in_archive_on_ack must be True or False, got str 'false'"),
        ({"configure_logging": 0}, "configure_logging must be True or False or None"),
        ({"fetch_batch_size": 10.5}, "fetch_batch_size must be an integer, got float 10.5"),
        ({"max_payload_bytes": "1MB"}, "max_payload_bytes must be an integer"),
        ({"graceful_timeout": "30"}, "graceful_timeout must be a number, got str '30'"),
        ({"flush_interval": False}, "flush_interval must be a number"),
        ({"table_prefix": b"jq_"}, "table_prefix must be a string"),
    ],
)
def test_invalid_settings_name_the_problem(changes: dict, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        Settings(**changes)


def test_integers_are_numbers_of_seconds_and_none_leaves_an_optional_setting_unset() -> None:
    settings = Settings(graceful_timeout=5, concurrency=None, configure_logging=None, retain_in_archive_on_ack=False)
    assert (settings.graceful_timeout, settings.concurrency, settings.retain_in_archive_on_ack) == (5, None, False)


def test_concurrency_up_to_the_bound_is_accepted() -> None:
    """Well above the 64 processes a supervisor of the scale benchmark runs."""
    assert Settings(concurrency=1024).effective_concurrency == 1024


def test_parse_queues() -> None:
    assert parse_queues("a, b,a,,c") == ("a", "b", "c")
    assert parse_queues(None) is None
    assert parse_queues("") is None


def test_database_url_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBQUEUE_DATABASE_URL", raising=False)
    assert resolve_database_url(None, None) == DEFAULT_DATABASE_URL
    assert resolve_database_url(None, "sqlite:///given.db") == "sqlite:///given.db"
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", "sqlite:///env.db")
    assert resolve_database_url(None, "sqlite:///given.db") == "sqlite:///env.db"
    assert resolve_database_url("sqlite:///option.db", "sqlite:///given.db") == "sqlite:///option.db"
    app = JobQueue("sqlite:///given.db")
    app.configure(database_url="sqlite:///option.db")
    assert app.database_url == "sqlite:///option.db"


def test_passwords_are_masked() -> None:
    url = "postgresql+psycopg2://app:s3cret@db.example.com/app"
    assert "s3cret" not in mask_url(url)
    assert "s3cret" not in repr(JobQueue(url))


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("oracle://x@y/z", "unsupported database"),
        ("not a url", "cannot parse database URL"),
        ("jobs.db", "is not a database URL: for that SQLite file write sqlite:///jobs.db"),
        ("sqlite://", "in-memory SQLite"),
    ],
)
def test_bad_urls(url: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        backend_name(url) if "sqlite" not in url else create_engine(url).connect()


def test_a_driver_that_is_not_installed_is_named_with_the_one_jobqueue_installs() -> None:
    if importlib.util.find_spec("pg8000") is not None:
        pytest.skip("pg8000 is installed here")
    with pytest.raises(ConfigurationError) as raised:
        create_engine("postgresql+pg8000://app:s3cret@db/app")
    assert str(raised.value) == (
        "the driver for postgresql+pg8000://app:***@db/app is not installed (pg8000); install it, or use "
        "the driver pip install 'jobqueue[postgresql]' brings: postgresql+psycopg2://..."
    )


@pytest.mark.parametrize(
    "url, fix",
    [
        ("postgres://app:s3cret@db/app", "write the scheme as postgresql://"),
        (
            "mysql+mysqlclient://app:s3cret@db/app",
            "knows no driver 'mysqlclient' for mysql+mysqlclient://app:***@db/app: use mysql+mysqldb://...",
        ),
        (
            "postgresql+asyncpg://app:s3cret@db/app",
            "jobqueue's workers and enqueues are synchronous: use postgresql+psycopg2://...",
        ),
        ("sqlite+aiosqlite:///jobs.sqlite3", "synchronous: use sqlite:///PATH"),
        # It replaced utf8mb4: an emoji in a unique key was refused by the collation, error
        # messages were stored with "?" in place of what utf8 lacks.
        ("mysql+mysqldb://app:s3cret@db/app?charset=utf8", "remove the charset parameter, or write charset=utf8mb4"),
        ("mysql://app:s3cret@db/app?charset=latin1", "sets charset=latin1: jobqueue's tables hold text as utf8mb4"),
    ],
)
def test_a_url_a_user_often_gets_wrong_is_refused_naming_the_fix(url: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        create_engine(url)
    assert fix in str(raised.value)
    assert "s3cret" not in str(raised.value)


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:jobs?mode=memory&cache=shared&uri=true"]
)
def test_an_in_memory_sqlite_database_is_refused_when_a_connection_opens(url: str) -> None:
    engine = create_engine(url)  # a JobQueue under Django still writes through Django's connection
    with pytest.raises(ConfigurationError, match="in-memory SQLite database cannot be shared by worker processes"):
        engine.connect()


@pytest.mark.parametrize(
    "first, second, same",
    [
        ("postgresql://a:pw@localhost/app", "postgresql+psycopg2://b@127.0.0.1:5432/app", True),
        ("postgresql://localhost/app", "postgresql://localhost/other", False),
        ("postgresql://db1/app", "postgresql://db2/app", False),
        ("postgresql://localhost:5433/app", "postgresql://localhost/app", False),
        ("mysql+mysqldb://root@localhost/app", "mariadb://root@localhost:3306/app", True),
        ("sqlite:///data/../data/app.sqlite3", "sqlite:///data/app.sqlite3", True),
        ("sqlite:///app.sqlite3", "sqlite:///other.sqlite3", False),
        ("sqlite:///app.sqlite3", "postgresql://localhost/app.sqlite3", False),
    ],
)
def test_same_database_ignores_drivers_users_and_spellings_of_localhost(first: str, second: str, same: bool) -> None:
    from jobqueue.storage.engine import same_database

    assert same_database(first, second) is same


def test_a_url_without_a_driver_gets_the_installed_one() -> None:
    from jobqueue.storage.engine import create_engine

    # SQLAlchemy 2.1 alone would pick psycopg 3, which jobqueue does not install.
    engine = create_engine("postgresql://user@localhost/app")
    assert engine.dialect.driver == "psycopg2"
    engine.dispose()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg2://app:s3cr3t-pw@db/app",
        "postgresql+psycopg2://app@db/app?password=s3cr3t-pw&sslmode=require",
        "mysql+mysqldb://app@db/app?passwd=s3cr3t-pw",
        "postgresql://app@db/app?PASSWORD=s3cr3t-pw",
    ],
)
def test_passwords_are_masked_wherever_a_url_is_shown(url: str) -> None:
    app = JobQueue(url)
    for shown in (mask_url(url), repr(app.settings), repr(app)):
        assert "s3cr3t-pw" not in shown and "***" in shown, shown
    assert "sslmode=require" in mask_url(url) or "sslmode" not in url


@pytest.mark.parametrize(
    "url", ["postgresql://app:s3cr@t@pw@db/app", "mysql+mysqldb://app:s3cr@t@pw@db:3306/app?charset=utf8mb4"]
)
def test_a_password_with_an_unescaped_at_sign_is_refused_and_never_shown(url: str) -> None:
    """The URL was read up to its first "@" as user part: the rest of the password became the
    host, shown in the masked URL and in the driver's "could not translate host name" error."""
    app = JobQueue(url)
    for shown in (mask_url(url), repr(app.settings), repr(app), mask_in(f"host {url}: t@pw@db", url)):
        assert "t@pw" not in shown and "***@db" in shown, shown
    with pytest.raises(ConfigurationError) as raised:
        create_engine(url)
    assert "write each '@' of the user name or password as %40" in str(raised.value)
    assert "t@pw" not in str(raised.value) and "s3cr" not in str(raised.value)


@pytest.mark.parametrize("url", ["sqlite:///jobs.sqlite3\n", "postgresql://app:s3cret@db/app ", " mysql://app@db/app"])
def test_a_url_with_whitespace_around_it_is_refused(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From an env file or a secret: SQLite opened a new, empty database named with the line break."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="(begins|ends) with .*: remove it") as raised:
        create_engine(url)
    assert "s3cret" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text, url, masked",
    [
        ("user 'postgres' of postgresql", "postgresql://postgres:postgres@h/db", "user '***' of postgresql"),
        ("a cannot: a", "postgresql://u:a@h/db", "*** cannot: ***"),
        ("x!pw@h and !pw", "postgresql://u:!pw@h/db", "x***@h and ***"),
        ("password=hunter2 hunter2x", "mysql://u@h/db?passwd=hunter2", "password=*** hunter2x"),
        ("cannot parse pw:e", "pw:e", "cannot parse <unparseable database URL>"),
        ("cannot parse e", "e", "cannot parse <unparseable database URL>"),  # it may be the password itself
        ("cannot parse jobs.db", "jobs.db", "cannot parse jobs.db"),  # a SQLite file's name: shown
        ("a b", " ", "a b"),
    ],
)
def test_passwords_are_masked_where_they_stand_alone(text: str, url: str, masked: str) -> None:
    assert mask_in(text, url) == masked


@pytest.mark.parametrize(
    "changes",
    [{"groups": 5}, {"groups": ["billing", 3]}, {"groups": b"billing"}, {"queues": 5}, {"queues": ["a", None]}],
)
def test_queues_and_groups_of_another_kind_are_refused_naming_the_setting(changes: dict) -> None:
    """They raised TypeError or AttributeError from inside the parsing."""
    (name,) = changes
    with pytest.raises(ConfigurationError, match=f"{name} must be a comma-separated string or a list of names"):
        JobQueue("sqlite:///unused.sqlite3", **changes)
    with pytest.raises(ConfigurationError, match=f"{name} must be a comma-separated string"):
        JobQueue("sqlite:///unused.sqlite3").configure(**changes)


def test_a_url_object_and_any_iterable_of_names_are_taken() -> None:
    """The kinds check must not refuse what was always accepted: SQLAlchemy's URL, a generator of queues."""
    import sqlalchemy as sa

    url: Any = sa.make_url("sqlite:///unused.sqlite3")  # not in JobQueue's signature, but taken at run time
    app = JobQueue(url, queues=(name for name in ["a", "b"]), groups={"g"})
    assert app.settings.queues == ("a", "b") and app.settings.groups == ("g",)
