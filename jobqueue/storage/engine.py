"""Engine creation: per-database connection settings, and URL masking for logs."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from jobqueue.errors import ConfigurationError

READONLY = "jobqueue_readonly"
# For jobqueue's own connections only. A queue table's statistics are always out of date: a burst
# can add a million ready rows between two ANALYZE runs. Planning the acquire on stale statistics
# picks "bitmap-scan every ready row and sort them" over "walk the ordered index, stop after LIMIT",
# and every fetch then sorts the whole backlog. These settings make that alternative look
# expensive, so acquire and flush stay index lookups at any backlog size.
POSTGRES_PLANNER = "-c enable_bitmapscan=off -c enable_sort=off -c enable_seqscan=off"
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
# jobqueue's transactions last milliseconds. A process frozen inside one (SIGSTOP, a stalled VM)
# would keep its row locks for ever, and the lock waits of everyone else would run into
# lock_timeout; after this long idle inside a transaction the server ends its session instead.
IDLE_IN_TRANSACTION_SECONDS = 10


# Query parameters that carry a password for the drivers jobqueue supports (psycopg2's password and
# sslpassword, mysqlclient's passwd), in any case.
SECRET_PARAMETERS = {"password", "passwd", "pwd", "sslpassword"}


def mask_url(url: str | sa.URL) -> str:
    """Return ``url`` as text with any password, in its user part or its query, replaced by ``***``."""
    try:
        parsed = sa.make_url(url)
        hidden = {key: "***" for key in parsed.query if key.lower() in SECRET_PARAMETERS}
        if hidden:
            parsed = parsed.update_query_dict(hidden)
        return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")  # not URL-escaped
    except Exception:  # not a URL at all: show nothing that might be a secret
        return "<unparseable database URL>"


def url_secrets(url: str | sa.URL | None) -> list[str]:
    """The passwords written in ``url`` (user part and query), to scrub from any text."""
    if not url:
        return []
    try:
        parsed = sa.make_url(url)
    except Exception:
        return []
    found = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if key.lower() in SECRET_PARAMETERS:
            found.extend([value] if isinstance(value, str) else list(value))
    return [str(secret) for secret in found if secret]


LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1", "::1"}
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}
DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+mysqldb", "mariadb": "mariadb+mysqldb"}


def streams_bulk(url: str | sa.URL) -> bool:
    """Whether ``bulk()`` streams one COPY over this URL (PostgreSQL through psycopg2)."""
    parsed = sa.make_url(url)
    return DEFAULT_DRIVERS.get(parsed.drivername, parsed.drivername) == "postgresql+psycopg2"


def same_database(first: str | sa.URL, second: str | sa.URL) -> bool:
    """True when two URLs name the same database (drivers, users and passwords aside)."""
    a, b = sa.make_url(first), sa.make_url(second)
    backend = backend_name(a)
    if backend != backend_name(b):
        return False
    if backend == "sqlite":
        return _sqlite_path(a) == _sqlite_path(b)
    host_a = "localhost" if a.host in LOCAL_HOSTS else a.host
    host_b = "localhost" if b.host in LOCAL_HOSTS else b.host
    port_a, port_b = a.port or DEFAULT_PORTS[backend], b.port or DEFAULT_PORTS[backend]
    return (host_a, port_a, a.database) == (host_b, port_b, b.database)


def _sqlite_path(url: sa.URL) -> str:
    return os.path.realpath(url.database) if url.database else ""


def backend_name(url: str | sa.URL) -> str:
    """Return "sqlite", "postgresql" or "mysql" for a URL, or raise ConfigurationError."""
    try:
        name = sa.make_url(url).get_backend_name()
    except Exception as exc:
        raise ConfigurationError(
            f"cannot parse database URL {mask_url(url)!r} ({exc}); expected for example "
            "sqlite:///jobqueue.sqlite3, postgresql+psycopg2://user@host/db or mysql+mysqldb://user@host/db"
        ) from None
    if name == "mariadb":
        return "mysql"
    if name not in ("sqlite", "postgresql", "mysql"):
        raise ConfigurationError(
            f"unsupported database {name!r} in {mask_url(url)!r}: jobqueue runs on sqlite, postgresql and mysql/mariadb"
        )
    return name


def create_engine(url: str | sa.URL, **kwargs: Any) -> sa.Engine:
    """Create an engine configured for jobqueue's access pattern on its database."""
    parsed = sa.make_url(url)
    backend = backend_name(parsed)
    if parsed.drivername in DEFAULT_DRIVERS:
        # A URL without a driver gets the one jobqueue installs (SQLAlchemy 2.1 would pick psycopg 3).
        parsed = parsed.set(drivername=DEFAULT_DRIVERS[parsed.drivername])
    options: dict[str, Any] = {"pool_size": 2, "max_overflow": 8}
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            # Each connection would see its own empty database; worker processes could never share it.
            raise ConfigurationError("an in-memory SQLite database cannot be shared by worker processes; "
                                     "use a file, for example sqlite:///jobqueue.sqlite3")
        options = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False}}
    elif backend == "postgresql":
        # execute_batch for UPDATE executemany: one round trip per page, not per row.
        options["executemany_mode"] = "values_plus_batch"
        # Whatever the server's default: SKIP LOCKED acquires and the unique-key checks rely on
        # each statement seeing the latest commits.
        options["isolation_level"] = "READ COMMITTED"
        # A dead server or network is noticed (keepalives) instead of hanging a worker forever;
        # a lock wait that long is a fault, retried as contention. The planner settings keep every
        # statement on its index whatever the table statistics say (see POSTGRES_PLANNER).
        options["connect_args"] = _unless_in_url(parsed, {
            "connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
            "keepalives_count": 3,
            "options": f"-c lock_timeout=30000 -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_SECONDS * 1000} "
                       + POSTGRES_PLANNER})
    elif backend == "mysql":
        # READ COMMITTED: no gap locks, so SKIP LOCKED acquires never block enqueues.
        options["isolation_level"] = "READ COMMITTED"
        if "charset" not in parsed.query:
            parsed = parsed.update_query_dict({"charset": "utf8mb4"})
        # A silent server is noticed instead of hanging a worker forever.
        options["connect_args"] = _unless_in_url(parsed, {"connect_timeout": 10, "read_timeout": 60,
                                                          "write_timeout": 60})
    options.update(kwargs)
    try:
        engine = sa.create_engine(parsed, **options)
    except ModuleNotFoundError as exc:
        extra = {"postgresql": "postgresql", "mysql": "mysql"}.get(backend, backend)
        raise ConfigurationError(
            f"the driver for {mask_url(parsed)} is not installed ({exc.name}); "
            f"pip install 'jobqueue[{extra}]'") from None
    if backend == "sqlite":
        _configure_sqlite(engine)
    elif backend == "mysql":
        _configure_mysql(engine)
    return engine


