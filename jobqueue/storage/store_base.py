"""How the store reaches its database: transactions of its own or on a caller's Connection or
Session, driver errors turned into errors that name their fix, and the lease clock.

Every group of the store's operations (see ``jobqueue.storage.store``) stands on this base.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue import clock
from jobqueue.clock import host_now, utcnow
from jobqueue.errors import ConfigurationError, SchemaError
from jobqueue.storage.dialects import dialect_for
from jobqueue.storage.dialects.common import LeaseClock
from jobqueue.storage.dialects.connector import first_line, lacks_a_privilege, privilege_advice
from jobqueue.storage.engine import database_kind, mask_url, same_database
from jobqueue.storage.tables import SCHEMA_VERSION, Tables


def commit_watch(connection: Any) -> Callable[[], bool] | None:
    """After a write through a caller's Connection or Session: a function telling whether the
    transaction holding it is still open, or None when there is none (it committed already)."""
    if connection is None:
        return None
    if not isinstance(connection, sa.Connection):
        connection = _session(connection)  # for a scoped session, this thread's: the job's
    transaction = connection.get_transaction()  # the outermost one, savepoints aside
    if transaction is None:
        return None
    return lambda: bool(transaction.is_active)


def _session_connection(session: Any) -> sa.Connection:
    """The Connection of a Session (or scoped session: Flask-SQLAlchemy's db.session), in its transaction."""
    connection: sa.Connection = _session(session).connection()
    return connection


def _session(session: Any) -> Any:
    """A Session, or a scoped session's Session for this thread; anything else is refused."""
    from sqlalchemy import orm  # imported only here: workers never need the ORM

    if isinstance(session, orm.scoped_session):
        session = session()
    if not isinstance(session, orm.Session):
        raise ConfigurationError(f"connection must be a SQLAlchemy Connection or Session, not {type(session).__name__}")
    return session


class StoreBase:
    """One database through its dialect: its transactions, its errors and its lease clock."""

    def __init__(self, engine: sa.Engine, tables: Tables, schema_command: str | None = None) -> None:
        self.engine = engine
        self.tables = tables
        # What a SchemaError tells to run, where the application manages the tables (Django's migrate).
        self.schema_command = schema_command
        self.dialect = dialect_for(engine, tables)
        # Whether the engines of callers' connections reach this database (see _check_same_server).
        self._same_server: weakref.WeakKeyDictionary[sa.Engine, bool] = weakref.WeakKeyDictionary()
        self._identity: tuple[Any, ...] | None = None

    def dispose(self, close: bool = True) -> None:
        """Drop every pooled connection; ``close=False`` in a forked child, whose parent still uses them."""
        self.dialect.dispose(close=close)

    # -- errors and transactions -------------------------------------------------------------------
    def classify(self, exc: BaseException) -> str | None:
        """ "contention", "outage", or None for an error that retrying cannot fix."""
        return self.dialect.classify(exc)

    def explain(self, exc: BaseException) -> str | None:
        """What a write refused, a statement cancelled or a login refused means, and its fix (None:
        nothing to add)."""
        try:
            explained = self.dialect.explain(exc)
            if explained:
                return explained
            fix = self.dialect.login_refused(exc)
            return f"the server refuses this login; {fix}" if fix else None
        except Exception:  # the explanation asks the server, which may not answer: the error says enough
            return None

    def check_workable(self) -> None:
        """Raise ConfigurationError, naming the cause and its fix, where a worker could never do
        its work: a login the server refuses (a database or user that does not exist, a wrong
        password), a SQLite file this process may not write, a statement time limit too short for
        any statement. A server that does not answer is no such case: the worker waits for it."""
        self.dialect.check_workable()

    def check_rights(self) -> None:
        """Raise ConfigurationError, naming each table and the grant, if the login may not read
        and write every jobqueue table (a worker's start)."""
        from jobqueue.storage.schema_manager import check_rights

        check_rights(self.engine, self.tables)

    def connection_limit_warning(self, needed: int, what: str) -> str | None:
        """What to say if the login may hold fewer than ``needed`` connections at once (``what``
        needs them): its processes beyond the limit would wait for one. A warning, not a refusal:
        behind a pooler (PgBouncer) the limit bounds the pooler's server connections, not these."""
        with self.engine.connect() as connection:
            found = self.dialect.connection_limit(connection)
            connection.rollback()
        if found is None or found[0] >= needed:
            return None
        limit, statement = found
        return (
            f"the database login may hold at most {limit} connection(s) at once, and {what} needs {needed}: "
            "the processes beyond the limit wait for a connection and run nothing, and a supervisor that loses "
            "its own connection (a restart) may wait too, renewing no lease meanwhile, which stops the whole "
            "worker. Raise the limit "
            f"({statement.format(needed=needed)}; more if the application shares the login), or lower "
            "--concurrency (behind a pooler such as PgBouncer the limit bounds its server connections, not these)"
        )

    @contextmanager
    def schema_errors(self) -> Iterator[None]:
        """Turn "table missing" driver errors into a SchemaError naming the fix."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            self._raise_if_missing_tables(exc)
            raise

    @contextmanager
    def enqueue_errors(self) -> Iterator[None]:
        """For an enqueue: a database this process may not write (a read-only SQLite file) is a
        ConfigurationError naming the file and the fix. The worker runtime instead waits for the
        permissions to come back (the dialect classifies the error as READ_ONLY)."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            refused = self.enqueue_refused(exc)
            if refused is not None:
                raise refused from exc
            raise

    def enqueue_refused(self, exc: sa.exc.DBAPIError) -> ConfigurationError | None:
        """The ConfigurationError, naming the fix, for an enqueue the database refused for want of a
        right (a file this process may not write, a privilege the login lacks); None for another error."""
        unwritable = self.dialect.unwritable(exc)
        if unwritable:
            return ConfigurationError(unwritable)
        if lacks_a_privilege(exc):
            reason = first_line(exc)
            return ConfigurationError(f"{reason}; nothing was enqueued: {privilege_advice(reason)}")
        return None

    def _raise_if_missing_tables(self, exc: sa.exc.DBAPIError) -> None:
        missing_table = self.dialect.missing_table(exc)
        if missing_table or self.dialect.missing_column(exc):
            # Tables of an older (or newer) schema lack some: the version says which command fixes it.
            from jobqueue.storage.migrations import installed_version
            from jobqueue.storage.schema_manager import check_schema

            try:
                with self.engine.connect() as conn:
                    version = installed_version(conn, self.tables)
                if version is not None and version != SCHEMA_VERSION:
                    check_schema(self.engine, self.tables, self.schema_command)
            except SchemaError as wrong_version:
                raise wrong_version from exc
            except Exception:  # the version cannot be read either: the driver's error says more
                pass
        if missing_table:
            from jobqueue.storage.migrations import missing_error

            raise missing_error(self.tables, self.schema_command) from exc

    @contextmanager
    def writing(self, connection: Any = None) -> Iterator[sa.Connection]:
        """Yield the caller's connection (never committed here) or a new transaction of our own."""
        with self.schema_errors():
            if connection is None:
                with self.engine.begin() as conn:
                    yield conn
            elif isinstance(connection, sa.Connection):
                self._check_same_database(connection.dialect)
                self._check_same_server(connection)
                yield connection
            else:
                self._check_same_database(_session(connection).get_bind().dialect)  # before it connects
                theirs = _session_connection(connection)
                self._check_same_server(theirs)
                yield theirs

    def _check_same_database(self, dialect: sa.Dialect) -> None:
        """Refuse a caller's connection to another kind of database than the queue's: the job would
        be written where no worker of this queue looks, with statements meant for another database."""
        theirs, ours = database_kind(dialect.name), database_kind(self.engine.dialect.name)
        if theirs != ours:
            raise ConfigurationError(
                f"connection= is a {theirs} connection but this JobQueue's database is {ours} "
                f"({mask_url(self.engine.url)}): a job is in your transaction only if the jobqueue "
                "tables are in the database your connection is on; point the JobQueue at that database"
            )

    def _check_same_server(self, connection: sa.Connection) -> None:
        """Refuse a caller's connection to another database of the same kind (another file, another
        database of the server, another server): the job would be committed there, where no worker
        of this queue looks, and its handle would read this queue's. Once per engine of theirs: its
        URL naming the queue's database settles it, else the server says where each connection is."""
        engine = connection.engine
        verdict = self._same_server.get(engine)
        if verdict is None:
            from jobqueue.storage.borrowed import BORROWED  # only here: most enqueues never come this way

            verdict = engine is self.engine or engine in BORROWED or same_database(engine.url, self.engine.url)
            if not verdict:
                verdict = self.dialect.server_identity(connection) == self._own_identity()
            self._same_server[engine] = verdict
        if not verdict:
            raise ConfigurationError(
                f"connection= is on another database ({mask_url(engine.url)}) than this JobQueue's "
                f"({mask_url(self.engine.url)}): the job would be committed where no worker of this queue "
                "looks; point the JobQueue at the database your connection is on, or enqueue without connection="
            )

    def _own_identity(self) -> tuple[Any, ...]:
        """Where this queue's database is, as server_identity says it: by its file on SQLite (a
        connection of ours would wait for the write lock the caller's transaction holds)."""
        if self._identity is None:
            if self.dialect.where_am_i is None:
                self._identity = self.dialect.database_identity(self.engine.url)
            else:
                with self.engine.connect() as ours:
                    self._identity = self.dialect.server_identity(ours)
        return self._identity

    @contextmanager
    def reading(self) -> Iterator[sa.Connection]:
        with self.schema_errors(), self.engine.connect() as conn:
            conn = conn.execution_options(jobqueue_readonly=True)
            with conn.begin():
                yield conn

    @contextmanager
    def snapshot(self) -> Iterator[sa.Connection]:
        """A read-only transaction whose statements all see the database as of its first one."""
        if self.engine.dialect.name == "sqlite":  # a read transaction is one snapshot already
            with self.reading() as conn:
                yield conn
            return
        with self.schema_errors(), self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ", jobqueue_readonly=True)
            with conn.begin():
                yield conn

    # -- the lease clock ---------------------------------------------------------------------------
    def _lease_clock(self, seconds: float, now: datetime | None) -> LeaseClock:
        """Binds for the lease clock: the server's (``now`` None), this host's (SQLite), or ``now``."""
        if now is None and self.dialect.client_clock:
            now = utcnow()
        return LeaseClock(now, seconds)

    def lease_clock_binds(self, seconds: float, now: datetime | None = None) -> dict[str, Any]:
        """The binds of ``dialect.clock_plus()``: the lease clock's time plus ``seconds``."""
        return self._lease_clock(seconds, now).binds()

    def lease_clock_now(self) -> datetime:
        """The lease clock's time: this host's where leases are stamped by it (SQLite), else the
        database server's, read by a query."""
        if self.dialect.client_clock:
            return utcnow()
        # On the engine's own pool, as the heartbeat: no connection more for the supervisor.
        with self.engine.connect() as connection:
            return self.database_now(connection)

    def clock_now(self) -> datetime:
        """``utcnow()``, once this host's clock was measured against the server's if it was time to
        (see jobqueue.clock): for the times an enqueue or a command starts from."""
        clock.refresh(self.measure_clock)
        return utcnow()

    def measure_clock(self) -> float | None:
        """Read the server's clock and correct this host's by it; None if the reading was of no use
        (see jobqueue.clock). On the engine's own pool: no connection more."""
        if self.dialect.client_clock:
            return 0.0  # the server is this host: one clock
        pool = self.engine.pool
        if isinstance(pool, sa.pool.QueuePool) and pool.checkedin() == 0 and _pool_full(pool):
            # Every connection the pool may open is in use (the application's own, given to
            # enqueues): no waiting for one only to read a clock. Later. (Short of its limit it
            # opens one more: an application that always enqueues on a connection of this
            # engine, its only open one, would otherwise never have its clock measured.)
            return None
        with self.engine.connect() as connection:
            sent = host_now()
            server = self.database_now(connection)
            received = host_now()
        return clock.observe(server, sent, received)

    def database_now(self, connection: sa.Connection) -> datetime:
        """The lease clock's time: the database server's where the dialect reads it, else this host's."""
        now: datetime = connection.execute(
            sa.select(self.dialect.clock()), self._lease_clock(0, None).binds()
        ).scalar_one()
        return now


def _pool_full(pool: sa.pool.QueuePool) -> bool:
    """Whether ``pool`` has opened every connection it may (a checkout would wait for one)."""
    limit = getattr(pool, "_max_overflow", 0)
    return limit >= 0 and pool.checkedout() >= pool.size() + limit
