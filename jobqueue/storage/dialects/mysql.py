"""MySQL 8 and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one short transaction.

Neither has UPDATE ... RETURNING, so the acquired values are applied to the selected rows in Python;
the rows are locked by then, so nothing else can change them in between. MariaDB 10.5+ has
INSERT ... RETURNING; MySQL 8 has not, and bulk inserts there read the ids from LAST_INSERT_ID().
"""

from __future__ import annotations

import contextlib
import os
import re
import weakref
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from jobqueue.errors import ConfigurationError, SchemaError
from jobqueue.job import Batch, Message, Outcome, OutcomeKind
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.dialects.common import (
    BATCH_COLUMNS,
    READY_LITERALS,
    AcquireParams,
    LeaseClock,
    count_up,
    delivery_order,
    readable_times,
)
from jobqueue.storage.dialects.connector import CANCELLED, CONTENTION, FULL, OUTAGE
from jobqueue.storage.dialects.mysql_ids import FreshIds
from jobqueue.storage.dialects.mysql_statements import (
    PacketLimit,
    connection_runner,
    cursor_runner,
    mysql_code,
    outcome_bytes,
)
from jobqueue.storage.engine import IDLE_IN_TRANSACTION_SECONDS, mask_url, unless_in_url
from jobqueue.storage.outcomes import ARCHIVED, ARCHIVED_COLUMNS, COPIED, archived_values, requeue_binds
from jobqueue.storage.tables import Timestamp

SCHEMA_LOCK_SECONDS = 600
MISSING_TABLE = 1146
UNKNOWN_COLUMN = 1054
# Error codes worth retrying: server gone or restarting, too many connections; lock wait timeout and
# deadlock. mysqlclient also reports permanent server errors (a packet too large, a bad value) as
# OperationalError, so the code decides, not the class.
MYSQL_DISCONNECTS = {1040, 1053, 1152, 1203, 1226, 1927, 2002, 2003, 2006, 2013, 2055, 4031}
MYSQL_DEADLOCK = 1213
MYSQL_CONTENTION = {1205, MYSQL_DEADLOCK}  # a lock wait timed out, a deadlock
# How long a schema change's step, or a group being added, waits for a lock before it is tried again.
BRIEF_LOCK_WAIT_SECONDS = 2
# How long any statement waits for a table's metadata lock (LOCK TABLES, a schema change) before it
# fails as contention, as on PostgreSQL (lock_timeout): the server's default is a year, so a command
# waited until its read timeout and said the connection was lost.
METADATA_LOCK_WAIT_SECONDS = 30
# The server refused to log in, and the fix. Once a worker runs these are an outage (a database
# being restored, a password being changed): its outcomes wait; no start gets past them.
LOGIN_REFUSALS = {
    1045: "fix the user name and password in the URL, or let the user log in from this host",
    1049: "create the database (CREATE DATABASE), or fix its name in the URL",
    1698: "this user logs in some other way (unix_socket): give the URL a user that logs in with a password",
}
# A statement the server's time limit stopped: MariaDB's max_statement_time (for every statement),
# MySQL's max_execution_time (for SELECTs). No outage; below MIN_STATEMENT_SECONDS a worker
# refuses to start, since even its quickest statements would be stopped.
STATEMENT_TIMEOUT = {1969, 3024}
MIN_STATEMENT_SECONDS = 0.1
ADVISED_STATEMENT_SECONDS = 60
MYSQL_FULL = {1021, 1114}  # disk full; the table is full (its table space at its limit)
# "Got error 28 from storage engine", "Error writing file ... (Errcode: 28 ...)": ENOSPC.
MYSQL_WRITE_ERRORS = {3, 1030}


