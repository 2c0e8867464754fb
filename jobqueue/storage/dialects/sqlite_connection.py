"""SQLite connections: how they are opened (WAL, a busy wait that polls, BEGIN IMMEDIATE for
writes) and who writes the journal back into the database file."""

from __future__ import annotations

import os
import sqlite3
import time
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from jobqueue.errors import ConfigurationError, SchemaError
from jobqueue.storage.engine import CREATING_DATABASE, READONLY

BUSY_TIMEOUT_SECONDS = 30.0
SQLITE_CONTENTION = ("database is locked", "database table is locked", "database is busy")
# While another process writes, a writer tries again for the lock this often (doubling from the
# first pause to the last): SQLite's own busy handler sleeps 1, 2, 5, 10 ms... between tries, many
# times as long as the transactions it waits for, and two worker processes spent most of their
# time asleep in it.
BUSY_PAUSES_SECONDS = (0.0001, 0.002)
# Where the supervisor writes the journal back (every second), its worker processes' connections
# do it themselves only past this many pages (SQLite's own default is 1,000).
SAFETY_NET_CHECKPOINT_PAGES = 10_000


def begin_immediate(driver: Any) -> None:
    """BEGIN IMMEDIATE on a DB-API connection: wait for the write lock, trying again every
    BUSY_PAUSES_SECONDS, for BUSY_TIMEOUT_SECONDS at most; then SQLite's "database is locked"
    (as an SQLAlchemy OperationalError, which the dialect classifies as contention).
    The connection's own busy timeout (for everything else) is off meanwhile."""
    pause, longest = BUSY_PAUSES_SECONDS
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    own = driver.execute("PRAGMA busy_timeout").fetchone()[0]
    driver.execute("PRAGMA busy_timeout=0")
    try:
        while True:
            try:
                driver.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not str(exc).lower().startswith(SQLITE_CONTENTION):
                    raise
                if time.monotonic() > deadline:
                    # As SQLAlchemy reports a statement's errors: contention, retried by the caller.
                    raise sa.exc.DBAPIError.instance("BEGIN IMMEDIATE", None, exc, sqlite3.Error) from exc
            time.sleep(pause)
            pause = min(pause * 2, longest)
    finally:
        driver.execute(f"PRAGMA busy_timeout={int(own)}")


class _Checkpoints:
    """Whether the connections an engine opens leave the journal to checkpoint(): the one connect
    listener of that engine, however many dialects are made for it (init_schema and check_schema
    make one per call, and a listener each would pile up on a long-lived engine)."""

    def __init__(self) -> None:
        self.elsewhere = False

    def __call__(self, dbapi_connection: Any, _record: Any) -> None:
        if self.elsewhere:
            dbapi_connection.execute(f"PRAGMA wal_autocheckpoint={SAFETY_NET_CHECKPOINT_PAGES}")


# By engine; the listener holds no reference to its engine, so an engine is dropped as before.
_CHECKPOINTS: weakref.WeakKeyDictionary[sa.Engine, _Checkpoints] = weakref.WeakKeyDictionary()


def checkpoints(engine: sa.Engine) -> _Checkpoints:
    """``engine``'s checkpoint setting, its connect listener installed the first time."""
    setting = _CHECKPOINTS.get(engine)
    if setting is None:
        setting = _CHECKPOINTS[engine] = _Checkpoints()
        event.listen(engine, "connect", setting)
    return setting


def refuse_in_memory() -> Any:
    raise ConfigurationError(
        "an in-memory SQLite database cannot be shared by worker processes; use a "
        "file, for example sqlite:///jobqueue.sqlite3 (under Django, give the "
        "database, and DATABASES[...]['TEST']['NAME'] for tests, a file path)"
    )


def engine_options(url: sa.URL) -> tuple[sa.URL, dict[str, Any]]:
    """The URL and create_engine options for a SQLite database."""
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory" or "mode=memory" in database:
        # Each connection would see its own empty database; worker processes could never share
        # it. Refused when a connection opens: under Django, jobs are still written through
        # Django's connection (a test's), and only what reads them on jobqueue's own fails.
        return url, {"creator": refuse_in_memory, "poolclass": sa.pool.NullPool}
    return url, {"connect_args": {"timeout": BUSY_TIMEOUT_SECONDS, "check_same_thread": False}}


def _absent(path: str) -> bool:
    """Whether nothing is at ``path`` (a directory this user may not search is left to SQLite,
    whose error the permissions then explain)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def configure(engine: sa.Engine) -> None:
    """Set up every connection ``engine`` opens, and every transaction it begins."""

    @event.listens_for(engine, "do_connect")
    def on_do_connect(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        # SQLite makes a database wherever it is asked to open one: only the creation of the
        # tables may (a URI, "file:...", says for itself what may be made). A directory that is
        # not there is left to SQLite's error: a worker waits for it, as for a mount to come.
        path = cargs[0] if cargs else cparams.get("database")
        if (
            isinstance(path, str)
            and not cparams.get("uri")
            and not CREATING_DATABASE.get()
            and _absent(path)
            and os.path.isdir(os.path.dirname(os.path.abspath(path)))
        ):
            raise SchemaError(
                f"there is no SQLite database at {os.path.abspath(path)}: correct the path in the database URL, "
                "or create the database and its tables with `jobqueue db init` (or app.init_schema())"
            )

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (the pysqlite driver would defer it).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # WAL: readers never block the writer. NORMAL: durable across process crashes, and only
        # the last transactions can be lost on power failure (see docs/configuration.md).
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            # Another connection is writing to a database not in WAL mode yet (a Django test's
            # transaction, on the file Django just made), and the switch does not wait for it.
            # This connection works in the database's mode; the next one to connect switches
            # it, and every connection then follows.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_SECONDS * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: sa.Connection) -> None:
        # IMMEDIATE takes the write lock up front: a deferred transaction that reads and then
        # writes fails with SQLITE_BUSY (no wait) if another process wrote in between.
        # Straight on the driver: the event runs twice per worker batch.
        driver: Any = connection.connection.driver_connection
        if connection.get_execution_options().get(READONLY):
            driver.execute("BEGIN")
        else:
            begin_immediate(driver)
