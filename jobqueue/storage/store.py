"""The queue's operations, written once: enqueue, acquire, flush outcomes, heartbeat, release.

Every outcome is fenced: it is applied only to a message still PROCESSING under the lease token of
the delivery that produced it (``Dialect.lock_held``), so a worker that lost its lease can never
complete, retry or archive a message someone else now holds. Transactions are short; none is held
while a job runs.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError, SchemaError
from jobqueue.flow import RATE_MEMORY_SECONDS, rate_horizon
from jobqueue.job import Batch, Message, MessageState, Outcome
from jobqueue.storage import flowkeys
from jobqueue.storage.dialects import dialect_for
from jobqueue.storage.dialects.common import (
    PROCESSING,
    AcquireParams,
    LeaseClock,
    WorkerState,
)
from jobqueue.storage.dialects.due import PRIORITY_LEVELS_PROBED
from jobqueue.storage.dialects.wakeup import Waker
from jobqueue.storage.engine import check_listen_url, database_kind, mask_url
from jobqueue.storage.tables import SCHEMA_VERSION, Tables, Timestamp


def new_lease_token() -> int:
    """A random positive 63-bit token; one per acquisition, so a stale delivery can never match."""
    return secrets.randbits(62) + 1


@dataclass
class FlushResult:
    applied: list[Outcome] = field(default_factory=list)
    lost: list[Outcome] = field(default_factory=list)


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


@contextmanager
def schema_errors(engine: sa.Engine, tables: Tables) -> Iterator[None]:
    """For code with an engine of its own (Spark executors): missing tables as a SchemaError."""
    with Store(engine, tables).schema_errors():
        yield


# A walk of the ready index that came back short and took longer than this read a backlog due
# later; acquires then go level by level for WALK_AGAIN_SECONDS (see Store._acquire_plain).
LEVELS_AFTER_SECONDS = 0.005
WALK_AGAIN_SECONDS = 600.0


class Store:
    """The queue's operations on one database, through its dialect (which runs them its own way)."""

    def __init__(self, engine: sa.Engine, tables: Tables, schema_command: str | None = None) -> None:
        self.engine = engine
        self.tables = tables
        # What a SchemaError tells to run, where the application manages the tables (Django's migrate).
        self.schema_command = schema_command
        self.dialect = dialect_for(engine, tables)
        self._flow_first = False
        # Until when (time.monotonic()) plain acquires go level by level (see _acquire_plain).
        self._by_level_until = 0.0
        self.flow_due_in: float | None = None

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
            return self.dialect.explain(exc) or self.dialect.login_refused(exc)
        except Exception:  # the explanation asks the server, which may not answer: the error says enough
            return None

    def check_workable(self) -> None:
        """Raise ConfigurationError, naming the cause and its fix, where a worker could never do
        its work: a login the server refuses (a database or user that does not exist, a wrong
        password), a SQLite file this process may not write, a statement time limit too short for
        any statement. A server that does not answer is no such case: the worker waits for it."""
        self.dialect.check_workable()

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
            unwritable = self.dialect.unwritable(exc)
            if unwritable:
                raise ConfigurationError(unwritable) from exc
            raise

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
                yield connection
            else:
                self._check_same_database(_session(connection).get_bind().dialect)  # before it connects
                yield _session_connection(connection)

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

    # -- enqueue -----------------------------------------------------------------------------------
    def enqueue(self, rows: list[dict[str, Any]], connection: Any = None, found: list[int] | None = None) -> list[int]:
        """Insert message rows and return their ids in input order.

        Rows with a ``unique_key`` return the id of the active message holding that key, if any;
        the indexes of those rows (nothing inserted for them) are appended to ``found``.
        """
        if connection is None and len(rows) == 1:
            row = rows[0]
            if row.get("unique_key") is None and row.get("flow_key") is None:
                # Every delay() outside a transaction: no context manager on the way (schema_errors'
                # and enqueue_errors' work, inlined), this path being a few microseconds of Python in all.
                try:
                    return [self.dialect.enqueue_one(row)]
                except sa.exc.DBAPIError as exc:
                    self._raise_if_missing_tables(exc)
                    unwritable = self.dialect.unwritable(exc)
                    if unwritable:
                        raise ConfigurationError(unwritable) from exc
                    raise
        with self.enqueue_errors():
            return self._enqueue(rows, connection, found)

    def _enqueue(self, rows: list[dict[str, Any]], connection: Any, found: list[int] | None) -> list[int]:
        flow_keys = {row["flow_key"] for row in rows if row.get("flow_key") is not None}
        ids: list[int] = [0] * len(rows)
        with self.writing(connection) as conn:
            if flow_keys:
                self.dialect.hold_flow_keys(conn, flow_keys, utcnow())
            plain = [i for i, row in enumerate(rows) if row.get("unique_key") is None]
            if plain:
                for i, new_id in zip(plain, self.dialect.insert_messages(conn, [rows[i] for i in plain]), strict=True):
                    ids[i] = new_id
            for i, row in enumerate(rows):
                if row.get("unique_key") is not None:
                    ids[i], inserted = self.dialect.insert_keyed(conn, row)
                    if not inserted and found is not None:
                        found.append(i)
        return ids

    def enqueue_batch(self, batch: Batch, connection: Any = None) -> list[int]:
        """Insert a batch (one round trip for its unkeyed rows) and return the ids in order."""
        with self.enqueue_errors(), self.writing(connection) as conn:
            return self._insert_batch(conn, batch)

    def _insert_batch(
        self, conn: sa.Connection, batch: Batch, found: list[int] | None = None, start: int = 0
    ) -> list[int]:
        ids: list[int] = [0] * len(batch)
        self.dialect.bulk_holding_flow_key(conn, batch)
        plain = [i for i, key in enumerate(batch.unique_keys) if key is None]
        if plain:
            for i, new_id in zip(plain, self.dialect.insert_batch(conn, batch.take(plain)), strict=True):
                ids[i] = new_id
        for i, key in enumerate(batch.unique_keys):
            if key is not None:
                ids[i], inserted = self.dialect.insert_keyed(conn, batch.row(i))
                if not inserted and found is not None:
                    found.append(start + i)
        return ids

    def enqueue_bulk(
        self, batch: Batch, batch_size: int, connection: Any = None, found: list[int] | None = None
    ) -> list[int]:
        """Insert a whole bulk() all or nothing, ``batch_size`` rows a round trip; ids in order.

        Outside the caller's transaction the dialect runs it in one of its own (PostgreSQL streams
        one COPY, serializing each payload as it is read); otherwise every payload is serialized
        first, so that a bad item writes nothing. The indexes of keyed rows that found an active
        job holding their key (and inserted nothing) are appended to ``found``.
        """
        if connection is None and not any(key is not None for key in batch.unique_keys):
            with self.enqueue_errors(), self.schema_errors():
                return self.dialect.bulk(batch, batch_size)
        payloads = list(batch.payloads)
        ids: list[int] = []
        with self.enqueue_errors(), self.writing(connection) as conn:
            for start in range(0, len(payloads), batch_size):
                end = start + batch_size
                part = Batch(batch.common, payloads[start:end], batch.unique_keys[start:end])
                ids.extend(self._insert_batch(conn, part, found, start))
        return ids

    def enqueue_new(self, batch: Batch) -> int:
        """Insert the rows of a keyed batch (one task) whose key no job holds, active or archived.

        For pipelines that run again: a key seen before, even that of a job long finished, adds
        nothing. Returns how many rows were inserted; a key repeated within the batch counts once
        (its first row goes in).
        """
        first: dict[str, int] = {}
        for index, key in enumerate(batch.unique_keys):
            if key is None:
                raise ConfigurationError(f"row {index} of a keyed batch has no unique_key")
            first.setdefault(key, index)
        with self.enqueue_errors(), self.writing() as conn:
            return self.dialect.insert_unseen(conn, batch.take(list(first.values())))

    # -- acquire and outcomes ------------------------------------------------------------------------
    def acquire(
        self,
        worker_id: str,
        queues: tuple[str, ...] | None,
        limit: int,
        lease_seconds: float,
        now: datetime | None = None,
        token: int | None = None,
        flow: bool = False,
        rated: bool = False,
    ) -> list[Message]:
        """Mark up to ``limit`` ready messages PROCESSING under a new lease token and return them.

        With ``flow``, messages that have a flow key are acquired too, within their keys' limits;
        with ``rated`` as well, ``flow_due_in`` says in how many seconds a key held back by its rate
        may start its next one. Flow and plain messages take turns to go first, so that neither
        kind starves the other.
        """
        params = AcquireParams(
            worker_id=worker_id,
            token=token or new_lease_token(),
            queues=queues,
            limit=limit,
            now=now or utcnow(),
            lease=self._lease_clock(lease_seconds, now),
            rated=rated,
        )
        with self.schema_errors():
            if not flow:
                return self._acquire_plain(params)
            self.flow_due_in = None
            self._flow_first = not self._flow_first
            if not self._flow_first:
                messages = self._acquire_plain(params)
                if len(messages) >= limit:
                    return messages
                params = dataclasses.replace(params, limit=limit - len(messages), now=now or utcnow())
            flowed = self.dialect.acquire_flow(params)
            self.flow_due_in = flowed.due_in
            if not self._flow_first:
                return messages + flowed.messages
            rest = limit - len(flowed.messages)
            if rest <= 0:
                return flowed.messages
            # What is due is read again: a job enqueued while the first acquire ran is due now, and
            # its notification may have come before this process listened.
            return flowed.messages + self._acquire_plain(dataclasses.replace(params, limit=rest, now=now or utcnow()))

    def _acquire_plain(self, params: AcquireParams) -> list[Message]:
        """Acquire messages without a flow key.

        One statement walks the ready index in delivery order, skipping what is not due yet, and
        stops at ``limit``: one round trip, cheap while enough is due. A walk that comes back
        short has read every ready job, and behind the due ones there may be a backlog due later
        (reminders for tomorrow, retries waiting an hour): a hundred thousand such jobs cost a walk
        about 10 ms on PostgreSQL and SQLite and 100 ms on MariaDB. When a short walk took longer
        than LEVELS_AFTER_SECONDS, acquires go level by level for a while: per priority present,
        highest first, a walk of that priority alone, which ends at its first job not due; a few
        indexed statements, however large the backlog. A full batch, or WALK_AGAIN_SECONDS, brings
        the single walk back.
        """
        now = time.monotonic()
        if now < self._by_level_until:
            messages = self._acquire_by_level(params)
            if len(messages) >= params.limit:
                self._by_level_until = 0.0
            return messages
        began = time.perf_counter()
        messages = self.dialect.acquire(params)
        if len(messages) < params.limit and time.perf_counter() - began > LEVELS_AFTER_SECONDS:
            self._by_level_until = now + WALK_AGAIN_SECONDS
        return messages

    def _acquire_by_level(self, params: AcquireParams) -> list[Message]:
        taken: list[Message] = []
        level = None
        for _ in range(PRIORITY_LEVELS_PROBED):
            with self.dialect.probing() as conn:
                level = self.dialect.due_check.next_level(conn, params.queues, level)
            if level is None:
                return taken
            taken += self.dialect.acquire(dataclasses.replace(params, limit=params.limit - len(taken), level=level))
            if len(taken) >= params.limit:
                return taken
        # Jobs over more priorities than that: one walk of them all for the rest.
        return taken + self.dialect.acquire(dataclasses.replace(params, limit=params.limit - len(taken)))

    def warm_up(self, queues: tuple[str, ...] | None) -> None:
        """Build and compile the statements a worker serving ``queues`` fetches and writes with (see
        the dialect's warm_up): in a supervisor, before it forks its worker processes."""
        params = AcquireParams(
            worker_id="", token=0, queues=queues, limit=1, now=utcnow(), lease=self._lease_clock(1.0, None)
        )
        with self.schema_errors():
            self.dialect.warm_up(params)

    def flush(self, outcomes: list[Outcome], now: datetime | None = None) -> FlushResult:
        """Apply outcomes in one transaction; those whose lease was lost are returned as ``lost``."""
        result = FlushResult()
        if not outcomes:
            return result
        applied = self.dialect.flush(outcomes, now or utcnow())
        for outcome in outcomes:
            key = (outcome.message.id, outcome.message.lease_token)
            (result.applied if key in applied else result.lost).append(outcome)
        return result

    def fire_schedule(self, message: Message, job: dict[str, Any], next_fire: datetime, state: bytes) -> bool:
        """Enqueue a schedule's ``job`` and defer its message to ``next_fire``, fenced (see the dialect)."""
        return self.dialect.fire_schedule(message, job, next_fire, state)

    def held_message(self, message_id: int, token: int) -> Message | None:
        """Load a message if it is still PROCESSING under ``token`` (for the supervisor's time limits)."""
        m = self.tables.message
        stmt = sa.select(*self.dialect.returned).where(
            m.c.id == message_id, m.c.lease_token == token, m.c.state == PROCESSING
        )
        with self.engine.begin() as conn:
            row = conn.execute(stmt).mappings().first()
        return Message(**row) if row is not None else None

    def archived_with(self, message_id: int, finished_at: datetime) -> bool:
        """True if the job is archived COMPLETED with exactly this ``finished_at`` (our own ack)."""
        a = self.tables.archive
        stmt = sa.select(a.c.id).where(
            a.c.id == message_id, a.c.state == MessageState.COMPLETED.value, a.c.finished_at == finished_at
        )
        with self.engine.begin() as conn:
            return conn.execute(stmt).first() is not None

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

    def database_now(self, connection: sa.Connection) -> datetime:
        """The lease clock's time: the database server's where the dialect reads it, else this host's."""
        now: datetime = connection.execute(
            sa.select(self.dialect.clock()), self._lease_clock(0, None).binds()
        ).scalar_one()
        return now

    def extend_lease(self, message_id: int, token: int, seconds: float, now: datetime | None = None) -> bool:
        """Make one delivery's lease last at least ``seconds`` more (never shorter); False if it was lost."""
        m = self.tables.message
        until = self.dialect.clock_plus()
        later = sa.case((m.c.lease_expires_at < until, until), else_=m.c.lease_expires_at)
        stmt = (
            sa.update(m)
            .where(m.c.id == message_id, m.c.lease_token == token, m.c.state == PROCESSING)
            .values(lease_expires_at=later)
        )
        with self.engine.begin() as conn:
            return conn.execute(stmt, self._lease_clock(seconds, now).binds()).rowcount == 1

    def save_checkpoint(self, message_id: int, token: int, checkpoint: bytes | None) -> bool:
        """Store a running delivery's checkpoint durably now; False if the lease was lost.

        Raises SerializationError, writing nothing, for a checkpoint too large for one statement
        (over MySQL's max_allowed_packet)."""
        m = self.tables.message
        stmt = (
            sa.update(m)
            .where(m.c.id == message_id, m.c.lease_token == token, m.c.state == PROCESSING)
            .values(checkpoint=checkpoint)
        )
        with self.engine.begin() as conn:
            self.dialect.check_checkpoint(conn, checkpoint)
            return conn.execute(stmt).rowcount == 1

    # -- leases ------------------------------------------------------------------------------------
    def heartbeat(
        self, workers: list[str] | list[WorkerState], lease_seconds: float, now: datetime | None = None
    ) -> int:
        """Renew the worker rows (with what each process is doing) and the leases of every message
        they hold; return leases renewed.

        Renewal only moves a lease forward, so a longer ``extend()`` is kept. Times come from the
        lease clock (the database server's), or ``now``.
        """
        if not workers:
            return 0
        states = [w if isinstance(w, WorkerState) else WorkerState(w) for w in workers]
        return self.dialect.renew(states, self._lease_clock(lease_seconds, now))

    def release_expired(self, now: datetime | None = None) -> int:
        """Return messages whose lease expired by the lease clock to PENDING (their delivery stays counted)."""
        m = self.tables.message
        return self.dialect.release(
            [m.c.lease_expires_at < self.dialect.clock()], binds=self._lease_clock(0, now).binds()
        )

    def release_worker(self, worker_id: str, running: int | None = None, finished: list[int] | None = None) -> int:
        """Return every message a dead worker process held to PENDING at once.

        Only the message it was ``running`` keeps its attempt and its delivery: it may have killed
        the process, and a poison message must reach max_deliveries. Messages it ``finished``
        without writing their outcomes keep their attempt (they ran) but not the delivery; the rest,
        never started, go back as if never fetched. So jobs that merely shared a process with a
        process-killing job are never failed for it. ``finished=None`` means the process lost count:
        everything but the running one is then treated as unstarted.
        """
        m = self.tables.message
        charged = sa.case((m.c.id == running, 0), else_=1) if running else sa.literal(1)
        ran = [running] if running else []
        ran += finished or []
        unstarted = sa.case((m.c.id.in_(ran), 0), else_=1) if ran else sa.literal(1)
        return self.dialect.release([m.c.worker_id == worker_id], attempts=unstarted, deliveries=charged)

    def release_unstarted(self, worker_id: str, tokens: list[int], started: list[int] | None) -> int:
        """Return a live process's unstarted messages of these batches (lease tokens), uncounted.

        ``started``: the ids it started, which stay; None when it lost count (nothing is released).
        """
        if not tokens or started is None:
            return 0
        m = self.tables.message
        conditions = [m.c.worker_id == worker_id, m.c.lease_token.in_(tokens)]
        if started:
            conditions.append(m.c.id.not_in(started))
        return self.dialect.release(conditions, attempts=sa.literal(1), deliveries=sa.literal(1))

    def release_token(self, token: int) -> int:
        """Undo an acquisition whose reply was lost (the connection dropped after COMMIT)."""
        m = self.tables.message
        return self.dialect.release([m.c.lease_token == token], attempts=sa.literal(1), deliveries=sa.literal(1))

    def forget_idle_flow_keys(self, idle_seconds: float, now: datetime | None = None, most: int = 1000) -> int:
        """Delete the flow rows of keys without jobs that were last served more than
        ``idle_seconds`` ago by the lease clock; a key's next job adds its row back. A key with a
        rate limit is kept until its last start is ``RATE_MEMORY_SECONDS`` old: forgetting it
        sooner would let its next jobs start at once. Rows an enqueue or an acquire holds are
        skipped."""
        f, m = self.tables.flow, self.tables.message
        idle = [
            f.c.served_at < sa.bindparam("quiet_before", type_=Timestamp),
            sa.or_(
                f.c.next_start_at.is_(None),
                f.c.next_start_at < sa.bindparam("rates_before", type_=Timestamp),
                f.c.next_start_at > sa.bindparam("rate_horizon", type_=Timestamp),  # no rate's: see rate_horizon
            ),
            ~sa.exists().where(m.c.flow_key == f.c.flow_key),
        ]
        found = sa.select(f.c.flow_key).where(*idle).order_by(f.c.served_at).limit(most)
        with self.writing() as conn:
            now = now or self.database_now(conn)
            binds = {
                "quiet_before": now - timedelta(seconds=idle_seconds),
                "rates_before": now - timedelta(seconds=max(idle_seconds, RATE_MEMORY_SECONDS)),
                "rate_horizon": rate_horizon(now),
            }
            keys = list(conn.execute(found.with_for_update(skip_locked=True), binds).scalars())
            if not keys:
                return 0
            # Checked again by a statement of its own: a job committed since the first one read
            # keeps its key (the rows are locked now, so no enqueue of them can be half done).
            gone = sa.delete(f).where(f.c.flow_key.in_(keys), *idle)
            return int(conn.execute(gone, binds).rowcount)

    def restore_missing_flow_keys(self, after: str | None = None, most: int = flowkeys.WALK_MOST) -> flowkeys.Restored:
        """Add back the flow rows that keys with jobs lack (deleted by hand): without its row, no
        worker acquires a key's jobs. Walks ``most`` keys at most, one index probe each, from the
        one after ``after``; the result says where the next call goes on."""
        return flowkeys.restore_missing(self, after, most)

    def has_work(self, queues: tuple[str, ...] | None, horizon: datetime) -> bool:
        """True while the queues hold a message PROCESSING or due before ``horizon`` (for --burst).

        A message its key holds back is not due: one behind the oldest job of its partition (which
        is not due either, or it would count), or one whose key's rate allows no start before
        ``horizon``. Counting them kept --burst running for as long as a partition's head waited to
        retry (an hour, say) or a "1/h" rate spaced the key's jobs.
        """
        with self.reading() as conn:  # four times a second: on indexes, like has_ready
            return self.dialect.due_check.work_until(conn, queues, horizon)

    def has_ready(self, queues: tuple[str, ...] | None, now: datetime) -> bool:
        """True if a message of these queues is due now, for idle polling: read on indexes, a few
        probes per priority level for jobs without a key and one per flow key for the others, so
        that a backlog of jobs due later is never walked (an idle supervisor asks every second)."""
        params = AcquireParams("", 0, queues, 1, now, self._lease_clock(0, None))
        with self.reading() as conn:  # the supervisor's own pool: no connection more for it
            return self.dialect.due_check.anything_due(conn, params)

    def notify(self) -> None:
        """Wake idle workers now (PostgreSQL: NOTIFY; elsewhere their supervisors poll anyway)."""
        self.dialect.notify()

    def waker(
        self, queues: tuple[str, ...] | None, interval: float, due_interval: float, listen_url: str | None = None
    ) -> Waker:
        """What tells a supervisor that work arrived for its idle processes (see storage.dialects.wakeup):
        news checked every ``interval``, due work every ``due_interval``; ``listen_url``, where
        PostgreSQL's LISTEN goes if not to the database URL."""
        check_listen_url(self.engine.url, listen_url)
        return self.dialect.waker(lambda: self.has_ready(queues, utcnow()), interval, due_interval, listen_url)

    # -- worker registry ---------------------------------------------------------------------------
    def register_worker(self, row: dict[str, Any]) -> None:
        with self.schema_errors(), self.engine.begin() as conn:
            conn.execute(sa.insert(self.tables.worker), row)

    def remove_workers(self, worker_ids: list[str]) -> None:
        if worker_ids:
            w = self.tables.worker
            with self.engine.begin() as conn:
                conn.execute(sa.delete(w).where(w.c.id.in_(worker_ids)))

    def supervisor_peers(
        self, supervisor_id: str, queues: tuple[str, ...] | None, stale_seconds: float
    ) -> tuple[int, int]:
        """(rank, count) of this supervisor among the live ones serving the same queues, ordered
        by id; (0, 1) until its processes have registered."""
        w = self.tables.worker
        served = ",".join(queues or ()) or None
        stmt = (
            sa.select(w.c.supervisor_id)
            .distinct()
            .where(
                w.c.queues.is_(None) if served is None else w.c.queues == served,
                w.c.heartbeat_at >= self.dialect.clock_plus(),
            )
            .order_by(w.c.supervisor_id)
        )
        with self.reading() as conn:
            ids = list(conn.execute(stmt, self._lease_clock(-stale_seconds, None).binds()).scalars())
        return (ids.index(supervisor_id), len(ids)) if supervisor_id in ids else (0, 1)

    def prune_workers(self, stale_seconds: float, now: datetime | None = None) -> int:
        """Delete worker rows whose heartbeat is older than ``stale_seconds`` by the lease clock."""
        w = self.tables.worker
        with self.engine.begin() as conn:
            stmt = sa.delete(w).where(w.c.heartbeat_at < self.dialect.clock_plus())
            return int(conn.execute(stmt, self._lease_clock(-stale_seconds, now).binds()).rowcount)

    def repair_ids(self) -> int:
        """Give fresh ids to waiting messages whose ids an archived job has (see the MySQL dialect)."""
        with self.engine.begin() as conn:
            return self.dialect.repair_ids(conn)

    def take_over_checkpoints(self) -> bool:
        """Let this process write the journal back from now on (see :meth:`checkpoint`), for its
        connections and those of the processes it forks: SQLite's commits otherwise do it now and
        then, and wait for the disk while a job waits. False where there is nothing to take over."""
        return self.dialect.take_over_checkpoints()

    def checkpoint(self) -> None:
        """Write the journal back into the database file, where :meth:`take_over_checkpoints` took
        that over (SQLite); without blocking readers or writers."""
        self.dialect.checkpoint()

    def ping(self) -> None:
        """Raise unless the database answers a trivial query on a new connection."""
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
