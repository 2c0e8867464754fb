"""A dialect's own connections and its reading of driver errors.

The hot paths run straight on the DB-API driver in autocommit: on an idle worker SQLAlchemy's
per-statement machinery took longer than the statement. The rest goes through SQLAlchemy Core.
Errors come back wrapped as SQLAlchemy wraps them, so that the outage logic reads them one way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa

from jobqueue.errors import ConfigurationError
from jobqueue.storage.engine import READONLY, engine_like

T = TypeVar("T")

# What a driver error means to the runtime (see Connector.classify).
CONTENTION = "contention"  # a deadlock, a lock timeout, a busy file: retried quietly
OUTAGE = "outage"  # a lost connection, a server down or restarting: retried with backoff, logged once
# The database has no room left (a full disk, a table space at its limit): retried with backoff and
# logged once like an outage, but never taken for a refusal of the one operation (the server still
# answers reads), so outcomes are kept until there is room again instead of failing their jobs.
FULL = "full"
# The database refuses this process's writes (a SQLite file or directory it may not write) and a
# statement the server cancelled (PostgreSQL's statement_timeout, MariaDB's max_statement_time):
# neither is an outage. Retried with backoff like FULL (nothing is lost, and the work goes on once
# someone fixes the cause), with a warning that says what happened and the fix (Connector.explain).
READ_ONLY = "read-only"
CANCELLED = "cancelled"


# The server refused a statement for want of a privilege: PostgreSQL's SQLSTATE, MySQL's error numbers
# (database, table and column access denied).
INSUFFICIENT_PRIVILEGE_SQLSTATE = "42501"
MYSQL_ACCESS_DENIED = {1044, 1142, 1143}


def lacks_a_privilege(exc: sa.exc.DBAPIError) -> bool:
    """Whether the server refused ``exc``'s statement because the login lacks a privilege."""
    if getattr(exc.orig, "pgcode", None) == INSUFFICIENT_PRIVILEGE_SQLSTATE:
        return True
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return bool(args) and args[0] in MYSQL_ACCESS_DENIED


