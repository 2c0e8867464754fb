"""SQLite: UPDATE ... RETURNING inside BEGIN IMMEDIATE (set up by storage.engine), WAL journal.

SQLite has one writer at a time, so there is nothing to skip: the IMMEDIATE transaction makes the
select-and-mark atomic, and busy_timeout makes the other processes wait their turn.
"""

from __future__ import annotations

import os
import sqlite3
from collections import namedtuple
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from jobqueue.errors import ConfigurationError
from jobqueue.job import Batch, Message, Outcome
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.dialects.common import BATCH_COLUMNS, AcquireParams, delivery_order
from jobqueue.storage.dialects.connector import CONTENTION, FULL, OUTAGE, READ_ONLY
from jobqueue.storage.dialects.flow import FlowAcquirer, is_partition
from jobqueue.storage.dialects.sqlite_access import access_problem, cannot_write
from jobqueue.storage.dialects.sqlite_connection import SQLITE_CONTENTION, checkpoints, configure, engine_options
from jobqueue.storage.dialects.sqlite_driver import DriverStatement, JsonList, execute_on_driver
from jobqueue.storage.dialects.sqlite_outcomes import OutcomeWriter, archive_copies
from jobqueue.storage.dialects.sqlite_rows import insert_one_params, read_message, sqlite_value
from jobqueue.storage.dialects.wakeup import PollingWaker, Waker, Wakers

SQLITE_OUTAGE = ("disk i/o error", "unable to open database file")
SQLITE_FULL = ("database or disk is full",)
# "attempt to write a readonly database": the file, or the directory where SQLite must create its
# journal (-wal, -shm), may not be written by this process.
SQLITE_READ_ONLY = ("readonly database",)
# Idle connections kept for delay() (see SQLiteDialect.enqueue_one); one per thread enqueuing at
# the same time is the most that ever helps.
SPARE_ENQUEUE_CONNECTIONS = 4


class SQLiteDialect(Dialect):
    name = "sqlite"
    lock_holder_hint = "find the process that has the database file open with `fuser FILE` or `lsof FILE`"
    autocommit = False

    @classmethod
    def engine_options(cls, url: sa.URL) -> tuple[sa.URL, dict[str, Any]]:
        return engine_options(url)

    @classmethod
    def configure(cls, engine: sa.Engine) -> None:
        configure(engine)

    def __init__(self, engine: sa.Engine, tables: Any) -> None:
        super().__init__(engine, tables)
        self.outcome_writer = OutcomeWriter(tables, self.requeue)
        # The acquire statements as the driver takes them, by shape (None: not on the driver).
        self._driver_acquires: dict[tuple[str, bool], DriverStatement | None] = {}
        self._driver_take: DriverStatement | None = None
        # Driver connections of enqueue_one, out of the engine's pool (opened through it, so
        # configured as every other one). Taking one from this list and putting it back costs
        # next to nothing, where a pool checkout and its reset cost a third of the insert.
        self._spares: list[sqlite3.Connection] = []
        self._spares_pid = os.getpid()
        self._checkpoints = checkpoints(engine)

    def never_due(self, column: Any) -> Any:
        # A time is stored as text that starts with a digit: text that sorts after every digit
        # (letters: "soon") and blobs sort after every time, while numbers sort before them (due
        # at once, and failed when read).
        return column >= sa.literal_column("':'")

    def as_stored(self, column: Any) -> Any:
        return sa.type_coerce(column, sa.types.NullType())  # text or bytes, as stored (CAST decodes bytes)

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
        statement = "PRAGMA wal_checkpoint(PASSIVE)"
        try:
            pooled.driver_connection.execute(statement).fetchall()  # type: ignore[union-attr]
        except sqlite3.Error as exc:  # as SQLAlchemy reports it: a full disk is an outage, logged as one
            raise sa.exc.DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc
        finally:
            pooled.close()

    @classmethod
    def database_identity(cls, url: sa.URL) -> tuple[Any, ...]:
        name = url.database or ""
        if name.startswith("file:"):  # a URI: file:/path?mode=rwc, file:///path
            name = name[len("file:") :].partition("?")[0]
            name = name[len("//") :] if name.startswith("///") else name
        return (os.path.realpath(name) if name else "",)

    def server_identity(self, connection: sa.Connection) -> tuple[Any, ...]:
        files = {row[1]: row[2] for row in connection.exec_driver_sql("PRAGMA database_list")}
        main = files.get("main") or ""
        return (os.path.realpath(main) if main else "",)

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
        path = os.path.abspath(self.engine.url.database or "")
        if "file is not a database" in text:
            return (
                f"{path} is not a SQLite database (another kind of file, or an encrypted one): fix the path in the URL"
            )
        if "database disk image is malformed" in text or "malformed database schema" in text:
            return (
                f"the SQLite database {path} is damaged (its disk image is malformed): restore it from a backup; "
                f"`sqlite3 {path} .recover` may save what it holds"
            )
        if any(part in text for part in SQLITE_READ_ONLY):
            return self.access_problem() or cannot_write(self.engine.url.database, "SQLite refuses to write it")
        if "unable to open database file" in text:
            return self.access_problem()  # None: not a question of permissions (an outage)
        return None

    def explain(self, exc: BaseException) -> str | None:
        return self.unwritable(exc) if isinstance(exc, sa.exc.DBAPIError) else None

    def access_problem(self) -> str | None:
        """Why this process cannot write the database file, as far as its permissions tell; None
        if they allow it (or the database is no plain file path)."""
        return access_problem(self.engine.url.database)

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
        copies = archive_copies(outcomes, now)
        with self.engine.begin() as connection:
            return self.outcome_writer.apply(connection, outcomes, now, copies)

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
        return self.outcome_writer.apply(connection, outcomes, now, archive_copies(outcomes, now))

    def lock_held(self, connection: sa.Connection, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
        return self.outcome_writer.lock_held(connection, pairs)

    def delete_messages(self, connection: sa.Connection, ids: list[int]) -> None:
        self.outcome_writer.delete_messages(connection, ids)

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
