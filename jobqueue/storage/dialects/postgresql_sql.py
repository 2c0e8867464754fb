"""The statements PostgreSQL runs its own way: a prepared acquire and a one-statement flush (bulk
enqueue's COPY is in postgresql_copy).

Each was measured to pay for itself (docs/performance.md): on an idle worker SQLAlchemy's
execution and the server's parse and plan took longer than running the acquire; a flush of any
size is one round trip.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from jobqueue.job import Message, Outcome, OutcomeKind
from jobqueue.storage.dialects.common import ACQUIRED_COLUMNS, PROCESSING, readable_times
from jobqueue.storage.outcomes import ARCHIVED, COPIED, RELEASED, REQUEUED, Field, archived_values

logger = logging.getLogger("jobqueue.storage")


# -- the flush: one statement, the outcomes as JSON recordsets --------------------------------------
# Outcomes travel as one JSON document per kind, which json_to_recordset turns back into typed rows
# on the server: one literal to send and parse, where one array literal per field and row cost more
# on both sides than the statement itself. Bytes travel base64-encoded. The columns are the shared
# outcome fields (storage.outcomes), plus each delivery's id and lease token. Keys are short (the
# field's position), and a field that is the same for the whole flush is bound once: the document
# is built by the worker and parsed by the server for every outcome, so its size is paid twice.
_KINDS = {"text": sa.Text, "bytes": sa.Text, "integer": sa.Integer, "timestamp": sa.DateTime}
_KEYS = (sa.column("id", sa.BigInteger), sa.column("token", sa.BigInteger))


def _sent(fields: tuple[Field, ...]) -> list[tuple[str, Field]]:
    """The fields that travel in each outcome's JSON object, with their keys."""
    return [(f"f{number}", field) for number, field in enumerate(fields) if not field.per_flush]


def _recordset(param: str, fields: tuple[Field, ...], extra: tuple[Any, ...] = ()) -> Any:
    columns = [*_KEYS, *extra, *[sa.column(key, _KINDS[f.kind]) for key, f in _sent(fields)]]
    rows = (
        sa.func.json_to_recordset(sa.cast(sa.bindparam(param, type_=sa.Text), postgresql.JSON))
        .table_valued(*columns)
        .render_derived(name=f"{param}_rows", with_types=True)
    )
    return sa.select(rows).cte(param)


def _column(recordset: Any, fields: tuple[Field, ...], field: Field) -> Any:
    """A field's value as its table column takes it: from the recordset (bytes come base64-encoded),
    or from the flush's bind for a field the same for every outcome."""
    if field.per_flush:
        return sa.bindparam(f"flush_{field.column}", type_=_KINDS[field.kind])
    column = recordset.c[f"f{fields.index(field)}"]
    return sa.func.decode(column, sa.literal_column("'base64'")) if field.kind == "bytes" else column


def _among(m: sa.Table, recordset: Any) -> Any:
    """The message's id is one of the recordset's, as an index condition on the primary key."""
    ids = sa.select(recordset.c.id).scalar_subquery()
    return m.c.id == sa.any_(sa.func.array(ids))