def _configure_mysql(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # MariaDB ends a session left idle inside a transaction (see IDLE_IN_TRANSACTION_SECONDS);
        # MySQL 8 has no such setting, and a frozen process holds its locks until it wakes.
        info = getattr(dbapi_connection, "get_server_info", lambda: "")()
        cursor = dbapi_connection.cursor()
        if "MariaDB" in str(info):
            cursor.execute(f"SET SESSION idle_transaction_timeout = {IDLE_IN_TRANSACTION_SECONDS}")
        else:
            # MySQL 8 caches information_schema's AUTO_INCREMENT; the id check needs the live value.
            cursor.execute("SET SESSION information_schema_stats_expiry = 0")
        cursor.close()


def _unless_in_url(url: sa.URL, defaults: dict[str, Any]) -> dict[str, Any]:
    """Connection defaults that the URL's own query parameters override."""
    return {key: value for key, value in defaults.items() if key not in url.query}


def _configure_sqlite(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (the pysqlite driver would defer it).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # WAL: readers never block the writer. NORMAL: durable across process crashes, and only
        # the last transactions can be lost on power failure (see docs/configuration.md).
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: sa.Connection) -> None:
        # IMMEDIATE takes the write lock up front: a deferred transaction that reads and then
        # writes fails with SQLITE_BUSY (no wait) if another process wrote in between.
        # Straight on the driver: the event runs twice per worker batch.
        driver: Any = connection.connection.driver_connection
        driver.execute("BEGIN" if connection.get_execution_options().get(READONLY) else "BEGIN IMMEDIATE")

