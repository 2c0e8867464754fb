"""PostgreSQL: acquire in one statement, a CTE with FOR UPDATE SKIP LOCKED feeding UPDATE ... RETURNING.

Acquire, on the path from enqueue to a job's start, runs on the driver as a prepared statement:
SQLAlchemy's execution and the server's parse and plan took longer than running it, and an idle
worker pays for every instruction twice over (cold caches).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import re
from datetime import datetime
from typing import Any, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from jobqueue.job import Batch, Message, Outcome, OutcomeKind
from jobqueue.storage.dialects.base import PROCESSING, SHARED_COLUMNS, AcquireParams, Dialect, LeaseClock
from jobqueue.storage.outcomes import RELEASED, requeue_binds
from jobqueue.storage.tables import Tables, notify_channel, postgresql_notify_ddl

logger = logging.getLogger("jobqueue.storage")


class PostgreSQLDialect(Dialect):
    name = "postgresql"
    one_statement_acquire = True
    one_statement_outcomes = True
    insert_on_conflict = staticmethod(postgresql.insert)

    _apply_outcomes: Any = None

    def __init__(self, tables: Tables) -> None:
        super().__init__(tables)
        self._prepared: dict[str, Prepared] = {}

    def after_create(self, connection: sa.Connection) -> None:
        for statement in postgresql_notify_ddl(self.tables.prefix):
            connection.exec_driver_sql(statement)

    def after_drop(self, connection: sa.Connection) -> None:
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {self.tables.prefix}notify()")

    def notify_statement(self) -> Any:
        return sa.select(sa.func.pg_notify(notify_channel(self.tables.prefix), ""))

    def check_server(self, connection: sa.Connection) -> None:
        self._require(connection.dialect.server_version_info, (13,), "PostgreSQL")

    client_clock = False

    def clock(self) -> Any:
        # now() is the time the transaction began: every lease statement is a short one of its own.
        return sa.func.coalesce(sa.bindparam("lease_now", type_=sa.DateTime),
                                sa.func.timezone("UTC", sa.func.now()), type_=sa.DateTime)

    def clock_plus(self) -> Any:
        seconds = sa.bindparam("lease_us", type_=sa.BigInteger) / sa.literal_column("1000000.0")
        return self.clock() + sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds, type_=sa.Interval)

    def build_acquire(self, queues: str) -> Any:
        m = self.message
        ready = (self.ready_select([m.c.id], queues != "all", queues == "one")
                 .with_for_update(skip_locked=True).cte("ready"))
        # id = ANY(ARRAY(SELECT ...)): the chosen ids become one array, then primary-key lookups.
        # A join with the CTE lets the planner hash-join against a scan of the whole backlog.
        chosen = sa.func.array(sa.select(ready.c.id).scalar_subquery())
        return (sa.update(m).where(m.c.id == sa.any_(chosen))
                .values(self.acquired_values()).returning(*self.returned))

    def queue_filter(self, one: bool) -> Any:
        # One parameter whatever the number of queues, so that a prepared statement serves every
        # call. One queue is an equality: the ordered walk of the queue's ready index.
        if one:
            return self.message.c.queue == sa.bindparam("queue", type_=sa.String)
        return self.message.c.queue == sa.any_(sa.bindparam("queues", type_=postgresql.ARRAY(sa.String)))

    # -- the hot paths, prepared on the driver --
    def acquires_on_driver(self, driver: str) -> bool:
        return driver == "psycopg2"

    def acquire_on_cursor(self, cursor: Any, params: AcquireParams, info: dict[str, Any]) -> list[Message]:
        queues = "all" if not params.queues else "one" if len(params.queues) == 1 else "many"
        prepared = self._prepared.get(queues)
        if prepared is None:
            prepared = self._prepared[queues] = Prepared.compile(self.build_acquire(queues))
        prepared.run(cursor, params.binds(), info)
        rows = [Message(*_driver_values(row)) for row in cursor.fetchall()]
        rows.sort(key=lambda r: (-r.priority, r.next_attempt_at, r.id))  # RETURNING gives no order
        return rows

    def insert_batch(self, connection: sa.Connection, batch: Batch) -> list[int]:
        if connection.dialect.driver != "psycopg2":  # COPY is written for psycopg2's copy_expert
            return super().insert_batch(connection, batch)
        return copy_batch(connection, self.message, batch)

    def apply_outcomes(self, connection: sa.Connection, outcomes: list[Outcome],
                       now: datetime) -> set[tuple[int, int]]:
        if self._apply_outcomes is None:
            self._apply_outcomes = build_apply_outcomes(self.message, self.tables.archive)
        rows = connection.execute(self._apply_outcomes, outcome_binds(outcomes, now)).all()
        return {(row[0], row[1]) for row in rows}

    def renew_leases(self, connection: sa.Connection, worker_ids: list[str], lease: LeaseClock) -> int:
        # Rows a worker is flushing right now are skipped, not waited for: waiting could deadlock
        # with the flush's own row locks, and those rows are about to leave PROCESSING anyway.
        m = self.message
        locked = sa.select(m.c.id).where(*self.renewable(worker_ids)).with_for_update(skip_locked=True)
        stmt = sa.update(m).where(m.c.id.in_(locked.scalar_subquery())).values(lease_expires_at=self.clock_plus())
        return int(connection.execute(stmt, lease.binds()).rowcount)


# Outcomes travel as one JSON document per kind, which json_to_recordset turns back into typed rows
# on the server: one literal to send and parse, where one array literal per field and row cost more
# on both sides than the statement itself. Bytes travel base64-encoded.
FINAL_FIELDS = (("id", "bigint"), ("token", "bigint"), ("state", "text"), ("result", "text"),
                ("checkpoint", "text"), ("etype", "text"), ("emsg", "text"), ("etb", "text"),
                ("started", "timestamp"), ("finished", "timestamp"), ("attempts", "integer"),
                ("deliveries", "integer"), ("retain", "boolean"), ("first", "timestamp"))
REQUEUE_FIELDS = (("id", "bigint"), ("token", "bigint"), ("state", "text"), ("next", "timestamp"),
                  ("attempts", "integer"), ("deliveries", "integer"), ("checkpoint", "text"),
                  ("etype", "text"), ("emsg", "text"), ("etb", "text"))
_TYPES = {"bigint": sa.BigInteger, "text": sa.Text, "timestamp": sa.DateTime, "integer": sa.Integer,
          "boolean": sa.Boolean}


def _recordset(param: str, fields: tuple[tuple[str, str], ...], name: str) -> Any:
    rows = (sa.func.json_to_recordset(sa.cast(sa.bindparam(param, type_=sa.Text), postgresql.JSON))
            .table_valued(*[sa.column(field, _TYPES[kind]) for field, kind in fields])
            .render_derived(name=f"{name}_rows", with_types=True))
    return sa.select(rows).cte(name)


def _bytes(column: Any) -> Any:
    return sa.func.decode(column, sa.literal_column("'base64'"))


def build_apply_outcomes(m: sa.Table, a: sa.Table) -> Any:
    """Every outcome of a flush in one statement, fenced, with the archive filled server-side.

    DELETE ... RETURNING moves finished messages (payload and all, without sending them back) into
    INSERT INTO archive; UPDATE requeues the others; both apply only where the message is still
    PROCESSING under the delivery's lease token. The result is the (id, token) pairs applied. The
    ids also come as an array so that both find their rows through the primary key.
    """
    fin = _recordset("fin", FINAL_FIELDS, "fin")
    req = _recordset("req", REQUEUE_FIELDS, "req")
    ids = sa.cast(sa.bindparam("ids", type_=sa.Text), postgresql.ARRAY(sa.BigInteger))
    moved = (sa.delete(m)
             .where(m.c.id == sa.any_(ids), m.c.id == fin.c.id, m.c.lease_token == fin.c.token,
                    m.c.state == PROCESSING)
             .returning(m.c.id, m.c.lease_token, m.c.task_name, m.c.queue, m.c.priority, m.c.payload, m.c.headers,
                        m.c.unique_key, m.c.partition_key, m.c.options, m.c.history, m.c.created_at,
                        m.c.first_attempt_at)
             .cte("moved"))
    matched = sa.and_(fin.c.id == moved.c.id, fin.c.token == moved.c.lease_token)
    archived = sa.insert(a).from_select(
        ["id", "task_name", "queue", "priority", "state", "payload", "headers", "unique_key", "partition_key",
         "checkpoint", "options", "history", "attempts_count", "deliveries_count", "created_at", "first_attempt_at",
         "last_attempt_at", "finished_at", "archived_at", "result", "error_type", "error_message", "error_traceback"],
        sa.select(moved.c.id, moved.c.task_name, moved.c.queue, moved.c.priority, fin.c.state, moved.c.payload,
                  moved.c.headers, moved.c.unique_key, moved.c.partition_key, _bytes(fin.c.checkpoint),
                  moved.c.options, moved.c.history, fin.c.attempts, fin.c.deliveries, moved.c.created_at,
                  sa.func.coalesce(moved.c.first_attempt_at, fin.c.first), fin.c.started, fin.c.finished,
                  sa.bindparam("now", type_=sa.DateTime), _bytes(fin.c.result), fin.c.etype, fin.c.emsg, fin.c.etb)
        .join_from(moved, fin, matched).where(fin.c.retain),
    ).cte("archived")
    requeued = (sa.update(m)
                .where(m.c.id == sa.any_(ids), m.c.id == req.c.id, m.c.lease_token == req.c.token,
                       m.c.state == PROCESSING)
                .values(state=req.c.state, next_attempt_at=req.c.next, attempts_count=req.c.attempts,
                        deliveries_count=req.c.deliveries, checkpoint=_bytes(req.c.checkpoint),
                        # A hand-back or deferral carries no error: keep the last one recorded.
                        last_error_type=sa.func.coalesce(req.c.etype, m.c.last_error_type),
                        last_error_message=sa.func.coalesce(req.c.emsg, m.c.last_error_message),
                        last_error_traceback=sa.func.coalesce(req.c.etb, m.c.last_error_traceback),
                        **RELEASED)
                .returning(m.c.id, req.c.token)
                .cte("requeued"))
    return sa.union_all(sa.select(moved.c.id, moved.c.lease_token).add_cte(archived),
                        sa.select(requeued.c.id, requeued.c.token))


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def outcome_binds(outcomes: list[Outcome], now: datetime) -> dict[str, Any]:
    """The bind values of build_apply_outcomes: the ids, and a JSON document per kind of outcome."""
    finals, requeues = [], []
    for outcome in outcomes:
        m = outcome.message
        error = outcome.error
        if outcome.kind is OutcomeKind.ARCHIVE:
            started = _iso(outcome.started_at or m.acquired_at)
            row: dict[str, Any] = {
                "id": m.id, "token": m.lease_token, "state": outcome.state.value, "started": started,
                "finished": _iso(outcome.finished_at), "attempts": m.attempts_count,
                "deliveries": m.deliveries_count, "retain": outcome.retain, "first": started}
            # Only what is set: a missing key reads as NULL, and most outcomes carry no result or error.
            if outcome.result is not None:
                row["result"] = _b64(outcome.result)
            if outcome.checkpoint is not None:
                row["checkpoint"] = _b64(outcome.checkpoint)
            if error is not None:
                row.update(etype=error.type, emsg=error.message, etb=error.traceback)
            finals.append(row)
        else:
            b = requeue_binds(outcome)
            requeues.append({
                "id": b["b_id"], "token": b["b_token"], "state": b["b_state"], "next": _iso(b["b_next"]),
                "attempts": b["b_attempts"], "deliveries": b["b_deliveries"], "checkpoint": _b64(b["b_checkpoint"]),
                "etype": b["b_error_type"], "emsg": b["b_error_message"], "etb": b["b_error_traceback"]})
    return {"ids": "{" + ",".join(str(o.message.id) for o in outcomes) + "}", "now": now,
            "fin": json.dumps(finals), "req": json.dumps(requeues)}


def _copy_text(value: Any) -> str:
    """A value in COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        return "\\\\x" + value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        value = json.dumps(value, separators=(",", ":"))
    text = str(value)
    if any(c in text for c in "\\\t\n\r"):
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def copy_batch(connection: sa.Connection, table: sa.Table, batch: Batch) -> list[int]:
    """Bulk-insert with COPY: ids reserved from the sequence first (one round trip), then the rows.

    COPY is parsed as data, not as SQL: several times cheaper on the server than multi-row VALUES.
    The columns the rows share are formatted once.
    """
    ids = [row[0] for row in connection.exec_driver_sql(
        f"SELECT nextval('{table.name}_id_seq') FROM generate_series(1, {len(batch)})").all()]
    shared = "\t".join(_copy_text(batch.common[column]) for column in SHARED_COLUMNS)
    lines = (f"{job_id}\t\\\\x{payload.hex()}\t{shared}\n" for job_id, payload in zip(ids, batch.payloads))
    stream = _CopyStream(lines)
    raw = connection.connection.driver_connection
    cursor = raw.cursor()  # type: ignore[union-attr]
    statement = f"COPY {table.name} (id, payload, {', '.join(SHARED_COLUMNS)}) FROM STDIN"
    try:
        cursor.copy_expert(statement, stream, size=COPY_CHUNK)
    except Exception as exc:
        if stream.error is not None:  # psycopg2 reports a failed read() as a cancelled COPY: say what failed
            raise stream.error from None
        dbapi = connection.dialect.loaded_dbapi
        if isinstance(exc, dbapi.Error):  # as SQLAlchemy reports every other statement's errors
            invalidated = connection.dialect.is_disconnect(exc, raw, cursor)
            raise sa.exc.DBAPIError.instance(statement, None, exc, dbapi.Error,
                                             connection_invalidated=invalidated) from exc
        raise
    finally:
        cursor.close()
    return ids