def build_apply_outcomes(m: sa.Table, a: sa.Table) -> Any:
    """Every outcome of a flush in one statement, fenced, with the archive filled server-side.

    DELETE ... RETURNING moves finished messages (payload and all, without sending them back) into
    INSERT INTO archive; UPDATE requeues the others; both apply only where the message is still
    PROCESSING under the delivery's lease token. The result is the (id, token) pairs applied.

    Each outcome finds its row by id, through the primary key: ``id = ANY(the flush's ids)`` is an
    index condition the planner costs as a few lookups, whatever the statistics say. Joined to the
    outcomes alone, a small table whose statistics underrated the PROCESSING rows had the planner
    walk the whole primary key for each flush (3,000 rows: 3 ms where the lookups take 0.4). The
    state is compared as an expression, which the partial index of PROCESSING rows cannot answer:
    that index had the planner walk every worker's buffers for each flush.
    """
    processing = m.c.state.op("||")(sa.literal_column("''")) == PROCESSING
    fin = _recordset("fin", ARCHIVED, (sa.column("retain", sa.Boolean),))
    req = _recordset("req", REQUEUED)
    moved = (
        sa.delete(m)
        .where(_among(m, fin), m.c.id == fin.c.id, m.c.lease_token == fin.c.token, processing)
        .returning(m.c.lease_token, *[m.c[column] for column in COPIED])
        .cte("moved")
    )
    matched = sa.and_(fin.c.id == moved.c.id, fin.c.token == moved.c.lease_token)
    archived = (
        sa.insert(a)
        .from_select(
            [*COPIED, *[f.column for f in ARCHIVED]],
            sa.select(*[moved.c[column] for column in COPIED], *[_column(fin, ARCHIVED, f) for f in ARCHIVED])
            .join_from(moved, fin, matched)
            .where(fin.c.retain),
        )
        .cte("archived")
    )
    values: dict[str, Any] = {}
    for field in REQUEUED:
        value = _column(req, REQUEUED, field)
        values[field.column] = sa.func.coalesce(value, m.c[field.column]) if field.keep_if_null else value
    requeued = (
        sa.update(m)
        .where(_among(m, req), m.c.id == req.c.id, m.c.lease_token == req.c.token, processing)
        .values(**values, **RELEASED)
        .returning(m.c.id, req.c.token)
        .cte("requeued")
    )
    return sa.union_all(
        sa.select(moved.c.id, moved.c.lease_token).add_cte(archived), sa.select(requeued.c.id, requeued.c.token)
    )


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


# How a value of each kind travels in JSON (None: as it is). Chosen once per field, not per value.
_TO_JSON: dict[str, Callable[[Any], Any] | None] = {
    "text": None,
    "integer": None,
    "timestamp": datetime.isoformat,
    "bytes": _base64,
}

Document = Callable[[Outcome, datetime], dict[str, Any]]


def _document(fields: tuple[Field, ...]) -> Document:
    """A function building one outcome's JSON object for the recordset of ``fields``."""
    sent = [(key, field.value, _TO_JSON[field.kind]) for key, field in _sent(fields)]

    def document(outcome: Outcome, now: datetime) -> dict[str, Any]:
        row: dict[str, Any] = {"id": outcome.message.id, "token": outcome.message.lease_token}
        for key, value_of, to_json in sent:
            value = value_of(outcome, now)
            if value is not None:  # a missing key reads as NULL: most outcomes carry no result or error
                row[key] = value if to_json is None else to_json(value)
        return row

    return document


# Positions in archived_values, keys and conversions of the archived fields that travel.
_ARCHIVED_SENT = [(ARCHIVED.index(field), key, _TO_JSON[field.kind]) for key, field in _sent(ARCHIVED)]


def _archived_document(outcome: Outcome, now: datetime) -> dict[str, Any]:
    """One archived outcome's JSON object (as _document(ARCHIVED) builds it, from its values in one pass)."""
    message = outcome.message
    row: dict[str, Any] = {"id": message.id, "token": message.lease_token}
    values = archived_values(outcome, now)
    for index, key, to_json in _ARCHIVED_SENT:
        value = values[index]
        if value is not None:  # a missing key reads as NULL: most outcomes carry no result or error
            row[key] = value if to_json is None else to_json(value)
    return row


_ARCHIVED_DOCUMENT, _REQUEUED_DOCUMENT = _archived_document, _document(REQUEUED)
_PER_FLUSH = [field for field in (*ARCHIVED, *REQUEUED) if field.per_flush]


def outcome_binds(outcomes: list[Outcome], now: datetime) -> dict[str, Any]:
    """The bind values of build_apply_outcomes: a JSON document per kind of outcome."""
    finals, requeues = [], []
    for outcome in outcomes:
        if outcome.kind is OutcomeKind.ARCHIVE:
            row = _ARCHIVED_DOCUMENT(outcome, now)
            row["retain"] = outcome.retain
            finals.append(row)
        else:
            requeues.append(_REQUEUED_DOCUMENT(outcome, now))
    flush_wide = {f"flush_{field.column}": field.value(outcomes[0], now) for field in _PER_FLUSH if outcomes}
    return {
        **flush_wide,
        "fin": json.dumps(finals),
        "req": json.dumps(requeues),
    }


