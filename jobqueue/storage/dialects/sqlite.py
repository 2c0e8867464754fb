"""SQLite: UPDATE ... RETURNING inside BEGIN IMMEDIATE (set up by storage.engine), WAL journal.

SQLite has one writer at a time, so there is nothing to skip: the IMMEDIATE transaction makes the
select-and-mark atomic, and busy_timeout makes the other processes wait their turn.
"""

from __future__ import annotations

import os
import sqlite3
import time
import weakref
from collections import namedtuple
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import sqlite

from jobqueue.errors import ConfigurationError
from jobqueue.job import Batch, Message, MessageState, Outcome, OutcomeKind
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.dialects.common import BATCH_COLUMNS, AcquireParams, delivery_order, json_text
from jobqueue.storage.dialects.connector import CONTENTION, FULL, OUTAGE, READ_ONLY
from jobqueue.storage.dialects.flow import FlowAcquirer, is_partition
from jobqueue.storage.dialects.sqlite_driver import (
    COPY_ROWS_MOST,
    DriverStatement,
    JsonList,
    execute_on_driver,
    id_lists,
)
from jobqueue.storage.dialects.sqlite_rows import read_message
from jobqueue.storage.dialects.wakeup import PollingWaker, Waker, Wakers
from jobqueue.storage.engine import READONLY
from jobqueue.storage.outcomes import ARCHIVED_COLUMNS, COPIED, archive_row, archived_values, requeue_binds

SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"  # what SQLAlchemy's DateTime stores on SQLite
BUSY_TIMEOUT_SECONDS = 30.0
SQLITE_CONTENTION = ("database is locked", "database table is locked", "database is busy")
SQLITE_OUTAGE = ("disk i/o error", "unable to open database file")
SQLITE_FULL = ("database or disk is full",)
# "attempt to write a readonly database": the file, or the directory where SQLite must create its
# journal (-wal, -shm), may not be written by this process.
SQLITE_READ_ONLY = ("readonly database",)


DATETIME_COLUMNS = {
    "created_at",
    "next_attempt_at",
    "first_attempt_at",
    "last_attempt_at",
    "finished_at",
    "archived_at",
}


Delivery = tuple[int, int]  # a message id and the lease token of one delivery of it


def _stamp(value: datetime) -> str:
    # The text SQLAlchemy's DateTime stores (SQLITE_DATETIME), by isoformat's C fast path.
    return value.isoformat(" ", "microseconds")


def insert_one_params(row: dict[str, Any]) -> tuple[Any, ...]:
    """The values of ``Dialect.insert_one_sql`` for one row: ``sqlite_value`` of each, inlined
    (the per-column calls cost as much as the rest of a delay()'s Python)."""
    get = row.get
    headers, options = get("headers"), get("options")
    created, due = get("created_at"), get("next_attempt_at")
    return (
        row["payload"],
        get("unique_key"),
        get("task_name"),
        get("queue"),
        get("priority"),
        get("state"),
        None if headers is None else json_text(headers),
        get("partition_key"),
        get("flow_key"),
        get("concurrency_limit"),
        get("rate_interval_us"),
        None if options is None else json_text(options),
        get("attempts_count"),
        get("deliveries_count"),
        None if created is None else _stamp(created),
        None if due is None else _stamp(due),
    )


def sqlite_value(column: str, value: Any) -> Any:
    if column in ("headers", "options"):
        return json_text(value)
    if column in DATETIME_COLUMNS:
        # The text SQLAlchemy's DateTime stores (SQLITE_DATETIME), by isoformat's C fast path.
        return None if value is None else value.isoformat(" ", "microseconds")
    return value


# While another process writes, a writer tries again for the lock this often (doubling from the
# first pause to the last): SQLite's own busy handler sleeps 1, 2, 5, 10 ms... between tries, many
# times as long as the transactions it waits for, and two worker processes spent most of their
# time asleep in it.
BUSY_PAUSES_SECONDS = (0.0001, 0.002)
# Where the supervisor writes the journal back (every second), its worker processes' connections
# do it themselves only past this many pages (SQLite's own default is 1,000).
SAFETY_NET_CHECKPOINT_PAGES = 10_000
# Idle connections kept for delay() (see SQLiteDialect.enqueue_one); one per thread enqueuing at
# the same time is the most that ever helps.
SPARE_ENQUEUE_CONNECTIONS = 4


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


