"""Database servers and throwaway databases for the tests.

Each session creates its own databases (``jobqueue_test_<random>``) on the real PostgreSQL and
MariaDB servers and drops only those. A stopped server is started with the commands from the
project brief; a server that cannot be reached fails the tests that need it (never a skip).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import sqlalchemy as sa

POSTGRES_URL = os.environ.get("JOBQUEUE_TEST_POSTGRES_URL",
                              "postgresql+psycopg2://jobqueue_test:jobqueue_test@127.0.0.1:5432/postgres")
MYSQL_URL = os.environ.get("JOBQUEUE_TEST_MYSQL_URL",
                           "mysql+mysqldb://jobqueue_test:jobqueue_test@127.0.0.1:3306/")
ALL_BACKENDS = ("sqlite", "postgresql", "mysql")


def selected_backends() -> tuple[str, ...]:
    chosen = os.environ.get("JOBQUEUE_TEST_BACKENDS")
    if not chosen:
        return ALL_BACKENDS
    return tuple(name.strip() for name in chosen.split(",") if name.strip() in ALL_BACKENDS)


def _start_commands(backend: str) -> list[list[str]]:
    if backend == "postgresql":
        versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
        return [["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"]] if versions else []
    return [["mkdir", "-p", "/run/mysqld"], ["chown", "mysql:mysql", "/run/mysqld"],
            ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"]]


def _reachable(url: str) -> Exception | None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except Exception as exc:  # any failure to connect
        return exc
    finally:
        engine.dispose()


def ensure_server(backend: str) -> None:
    """Start the server if it is down; raise RuntimeError if it stays unreachable."""
    url = POSTGRES_URL if backend == "postgresql" else MYSQL_URL
    error = _reachable(url)
    if error is None:
        return
    if os.geteuid() == 0:
        for command in _start_commands(backend):
            subprocess.run(command, check=False, capture_output=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            error = _reachable(url)
            if error is None:
                return
            time.sleep(0.5)
    raise RuntimeError(f"{backend} server unreachable at {sa.make_url(url).render_as_string(hide_password=True)}: "
                       f"{error}. Run scripts/test.sh, which installs and starts it and creates the "
                       "jobqueue_test login.")


def create_database(backend: str, tmp_dir: str) -> str:
    """Create a fresh database for this session and return its URL."""
    if backend == "sqlite":
        return f"sqlite:///{os.path.join(tmp_dir, 'session.sqlite3')}"
    ensure_server(backend)
    name = f"jobqueue_test_{uuid.uuid4().hex[:10]}"
    admin = POSTGRES_URL if backend == "postgresql" else MYSQL_URL
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}" + (" CHARACTER SET utf8mb4" if backend == "mysql" else "")))
    engine.dispose()
    return str(sa.make_url(admin).set(database=name).render_as_string(hide_password=False))


def drop_database(backend: str, url: str) -> None:
    if backend == "sqlite":
        return
    name = sa.make_url(url).database
    assert name and name.startswith("jobqueue_test_"), name  # only ever drop our own
    admin = POSTGRES_URL if backend == "postgresql" else MYSQL_URL
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        if backend == "postgresql":
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        else:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
    engine.dispose()