def first_line(exc: BaseException) -> str:
    """What an error says, in a line: the driver's own error's first line where there is one."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def privilege_advice(reason: str) -> str:
    """The grant that a privilege error (its first line, ``reason``) asks for."""
    if "for sequence" in reason:
        return "GRANT the database user USAGE on the jobqueue tables' sequences (GRANT USAGE ON SEQUENCE ...)"
    return (
        "GRANT the database user SELECT, INSERT, UPDATE and DELETE on the jobqueue tables "
        "(and CREATE, for `jobqueue db init` and `db upgrade`)"
    )


LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1", "::1"}


# Pools a forked child inherited: never collected there (see Connector.dispose).
PARENT_POOLS: list[Any] = []


class Connector:
    """The connections of one dialect: its engine's pool, and an autocommit pool where it pays."""

    # Whether single statements run in autocommit (a network round trip saved); not on SQLite,
    # whose transactions cost no round trips and must begin IMMEDIATE.
    autocommit = True
    default_port: int | None = None
    # Which database of which server a connection reaches, the same through a pooler as directly
    # (None: by the file, see server_identity).
    where_am_i: str | None = None

    # -- engines (class methods: they run before there is an engine) ------------------------------
    @classmethod
    def engine_options(cls, url: sa.URL) -> tuple[sa.URL, dict[str, Any]]:
        """The URL and ``sqlalchemy.create_engine`` options for jobqueue's own connections."""
        return url, {"pool_size": 2, "max_overflow": 8}

    @classmethod
    def configure(cls, engine: sa.Engine) -> None:
        """Install what every new connection of ``engine`` needs (event listeners)."""

    @classmethod
    def database_identity(cls, url: sa.URL) -> tuple[Any, ...]:
        """What names one database, drivers, users and passwords aside (a server's host, port, name)."""
        host = "localhost" if url.host in LOCAL_HOSTS else url.host
        return host, url.port or cls.default_port, url.database

    @classmethod
    def absolute_url(cls, url: sa.URL) -> sa.URL:
        """``url`` as any working directory reads it."""
        return url

    def server_identity(self, connection: sa.Connection) -> tuple[Any, ...]:
        """Which database ``connection`` is on, as its server says: two URLs may name one database
        (a pooler's and the server's, a socket and TCP), and one URL reach another (an alias)."""
        assert self.where_am_i is not None
        return tuple(connection.exec_driver_sql(self.where_am_i).one())

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._autocommit_engine: sa.Engine | None = None

    def dispose(self, close: bool = True) -> None:
        """Drop every pooled connection; ``close=False`` in a forked child, whose parent still uses them."""
        for engine in (self.engine, self._autocommit_engine):
            if engine is not None:
                if not close:
                    # Kept alive for good: a driver that closes a connection when it is garbage
                    # collected (mysqlclient sends COM_QUIT) would end the parent's session.
                    PARENT_POOLS.append(engine.pool)
                engine.dispose(close=close)

    def close_spare_autocommit(self) -> None:
        """Close the idle connections of the autocommit pool (what it compiled is kept): a process
        that used it once, and will not again soon, holds no connection for it."""
        if self._autocommit_engine is not None:
            self._autocommit_engine.dispose()

    def _autocommit(self) -> sa.Engine:
        if self._autocommit_engine is None:
            # Its own pool, always in autocommit: switching a pooled MySQL connection in and out of
            # autocommit would cost a round trip each way.
            self._autocommit_engine = engine_like(self.engine, isolation_level="AUTOCOMMIT")
        return self._autocommit_engine

    def _driver_engine(self) -> sa.Engine:
        return self._autocommit() if self.autocommit else self.engine

    @contextmanager
    def single_statement(self) -> Iterator[sa.Connection]:
        """A connection for one statement that is its own transaction: one round trip where BEGIN,
        the statement and COMMIT take three. SQLite keeps its IMMEDIATE transaction (local, cheap,
        and needed where a statement reads before it writes)."""
        if not self.autocommit:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._autocommit().connect() as conn:
            yield conn

    @contextmanager
    def probing(self) -> Iterator[sa.Connection]:
        """A connection for reads that need no snapshot together: each statement in autocommit
        where single statements are (one round trip each), else in a read-only transaction (on
        SQLite, without the write lock the other processes' fetches and flushes wait for)."""
        if self.autocommit:
            with self._autocommit().connect() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            conn = conn.execution_options(**{READONLY: True})
            with conn.begin():
                yield conn

    def checkout(self) -> Any:
        """A pooled DB-API connection in autocommit, for the dialect to keep (close() returns it).

        Its connect errors are wrapped as SQLAlchemy wraps them for a Connection, so that the
        outage logic recognises a server that is down.
        """
        engine = self._driver_engine()
        dbapi = engine.dialect.loaded_dbapi
        try:
            return engine.raw_connection()
        except dbapi.Error as exc:
            raise sa.exc.DBAPIError.instance("connect", None, exc, dbapi.Error, connection_invalidated=True) from exc

    def run_on_driver(self, work: Callable[[Any, dict[str, Any]], T], statement: str, connection: Any = None) -> T:
        """Run ``work(cursor, info)`` on a pooled DB-API connection in autocommit.

        ``info`` lives as long as the connection (a place for prepared-statement bookkeeping).
        ``connection``: one of the dialect's own from :meth:`checkout`, instead of the pool's.
        """
        engine = self._driver_engine()
        dbapi = engine.dialect.loaded_dbapi
        owned = connection is not None
        pooled = connection if owned else self.checkout()
        try:
            cursor = pooled.cursor()
            try:
                return work(cursor, pooled.info)
            finally:
                cursor.close()
        except dbapi.Error as exc:
            # Wrapped as SQLAlchemy would, so SchemaError and the outage logic recognise it.
            invalidated = engine.dialect.is_disconnect(exc, pooled.dbapi_connection, None)
            if invalidated:
                # As SQLAlchemy does on a disconnect: every connection pooled before now is stale
                # too (a restarted server), and is replaced when next checked out.
                engine.pool._invalidate(pooled, exc)
            raise sa.exc.DBAPIError.instance(
                statement, None, exc, dbapi.Error, connection_invalidated=invalidated
            ) from exc
        finally:
            if not owned:
                pooled.close()

    # -- errors ------------------------------------------------------------------------------------
    def deadlocked(self, exc: sa.exc.DBAPIError) -> bool:
        """Whether the database ended the transaction as a deadlock's victim (rolled back whole:
        running it again at once is safe); not a lock wait that timed out, which took its time."""
        return False

    def classify(self, exc: BaseException) -> str | None:
        """CONTENTION, OUTAGE, FULL, READ_ONLY, CANCELLED, or None for an error that retrying cannot fix.

        Here what every driver says the same way; the dialects add their own codes.
        """
        if isinstance(exc, sa.exc.DBAPIError):
            if exc.connection_invalidated:
                return OUTAGE
            return self.classify_driver_error(exc)
        if isinstance(exc, (sa.exc.DisconnectionError, ConnectionError)):
            return OUTAGE
        return None

    def classify_driver_error(self, exc: sa.exc.DBAPIError) -> str | None:
        """CONTENTION, OUTAGE or None for a driver error (the driver's own in ``exc.orig``)."""
        return None

    def explain(self, exc: BaseException) -> str | None:
        """For an error classified READ_ONLY or CANCELLED: what happened and its fix, for the log."""
        return None

    def login_refused(self, exc: BaseException) -> str | None:
        """If ``exc`` says that the server refused to log in (a database or user that does not
        exist, a wrong password): the fix. Such an error is an outage once a worker runs (the
        server may be coming back with its users), but no start can get past it."""
        return None

    def refuse_login(self, exc: sa.exc.DBAPIError) -> None:
        """Before a worker starts: raise ConfigurationError with the fix if ``exc`` is a refused login."""
        fix = self.login_refused(exc)
        if fix is not None:
            raise ConfigurationError(f"the database server refuses this login ({first_line(exc)}): {fix}") from None

    def missing_table(self, exc: sa.exc.DBAPIError) -> bool:
        """True if ``exc`` says that a table does not exist."""
        return False

    def missing_column(self, exc: sa.exc.DBAPIError) -> bool:
        """True if ``exc`` says that a column does not exist (tables of an older schema)."""
        return False
