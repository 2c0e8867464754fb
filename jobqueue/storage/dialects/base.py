"""What every database does the same way; the subclasses hold each database's own statements.

Only ``storage/dialects`` knows which database it is on. The statements are built once per dialect
with named bind parameters, so SQLAlchemy's compiled cache serves every later call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Sequence

import sqlalchemy as sa

from jobqueue.errors import ConfigurationError
from jobqueue.job import READY_STATES, Batch, Message, Outcome, OutcomeKind
from jobqueue.storage.outcomes import RELEASED, archive_row, requeue_binds
from jobqueue.storage.tables import Tables, Timestamp

# Literal states (not bind parameters) so that PostgreSQL and SQLite can prove a query matches the
# partial indexes' predicates at planning time.
READY_LITERALS: list[sa.ColumnClause[Any]] = [sa.literal_column(f"'{state}'") for state in READY_STATES]
PROCESSING: sa.ColumnClause[Any] = sa.literal_column("'PROCESSING'")

# The columns a worker needs from an acquired message, in the order of Message's fields.
ACQUIRED_COLUMNS = (
    "id", "task_name", "queue", "priority", "payload", "headers", "attempts_count", "deliveries_count",
    "lease_token", "created_at", "first_attempt_at", "next_attempt_at", "acquired_at", "unique_key",
    "partition_key", "checkpoint", "options", "history",
)


# The columns every row of a bulk batch shares (all the enqueued columns but payload and unique_key),
# in the order the driver-level bulk paths send them.
SHARED_COLUMNS = ("task_name", "queue", "priority", "state", "headers", "partition_key", "options",
                  "attempts_count", "deliveries_count", "created_at", "next_attempt_at")


def json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class LeaseClock:
    """The binds of a statement that reads the lease clock: :meth:`Dialect.clock` and ``clock_plus``.

    ``now`` pins the clock (tests); None reads the database server's clock where the dialect can.
    ``seconds`` is the offset ``clock_plus`` adds (a lease, or minus a staleness limit).
    """

    now: datetime | None
    seconds: float

    def binds(self) -> dict[str, Any]:
        return {"lease_now": self.now, "lease_us": int(self.seconds * 1_000_000),
                "lease_until": None if self.now is None else self.now + timedelta(seconds=self.seconds)}


@dataclass(frozen=True)
class AcquireParams:
    worker_id: str
    token: int
    queues: tuple[str, ...] | None
    limit: int
    now: datetime  # what is due: messages whose next_attempt_at is not after it
    lease: LeaseClock

    def binds(self) -> dict[str, Any]:
        binds: dict[str, Any] = {"now": self.now, "limit": self.limit, "token": self.token,
                                 "worker_id": self.worker_id, **self.lease.binds()}
        if self.queues:
            binds["queues"] = list(self.queues)
            binds["queue"] = self.queues[0]
        return binds


class Dialect:
    """Statements for one database. Subclasses override what their database does differently."""

    name = "generic"
    # True when acquire / apply_outcomes are a single statement each, so they can run in autocommit:
    # one round trip, where BEGIN, the statement and COMMIT take three.
    one_statement_acquire = False
    one_statement_outcomes = False
    # Whether single statements run in autocommit (a network round trip saved); not on SQLite,
    # whose transactions cost no round trips and must begin IMMEDIATE.
    autocommit = True
    # Whether lease times come from this host's clock (bound by the caller) rather than the
    # server's. True only where the server is this host (SQLite).
    client_clock = True

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.message = tables.message
        self._acquire_cache: dict[str, Any] = {}
        m = self.message
        self.returned = [m.c[name] for name in ACQUIRED_COLUMNS]
        # ids and tokens as two plain IN lists: one primary-key scan. A tuple IN of (id, token)
        # pairs makes PostgreSQL plan one index probe per pair. The exact pairs are checked after.
        self.delete_ids = sa.delete(m).where(m.c.id.in_(sa.bindparam("ids", expanding=True)))
        self.requeue = sa.update(m).where(m.c.id == sa.bindparam("b_id")).values(
            state=sa.bindparam("b_state"),
            next_attempt_at=sa.bindparam("b_next", type_=Timestamp),
            attempts_count=sa.bindparam("b_attempts"),
            deliveries_count=sa.bindparam("b_deliveries"),
            checkpoint=sa.bindparam("b_checkpoint", type_=m.c.checkpoint.type),
            # A hand-back or deferral carries no error: keep the last one recorded.
            last_error_type=sa.func.coalesce(sa.bindparam("b_error_type", type_=sa.String), m.c.last_error_type),
            last_error_message=sa.func.coalesce(sa.bindparam("b_error_message", type_=sa.Text),
                                                m.c.last_error_message),
            last_error_traceback=sa.func.coalesce(sa.bindparam("b_error_traceback", type_=sa.Text),
                                                  m.c.last_error_traceback),
            **RELEASED,
        )
        self.lock_held_stmt = (
            sa.select(m.c.id, m.c.lease_token)
            .where(m.c.id.in_(sa.bindparam("ids", expanding=True)),
                   m.c.lease_token.in_(sa.bindparam("tokens", expanding=True)),
                   m.c.state == PROCESSING)
            .with_for_update()
        )

    # -- schema and notifications ----------------------------------------------------------------
    def after_create(self, connection: sa.Connection) -> None:
        """DDL beyond the tables that `db init` (re)applies: nothing by default."""

    def after_drop(self, connection: sa.Connection) -> None:
        """Drop what :meth:`after_create` made that dropping the tables leaves behind."""

    def notify_statement(self) -> Any:
        """A statement that wakes idle workers at once, or None where supervisors poll instead."""
        return None

    # -- server ------------------------------------------------------------------------------------
    def check_server(self, connection: sa.Connection) -> None:
        """Raise ConfigurationError if the server is too old for jobqueue's statements."""

    @staticmethod
    def _require(version: Sequence[Any] | None, minimum: tuple[int, ...], what: str) -> None:
        numbers = tuple(v for v in (version or ()) if isinstance(v, int))
        if numbers and numbers < minimum:
            shown = ".".join(map(str, numbers))
            raise ConfigurationError(f"{what} {shown} is too old: jobqueue needs {'.'.join(map(str, minimum))} "
                                     "or newer (for SKIP LOCKED and RETURNING)")

    # -- the lease clock ----------------------------------------------------------------------------
    # Lease times (acquired, expires, released, worker heartbeats) are read from the database
    # server's clock where there is one, so that hosts whose clocks disagree never release each
    # other's live leases. A bound ``lease_now`` pins the clock (tests).
    def clock(self) -> Any:
        """The lease clock's current time, as a SQL expression."""
        return sa.bindparam("lease_now", type_=Timestamp)

    def clock_plus(self) -> Any:
        """The lease clock's time plus ``lease_us`` microseconds, as a SQL expression."""
        return sa.bindparam("lease_until", type_=Timestamp)

    # -- acquire -----------------------------------------------------------------------------------
    def ready_select(self, columns: Sequence[Any], filtered: bool, one: bool = False) -> sa.Select[Any]:
        """Ready messages in delivery order: higher priority first, then due time, then id."""
        m = self.message
        stmt = sa.select(*columns).where(
            m.c.state.in_(READY_LITERALS),
            m.c.next_attempt_at <= sa.bindparam("now", type_=Timestamp),
        )
        if filtered:
            stmt = stmt.where(self.queue_filter(one))
        return stmt.order_by(m.c.priority.desc(), m.c.next_attempt_at, m.c.id).limit(sa.bindparam("limit"))

    def queue_filter(self, one: bool) -> Any:
        """The condition "in one of the worker's queues": bind ``queues`` (a list), or ``queue`` when ``one``."""
        return self.message.c.queue.in_(sa.bindparam("queues", expanding=True))

    def acquired_values(self, now: Any = None, until: Any = None) -> dict[str, Any]:
        """The SET clause of an acquisition: PROCESSING under a fresh lease token, leased from ``now``
        (default: the lease clock) to ``until`` (default: the clock plus the lease)."""
        m = self.message
        now = self.clock() if now is None else now
        return {
            "state": PROCESSING,
            "attempts_count": m.c.attempts_count + 1,
            "deliveries_count": m.c.deliveries_count + 1,
            "lease_token": sa.bindparam("token", type_=sa.BigInteger),
            "worker_id": sa.bindparam("worker_id", type_=sa.String),
            "acquired_at": now,
            "lease_expires_at": self.clock_plus() if until is None else until,
            "first_attempt_at": sa.func.coalesce(m.c.first_attempt_at, now),
            "last_attempt_at": now,
        }

    def acquire(self, connection: sa.Connection, params: AcquireParams) -> list[Message]:
        """Mark up to ``params.limit`` ready messages PROCESSING for this worker and return them."""
        queues = "all" if not params.queues else "one" if len(params.queues) == 1 else "many"
        stmt = self._acquire_cache.get(queues)
        if stmt is None:
            stmt = self._acquire_cache[queues] = self.build_acquire(queues)
        rows = [Message(*row) for row in connection.execute(stmt, params.binds()).all()]
        # RETURNING gives no order guarantee: restore delivery order.
        rows.sort(key=lambda r: (-r.priority, r.next_attempt_at, r.id))
        return rows

    def build_acquire(self, queues: str) -> Any:
        """The acquire statement for a worker serving "all" queues, "one" or "many"."""
        raise NotImplementedError

    # -- leases ------------------------------------------------------------------------------------
    def renew_leases(self, connection: sa.Connection, worker_ids: list[str], lease: LeaseClock) -> int:
        """Move the leases of these workers' messages forward to the clock plus the lease (never back)."""
        m = self.message
        stmt = sa.update(m).where(*self.renewable(worker_ids)).values(lease_expires_at=self.clock_plus())
        return int(connection.execute(stmt, lease.binds()).rowcount)

    def renewable(self, worker_ids: list[str]) -> list[Any]:
        m = self.message
        return [m.c.worker_id.in_(worker_ids), m.c.state == PROCESSING, m.c.lease_expires_at < self.clock_plus()]

    # -- outcomes ----------------------------------------------------------------------------------
    def lock_held(self, connection: sa.Connection, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
        """Lock and return those ``(id, lease_token)`` pairs whose message is still PROCESSING under that token.

        This is the fence: an outcome is applied only for the pairs returned here.
        """
        if not pairs:
            return set()
        wanted = set(pairs)
        binds = {"ids": sorted({p[0] for p in pairs}), "tokens": sorted({p[1] for p in pairs})}
        return {(row[0], row[1]) for row in connection.execute(self.lock_held_stmt, binds)} & wanted

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome],
                       now: datetime) -> set[tuple[int, int]]:
        """Apply outcomes whose delivery still holds its message; return those (id, token) pairs.

        COMPLETED and FAILED rows move to the archive (insert and delete in one transaction);
        the others are updated in place with one executemany.
        """
        held = self.lock_held(connection, [(o.message.id, o.message.lease_token) for o in outcomes])
        applied = [o for o in outcomes if (o.message.id, o.message.lease_token) in held]
        finals = [o for o in applied if o.kind is OutcomeKind.ARCHIVE]
        if finals:
            connection.execute(self.delete_ids, {"ids": [o.message.id for o in finals]})
            rows = [archive_row(o, now) for o in finals if o.retain]
            if rows:
                connection.execute(sa.insert(self.tables.archive), rows)
        updates = [requeue_binds(o) for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        if updates:
            connection.execute(self.requeue, updates)
        return held

    # -- enqueue -----------------------------------------------------------------------------------
    def insert_messages(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
        """Insert ``rows`` in one round trip per page and return their ids in input order."""
        m = self.message
        if len(rows) == 1:
            return [connection.execute(sa.insert(m).returning(m.c.id), rows[0]).scalar_one()]
        result = connection.execute(sa.insert(m).returning(m.c.id, sort_by_parameter_order=True), rows)
        return list(result.scalars())

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        """Insert a bulk batch of unkeyed rows in one round trip and return their ids in order.

        This generic version lets SQLAlchemy process every value of every row; the dialects
        override it with driver-level paths that format the columns the rows share once.
        """
        return self.insert_messages(connection, batch.rows())

    # -- the single-row hot path (delay() outside a transaction) --
    marker = "%s"  # the driver's parameter marker

    def format_value(self, column: str, value: Any) -> Any:
        """A column value as the driver takes it without SQLAlchemy's type processing."""
        return json_text(value) if column in ("headers", "options") else value

    def insert_one_sql(self) -> str:
        if self._insert_one_sql is None:
            values = "(" + ", ".join([self.marker] * (len(SHARED_COLUMNS) + 2)) + ")"
            self._insert_one_sql = self.batch_insert_sql(values, with_key=True) + self.returning_id
        return self._insert_one_sql

    def insert_one(self, cursor: Any, row: dict[str, Any]) -> int:
        """Insert one unkeyed row on a DB-API cursor with a precompiled statement; return its id.

        This is the path every ``delay()`` outside a transaction takes: it goes straight to the
        driver, without SQLAlchemy's per-statement machinery, which cost more client CPU than the
        insert itself. (Preparing it on PostgreSQL saved nothing measurable: its plan is trivial.)
        """
        params = (row["payload"], row["unique_key"],
                  *[self.format_value(column, row[column]) for column in SHARED_COLUMNS])
        cursor.execute(self.insert_one_sql(), params)
        return int(cursor.fetchone()[0] if self.returning_id else cursor.lastrowid)

    def repair_ids(self, connection: sa.Connection) -> int:
        """Give fresh ids to waiting messages whose ids an archived job has; how many (a worker's start).

        Only where the id counter can go back (MySQL's AUTO_INCREMENT after a TRUNCATE).
        """
        return 0

    # Whether acquire can run straight on the named DB-API driver (acquire_on_cursor).
    def acquires_on_driver(self, driver: str) -> bool:
        return False

    def acquire_on_cursor(self, cursor: Any, params: AcquireParams, info: dict[str, Any]) -> list[Message]:
        raise NotImplementedError

    _insert_one_sql: str | None = None
    returning_id = " RETURNING id"  # "" where the driver's lastrowid gives the id

    def batch_insert_sql(self, values: str, with_key: bool = False) -> str:
        """``INSERT INTO message (payload[, unique_key], SHARED_COLUMNS) VALUES <values>`` for exec_driver_sql."""
        key = ", unique_key" if with_key else ""
        return f"INSERT INTO {self.message.name} (payload{key}, {', '.join(SHARED_COLUMNS)}) VALUES {values}"

    # The dialect's INSERT with ON CONFLICT (PostgreSQL and SQLite share the syntax).
    insert_on_conflict: Any = None

    def insert_unique(self, connection: sa.Connection, row: dict[str, Any]) -> int | None:
        """Insert ``row`` unless an active message has its (task_name, unique_key); None if one has."""
        m = self.message
        stmt = (self.insert_on_conflict(m).values(row)
                .on_conflict_do_nothing(index_elements=[m.c.task_name, m.c.unique_key],
                                        index_where=m.c.unique_key.isnot(None))
                .returning(m.c.id))
        return connection.execute(stmt).scalar()

    def insert_new(self, connection: sa.Connection, rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
        """Insert keyed ``rows`` (all of one task), skipping those whose unique_key an active message
        holds; return the (id, unique_key) of the rows inserted. One round trip per page of rows."""
        m = self.message
        stmt = (self.insert_on_conflict(m)
                .on_conflict_do_nothing(index_elements=[m.c.task_name, m.c.unique_key],
                                        index_where=m.c.unique_key.isnot(None))
                .returning(m.c.id, m.c.unique_key))
        return [(row[0], row[1]) for row in connection.execute(stmt, rows)]