def _user_name() -> str:
    """Who this process writes files as."""
    uid = os.geteuid()
    try:
        import pwd  # POSIX only

        return f"{pwd.getpwuid(uid).pw_name!r}"
    except (ImportError, KeyError):
        return f"uid {uid}"


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


def _checkpoints(engine: sa.Engine) -> _Checkpoints:
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


class SQLiteDialect(Dialect):
    name = "sqlite"
    autocommit = False

    @classmethod
    def engine_options(cls, url: sa.URL) -> tuple[sa.URL, dict[str, Any]]:
        database = url.database or ""
        if database in ("", ":memory:") or url.query.get("mode") == "memory" or "mode=memory" in database:
            # Each connection would see its own empty database; worker processes could never share
            # it. Refused when a connection opens: under Django, jobs are still written through
            # Django's connection (a test's), and only what reads them on jobqueue's own fails.
            return url, {"creator": refuse_in_memory, "poolclass": sa.pool.NullPool}
        return url, {"connect_args": {"timeout": BUSY_TIMEOUT_SECONDS, "check_same_thread": False}}

    @classmethod
    def configure(cls, engine: sa.Engine) -> None:
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

    def __init__(self, engine: sa.Engine, tables: Any) -> None:
        super().__init__(engine, tables)
        self._archive_copies: dict[int, str] = {}
        # The acquire statements as the driver takes them, by shape (None: not on the driver).
        self._driver_acquires: dict[tuple[str, bool], DriverStatement | None] = {}
        self._driver_take: DriverStatement | None = None
        # Driver connections of enqueue_one, out of the engine's pool (opened through it, so
        # configured as every other one). Taking one from this list and putting it back costs
        # next to nothing, where a pool checkout and its reset cost a third of the insert.
        self._spares: list[sqlite3.Connection] = []
        self._spares_pid = os.getpid()
        self._checkpoints = _checkpoints(engine)

    def take_over_checkpoints(self) -> bool:
        # By default the commit that takes the WAL past 1000 pages copies them into the database
        # file and waits for the disk (tens of milliseconds, on the path of one unlucky flush or
        # fetch). Connections opened from now on, here and in processes forked from here, leave
        # that to checkpoint(), unless the WAL grows ten times as large (checkpoint() has not run:
        # the supervisor is stuck).
        self._checkpoints.elsewhere = True
        self.dispose()
        return True

    def dispose(self, close: bool = True) -> None:
        super().dispose(close=close)
        spares, self._spares = self._spares, []
        if close:
            for driver in spares:
                driver.close()

    def checkpoint(self) -> None:
        # PASSIVE: copies what no reader still needs, without waiting for or blocking anyone.
        # Outside any transaction (a checkpoint cannot run inside one).
        pooled = self.engine.raw_connection()
        try:
            pooled.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # type: ignore[union-attr]
        finally:
            pooled.close()

    @classmethod
    def database_identity(cls, url: sa.URL) -> tuple[Any, ...]:
        return (os.path.realpath(url.database) if url.database else "",)

    @classmethod
    def absolute_url(cls, url: sa.URL) -> sa.URL:
        # Another working directory (a Spark executor's, say) would find another file.
        if url.database and not url.database.startswith("file:") and not os.path.isabs(url.database):
            return url.set(database=os.path.abspath(url.database))
        return url

    marker = "?"
    returning_id = ""  # lastrowid: one step of the statement, where RETURNING takes a second

    def format_value(self, column: str, value: Any) -> Any:
        return sqlite_value(column, value)

    def enqueue_one(self, row: dict[str, Any]) -> int:
        # In autocommit: a lone INSERT is its own transaction, and the write lock is taken when it
        # starts (busy_timeout waits for it), so nothing reads before it writes.
        driver = self._spare()
        sql = self.insert_one_sql()
        try:
            new_id = driver.execute(sql, insert_one_params(row)).lastrowid
        except sqlite3.Error as exc:
            driver.close()
            # As SQLAlchemy reports a statement's errors, so SchemaError and the outage logic see them.
            raise sa.exc.DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
        except BaseException:
            driver.close()
            raise
        if len(self._spares) < SPARE_ENQUEUE_CONNECTIONS:
            self._spares.append(driver)
        else:
            driver.close()
        return cast(int, new_id)  # set by every INSERT

    def _spare(self) -> sqlite3.Connection:
        """An idle connection of enqueue_one's, or a new one (list pops are atomic: thread-safe)."""
        if self._spares_pid != os.getpid():
            # A forked child: its parent's connections are not its to use, nor to close.
            self._spares, self._spares_pid = [], os.getpid()
        try:
            return self._spares.pop()
        except IndexError:
            pass
        pooled = self.checkout()
        driver = cast(sqlite3.Connection, pooled.driver_connection)
        pooled.detach()  # ours from now on: closing it closes it
        return driver

    insert_on_conflict = staticmethod(sqlite.insert)

    def classify_driver_error(self, exc: sa.exc.DBAPIError) -> str | None:
        # sqlite3 says it in words: busy files wait their turn, an unreadable file is an outage.
        # A file turned read-only under a running worker waits for its permissions to come back
        # (a worker refuses to start on one: check_workable).
        text = str(exc.orig).lower()
        if any(part in text for part in SQLITE_CONTENTION):
            return CONTENTION
        if any(part in text for part in SQLITE_FULL):
            return FULL
        if any(part in text for part in SQLITE_READ_ONLY):
            return READ_ONLY
        return OUTAGE if any(part in text for part in SQLITE_OUTAGE) else None

    def check_workable(self) -> None:
        # A write that changes nothing, in a write transaction: whatever keeps this process from
        # writing (file or directory permissions, a read-only mount, an immutable file) refuses it.
        # A directory that is not there (yet: a mount to come) is no such case: the worker waits
        # for it as for a server that is down, saying so.
        database = self.engine.url.database
        if database and not database.startswith("file:"):
            if not os.path.isdir(os.path.dirname(os.path.abspath(database))):
                return
        problem = self.access_problem()
        if problem is None:
            try:
                with self.engine.begin() as connection:
                    connection.exec_driver_sql(f"UPDATE {self.tables.worker.name} SET id = id WHERE 0")
            except sa.exc.DBAPIError as exc:
                problem = self.unwritable(exc)
        if problem is not None:
            raise ConfigurationError(problem)

    def unwritable(self, exc: sa.exc.DBAPIError) -> str | None:
        text = str(exc.orig).lower()
        if any(part in text for part in SQLITE_READ_ONLY):
            return self.access_problem() or self._cannot_write("SQLite refuses to write it")
        if "unable to open database file" in text:
            return self.access_problem()  # None: not a question of permissions (an outage)
        return None

    def explain(self, exc: BaseException) -> str | None:
        return self.unwritable(exc) if isinstance(exc, sa.exc.DBAPIError) else None

    def access_problem(self) -> str | None:
        """Why this process cannot write the database file, as far as its permissions tell; None
        if they allow it (or the database is no plain file path)."""
        database = self.engine.url.database
        if not database or database.startswith("file:"):
            return None
        path = os.path.abspath(database)
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            return f"the directory {directory} of the SQLite database {path} does not exist: create it, or fix the URL"
        if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
            return self._cannot_write("this user may not write the file")
        if not os.access(directory, os.W_OK | os.X_OK):
            return self._cannot_write(f"this user may not create files in its directory {directory}")
        for journal in (f"{path}-wal", f"{path}-shm"):
            if os.path.exists(journal) and not os.access(journal, os.R_OK | os.W_OK):
                return self._cannot_write(f"this user may not write its journal file {journal}")
        return None

    def _cannot_write(self, reason: str) -> str:
        path = os.path.abspath(self.engine.url.database or "")
        directory, name = os.path.split(path)
        return (
            f"cannot write the SQLite database {path} as user {_user_name()}: {reason}. Give that user "
            f"write permission on the file and on its directory {directory} (SQLite creates its journal, "
            f"{name}-wal and {name}-shm, beside the file), or run as the user who owns them"
        )

    def missing_table(self, exc: sa.exc.DBAPIError) -> bool:
        return "no such table" in str(exc.orig).lower()

    def missing_column(self, exc: sa.exc.DBAPIError) -> bool:
        message = str(exc.orig).lower()
        return "no such column" in message or "has no column named" in message

    def waker(self, ready: Callable[[], bool], interval: float, due_interval: float, listen_url: str | None) -> Waker:
        # data_version says that something committed; delayed jobs come due without a commit.
        return Wakers(SQLiteWaker(self, interval), PollingWaker(ready, due_interval))

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        # One executemany in one write transaction: with AUTOINCREMENT and the write lock held, the
        # ids are the consecutive run ending at last_insert_rowid().
        shared = tuple(self.format_value(column, batch.common.get(column)) for column in BATCH_COLUMNS)
        sql = self.batch_insert_sql("(" + ", ".join(["?"] * (len(BATCH_COLUMNS) + 1)) + ")")
        connection.exec_driver_sql(sql, [(payload, *shared) for payload in batch.payloads])
        last = connection.exec_driver_sql("SELECT last_insert_rowid()").scalar_one()
        return list(range(last - len(batch) + 1, last + 1))

    def flush(self, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
        # The archive rows' values are built before BEGIN IMMEDIATE: other processes wait for the
        # write lock while it is held.
        copies = self.archive_copies(outcomes, now)
        with self.engine.begin() as connection:
            return self._apply(connection, outcomes, now, copies)

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
        return self._apply(connection, outcomes, now, self.archive_copies(outcomes, now))

    @staticmethod
    def archive_copies(outcomes: list[Outcome], now: datetime) -> dict[tuple[int, int], tuple[Any, ...]]:
        """The bind values of each archive copy (the message id and its lease token, then ARCHIVED
        values), by delivery."""
        archived_at = _stamp(now)
        return {
            (o.message.id, o.message.lease_token): (
                o.message.id,
                o.message.lease_token,
                *archived_values(o, archived_at, _stamp),
            )
            for o in outcomes
            if o.kind is OutcomeKind.ARCHIVE and o.retain and o.message.corrupt is None
        }

    def _apply(
        self,
        connection: sa.Connection,
        outcomes: list[Outcome],
        now: datetime,
        copies: dict[tuple[int, int], tuple[Any, ...]],
    ) -> set[tuple[int, int]]:
        # Inside BEGIN IMMEDIATE: the write lock is ours, so nothing can change the rows meanwhile.
        # Archive rows are copied from the message rows by the database (payloads never travel
        # back), one INSERT ... SELECT for up to COPY_ROWS_MOST of them (a third cheaper than one
        # execution per row), then one DELETE. The copy checks its leases itself: it copies a
        # message only while it is PROCESSING under the outcome's token, and says which it copied;
        # the other outcomes (requeues, and jobs archived without a copy) are checked by lock_held.
        pairs = [(o.message.id, o.message.lease_token) for o in outcomes]
        if len({key[0] for key in copies}) == len(copies):
            held = self._copy(connection, list(copies.items()))
            held |= self.lock_held(connection, [pair for pair in pairs if pair not in copies])
        else:  # two deliveries of one message: a copied id would not say which of them holds it
            held = self.lock_held(connection, pairs)
            self._copy(connection, [(key, copy) for key, copy in copies.items() if key in held])
        applied = [o for o in outcomes if (o.message.id, o.message.lease_token) in held]
        finals = [o for o in applied if o.kind is OutcomeKind.ARCHIVE]
        if finals:
            # A corrupt row is archived from the values that could be read (its error message holds
            # the unreadable text), so that the archive never holds text it cannot read back.
            repaired = [archive_row(o, now) for o in finals if o.retain and o.message.corrupt is not None]
            if repaired:
                connection.execute(sa.insert(self.tables.archive), repaired)
            self.delete_messages(connection, [o.message.id for o in finals])
        updates = [requeue_binds(o, now) for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        if updates:
            connection.execute(self.requeue, updates)
        return held

    def _copy(
        self, connection: sa.Connection, copies: list[tuple[tuple[int, int], tuple[Any, ...]]]
    ) -> set[tuple[int, int]]:
        """Copy into the archive the messages of ``copies`` whose lease is still held; return
        those deliveries. When a statement copies fewer rows than it was given (a lease was lost),
        lock_held says which: the rows it copied are still PROCESSING under their tokens."""
        held: set[Delivery] = set()
        width = len(ARCHIVED_COLUMNS) + 2
        for start in range(0, len(copies), COPY_ROWS_MOST):
            chunk = copies[start : start + COPY_ROWS_MOST]
            size = 1 << (len(chunk) - 1).bit_length()
            values = [value for _key, copy in chunk for value in copy]
            values += [None] * ((size - len(chunk)) * width)
            keys = [key for key, _copy in chunk]
            if execute_on_driver(connection, self._archive_copy_sql(size), tuple(values)).rowcount == len(chunk):
                held.update(keys)
            else:
                held |= self.lock_held(connection, keys)
        return held

    def lock_held(self, connection: sa.Connection, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
        # The write lock is ours already; by id alone, the token compared here. Plain SQL: the
        # expanding IN list of the shared statement is compiled anew for every flush.
        if not pairs:
            return set()
        held: set[tuple[int, int]] = set()
        processing = MessageState.PROCESSING.value
        sql = f"SELECT id, lease_token FROM {self.message.name} WHERE state = '{processing}' AND id IN "
        for marks, ids in id_lists(sorted({pair[0] for pair in pairs})):
            held.update((row[0], row[1]) for row in execute_on_driver(connection, sql + marks, ids))
        return held & set(pairs)

    def delete_messages(self, connection: sa.Connection, ids: list[int]) -> None:
        sql = f"DELETE FROM {self.message.name} WHERE id IN "
        for marks, chunk in id_lists(ids):
            execute_on_driver(connection, sql + marks, chunk)

    def _archive_copy_sql(self, rows: int) -> str:
        """Copy ``rows`` messages into the archive, each joined to the values its outcome supplies
        (its id and lease token, then ARCHIVED_COLUMNS) while it is PROCESSING under that token; a
        row of NULLs joins no message and adds nothing. (No RETURNING: it made the copy a quarter
        slower, where the count of rows copied says whether all were.)"""
        sql = self._archive_copies.get(rows)
        if sql is None:
            message, archive = self.message.name, self.tables.archive.name
            columns = ", ".join(COPIED + ARCHIVED_COLUMNS)
            copied = ", ".join(f"m.{column}" for column in COPIED)
            # SQLite names the columns of a VALUES list column1, column2...
            supplied = ", ".join(f"v.column{number + 3}" for number in range(len(ARCHIVED_COLUMNS)))
            row = "(" + ", ".join("?" * (len(ARCHIVED_COLUMNS) + 2)) + ")"
            processing = MessageState.PROCESSING.value
            sql = self._archive_copies[rows] = (
                f"INSERT INTO {archive} ({columns}) SELECT {copied}, {supplied} "
                f"FROM (VALUES {', '.join([row] * rows)}) AS v JOIN {message} AS m "
                f"ON m.id = v.column1 AND m.lease_token = v.column2 AND m.state = '{processing}'"
            )
        return sql

    def check_server(self, connection: sa.Connection) -> None:
        self._require(sqlite3.sqlite_version_info, (3, 35), "SQLite")

    def build_acquire(self, queues: str, levelled: bool = False) -> Any:
        # Columns come back as stored, undecoded: a hand-edited row with text that is not JSON or
        # not a timestamp must fail alone (see read_message), not the whole acquire in every process.
        m = self.message
        ready = self.ready_select([m.c.id], queues != "all", queues == "one", levelled).scalar_subquery()
        return sa.update(m).where(m.c.id.in_(ready)).values(self.acquired_values()).returning(*self.taken_columns())

    def taken_columns(self) -> list[Any]:
        return [sa.type_coerce(column, sa.types.NullType()).label(column.name) for column in self.returned]

    def read_taken(self, row: Any) -> Message:
        return read_message(row)

    def acquire(self, params: AcquireParams) -> list[Message]:
        driver_sql = self._driver_acquire(params)
        with self.engine.begin() as connection:
            if driver_sql is None:
                rows: Sequence[Any] = connection.execute(self.acquire_statement(params), params.binds()).all()
            else:
                rows = execute_on_driver(connection, *driver_sql).fetchall()
        # Read once the write lock is released: other processes wait for it meanwhile.
        messages = [read_message(row) for row in rows]
        messages.sort(key=delivery_order)
        return messages

    def queue_filter(self, one: bool) -> Any:
        # One queue is an equality, which the driver's acquire can take (an IN list is expanded per call).
        if one:
            return self.message.c.queue == sa.bindparam("only_queue", type_=sa.String)
        return super().queue_filter(one)

    def _driver_acquire(self, params: AcquireParams) -> tuple[str, tuple[Any, ...]] | None:
        """The acquire as SQL and values for the driver itself, or None where it takes a list of
        queues (its IN list is expanded per call). Inside the write lock, which the other processes
        wait for, SQLAlchemy's execution and its result rows cost as much as some of SQLite's work."""
        if params.statement not in self._driver_acquires:
            statement = DriverStatement(self.acquire_statement(params), self.engine.dialect)
            self._driver_acquires[params.statement] = None if statement.expanding else statement
        compiled = self._driver_acquires[params.statement]
        return None if compiled is None else (compiled.sql, compiled.values(params.binds()))

    def id_in_list(self) -> Any:
        # A JSON array read by json_each: one statement for any number of ids, prepared once,
        # where an IN list is expanded (and prepared) anew for every length.
        listed = sa.func.json_each(sa.bindparam("ids", type_=JsonList())).table_valued("value")
        return self.message.c.id.in_(sa.select(listed.c.value))

    def take(self, connection: sa.Connection, ids: list[int], params: AcquireParams) -> list[Message]:
        if self._driver_take is None:
            self._driver_take = DriverStatement(self.take_statement(), self.engine.dialect)
        statement = self._driver_take
        rows = execute_on_driver(connection, statement.sql, statement.values({**params.binds(), "ids": ids}))
        messages = [read_message(row) for row in rows]
        messages.sort(key=delivery_order)
        return messages

    def per_key_candidates(self, acquirer: FlowAcquirer) -> Callable[..., dict[str, list[Any]]] | None:
        # One small statement per key, each prepared once and run on the driver: a statement costs
        # SQLite little more than its work, where one statement for all keys had to be compiled
        # for every number of keys (tens of milliseconds each, inside the write lock).
        parts = {
            partition: DriverStatement(
                acquirer.part(
                    sa.literal_column("0"),
                    sa.bindparam("key", type_=sa.String),
                    sa.bindparam("share", type_=sa.Integer),
                    partition,
                ),
                self.engine.dialect,
            )
            for partition in (True, False)
        }
        if any(part.expanding for part in parts.values()):
            return None  # a list of queues, expanded per call
        candidate = namedtuple("candidate", parts[True].columns)  # type: ignore[misc]

        def read(connection: sa.Connection, binds: dict[str, Any], keys: list[str], share: int) -> dict[str, list[Any]]:
            rows: dict[str, list[Any]] = {}
            for key in keys:
                partition = is_partition(key)
                # A partition reads one row past its share (see partition_run).
                values = parts[partition].values({**binds, "key": key, "share": share + partition})
                found = execute_on_driver(connection, parts[partition].sql, values)
                rows[key] = [candidate._make(row) for row in found]  # in the statement's order
            return rows

        return read

    def acquire_on(self, connection: sa.Connection, params: AcquireParams) -> list[Message]:
        rows = connection.execute(self.acquire_statement(params), params.binds()).all()
        messages = [read_message(row) for row in rows]
        messages.sort(key=delivery_order)
        return messages


class SQLiteWaker(PollingWaker):
    """``PRAGMA data_version`` changes when another connection commits; reading it reads no table."""

    def __init__(self, dialect: SQLiteDialect, interval: float) -> None:
        super().__init__(self.changed, interval)
        self.connection = dialect.engine.raw_connection()
        self.last_seen: Any = None

    def changed(self) -> bool:
        version = self.connection.cursor().execute("PRAGMA data_version").fetchone()[0]
        # The first reading counts as news: a commit made after a process's first (empty) fetch
        # but before this reading would otherwise wait for that process's fallback poll.
        changed = self.last_seen is None or version != self.last_seen
        self.last_seen = version
        return changed

    def close(self) -> None:
        self.connection.close()
