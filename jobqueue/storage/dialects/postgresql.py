"""PostgreSQL: acquire in one statement, a CTE with FOR UPDATE SKIP LOCKED feeding UPDATE ... RETURNING.

Acquire, on the path from enqueue to a job's start, runs on the driver as a prepared statement
(postgresql_sql.Prepared); a flush is one statement in autocommit; bulk() streams one COPY
(postgresql_copy). An insert trigger notifies (delivered at COMMIT, so a rolled-back enqueue wakes
nobody), and each supervisor LISTENs on one connection for all its processes (:class:`ListeningWaker`), on
``listen_database_url`` where the database URL goes through a pooler in transaction mode. With a
driver other than psycopg2 (psycopg 3, untested) the supervisor polls.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from jobqueue.errors import ConfigurationError
from jobqueue.job import Batch, Message, Outcome
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.dialects.common import READY_LITERALS, AcquireParams, LeaseClock, delivery_order
from jobqueue.storage.dialects.connector import CANCELLED, CONTENTION, FULL, OUTAGE
from jobqueue.storage.dialects.flow import FlowAcquirer
from jobqueue.storage.dialects.postgresql_copy import UnseenStatements, copy_batch, copy_unseen
from jobqueue.storage.dialects.postgresql_listen import ListeningWaker
from jobqueue.storage.dialects.postgresql_session import (
    MIN_STATEMENT_TIMEOUT_MS,
    QUERY_CANCELED,
    STARTUP_OPTIONS,
    StatementTimeout,
    connect_without_refused_options,
    read_any_timestamp,
    read_statement_timeout,
    refuses_options,
    renew_read_only_sessions,
    statement_timeout_advice,
)
from jobqueue.storage.dialects.postgresql_sql import (
    Misses,
    Prepared,
    acquired_message,
    build_apply_outcomes,
    outcome_binds,
)
from jobqueue.storage.dialects.wakeup import PollingWaker, Waker, Wakers
from jobqueue.storage.engine import unless_in_url
from jobqueue.storage.tables import Tables, notify_channel, postgresql_notify_ddl

logger = logging.getLogger("jobqueue.storage")

DISK_FULL = "53100"
CONTENTION_CODES = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available
# A server that turned read-only (a standby after failover, or one shutting down) and a session the
# server ended (idle in transaction too long, administrator): wait for the new primary.
# How long a schema change's step, or a group being added, waits for a lock before it is tried again.
BRIEF_LOCK_WAIT_MS = 2000
INVALID_SCHEMA_NAME = "3F000"  # "no schema has been selected to create in": search_path names none that exists
READ_ONLY_TRANSACTION = "25006"  # a standby, or default_transaction_read_only: a failover in progress
OUTAGE_CODES = {READ_ONLY_TRANSACTION, "57P01", "57P02", "57P03", "25P03"}
UNDEFINED_TABLE = "42P01"
UNDEFINED_COLUMN = "42703"
# What the server (or PgBouncer) says when it refuses a login, and the fix: a worker does not start
# past these. The messages come before any statement, so they carry no SQLSTATE to go by.
LOGIN_REFUSALS = (
    (
        re.compile(r'database "[^"]*" does not exist|no such database'),
        "create the database (CREATE DATABASE, or createdb), or fix its name in the URL",
    ),
    (
        # PgBouncer's words for a user its auth_file (or auth_query) does not know.
        re.compile(r'no such user|"trust" authentication failed'),
        "list the user in the pooler's auth_file (or give it an auth_query), or fix the user name in the URL",
    ),
    (
        re.compile(r'role "[^"]*" does not exist'),
        "create the user (CREATE ROLE ... LOGIN), or fix the user name in the URL",
    ),
    (
        re.compile(r"authentication failed|no password supplied"),
        "fix the user name and password in the URL",
    ),
    (
        re.compile(r"no pg_hba\.conf entry"),
        "let this host, user and database log in through the server's pg_hba.conf, or fix the URL",
    ),
    (
        re.compile(r"permission denied for database|does not have CONNECT privilege"),
        "GRANT CONNECT ON DATABASE to the user in the URL",
    ),
)
# Rounds of locking a flow row and inserting it if missing; two always do unless a sweep deletes
# a row between them.
FLOW_HOLD_TRIES = 3


class PostgreSQLDialect(Dialect):
    name = "postgresql"
    lock_holder_hint = (
        "find it in pg_stat_activity (state 'idle in transaction', or the pid that pg_blocking_pids() names)"
    )
    client_clock = False
    default_port = 5432
    where_am_i = "SELECT current_database(), pg_postmaster_start_time()::text"
    insert_on_conflict = staticmethod(postgresql.insert)

    def never_due(self, column: Any) -> Any:
        # 'infinity' and years past 9999: later than every due time, and no Python datetime.
        return column > sa.literal_column("TIMESTAMP '9999-12-31 23:59:59.999999'")

    @classmethod
    def engine_options(cls, url: sa.URL) -> tuple[sa.URL, dict[str, Any]]:
        url, options = super().engine_options(url)
        # execute_batch for UPDATE executemany: one round trip per page, not per row.
        options["executemany_mode"] = "values_plus_batch"
        # Whatever the server's default: SKIP LOCKED acquires and the unique-key checks rely on
        # each statement seeing the latest commits.
        options["isolation_level"] = "READ COMMITTED"
        # A dead server or network is noticed (keepalives) instead of hanging a worker forever.
        # The session settings travel in the startup packet (see postgresql_session).
        options["connect_args"] = unless_in_url(
            url,
            {
                "connect_timeout": 10,
                "keepalives": 1,
                "keepalives_idle": 30,
                "keepalives_interval": 10,
                "keepalives_count": 3,
                "options": STARTUP_OPTIONS,
            },
        )
        return url, options

    @classmethod
    def configure(cls, engine: sa.Engine) -> None:
        connect_without_refused_options(engine)
        read_any_timestamp(engine)
        renew_read_only_sessions(engine, READ_ONLY_TRANSACTION)

    _apply_outcomes: Any = None
    _unseen: UnseenStatements | None = None
    _prepared_flush: Prepared | None = None

    def __init__(self, engine: sa.Engine, tables: Tables) -> None:
        super().__init__(engine, tables)
        self._prepared: dict[tuple[str, bool], Prepared] = {}
        self._misses = Misses()  # prepared statements gone missing, for all of them
        self._compiled: dict[Any, Prepared] = {}  # statements run unprepared, compiled once
        f = tables.flow
        self._hold_flow = (
            sa.select(f.c.flow_key)
            .where(f.c.flow_key.in_(sa.bindparam("keys", expanding=True)))
            .order_by(f.c.flow_key)
            .with_for_update(read=True, key_share=True)
        )

    @property
    def _on_psycopg2(self) -> bool:
        return self.engine.dialect.driver == "psycopg2"

    # -- schema, server, errors -----------------------------------------------------------------------
    @contextlib.contextmanager
    def schema_lock(self, connection: sa.Connection) -> Iterator[None]:
        # Released when the transaction ends. The DDL is transactional: the next holder reads the
        # version the one before recorded, and finds its tables and function there.
        name = f"{self.tables.prefix}schema"
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": name})
        yield

    def after_create(self, connection: sa.Connection) -> list[str]:
        statements = postgresql_notify_ddl(self.tables.prefix)
        if self._notify_trigger_in_place(connection, statements[0]):
            return []  # nothing to change: no right to create is needed (the application's own login)
        for statement in statements:
            connection.exec_driver_sql(statement)
        return [f"trigger {self.tables.prefix}message_notify"]

    def lacks_beyond_tables(self, connection: sa.Connection) -> list[str]:
        # Without it, idle workers hear of no new job and find it at their next poll (up to a second).
        if self._notify_trigger_in_place(connection, postgresql_notify_ddl(self.tables.prefix)[0]):
            return []
        return [f"trigger {self.tables.prefix}message_notify"]

    def _notify_trigger_in_place(self, connection: sa.Connection, create_function: str) -> bool:
        """Whether the wake-up trigger is on the message table and its function's body is the one
        ``create_function`` writes."""
        prefix = self.tables.prefix
        body = re.search(r"\$\$(.*)\$\$", create_function, re.S)
        found = connection.execute(
            sa.text("SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure(:function)"),
            {"function": f"{prefix}notify()"},
        ).first()
        if body is None or found is None or found[0] != body.group(1):
            return False
        trigger = sa.text("SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(:table) AND tgname = :name")
        names = {"table": f"{prefix}message", "name": f"{prefix}message_notify"}
        return connection.execute(trigger, names).first() is not None

    def after_drop(self, connection: sa.Connection) -> None:
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {self.tables.prefix}notify()")

    def check_server(self, connection: sa.Connection) -> None:
        self._require(connection.dialect.server_version_info, (13,), "PostgreSQL")

    def deadlocked(self, exc: sa.exc.DBAPIError) -> bool:
        return getattr(exc.orig, "pgcode", None) == "40P01"

    def classify_driver_error(self, exc: sa.exc.DBAPIError) -> str | None:
        code = getattr(exc.orig, "pgcode", None)
        if code in CONTENTION_CODES:
            return CONTENTION
        if code == DISK_FULL:
            return FULL
        if code == QUERY_CANCELED:  # statement_timeout, or pg_cancel_backend: the server is up
            return CANCELLED
        if code in OUTAGE_CODES or isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
            return OUTAGE
        return None

    @contextlib.contextmanager
    def brief_lock_waits(self, connection: sa.Connection) -> Iterator[None]:
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{BRIEF_LOCK_WAIT_MS}ms'")  # until the transaction ends
        yield

    def connection_limit(self, connection: sa.Connection) -> tuple[int, str] | None:
        row = connection.exec_driver_sql(
            "SELECT r.rolconnlimit, d.datconnlimit, session_user, current_database(), r.rolsuper "
            "FROM pg_roles r, pg_database d WHERE r.rolname = session_user AND d.datname = current_database()"
        ).one_or_none()
        if row is None or row[4]:  # a superuser is held to neither limit
            return None
        role, database, user, name, _ = row
        limits = []
        if role >= 0:
            limits.append((role, f'ALTER ROLE "{user}" CONNECTION LIMIT {{needed}}'))
        if database >= 0:
            limits.append((database, f'ALTER DATABASE "{name}" CONNECTION LIMIT {{needed}}'))
        return min(limits) if limits else None

    def explain(self, exc: BaseException) -> str | None:
        orig = getattr(exc, "orig", None)
        if getattr(orig, "pgcode", None) == INVALID_SCHEMA_NAME:
            return (
                "the login's search_path names no schema that exists (set in the URL's options, on the role or "
                "on the database): create that schema (CREATE SCHEMA ...), or correct search_path"
            )
        if getattr(orig, "pgcode", None) == READ_ONLY_TRANSACTION:
            return (
                "the database accepts no writes (a standby, a failover in progress, or "
                "default_transaction_read_only set on it or its user): point the URL at the primary, or turn it off"
            )
        if getattr(orig, "pgcode", None) != QUERY_CANCELED:
            return None
        if "statement timeout" not in str(orig):
            return "the server cancelled it (pg_cancel_backend, or an administrator), and it is tried again"
        return statement_timeout_advice(read_statement_timeout(self.engine), self.engine.url.username, "cancelled it")

    def check_workable(self) -> None:
        timeout: StatementTimeout | None = None  # None: so short that it cancelled even the reading
        try:
            timeout = read_statement_timeout(self.engine)
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) != QUERY_CANCELED:
                self.refuse_login(exc)  # a database or user that does not exist, a wrong password
                return  # the server is down: what follows waits
        if timeout is not None and not 0 < timeout.milliseconds < MIN_STATEMENT_TIMEOUT_MS:
            return
        what = f"is too short for a worker (under {MIN_STATEMENT_TIMEOUT_MS} ms)"
        raise ConfigurationError(statement_timeout_advice(timeout, self.engine.url.username, what, running=False))

    def login_refused(self, exc: BaseException) -> str | None:
        if not isinstance(exc, sa.exc.OperationalError) or getattr(exc.orig, "pgcode", None):
            return None
        text = str(exc.orig)
        return next((fix for pattern, fix in LOGIN_REFUSALS if pattern.search(text)), None)

    def missing_table(self, exc: sa.exc.DBAPIError) -> bool:
        return getattr(exc.orig, "pgcode", None) == UNDEFINED_TABLE

    def missing_column(self, exc: sa.exc.DBAPIError) -> bool:
        return getattr(exc.orig, "pgcode", None) == UNDEFINED_COLUMN

    # -- the lease clock ------------------------------------------------------------------------------
    def clock(self) -> Any:
        # now() is the time the transaction began: every lease statement is a short one of its own.
        return sa.func.coalesce(
            sa.bindparam("lease_now", type_=sa.DateTime), sa.func.timezone("UTC", sa.func.now()), type_=sa.DateTime
        )

    def clock_plus(self) -> Any:
        seconds = sa.bindparam("lease_us", type_=sa.BigInteger) / sa.literal_column("1000000.0")
        return self.clock() + sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds, type_=sa.Interval)

    # -- acquire --------------------------------------------------------------------------------------
    def build_acquire(self, queues: str, levelled: bool = False) -> Any:
        m = self.message
        ready = (
            self.ready_select([m.c.id], queues != "all", queues == "one", levelled)
            .with_for_update(skip_locked=True)
            .cte("ready")
        )
        # id = ANY(ARRAY(SELECT ...)): the chosen ids become one array, then primary-key lookups.
        # A join with the CTE lets the planner hash-join against a scan of the whole backlog.
        chosen = sa.func.array(sa.select(ready.c.id).scalar_subquery())
        return sa.update(m).where(m.c.id == sa.any_(chosen)).values(self.acquired_values()).returning(*self.returned)

    def lateral_candidates(self, acquirer: FlowAcquirer) -> Any:
        # unnest(keys) WITH ORDINALITY, each key's candidates a LATERAL subquery: one small
        # statement whatever the number of keys, where a UNION of one part per key took longer to
        # plan than to run.
        lists = {
            name: sa.bindparam(name, type_=postgresql.ARRAY(sa.String)) for name in ("partition_keys", "other_keys")
        }
        parts = []
        for name, partition in (("partition_keys", True), ("other_keys", False)):
            offset = None if partition else sa.func.coalesce(sa.func.cardinality(lists["partition_keys"]), 0)
            parts.append(self._lateral_part(acquirer, lists[name], name, partition, offset))
        return sa.union_all(*parts)

    def _lateral_part(self, acquirer: FlowAcquirer, keys: Any, name: str, partition: bool, offset: Any = None) -> Any:
        """The candidates of the keys in the array ``keys``, numbered from 0 (plus ``offset``)."""
        listed = (
            sa.func.unnest(keys)
            .table_valued(sa.column("key", sa.String), with_ordinality="ordinality")
            .render_derived(name=f"{name}_list")
        )
        number = listed.c.ordinality - 1 if offset is None else listed.c.ordinality - 1 + offset
        share = sa.bindparam("partition_share" if partition else "share", type_=sa.Integer)
        part = acquirer.part(number, listed.c.key, share, partition)
        part = part.lateral(f"{name}_rows")
        return sa.select(*[part.c[column] for column in part.c.keys()]).select_from(listed).join(part, sa.true())

    def partition_runs(self, acquirer: FlowAcquirer) -> Any:
        """One statement that takes the runs of the locked partition keys ``partition_keys`` and
        marks them served (bind ``share``, ``partition_share`` (one more), ``limit`` and ``served``
        besides the acquire's binds).

        A run is a partition's oldest jobs up to the first that may not be taken (running,
        retrying, waiting, or of another flow key), at most ``share`` of them, and none while one
        of its jobs runs; the keys' runs are
        taken in the order of the keys, ``limit`` jobs in all. The keys are locked already (by an
        earlier statement), so what this one reads cannot change under it.
        """
        if not self._on_psycopg2:
            return None
        m, f = self.message, self.tables.flow
        keys = sa.bindparam("partition_keys", type_=postgresql.ARRAY(sa.String))
        candidates = self._lateral_part(acquirer, keys, "partition_keys", True).subquery("candidates")
        # As partition_run: a partition's candidates go one past its share, and none is taken
        # while one of them runs.
        window = {"partition_by": candidates.c.part, "order_by": candidates.c.id}
        run = sa.func.bool_and(candidates.c.takeable == 1).over(**window)
        place = sa.func.row_number().over(**window)
        running = sa.func.bool_or(candidates.c.running == 1).over(partition_by=candidates.c.part)
        runs = sa.select(
            candidates.c.part, candidates.c.id, run.label("in_run"), place.label("place"), running.label("running")
        ).subquery("runs")
        chosen = (
            sa.select(runs.c.id)
            .where(runs.c.in_run, ~runs.c.running, runs.c.place <= sa.bindparam("share", type_=sa.Integer))
            .order_by(runs.c.part, runs.c.id)
            .limit(sa.bindparam("limit", type_=sa.Integer))
        )
        served = (
            sa.update(f)
            .where(f.c.flow_key == sa.any_(keys))
            .values(served_at=sa.bindparam("served", type_=sa.DateTime))
            .cte("served")
        )
        return (
            sa.update(m)
            .where(m.c.id == sa.any_(sa.func.array(chosen.scalar_subquery())), m.c.state.in_(READY_LITERALS))
            .values(self.acquired_values())
            .returning(*self.taken_columns())
            .add_cte(served)
        )

    def warm_up(self, params: AcquireParams) -> None:
        super().warm_up(params)
        if not self._on_psycopg2:
            return
        self._acquire_for(params.statement)
        self._flush_statement()
        runs = self.flow_acquirer(params.shape).runs
        if runs is not None:
            self._compiled_once(runs)

    def take_runs(self, connection: sa.Connection, runs: Any, binds: dict[str, Any]) -> list[Message]:
        return self._taken_on_driver(connection, runs, binds)

    def take(self, connection: sa.Connection, ids: list[int], params: AcquireParams) -> list[Message]:
        if not self._on_psycopg2:
            return super().take(connection, ids, params)
        return self._taken_on_driver(connection, self.take_statement(), {**params.binds(), "ids": ids})

    def _taken_on_driver(self, connection: sa.Connection, statement: Any, binds: dict[str, Any]) -> list[Message]:
        """Run a statement that takes messages, inside the acquire's transaction (so unprepared:
        a prepared statement gone missing would abort it), compiled once."""
        compiled = self._compiled_once(statement)
        # Rows read as the driver returns them, as the prepared acquire does: SQLAlchemy's row
        # handling of 500 rows took longer than their update.
        result = connection.exec_driver_sql(compiled.sql, {**compiled.defaults, **binds})
        try:
            rows = result.cursor.fetchall()
        finally:
            result.close()
        messages = [acquired_message(row) for row in rows]
        messages.sort(key=delivery_order)
        return messages

    def _compiled_once(self, statement: Any) -> Prepared:
        compiled = self._compiled.get(statement)
        if compiled is None:
            compiled = self._compiled[statement] = Prepared.compile(statement)
        return compiled

    def id_in_list(self) -> Any:
        # One array parameter: a list of 500 ids as 500 parameters took longer to parse and plan
        # than to update the rows.
        return self.message.c.id == sa.any_(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger)))

    def queue_filter(self, one: bool) -> Any:
        # One parameter whatever the number of queues, so that a prepared statement serves every
        # call. One queue is an equality: the ordered walk of the queue's ready index.
        if one:
            return self.message.c.queue == sa.bindparam("only_queue", type_=sa.String)
        return self.message.c.queue == sa.any_(sa.bindparam("queues", type_=postgresql.ARRAY(sa.String)))

    def acquire(self, params: AcquireParams) -> list[Message]:
        if not self._on_psycopg2:
            with self.single_statement() as connection:
                return self.acquire_on(connection, params)
        return self.run_on_driver(lambda cursor, info: self._acquire_prepared(cursor, info, params), "acquire")

    def _acquire_prepared(self, cursor: Any, info: dict[str, Any], params: AcquireParams) -> list[Message]:
        self._acquire_for(params.statement).run(cursor, params.binds(), info)
        messages = [acquired_message(row) for row in cursor.fetchall()]
        messages.sort(key=delivery_order)  # RETURNING gives no order
        return messages

    def _acquire_for(self, statement: tuple[str, bool]) -> Prepared:
        prepared = self._prepared.get(statement)
        if prepared is None:
            prepared = self._prepared[statement] = Prepared.compile(self.build_acquire(*statement), self._misses)
        return prepared

    # -- outcomes, leases -----------------------------------------------------------------------------
    def flush(self, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
        if not self._on_psycopg2:
            with self.single_statement() as connection:  # one statement, so one round trip in autocommit
                return self.apply_outcomes(connection, outcomes, now)
        # Prepared, as the acquire is: planning it took a third of a small flush.
        return self.run_on_driver(lambda cursor, info: self._flush_prepared(cursor, info, outcomes, now), "flush")

    def _flush_prepared(
        self, cursor: Any, info: dict[str, Any], outcomes: list[Outcome], now: datetime
    ) -> set[tuple[int, int]]:
        self._flush_statement().run(cursor, outcome_binds(outcomes, now), info)
        return {(row[0], row[1]) for row in cursor.fetchall()}

    def _flush_statement(self) -> Prepared:
        if self._prepared_flush is None:
            self._prepared_flush = Prepared.compile(self._outcomes_statement(), self._misses)
        return self._prepared_flush

    def _outcomes_statement(self) -> Any:
        if self._apply_outcomes is None:
            self._apply_outcomes = build_apply_outcomes(self.message, self.tables.archive)
        return self._apply_outcomes

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
        rows = connection.execute(self._outcomes_statement(), outcome_binds(outcomes, now)).all()
        return {(row[0], row[1]) for row in rows}

    def renew_leases(self, connection: sa.Connection, worker_ids: list[str], lease: LeaseClock) -> int:
        # Rows a worker is flushing right now are skipped, not waited for: waiting could deadlock
        # with the flush's own row locks, and those rows are about to leave PROCESSING anyway.
        m = self.message
        locked = sa.select(m.c.id).where(*self.renewable(worker_ids)).with_for_update(skip_locked=True)
        stmt = sa.update(m).where(m.c.id.in_(locked.scalar_subquery())).values(lease_expires_at=self.clock_plus())
        return int(connection.execute(stmt, lease.binds()).rowcount)

    # -- enqueue --------------------------------------------------------------------------------------
    def hold_flow_keys(self, connection: sa.Connection, keys: set[str], now: datetime) -> None:
        """Lock each flow row FOR KEY SHARE, inserting the missing ones (see the base class).

        That lock holds off only a DELETE: other enqueues share it, and acquires lock the rows FOR
        NO KEY UPDATE, which does not wait for it. An INSERT that finds a row takes no lock, so the
        rows it did not insert are locked again (a sweep may have deleted one meanwhile).
        """
        f = self.tables.flow
        missing = sorted(keys)
        for _ in range(FLOW_HOLD_TRIES):
            missing = sorted(set(missing) - set(connection.execute(self._hold_flow, {"keys": missing}).scalars()))
            if not missing:
                return
            inserted = connection.execute(
                self.insert_flow_rows().returning(f.c.flow_key, sort_by_parameter_order=True),
                self.flow_rows(missing, now),
            )
            missing = sorted(set(missing) - set(inserted.scalars()))
            if not missing:
                return
        raise RuntimeError(f"could not hold flow keys {missing!r}: they were deleted again and again")

    def bulk(self, batch: Batch, batch_size: int) -> list[int]:
        if not self._on_psycopg2:
            return super().bulk(batch, batch_size)
        # One COPY for every row, each payload serialized as it is read, while the server parses
        # the rows before it (17% faster than serializing first). A bad item aborts the COPY and
        # the transaction: nothing is committed.
        with self.engine.begin() as connection:
            self.bulk_holding_flow_key(connection, batch)
            return copy_batch(connection, self.message, batch)

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        if connection.dialect.driver != "psycopg2":  # COPY is written for psycopg2's copy_expert
            return super().insert_batch(connection, batch)
        return copy_batch(connection, self.message, batch)

    def insert_unseen(self, connection: sa.Connection, batch: Batch) -> int:
        if connection.dialect.driver != "psycopg2":  # COPY is written for psycopg2's copy_expert
            return super().insert_unseen(connection, batch)
        # The archive check is part of the INSERT, so the flow key is held whether or not a row
        # goes in: it must be before the first one does.
        self.bulk_holding_flow_key(connection, batch)
        if self._unseen is None:
            self._unseen = UnseenStatements(self.message, self.tables.archive)
        inserted = copy_unseen(connection, self._unseen, batch)
        if not inserted:
            return 0
        return len(inserted) - self.drop_archived(connection, inserted, self._unseen.archived(connection, batch))

    # -- wake-ups -------------------------------------------------------------------------------------
    def notify(self) -> None:
        with self.single_statement() as connection:
            connection.execute(sa.select(sa.func.pg_notify(notify_channel(self.tables.prefix), "")))

    def waker(self, ready: Callable[[], bool], interval: float, due_interval: float, listen_url: str | None) -> Waker:
        if not self._on_psycopg2:
            return super().waker(ready, interval, due_interval, None)
        polling = PollingWaker(ready, due_interval)  # for jobs coming due, which make no commit
        if listen_url is None and refuses_options(self.engine):
            # A pooler in transaction mode would run LISTEN on a server connection that other
            # clients then share: they would get the notifications (PgBouncer logs each one it
            # cannot deliver), the supervisor none. In session mode LISTEN would work: that is
            # for the user to say.
            logger.warning(
                "the database URL goes through a pooler (it refuses connection options): the "
                "supervisor does not LISTEN there, and looks for new jobs every %s s instead. Give "
                "listen_database_url (--listen-database-url): a direct connection to the database, "
                "or this URL if the pooler runs in session mode",
                due_interval,
            )
            return polling
        return Wakers(ListeningWaker(self, listen_url, ready), polling)