COPY_CHUNK = 1 << 16


class _CopyStream(io.TextIOBase):
    """COPY's text, made as psycopg2 reads it: the server parses one chunk while the next is built
    (and, for a streamed bulk(), while its payloads are serialized)."""

    def __init__(self, lines: Iterator[str]) -> None:
        self.lines = lines
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        parts, length = [], 0
        try:
            for line in self.lines:
                parts.append(line)
                length += len(line)
                if size is not None and 0 <= size <= length:
                    break
        except BaseException as exc:  # a payload that cannot be serialized: the COPY is abandoned
            self.error = exc
            raise
        return "".join(parts)



def _driver_values(row: Sequence[Any]) -> list[Any]:
    """A row as psycopg2 returns it, with bytea as bytes (JSON comes parsed already)."""
    return [bytes(v) if isinstance(v, memoryview) else v for v in row]


class Prepared:
    """A statement PREPAREd once per connection, then EXECUTEd by name: no parse or plan per call.

    Where prepared statements do not last (a pooler in transaction mode hands each transaction
    another server connection), a missing one costs one failed round trip and the statement runs
    plain; after ``GIVE_UP_AFTER`` misses in the life of the process this statement always runs plain.
    """

    GIVE_UP_AFTER = 3
    MISSING = "26000"  # invalid_sql_statement_name: not prepared on this server connection
    DUPLICATE = "42P05"  # duplicate_prepared_statement: prepared already (our bookkeeping was lost)
    CHANGED = "0A000"  # feature_not_supported: "cached plan must not change result type"

    def __init__(self, sql: str, defaults: dict[str, Any] | None = None) -> None:
        """``sql`` with psycopg2's ``%(name)s`` markers; ``run`` takes a dict of values over ``defaults``."""
        self.sql = sql
        self.defaults = defaults or {}
        self.names = tuple(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
        numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${self.names.index(m.group(1)) + 1}", sql)
        self.name = "jobqueue_" + hashlib.sha1(sql.encode()).hexdigest()[:16]
        self.prepare = f"PREPARE {self.name} AS {numbered.replace('%%', '%')}"
        self.execute = f"EXECUTE {self.name}" + (f" ({', '.join(['%s'] * len(self.names))})" if self.names else "")
        self.misses = 0

    @classmethod
    def compile(cls, statement: Any) -> Prepared:
        """A SQLAlchemy statement as its psycopg2 dialect renders it; literals it binds become defaults."""
        compiled = statement.compile(dialect=postgresql.psycopg2.dialect())  # type: ignore[no-untyped-call]
        return cls(str(compiled), {k: v for k, v in compiled.params.items() if not compiled.binds[k].required})

    def run(self, cursor: Any, params: dict[str, Any], info: dict[str, Any]) -> None:
        """Execute on ``cursor`` (a connection in autocommit); ``info`` lasts as long as the connection."""
        params = {**self.defaults, **params}
        if self.misses >= self.GIVE_UP_AFTER:
            cursor.execute(self.sql, params)
            return
        prepared: set[str] = info.setdefault("jobqueue_prepared", set())
        if self.name not in prepared:
            try:
                cursor.execute(self.prepare)
            except Exception as exc:
                if getattr(exc, "pgcode", None) != self.DUPLICATE:
                    raise
            prepared.add(self.name)
        args = [params[name] for name in self.names]
        try:
            cursor.execute(self.execute, args)
        except Exception as exc:
            code = getattr(exc, "pgcode", None)
            if code not in (self.MISSING, self.CHANGED):
                raise
            prepared.discard(self.name)
            if code == self.CHANGED:
                cursor.execute(f"DEALLOCATE {self.name}")
            else:
                self.misses += 1
                if self.misses == self.GIVE_UP_AFTER:
                    logger.warning("prepared statements do not last on this database connection (a pooler "
                                   "in transaction mode?): jobqueue runs its statements unprepared from now on")
            cursor.execute(self.sql, params)
