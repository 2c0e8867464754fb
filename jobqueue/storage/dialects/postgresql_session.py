"""The settings jobqueue's PostgreSQL sessions start with, and a pooler that refuses to pass them.

They travel in the connection's startup packet (libpq's ``options``), so that they cost no
statement. PgBouncer refuses that parameter ("unsupported startup parameter"), and in transaction
mode no session setting could last anyway: each transaction may land on another server
connection. Where the server refuses them, jobqueue connects without them and says which are not
in effect there; the cure is to set them where they apply to every server connection (the role
the workers log in as, or a pooler database entry of their own, see docs/deployment.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from jobqueue.storage.engine import IDLE_IN_TRANSACTION_SECONDS, mask_url
from jobqueue.storage.readable import Unreadable

logger = logging.getLogger("jobqueue.storage")

# For jobqueue's own connections only, as pg_settings shows them (milliseconds for the timeouts).
# A lock wait that long is a fault, retried as contention; a session frozen inside a transaction
# is ended.
#
# A queue table's statistics are always out of date: a burst can add a million ready rows between
# two ANALYZE runs. Planning the acquire on stale statistics picks "bitmap-scan every ready row and
# sort them" over "walk the ordered index, stop after LIMIT", and every fetch then sorts the whole
# backlog. The planner settings make that alternative look expensive, so acquire and flush stay
# index lookups at any backlog size. A plan that must scan anyway (the flow table has no index for
# every question) then costs billions on paper, which would make the server JIT-compile it:
# hundreds of milliseconds for a statement that reads a few rows. Our statements are all short,
# so JIT is off.
SESSION_SETTINGS = {
    "lock_timeout": "30000",
    "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_SECONDS * 1000),
    "enable_bitmapscan": "off",
    "enable_sort": "off",
    "enable_seqscan": "off",
    "jit": "off",
}
STARTUP_OPTIONS = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())
# PgBouncer up to 1.19 refuses ``options`` itself, later ones each setting they do not track.
REFUSED = "unsupported startup parameter"

_refused: set[str] = set()  # URLs (passwords masked) whose server refused the startup options


# The type of PostgreSQL's ``timestamp without time zone`` (every time jobqueue stores).
TIMESTAMP_OID = 1114


def read_any_timestamp(engine: sa.Engine) -> None:
    """Have ``engine``'s psycopg2 connections read a timestamp that Python cannot hold (a year past
    9999 or before 1, edited in by hand: PostgreSQL holds years up to 294276, and BC ones) as an
    :class:`Unreadable` instead of failing the whole fetch it comes in: the fetch of a worker's
    next batch, or of a listing. Infinities read as psycopg2 reads them (the first and last
    datetime). Only jobqueue's own engine is changed, never psycopg2 for the whole process."""
    if engine.dialect.driver != "psycopg2":
        return
    import psycopg2.extensions  # type: ignore[import-untyped]

    plain = psycopg2.extensions.PYDATETIME

    def read(value: str | None, cursor: Any) -> Any:
        try:
            return plain(value, cursor)
        except ValueError:  # year is out of range
            return Unreadable(value)

    readable = psycopg2.extensions.new_type((TIMESTAMP_OID,), "JOBQUEUE_TIMESTAMP", read)

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        psycopg2.extensions.register_type(readable, dbapi_connection)


def connect_without_refused_options(engine: sa.Engine) -> None:
    """Have ``engine`` connect without the startup options once its server refuses them.

    Only jobqueue's own options are dropped: options written in the URL are the user's to fix.
    The first refusal is logged, with the settings that are not in effect without them; the
    later connections of every engine on the same URL (in this process and those it forks) go
    straight to connecting without them.
    """
    url = mask_url(engine.url)

    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
        if cparams.get("options") != STARTUP_OPTIONS:
            return None
        if url not in _refused:
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as exc:
                if REFUSED not in str(exc):
                    raise
            first = url not in _refused  # not if another thread was refused meanwhile
            _refused.add(url)
            del cparams["options"]
            connection = dialect.connect(*cargs, **cparams)
            if first:
                _report(connection, url)
            return connection
        del cparams["options"]
        return None


