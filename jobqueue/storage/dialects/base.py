"""The driver interface: one method per queue operation, each run whole by the dialect.

``acquire``, ``flush``, ``enqueue_one``, ``bulk``, ``renew``, ``release``, ``fire_schedule`` and
``notify`` each run their own transaction (or prepared statement, or COPY) the way their database
does it best; ``insert_*`` run inside a transaction the caller gives (an enqueue in the
application's own). Each dialect also says how a supervisor hears of new work for its idle
processes (``waker``) and what its driver's errors mean (``classify``, ``missing_table``). Only
``storage/dialects`` knows which database it is on; here is what most databases do the same way.
Statements are built once per dialect with named bind parameters, so SQLAlchemy's compiled cache
serves every later call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.job import Message, MessageState, Outcome, OutcomeKind
from jobqueue.storage.dialects.common import (
    ACQUIRED_COLUMNS,
    PROCESSING,
    READY_LITERALS,
    AcquireParams,
    LeaseClock,
    WorkerState,
    counted,
    delivery_order,
    first_of_partition,
    readable_times,
)
from jobqueue.storage.dialects.due import DueCheck
from jobqueue.storage.dialects.flow import FlowAcquired, FlowAcquirer
from jobqueue.storage.dialects.inserts import Inserts
from jobqueue.storage.dialects.wakeup import PollingWaker, Waker
from jobqueue.storage.outcomes import RELEASED, REQUEUED, archive_row, requeue_binds
from jobqueue.storage.tables import Tables, Timestamp


class Dialect(Inserts):
    """One database's way of running the queue. Subclasses override what theirs does differently."""

    name = "generic"
    # Where an operator finds the session that holds a lock everyone waits for.
    lock_holder_hint = "find the session that holds it"
    # Whether the flow acquire may lock keys in the statement that finds them. Not where a sorted
    # SELECT ... FOR UPDATE locks every row it reads before LIMIT applies (MariaDB): one worker's
    # fetch would lock every key with work, and the others would find none.
    lock_flow_keys_as_found = True
    # Whether the distinct keys of an index are best read by GROUP BY, which skips from one key to
    # the next (MariaDB's loose index scan), rather than by a recursive query that probes the index
    # once per key (MariaDB's correlated probe in one walked the index from its start instead).
    distinct_keys_by_group = False
    # A plain SELECT in a caller's transaction reads the snapshot of its first read (REPEATABLE
    # READ, MySQL's and MariaDB's default), where a locking read sees what has committed since.
    snapshot_reads = False
    # Whether lease times come from this host's clock (bound by the caller) rather than the
    # server's. True only where the server is this host (SQLite).
    client_clock = True
    # The index that holds the ready jobs without a flow key in delivery order, for any queue.
    unkeyed_index = "ready"
    # Whether insert_messages writes one row with a single statement, which needs no transaction
    # around it (an enqueue through a connection that commits each statement on its own).
    one_statement_insert = True

    def __init__(self, engine: sa.Engine, tables: Tables) -> None:
        super().__init__(engine)
        self.tables = tables
        self.message = tables.message
        self._acquire_cache: dict[tuple[str, bool], Any] = {}
        self._flow_cache: dict[str, FlowAcquirer] = {}
        self.due_check = DueCheck(self)
        self._take: Any = None
        m = self.message
        self.returned = [m.c[name] for name in ACQUIRED_COLUMNS]
        # ids and tokens as two plain IN lists: one primary-key scan. A tuple IN of (id, token)
        # pairs makes PostgreSQL plan one index probe per pair. The exact pairs are checked after.
        self.delete_ids = sa.delete(m).where(m.c.id.in_(sa.bindparam("ids", expanding=True)))
        requeued: dict[str, Any] = {}
        for field in REQUEUED:
            bind = sa.bindparam(f"b_{field.column}", type_=m.c[field.column].type)
            requeued[field.column] = sa.func.coalesce(bind, m.c[field.column]) if field.keep_if_null else bind
        self.requeue = sa.update(m).where(m.c.id == sa.bindparam("b_id")).values(**requeued, **RELEASED)
        self.lock_held_stmt = (
            sa.select(m.c.id, m.c.lease_token)
            .where(
                m.c.id.in_(sa.bindparam("ids", expanding=True)),
                m.c.lease_token.in_(sa.bindparam("tokens", expanding=True)),
                m.c.state == PROCESSING,
            )
            .with_for_update()
        )

    # -- schema and server ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def schema_lock(self, connection: sa.Connection) -> Iterator[None]:
        """Held while `db init` creates or upgrades the tables, so that several at once (every
        container running it as it starts) take turns, each seeing what the one before did.
        SQLite needs none: its transaction already holds the database's one write lock."""
        yield

    def never_due(self, column: Any) -> Any:
        """A condition true where ``column`` holds what no due time compares after and no worker can
        read (edited in by hand); None where the column holds only readable times."""
        return None

    def as_stored(self, column: Any) -> Any:
        """``column`` as the database stores it, for a message about a value no type reads."""
        return sa.cast(column, sa.Text)

    def after_create(self, connection: sa.Connection) -> list[str]:
        """DDL beyond the tables that `db init` (re)applies: nothing by default. Returns what it
        had to make ("trigger x"): nothing when all was in place."""
        return []

    def lacks_beyond_tables(self, connection: sa.Connection) -> list[str]:
        """What of :meth:`after_create`'s making the database lacks ("trigger x"), for `db check`."""
        return []

    def after_drop(self, connection: sa.Connection) -> None:
        """Drop what :meth:`after_create` made that dropping the tables leaves behind."""

    def check_server(self, connection: sa.Connection) -> None:
        """Raise ConfigurationError if the server is too old for jobqueue's statements."""

    def check_workable(self) -> None:
        """Before a worker starts: raise ConfigurationError, naming the cause and the fix, where it
        could never do its work (a database this process may not write, a statement time limit
        shorter than any statement); nothing by default. Errors reaching the server are left to
        the checks that follow, which wait out an outage."""

    @contextlib.contextmanager
    def brief_lock_waits(self, connection: sa.Connection) -> Iterator[None]:
        """In a transaction that takes a lock everyone else shares (a schema change's, a consumer
        group being added): wait at most a moment for it, while another session's long
        transaction holds it. Every later statement that wants the lock queues behind one that
        waits, so a long wait would hold up every enqueue or publish; a short one is tried again
        instead. Nothing by default (SQLite's writers take turns anyway)."""
        yield

    def connection_limit(self, connection: sa.Connection) -> tuple[int, str] | None:
        """The most connections this login may hold at once, if the server limits it (per user or
        per database), and the statement that raises that limit to ``{needed}``; None: no limit
        of its own (the server's max_connections is shared with everyone else)."""
        return None

    def unwritable(self, exc: sa.exc.DBAPIError) -> str | None:
        """If ``exc`` says that this process may not write the database (or that the file is none, or
        damaged): which file, and the fix."""
        return None

    @staticmethod
    def _require(version: Sequence[Any] | None, minimum: tuple[int, ...], what: str) -> None:
        numbers = tuple(v for v in (version or ()) if isinstance(v, int))
        if numbers and numbers < minimum:
            shown = ".".join(map(str, numbers))
            raise ConfigurationError(
                f"{what} {shown} is too old: jobqueue needs {'.'.join(map(str, minimum))} "
                "or newer (for SKIP LOCKED and RETURNING)"
            )

    def repair_ids(self, connection: sa.Connection) -> int:
        """Give fresh ids to waiting messages whose ids an archived job has; how many (a worker's start).

        Only where the id counter can go back (MySQL's AUTO_INCREMENT after a TRUNCATE).
        """
        return 0

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

    # -- acquire ------------------------------------------------------------------------------------
    def acquire(self, params: AcquireParams) -> list[Message]:
        """Mark up to ``params.limit`` ready messages PROCESSING for this worker and return them."""
        with self.engine.begin() as connection:
            return self.acquire_on(connection, params)

    def acquire_on(self, connection: sa.Connection, params: AcquireParams) -> list[Message]:
        rows = [
            readable_times(Message(*row))
            for row in connection.execute(self.acquire_statement(params), params.binds()).all()
        ]
        # RETURNING gives no order guarantee: restore delivery order.
        rows.sort(key=delivery_order)
        return rows

    def acquire_statement(self, params: AcquireParams) -> Any:
        stmt = self._acquire_cache.get(params.statement)
        if stmt is None:
            stmt = self._acquire_cache[params.statement] = self.build_acquire(*params.statement)
        return stmt

    def build_acquire(self, queues: str, levelled: bool = False) -> Any:
        """The acquire statement for a worker serving "all" queues, "one" or "many"; ``levelled``:
        of one priority only (bind ``level``)."""
        raise NotImplementedError

    def ready_select(
        self, columns: Sequence[Any], filtered: bool, one: bool = False, levelled: bool = False
    ) -> sa.Select[Any]:
        """Ready messages in delivery order: higher priority first, then due time, then id.
        ``levelled``: of the priority ``level`` only, a walk that ends at the first one not due."""
        m = self.message
        stmt = sa.select(*columns).where(
            m.c.state.in_(READY_LITERALS),
            m.c.flow_key.is_(None),  # those with a flow key are acquired key by key (acquire_flow)
            m.c.next_attempt_at <= sa.bindparam("now", type_=Timestamp),
            first_of_partition(m),
        )
        if levelled:
            stmt = stmt.where(m.c.priority == sa.bindparam("level", type_=sa.Integer))
        if filtered:
            stmt = stmt.where(self.queue_filter(one))
        return stmt.order_by(m.c.priority.desc(), m.c.next_attempt_at, m.c.id).limit(sa.bindparam("limit"))

    def acquire_flow(self, params: AcquireParams) -> FlowAcquired:
        """Acquire up to ``params.limit`` messages that have a flow key, within their keys' limits."""
        # Most fetches find no key with work (most jobs have none): they say so in one statement
        # that locks nothing. (With a rate, the fetch also says when a held-back key may start.)
        if not params.rated and not self.flow_has_work(params):
            return FlowAcquired()
        with self.engine.begin() as connection:
            return self.flow_acquirer(params.shape).run(connection, params, self.take)

    def flow_has_work(self, params: AcquireParams) -> bool:
        """Whether any flow key has work it may start now, read outside a transaction."""
        with self.probing() as connection:
            return connection.execute(self.flow_acquirer(params.shape).any_keys, params.binds()).first() is not None

    def warm_up(self, params: AcquireParams) -> None:
        """Build and compile what fetches of ``params.shape`` use, reading nothing but whether a
        flow key has work. A supervisor calls it before it forks its worker processes, which then
        share the result instead of each building its own (a tenth of a second or more of CPU
        each, when a worker of many processes starts)."""
        self.flow_has_work(params)
        self.close_spare_autocommit()  # the supervisor's: its processes open their own

    def flow_acquirer(self, shape: str) -> FlowAcquirer:
        """The statements of acquire_flow for a worker serving "all" queues, "one" or "many"."""
        acquirer = self._flow_cache.get(shape)
        if acquirer is None:
            acquirer = self._flow_cache[shape] = FlowAcquirer(self, shape)
        return acquirer

    def lateral_candidates(self, acquirer: FlowAcquirer) -> Any:
        """The flow candidates of every key in one statement that takes the keys as arrays (bind
        ``partition_keys``, ``other_keys``, ``share`` and ``partition_share``, one more than the
        share), or None to read them with one part per key."""
        return None

    def per_key_candidates(self, acquirer: FlowAcquirer) -> Callable[..., dict[str, list[Any]]] | None:
        """A function reading the flow candidates key by key, as FlowAcquirer.read_candidates
        does (same arguments and result), or None to read them in one statement."""
        return None

    def take_over_checkpoints(self) -> bool:
        """From now on this process writes the database's journal back (:meth:`checkpoint`) for
        the connections it and its forks open, where the database leaves that to whichever
        commit comes at the wrong moment (SQLite); False where there is nothing to take over."""
        return False

    def checkpoint(self) -> None:
        """Write the journal back into the database (after :meth:`take_over_checkpoints`)."""

    def partition_runs(self, acquirer: FlowAcquirer) -> Any:
        """A statement that takes the runs of locked partition keys at once (see
        :meth:`take_runs`), or None to read their candidates and choose in Python."""
        return None

    def take_runs(self, connection: sa.Connection, runs: Any, binds: dict[str, Any]) -> list[Message]:
        """Take with ``runs`` (from :meth:`partition_runs`): bind ``partition_keys``, ``share``,
        ``partition_share`` (one more), ``limit`` and ``served`` besides the acquire's binds."""
        raise NotImplementedError

    def take(self, connection: sa.Connection, ids: list[int], params: AcquireParams) -> list[Message]:
        """Mark the ready messages ``ids`` acquired, as ``acquire`` does, and return them."""
        messages = [
            self.read_taken(row) for row in connection.execute(self.take_statement(), {**params.binds(), "ids": ids})
        ]
        messages.sort(key=delivery_order)
        return messages

    def take_statement(self) -> Any:
        if self._take is None:
            m = self.message
            self._take = (
                sa.update(m)
                .where(self.id_in_list(), m.c.state.in_(READY_LITERALS))
                .values(self.acquired_values())
                .returning(*self.taken_columns())
            )
        return self._take

    def id_in_list(self) -> Any:
        """The condition "id is one of the list bound as ``ids``"."""
        return self.message.c.id.in_(sa.bindparam("ids", expanding=True))

    def taken_columns(self) -> list[Any]:
        return self.returned

    def read_taken(self, row: Any) -> Message:
        return readable_times(Message(*row))

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
            "attempts_count": counted(m.c.attempts_count),
            "deliveries_count": counted(m.c.deliveries_count),
            "lease_token": sa.bindparam("token", type_=sa.BigInteger),
            "worker_id": sa.bindparam("worker_id", type_=sa.String),
            "acquired_at": now,
            "lease_expires_at": self.clock_plus() if until is None else until,
            "first_attempt_at": sa.func.coalesce(m.c.first_attempt_at, now),
            "last_attempt_at": now,
        }

    # -- outcomes -----------------------------------------------------------------------------------
    def flush(self, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
        """Apply outcomes in one transaction; return the (id, token) pairs whose delivery still held
        its message (the others lost their lease and are dropped: the fence)."""
        with self.engine.begin() as connection:
            return self.apply_outcomes(connection, outcomes, now)

    def lock_held(self, connection: sa.Connection, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
        """Lock and return those ``(id, lease_token)`` pairs whose message is still PROCESSING under that token."""
        if not pairs:
            return set()
        wanted = set(pairs)
        binds = {"ids": sorted({p[0] for p in pairs}), "tokens": sorted({p[1] for p in pairs})}
        return {(row[0], row[1]) for row in connection.execute(self.lock_held_stmt, binds)} & wanted

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome], now: datetime) -> set[tuple[int, int]]:
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
        updates = [requeue_binds(o, now) for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        if updates:
            connection.execute(self.requeue, updates)
        return held

    def check_checkpoint(self, connection: sa.Connection, checkpoint: bytes | None) -> None:
        """Raise SerializationError, before anything is sent, for a checkpoint this database would
        refuse without naming the reason (MySQL drops the connection); the others take any size."""

    # -- leases -------------------------------------------------------------------------------------
    def renew(self, workers: list[WorkerState], lease: LeaseClock) -> int:
        """Renew these worker processes' rows (with what each is doing) and the leases of every
        message they hold, in one transaction; return how many leases moved. A lease only ever
        moves forward."""
        w = self.tables.worker
        stmt = (
            sa.update(w)
            .where(w.c.id == sa.bindparam("w_id"))
            .values(
                heartbeat_at=self.clock(),
                running_job_id=sa.bindparam("w_job"),
                running_since=sa.bindparam("w_since", type_=Timestamp),
                jobs_done=sa.bindparam("w_done"),
            )
        )
        clock = lease.binds()
        with self.engine.begin() as connection:
            renewed = self.renew_leases(connection, [worker.id for worker in workers], lease)
            connection.execute(
                stmt,
                [
                    {
                        **clock,
                        "w_id": worker.id,
                        "w_job": worker.running_job_id,
                        "w_since": worker.running_since,
                        "w_done": worker.jobs_done,
                    }
                    for worker in workers
                ],
            )
        return renewed

    def renew_leases(self, connection: sa.Connection, worker_ids: list[str], lease: LeaseClock) -> int:
        m = self.message
        stmt = sa.update(m).where(*self.renewable(worker_ids)).values(lease_expires_at=self.clock_plus())
        return int(connection.execute(stmt, lease.binds()).rowcount)

    def renewable(self, worker_ids: list[str]) -> list[Any]:
        m = self.message
        return [m.c.worker_id.in_(worker_ids), m.c.state == PROCESSING, m.c.lease_expires_at < self.clock_plus()]

    def release(
        self, conditions: list[Any], attempts: Any = None, deliveries: Any = None, binds: dict[str, Any] | None = None
    ) -> int:
        """Return PROCESSING messages matching ``conditions`` to PENDING, subtracting ``attempts`` and
        ``deliveries`` (SQL expressions worth 0 or 1 per row) from their counters."""
        m = self.message
        values: dict[Any, Any] = {}
        if attempts is not None:
            # A job whose only attempt is taken back never had one: its first attempt is still to
            # come (a retry strategy's max_total_delay_seconds counts from it). Set first: MySQL
            # reads the columns a statement already set with their new values.
            values[m.c.first_attempt_at] = sa.case(
                (m.c.attempts_count - attempts <= 0, sa.null()), else_=m.c.first_attempt_at
            )
            values[m.c.attempts_count] = m.c.attempts_count - attempts
        if deliveries is not None:
            values[m.c.deliveries_count] = m.c.deliveries_count - deliveries
        values.update({m.c.state: MessageState.PENDING.value, **{m.c[name]: v for name, v in RELEASED.items()}})
        stmt = sa.update(m).where(m.c.state == PROCESSING, *conditions).ordered_values(*values.items())
        with self.engine.begin() as connection:
            return int(connection.execute(stmt, binds or {}).rowcount)

    # -- schedules ----------------------------------------------------------------------------------
    def fire_schedule(self, message: Message, job: dict[str, Any], next_fire: datetime, state: bytes) -> bool:
        """Enqueue ``job`` and defer the schedule message to ``next_fire``, in one transaction.

        Fenced like every outcome: nothing happens unless this delivery still holds the message. The
        job's unique key (schedule name and fire time) makes a second job for the same fire impossible
        while the first is active; a job with a flow key holds its key's row, as any enqueue does.
        """
        m = self.message
        held = sa.and_(m.c.id == message.id, m.c.lease_token == message.lease_token, m.c.state == PROCESSING)
        with self.engine.begin() as connection:
            if not self.lock_held(connection, [(message.id, message.lease_token)]):
                return False
            if job.get("flow_key") is not None:
                self.hold_flow_keys(connection, {job["flow_key"]}, utcnow())
            self.insert_or_existing(connection, job)
            connection.execute(
                sa.update(m)
                .where(held)
                .values(
                    state=MessageState.PENDING.value,
                    next_attempt_at=next_fire,
                    deliveries_count=0,
                    checkpoint=state,
                    **RELEASED,
                )
            )
        return True

    # -- wake-ups -----------------------------------------------------------------------------------
    def notify(self) -> None:
        """Wake idle workers everywhere now, where the database can (PostgreSQL); else nothing:
        their supervisors poll."""

    def waker(self, ready: Callable[[], bool], interval: float, due_interval: float, listen_url: str | None) -> Waker:
        """The supervisor's: ``ready()`` (one indexed query, which finds delayed jobs come due as
        well as new ones) every ``interval`` while processes idle. ``listen_url`` is PostgreSQL's
        (checked by storage.engine.check_listen_url)."""
        return PollingWaker(ready, min(interval, due_interval))