_PAYLOAD, _CHECKPOINT = ACQUIRED_COLUMNS.index("payload"), ACQUIRED_COLUMNS.index("checkpoint")


def acquired_message(row: Sequence[Any]) -> Message:
    """A message from a row of ACQUIRED_COLUMNS as psycopg2 returns it: bytea comes as a
    memoryview (JSON comes parsed already). Only the two bytea columns are looked at: testing all
    21 columns of 500 rows took a quarter of a fetch's time in Python."""
    values = list(row)
    values[_PAYLOAD] = bytes(values[_PAYLOAD])
    if values[_CHECKPOINT] is not None:
        values[_CHECKPOINT] = bytes(values[_CHECKPOINT])
    return readable_times(Message(*values))


# -- acquire: prepared once per connection --------------------------------------------------------
class Misses:
    """The prepared statements found missing on one database's connections.

    A pooler in transaction mode hands each transaction another server connection, where a
    statement prepared on the last one may be missing. Past ``GIVE_UP_AFTER`` misses in the life
    of the process, counted over all its statements, every statement runs plain; that is logged
    once.
    """

    GIVE_UP_AFTER = 3

    def __init__(self) -> None:
        self.count = 0

    @property
    def given_up(self) -> bool:
        return self.count >= self.GIVE_UP_AFTER

    def add(self) -> None:
        self.count += 1
        if self.count == self.GIVE_UP_AFTER:
            logger.warning(
                "prepared statements do not last on this database connection (a pooler "
                "in transaction mode?): jobqueue runs its statements unprepared from now on"
            )


class Prepared:
    """A statement PREPAREd once per connection, then EXECUTEd by name: no parse or plan per call.

    Where prepared statements do not last, a missing one costs one failed round trip and the
    statement runs plain; once ``misses`` gives up, it always runs plain. The name is the hash of
    the SQL, so a statement another client prepared on a pooled server connection is this one.
    """

    MISSING = "26000"  # invalid_sql_statement_name: not prepared on this server connection
    DUPLICATE = "42P05"  # duplicate_prepared_statement: prepared already (our bookkeeping was lost)
    CHANGED = "0A000"  # feature_not_supported: "cached plan must not change result type"

    def __init__(self, sql: str, defaults: dict[str, Any] | None = None, misses: Misses | None = None) -> None:
        """``sql`` with psycopg2's ``%(name)s`` markers; ``run`` takes a dict of values over ``defaults``.
        ``misses`` is shared by the statements of one database."""
        self.sql = sql
        self.defaults = defaults or {}
        self.names = tuple(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
        numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${self.names.index(m.group(1)) + 1}", sql)
        self.name = "jobqueue_" + hashlib.sha1(sql.encode()).hexdigest()[:16]
        self.prepare = f"PREPARE {self.name} AS {numbered.replace('%%', '%')}"
        self.execute = f"EXECUTE {self.name}" + (f" ({', '.join(['%s'] * len(self.names))})" if self.names else "")
        self.misses = misses or Misses()

    @classmethod
    def compile(cls, statement: Any, misses: Misses | None = None) -> Prepared:
        """A SQLAlchemy statement as its psycopg2 dialect renders it; literals it binds become defaults."""
        compiled = statement.compile(dialect=postgresql.psycopg2.dialect())  # type: ignore[no-untyped-call]
        defaults = {k: v for k, v in compiled.params.items() if not compiled.binds[k].required}
        return cls(str(compiled), defaults, misses)

    def run(self, cursor: Any, params: dict[str, Any], info: dict[str, Any]) -> None:
        """Execute on ``cursor`` (a connection in autocommit); ``info`` lasts as long as the connection."""
        params = {**self.defaults, **params}
        if self.misses.given_up:
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
                self._deallocate(cursor)
            else:
                self.misses.add()
            cursor.execute(self.sql, params)

    def _deallocate(self, cursor: Any) -> None:
        try:
            cursor.execute(f"DEALLOCATE {self.name}")
        except Exception as exc:  # behind a pooler, on another server connection that never had it
            if getattr(exc, "pgcode", None) != self.MISSING:
                raise