def _report(connection: Any, url: str) -> None:
    """Log which settings are not in effect on a connection made without the startup options."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(SESSION_SETTINGS),))
            found = dict(cursor.fetchall())
    finally:
        connection.rollback()
    missing = [f"{name}={value}" for name, value in SESSION_SETTINGS.items() if found.get(name) != value]
    if not missing:
        logger.info("%s refuses connection options; its sessions have jobqueue's settings already", url)
        return
    logger.warning(
        "%s refuses connection options (a pooler such as PgBouncer?): jobqueue connects without them, "
        "and these settings are not in effect: %s. Set them on the role the workers log in as "
        "(ALTER ROLE ... SET), see docs/deployment.md",
        url,
        ", ".join(missing),
    )


def refuses_options(engine: sa.Engine) -> bool:
    """True if ``engine``'s server (a pooler) refuses the startup options; connects to find out."""
    if mask_url(engine.url) not in _refused:
        engine.connect().close()
    return mask_url(engine.url) in _refused


# statement_timeout is the server's, not jobqueue's: a DBA may set it for the database or the role
# (ALTER DATABASE/ROLE ... SET), and it cancels a statement that runs longer (SQLSTATE 57014). That
# is no outage. jobqueue's statements take milliseconds, but may wait up to lock_timeout for a row
# lock; below this a worker refuses to start, since even its quickest statements would be cancelled.
QUERY_CANCELED = "57014"
MIN_STATEMENT_TIMEOUT_MS = 100
ADVISED_STATEMENT_TIMEOUT = "60s"
# Where pg_settings says the value came from, as a user would say it.
SETTING_SOURCES = {
    "database": "set for this database",
    "user": "set for this role",
    "database user": "set for this role in this database",
    "configuration file": "set in postgresql.conf",
    "command line": "set on the server's command line",
    "environment variable": "set by PGOPTIONS",
    "client": "set by the client",
}


@dataclass(frozen=True)
class StatementTimeout:
    milliseconds: int
    source: str
    role: str


def read_statement_timeout(engine: sa.Engine) -> StatementTimeout:
    """The statement_timeout in force on ``engine``'s connections, where it comes from, and the role."""
    with engine.connect() as connection:
        row = connection.exec_driver_sql(
            "SELECT setting, source, current_user FROM pg_settings WHERE name = 'statement_timeout'"
        ).one()
        connection.rollback()
    return StatementTimeout(int(row[0]), str(row[1]), str(row[2]))


def statement_timeout_advice(
    timeout: StatementTimeout | None, role: str | None, what: str, running: bool = True
) -> str:
    """``what`` the server's statement_timeout did (``timeout``: its value, if it could be read),
    why that is a problem, and the fix: raise it for the role the workers log in as (and restart
    them, if ``running``)."""
    if timeout is None:
        setting = "the server's statement_timeout (set for this database or role)"
    else:
        source = SETTING_SOURCES.get(timeout.source, f"from {timeout.source}")
        setting = f"the server's statement_timeout of {timeout.milliseconds} ms ({source})"
        role = timeout.role
    name = f'"{role}"' if role else "<role>"
    lock = int(SESSION_SETTINGS["lock_timeout"]) // 1000
    if timeout is not None and timeout.source == "client":
        # Given by the connection itself (the URL's options, PGOPTIONS): it outranks the role's.
        return (
            f"{setting} {what}; jobqueue's statements take milliseconds but may wait up to {lock} s for a row "
            f"lock: remove statement_timeout from the connection's options (the database URL's options=, or "
            f"PGOPTIONS), or set it to at least {ADVISED_STATEMENT_TIMEOUT} (or 0, no limit) there"
        )
    return (
        f"{setting} {what}; jobqueue's statements take milliseconds but may wait up to {lock} s for a row "
        f"lock: raise it to at least {ADVISED_STATEMENT_TIMEOUT} (or 0, no limit) for the role the workers "
        f"log in as, ALTER ROLE {name} SET statement_timeout = '{ADVISED_STATEMENT_TIMEOUT}'"
        + (", and restart the workers (a connection keeps the setting it started with)" if running else "")
    )


def renew_read_only_sessions(engine: sa.Engine, code: str) -> None:
    """Take a statement refused as read-only (SQLSTATE ``code``) as a lost connection: its session
    keeps the default_transaction_read_only it was opened with, or its standby's, for ever.
    Replacing it (and every session pooled before it) lets the worker write again as soon as the
    database accepts writes (the setting turned off, the standby promoted, the URL's host moved to
    the new primary); retried on the same session, it was refused until the worker restarted.
    Every way a statement reaches the server asks the dialect, SQLAlchemy's own and the driver's."""
    dialect: Any = engine.dialect
    is_disconnect = dialect.is_disconnect

    def refused_as_read_only_or_disconnect(exc: Any, connection: Any, cursor: Any) -> bool:
        return getattr(exc, "pgcode", None) == code or bool(is_disconnect(exc, connection, cursor))

    dialect.is_disconnect = refused_as_read_only_or_disconnect