class MySQLDialect(Dialect):
    name = "mysql"
    lock_holder_hint = "find it with SHOW PROCESSLIST (or information_schema.innodb_trx)"
    default_port = 3306
    where_am_i = "SELECT DATABASE(), @@hostname, @@port, @@datadir"
    lock_flow_keys_as_found = False  # a sorted SELECT ... FOR UPDATE locks every row it reads
    snapshot_reads = True
    # Without partial indexes, the ready index holds every row: a walk of it for jobs without a
    # key would read through a backlog of keyed ones. The flow keys' index leads with the key,
    # and jobs without one are its range of NULLs, in delivery order.
    unkeyed_index = "flow_ready"
    distinct_keys_by_group = True
    one_statement_insert = False  # a new row whose id an archived job has is moved to a fresh one

    @classmethod
    def engine_options(cls, url: sa.URL) -> tuple[sa.URL, dict[str, Any]]:
        url, options = super().engine_options(url)
        # READ COMMITTED: no gap locks, so SKIP LOCKED acquires never block enqueues.
        options["isolation_level"] = "READ COMMITTED"
        charset = url.query.get("charset")
        if charset is None:
            url = url.update_query_dict({"charset": "utf8mb4"})
        elif str(charset).lower() != "utf8mb4":
            # Text outside it (an emoji in a unique key or an error message) would be refused, or
            # stored as "?", or collide with the utf8mb4 columns' collation.
            raise ConfigurationError(
                f"{mask_url(url)} sets charset={charset}: jobqueue's tables hold text as utf8mb4; "
                "remove the charset parameter, or write charset=utf8mb4"
            )
        # A silent server is noticed instead of hanging a worker forever.
        options["connect_args"] = unless_in_url(url, {"connect_timeout": 10, "read_timeout": 60, "write_timeout": 60})
        return url, options

    @classmethod
    def configure(cls, engine: sa.Engine) -> None:
        @event.listens_for(engine, "connect")
        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            OPENED.add(dbapi_connection)  # for a forked child to cut itself off from (see below)
            info = getattr(dbapi_connection, "get_server_info", lambda: "")()
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET SESSION lock_wait_timeout = {METADATA_LOCK_WAIT_SECONDS}")
            if "MariaDB" in str(info):
                # A session left idle inside a transaction is ended (a frozen process); MySQL 8
                # has no such setting, and a frozen process holds its locks until it wakes.
                cursor.execute(f"SET SESSION idle_transaction_timeout = {IDLE_IN_TRANSACTION_SECONDS}")
            else:
                # MySQL 8 caches information_schema's AUTO_INCREMENT; the id check needs the live value.
                cursor.execute("SET SESSION information_schema_stats_expiry = 0")
            cursor.close()

    returning_id = ""  # MySQL 8 has no INSERT ... RETURNING; lastrowid gives the id

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        m = self.message
        self.packet = PacketLimit()
        self.ids = FreshIds(m.name, self.tables.archive.name)
        # The lease times are bound: acquire reads the server's clock with the rows it locks.
        self.mark_acquired = (
            sa.update(m)
            .where(m.c.id.in_(sa.bindparam("ids", expanding=True)))
            .values(
                self.acquired_values(
                    sa.bindparam("lease_now", type_=Timestamp), sa.bindparam("lease_until", type_=Timestamp)
                )
            )
        )

    @contextlib.contextmanager
    def schema_lock(self, connection: sa.Connection) -> Iterator[None]:
        # A named lock of the session (DDL commits as it goes, so no transaction can hold one),
        # per database and table prefix; names are at most 64 characters, so hashed.
        name = sa.func.sha1(sa.func.concat(sa.func.database(), ".", f"{self.tables.prefix}schema"))
        got = connection.execute(sa.select(sa.func.get_lock(name, SCHEMA_LOCK_SECONDS))).scalar()
        if got != 1:
            raise SchemaError(
                f"another `jobqueue db init` or upgrade of this database has held its lock for "
                f"{SCHEMA_LOCK_SECONDS} s; let it finish, then run this one again"
            )
        try:
            yield
            # Committed before the next holder looks: the version row (the DDL has committed
            # itself, as DDL always does on MySQL, so the transaction was not atomic anyway).
            connection.exec_driver_sql("COMMIT")
        except BaseException:
            # Interrupted (Ctrl-C) or failed: the session may be unusable now, and its end releases
            # the lock anyway; the error that stopped the work is the one to tell.
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                connection.execute(sa.select(sa.func.release_lock(name)))
            raise
        connection.execute(sa.select(sa.func.release_lock(name)))

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
        # After lock_held (SELECT ... FOR UPDATE), one INSERT ... SELECT copies the archive rows
        # from the message rows on the server (payloads never travel back), joined to the outcome
        # fields sent as a UNION ALL derived table, which MySQL and MariaDB both read.
        held = self.lock_held(connection, [(o.message.id, o.message.lease_token) for o in outcomes])
        applied = [o for o in outcomes if (o.message.id, o.message.lease_token) in held]
        finals = [o for o in applied if o.kind is OutcomeKind.ARCHIVE]
        kept = [o for o in finals if o.retain]
        requeued = [o for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        run = connection_runner(connection)
        for outcome in [*kept, *requeued]:  # what is sent
            self.packet.check_outcome(run, outcome)
        # Each statement stays under the server's max_allowed_packet: one over it is refused and
        # the server drops the connection (a flush of 22 results of 900 KB was one such statement).
        for chunk in self.packet.packets(run, kept, outcome_bytes):
            params: list[Any] = []
            for outcome in chunk:
                params.append(outcome.message.id)
                params.extend(archived_values(outcome, now))
            connection.exec_driver_sql(self._archive_copy_sql(len(chunk)), tuple(params))
        if finals:
            connection.execute(self.delete_ids, {"ids": [o.message.id for o in finals]})
        updates = [requeue_binds(o, now) for o in requeued]
        if updates:
            connection.execute(self.requeue, updates)
        return held

    def check_checkpoint(self, connection: sa.Connection, checkpoint: bytes | None) -> None:
        if checkpoint:
            self.packet.check_checkpoint(connection_runner(connection), checkpoint)

    def row_pages(self, connection: sa.Connection, rows: list[dict[str, Any]], most: int = 1000) -> Iterator[list[Any]]:
        run = connection_runner(connection)
        # Only topics page their rows: a published message's payload (its log row and deliveries).
        self.packet.check_payloads(run, [row["payload"] for row in rows], "the published message's payload takes")
        for packet in self.packet.packets(run, rows, lambda row: len(row["payload"])):
            for start in range(0, len(packet), most):
                yield packet[start : start + most]

    def _archive_copy_sql(self, rows: int) -> str:
        message, archive = self.message.name, self.tables.archive.name
        # A derived table's column of plain literals is text in the connection's character set,
        # which turns bytes that are not UTF-8 (a pickled result or checkpoint) into "?": binary
        # values are cast so that they reach the archive as they are.
        places = {field.column: "CAST(%s AS BINARY)" if field.kind == "bytes" else "%s" for field in ARCHIVED}
        first = "SELECT %s AS id, " + ", ".join(f"{places[column]} AS {column}" for column in ARCHIVED_COLUMNS)
        other = "SELECT %s, " + ", ".join(places[column] for column in ARCHIVED_COLUMNS)
        values = " UNION ALL ".join([first] + [other] * (rows - 1))
        copied = ", ".join(f"m.{column}" for column in COPIED)
        supplied = ", ".join(f"v.{column}" for column in ARCHIVED_COLUMNS)
        return (
            f"INSERT INTO {archive} ({', '.join(COPIED + ARCHIVED_COLUMNS)}) SELECT {copied}, {supplied} "
            f"FROM {message} m JOIN ({values}) v ON v.id = m.id"
        )

    client_clock = False

    def deadlocked(self, exc: sa.exc.DBAPIError) -> bool:
        return mysql_code(exc) == MYSQL_DEADLOCK

    def classify_driver_error(self, exc: sa.exc.DBAPIError) -> str | None:
        code = mysql_code(exc)
        if code in MYSQL_CONTENTION:
            return CONTENTION
        if code in STATEMENT_TIMEOUT:
            return CANCELLED
        if code in MYSQL_FULL or code in MYSQL_WRITE_ERRORS:
            text = str(exc.orig)
            if code in MYSQL_WRITE_ERRORS and not re.search(r"\b28\b", text):
                return None
            # An internal temporary table of one query that outgrew tmp_table_size is that
            # query's own limit, not a full database: retrying it would never succeed.
            return None if "#sql" in text else FULL
        return OUTAGE if code in MYSQL_DISCONNECTS or code in LOGIN_REFUSALS else None

    def login_refused(self, exc: BaseException) -> str | None:
        code = mysql_code(exc)
        return LOGIN_REFUSALS[code] if isinstance(exc, sa.exc.OperationalError) and code in LOGIN_REFUSALS else None

    @contextlib.contextmanager
    def brief_lock_waits(self, connection: sa.Connection) -> Iterator[None]:
        # A table's metadata lock (DDL) and a row's; the session's, so put back after as the
        # session had them (an init_command's, say), not to the server's defaults.
        before = connection.exec_driver_sql(
            "SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout"
        ).one()
        seconds = BRIEF_LOCK_WAIT_SECONDS
        connection.exec_driver_sql(f"SET SESSION lock_wait_timeout = {seconds}, innodb_lock_wait_timeout = {seconds}")
        try:
            yield
        finally:
            # The connection may be gone, or left unusable by an interrupt (and its session with it):
            # the error, or the KeyboardInterrupt, is the caller's to see.
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                connection.exec_driver_sql(
                    f"SET SESSION lock_wait_timeout = {int(before[0])}, innodb_lock_wait_timeout = {int(before[1])}"
                )

    def connection_limit(self, connection: sa.Connection) -> tuple[int, str] | None:
        # The session's value is the account's MAX_USER_CONNECTIONS where it has one.
        limit, user = connection.exec_driver_sql("SELECT @@max_user_connections, CURRENT_USER()").one()
        if not limit:
            return None
        name, _, host = str(user).rpartition("@")
        return int(limit), f"ALTER USER '{name}'@'{host}' WITH MAX_USER_CONNECTIONS {{needed}}"

    def explain(self, exc: BaseException) -> str | None:
        if mysql_code(exc) not in STATEMENT_TIMEOUT:
            return None
        seconds, user = self._statement_time()
        return self._statement_time_advice(seconds, user, "stopped it", running=True)

    def check_workable(self) -> None:
        try:
            seconds, user = self._statement_time()
        except sa.exc.DBAPIError as exc:
            if mysql_code(exc) in STATEMENT_TIMEOUT:  # so short that it stopped even this
                raise ConfigurationError(
                    self._statement_time_advice(None, None, "is too short for a worker", running=False)
                ) from None
            self.refuse_login(exc)  # a database or user that does not exist, a wrong password
            return  # MySQL (no such variable), or the server is down: what follows waits, or says why
        if 0 < seconds < MIN_STATEMENT_SECONDS:
            what = f"is too short for a worker (under {MIN_STATEMENT_SECONDS} s)"
            raise ConfigurationError(self._statement_time_advice(seconds, user, what, running=False))

    def _statement_time(self) -> tuple[float, str]:
        """MariaDB's max_statement_time on jobqueue's connections, in seconds, and the user."""
        with self.engine.connect() as connection:
            row = connection.exec_driver_sql("SELECT @@max_statement_time, CURRENT_USER()").one()
            connection.rollback()
        return float(row[0]), str(row[1])

    def _statement_time_advice(self, seconds: float | None, user: str | None, what: str, running: bool) -> str:
        setting = "the server's max_statement_time" + (f" of {seconds:g} s" if seconds is not None else "")
        account = user.replace("@", "'@'", 1) if user else "user'@'host"
        return (
            f"{setting} {what}; jobqueue's statements take milliseconds but may wait for a row lock up to "
            f"innodb_lock_wait_timeout: raise it to at least {ADVISED_STATEMENT_SECONDS} s (or 0, no limit) for "
            f"the user the workers log in as, ALTER USER '{account}' WITH MAX_STATEMENT_TIME "
            f"{ADVISED_STATEMENT_SECONDS}, or globally (SET GLOBAL max_statement_time)"
            + (", and restart the workers (a connection keeps the limit it started with)" if running else "")
        )

    def missing_table(self, exc: sa.exc.DBAPIError) -> bool:
        return mysql_code(exc) == MISSING_TABLE

    def missing_column(self, exc: sa.exc.DBAPIError) -> bool:
        return mysql_code(exc) == UNKNOWN_COLUMN

    def clock(self) -> Any:
        # Cast: COALESCE with a parameter comes back as text, which the driver would not parse.
        return sa.cast(
            sa.func.coalesce(sa.bindparam("lease_now", type_=Timestamp), sa.func.utc_timestamp(6)), Timestamp
        )

    def clock_plus(self) -> Any:
        return sa.func.timestampadd(
            sa.literal_column("MICROSECOND"),
            sa.bindparam("lease_us", type_=sa.BigInteger),
            self.clock(),
            type_=Timestamp,
        )

    def check_server(self, connection: sa.Connection) -> None:
        if getattr(connection.dialect, "is_mariadb", False):
            self._require(connection.dialect.server_version_info, (10, 6), "MariaDB")
        else:
            self._require(connection.dialect.server_version_info, (8, 0, 1), "MySQL")

    def build_acquire(self, queues: str, levelled: bool = False) -> Any:
        stmt = self.ready_select(
            [*self.returned, sa.func.utc_timestamp(6, type_=Timestamp)], queues != "all", levelled=levelled
        ).with_for_update(skip_locked=True)
        if queues == "many":
            # With queue IN (a, b) InnoDB would sort every ready row of those queues, locking each one
            # it reads before LIMIT applies, and concurrent workers would skip everything and take
            # turns. Walking the priority-ordered index and filtering on queue stops at LIMIT rows.
            stmt = stmt.with_hint(self.message, f"FORCE INDEX (ix_{self.tables.prefix}message_ready)")
        return stmt

    def renew_leases(self, connection: sa.Connection, worker_ids: list[str], lease: LeaseClock) -> int:
        # Skip rows a worker is flushing right now instead of waiting on them (see PostgreSQL).
        m = self.message
        binds = lease.binds()
        ids = list(
            connection.execute(
                sa.select(m.c.id).where(*self.renewable(worker_ids)).with_for_update(skip_locked=True), binds
            ).scalars()
        )
        if not ids:
            return 0
        stmt = sa.update(m).where(m.c.id.in_(ids)).values(lease_expires_at=self.clock_plus())
        return int(connection.execute(stmt, binds).rowcount)

    def acquire_on(self, connection: sa.Connection, params: AcquireParams) -> list[Message]:
        return self._mark(connection, self.acquire_statement(params), params.binds(), params)

    def insert_ignoring(self, table: sa.Table, key: list[Any]) -> Any:
        return sa.insert(table).prefix_with("IGNORE")

    def insert_unless_present(self, table: sa.Table, key: list[Any]) -> Any:
        # INSERT IGNORE would also turn a value too long into a warning and a cut value.
        from sqlalchemy.dialects.mysql import insert

        return insert(table).on_duplicate_key_update({key[0].name: key[0]})

    def take(self, connection: sa.Connection, ids: list[int], params: AcquireParams) -> list[Message]:
        m = self.message
        chosen = (
            sa.select(*self.returned, sa.func.utc_timestamp(6, type_=Timestamp))
            .where(m.c.id.in_(sa.bindparam("ids", expanding=True)), m.c.state.in_(READY_LITERALS))
            .with_for_update()
        )
        return self._mark(connection, chosen, {**params.binds(), "ids": ids}, params)

    def _mark(
        self, connection: sa.Connection, select: Any, binds: dict[str, Any], params: AcquireParams
    ) -> list[Message]:
        """Mark the rows ``select`` locks acquired; return them as RETURNING would have."""
        rows = connection.execute(select, binds).all()
        if not rows:
            return []
        # The server's time, read with the rows, is written as acquired_at and the lease's start.
        now = params.lease.now or rows[0][-1]
        messages = [readable_times(Message(*row[:-1])) for row in rows]
        messages.sort(key=delivery_order)
        binds.update(
            ids=[m.id for m in messages], lease_now=now, lease_until=now + timedelta(seconds=params.lease.seconds)
        )
        connection.execute(self.mark_acquired, binds)
        for m in messages:  # what the UPDATE just wrote, as RETURNING would have said
            m.attempts_count = count_up(m.attempts_count)
            m.deliveries_count = count_up(m.deliveries_count)
            m.lease_token = params.token
            m.acquired_at = now
            m.first_attempt_at = m.first_attempt_at or now
        return messages

    # -- fresh ids: a new job never gets the id of an archived one (see mysql_ids) ---------------------
    def fresh_ids(self, connection: sa.Connection, ids: list[int], floor: int | None = None) -> list[int]:
        return self.ids.checked(connection_runner(connection), ids, floor)

    def repair_ids(self, connection: sa.Connection) -> int:
        """Give fresh ids to waiting messages whose ids an archived job has (a worker's start)."""
        m, a = self.message, self.tables.archive
        floor = int(connection.exec_driver_sql(f"SELECT {self.ids.floor_sql}").scalar() or 0)
        ids = list(connection.execute(sa.select(m.c.id).join(a, a.c.id == m.c.id).where(m.c.id <= floor)).scalars())
        return len(self.ids.move(connection_runner(connection), ids, floor)) if ids else 0

    def insert_one(self, cursor: Any, row: dict[str, Any]) -> int:
        self.packet.check_payloads(cursor_runner(cursor), [row["payload"]])
        params = (
            row["payload"],
            row["unique_key"],
            *[self.format_value(column, row.get(column)) for column in BATCH_COLUMNS],
        )
        cursor.execute(self.insert_one_sql(), params)
        return self.ids.checked(cursor_runner(cursor), [int(cursor.lastrowid)])[0]

    def insert_messages(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        self.packet.check_payloads(connection_runner(connection), [row["payload"] for row in rows])
        if connection.dialect.insert_returning:  # MariaDB: INSERT ... RETURNING
            ids = super().insert_messages(connection, rows)
        else:
            ids = [int(connection.execute(sa.insert(self.message).values(row)).lastrowid) for row in rows]
        return self.fresh_ids(connection, ids)

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        # One multi-row INSERT whose ids are consecutive from lastrowid, unless
        # innodb_autoinc_lock_mode is 2 (interleaved). Built here rather than by mysqlclient's
        # executemany, which splits long batches into several statements. The values the rows
        # share are bound once, into session variables, so only the payloads are bound per row:
        # escaping every shared value again for each row took twice as long as the insert.
        if not self._consecutive_ids(connection):
            return super().insert_batch(connection, batch)
        # The same round trip reads the archive's largest id (see fresh ids).
        floor = connection.exec_driver_sql(
            "SELECT " + ", ".join(f"@jobqueue_{column} := %s" for column in BATCH_COLUMNS) + f", {self.ids.floor_sql}",
            tuple(self.format_value(column, batch.common.get(column)) for column in BATCH_COLUMNS),
        ).one()[-1]
        row = "(%s, " + ", ".join(f"@jobqueue_{column}" for column in BATCH_COLUMNS) + ")"
        payloads = list(batch.payloads)
        run = connection_runner(connection)
        self.packet.check_payloads(run, payloads)
        ids: list[int] = []
        for packet in self.packet.packets(run, payloads, len):
            first = connection.exec_driver_sql(
                self.batch_insert_sql(", ".join([row] * len(packet))), tuple(packet)
            ).lastrowid
            ids.extend(range(first, first + len(packet)))
        return self.fresh_ids(connection, ids, int(floor))

    def _consecutive_ids(self, connection: sa.Connection) -> bool:
        # A server setting that cannot change while the server runs: asked once per dialect object.
        if self._lock_mode is None:
            self._lock_mode = int(connection.exec_driver_sql("SELECT @@innodb_autoinc_lock_mode").scalar() or 0)
        return self._lock_mode < 2

    _lock_mode: int | None = None

    def insert_new(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
        # IGNORE skips the duplicate keys (it would turn other errors into warnings too, but every
        # value is checked before it gets here). MariaDB returns the inserted rows. MySQL has no
        # RETURNING: with consecutive auto-increment, the ids of one multi-row INSERT lie in
        # [LAST_INSERT_ID(), + len(rows)), skipped rows leaving gaps, and no other row can be there.
        inserted = self._insert_new(connection, rows)
        fresh = self.fresh_ids(connection, [job_id for job_id, _ in inserted])
        return [(job_id, key) for job_id, (_, key) in zip(fresh, inserted, strict=True)]

    def _insert_new(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
        self.packet.check_payloads(connection_runner(connection), [row["payload"] for row in rows])
        m = self.message
        insert = sa.insert(m).prefix_with("IGNORE")
        if connection.dialect.insert_returning:
            return [(row[0], row[1]) for row in connection.execute(insert.returning(m.c.id, m.c.unique_key), rows)]
        if not self._consecutive_ids(connection):
            raise ConfigurationError(
                "keyed bulk inserts on MySQL without RETURNING need innodb_autoinc_lock_mode "
                "0 or 1 (this server runs 2); use MariaDB, or enqueue keyed jobs one by one"
            )
        first = connection.execute(insert.values(rows)).lastrowid
        if not first:
            return []
        mine = sa.select(m.c.id, m.c.unique_key).where(
            m.c.id >= first, m.c.id < first + len(rows), m.c.task_name == rows[0]["task_name"]
        )
        return [(row[0], row[1]) for row in connection.execute(mine)]

    def holder_of_key(self, select: sa.Select[Any]) -> sa.Select[Any]:
        # A plain read in the caller's REPEATABLE READ transaction (SQLAlchemy's and Flask's default
        # on MySQL) sees its snapshot, older than the duplicate INSERT IGNORE met; a locking read
        # sees the latest row. (The insert share-locked that row's index entry already.)
        return select.with_for_update(read=True)

    def insert_unique(self, connection: sa.Connection, row: dict[str, Any]) -> int | None:
        # IGNORE reports a skipped duplicate as no row (ON DUPLICATE KEY UPDATE could not: with
        # CLIENT_FOUND_ROWS, which SQLAlchemy sets, a no-op update reports one row like an insert).
        self.packet.check_payloads(connection_runner(connection), [row["payload"]])
        result = connection.execute(sa.insert(self.message).prefix_with("IGNORE").values(row))
        return self.fresh_ids(connection, [int(result.lastrowid)])[0] if result.rowcount == 1 else None


# Every connection this process opened (and, in a forked child, those it inherited).
OPENED: weakref.WeakSet[Any] = weakref.WeakSet()


def _cut_off_inherited_connections() -> None:
    """In a forked child: point the socket of every connection inherited from the parent at
    /dev/null. mysqlclient sends COM_QUIT when it closes a connection (garbage collected, or as the
    child's interpreter exits), and down the socket the child shares with its parent that ended
    the parent's session: its next statement failed with "Lost connection to server during
    query". The child opens its own connections."""
    if not OPENED:
        return
    nowhere = os.open(os.devnull, os.O_RDWR)
    try:
        for connection in list(OPENED):
            try:
                os.dup2(nowhere, connection.fileno())
            except Exception:  # closed already
                continue
    finally:
        os.close(nowhere)
    OPENED.clear()


os.register_at_fork(after_in_child=_cut_off_inherited_connections)
