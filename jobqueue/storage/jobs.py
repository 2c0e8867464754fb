"""Reading and changing single jobs from outside a worker: status, outcome, cancel, queue counts."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.errors import CorruptMessage
from jobqueue.job import ACTIVE_STATES, FINAL_STATES, SCHEDULE_TASK, MessageState
from jobqueue.storage.dialects.common import READY_LITERALS
from jobqueue.storage.readable import readable_rows
from jobqueue.storage.store import Store
from jobqueue.storage.tables import Tables


@dataclass(frozen=True)
class ArchivedJob:
    id: int
    state: MessageState
    result: bytes | None
    error_type: str | None
    error_message: str | None
    error_traceback: str | None


def message_archive_columns(tables: Tables) -> list[str]:
    """The columns a message row and its archive row both have (what moves with a job between them)."""
    archive = set(tables.archive.c.keys())
    return [name for name in tables.message.c.keys() if name in archive]


def job_state(store: Store, job_id: int) -> MessageState | None:
    """Return the job's state wherever it is, or None if neither table has it."""
    m, a = store.tables.message, store.tables.archive
    with store.reading() as conn:
        state = conn.execute(sa.select(m.c.state).where(m.c.id == job_id)).scalar()
        if state is None:
            state = conn.execute(sa.select(a.c.state).where(a.c.id == job_id)).scalar()
    return None if state is None else _known_state(job_id, state)


def _known_state(job_id: int, state: str) -> MessageState:
    try:
        return MessageState(state)
    except ValueError:
        raise CorruptMessage(
            f"job {job_id} has the state {state!r}, which is none of jobqueue's (edited by hand?): set it to "
            f"PENDING to run it again (the states are {', '.join(s.value for s in MessageState)})"
        ) from None


def archived_job(store: Store, job_id: int) -> ArchivedJob | None:
    a = store.tables.archive
    stmt = sa.select(a.c.id, a.c.state, a.c.result, a.c.error_type, a.c.error_message, a.c.error_traceback)
    with store.reading() as conn:
        row = conn.execute(stmt.where(a.c.id == job_id)).first()
    if row is None:
        return None
    return ArchivedJob(
        row.id, _known_state(row.id, row.state), row.result, row.error_type, row.error_message, row.error_traceback
    )


def cancel(store: Store, job_id: int, now: datetime | None = None, headers: dict[str, Any] | None = None) -> bool:
    """Archive a PENDING or RETRYABLE job as CANCELLED (with ``headers`` added to its own); False if
    it is running or gone."""
    return bool(_archive_as_stored(store, [job_id], MessageState.CANCELLED, now or store.clock_now(), headers=headers))


CANCEL_BATCH = 500  # jobs cancelled per transaction by ``jobqueue jobs cancel``


def cancel_many(store: Store, job_ids: list[int], now: datetime | None = None) -> list[int]:
    """Archive those of ``job_ids`` that are PENDING or RETRYABLE as CANCELLED, in one
    transaction; the ids cancelled, in id order (the rest are running or gone)."""
    return _archive_as_stored(store, job_ids, MessageState.CANCELLED, now or store.clock_now())


def _ready(store: Store, queue: str | None, task: str | None) -> list[sa.ColumnElement[bool]]:
    """Pending or retryable jobs (never a periodic schedule's message), of ``queue`` and ``task``
    where given."""
    m = store.tables.message
    where = [m.c.state.in_(READY_LITERALS), m.c.task_name != SCHEDULE_TASK]
    if queue is not None:
        where.append(m.c.queue == queue)
    if task is not None:
        where.append(m.c.task_name == task)
    return where


def ready_ids(store: Store, queue: str | None = None, task: str | None = None, page: int = 10_000) -> array[int]:
    """The ids of every pending or retryable job now (of ``queue`` and ``task`` where given), in
    id order, read ``page`` at a time: what a command that goes through them all goes through,
    and no job committed later (a transaction's jobs take their ids before it commits, a retried
    job keeps its old one). Eight bytes an id."""
    m = store.tables.message
    ids: array[int] = array("q")
    after = 0
    with store.reading() as conn:
        while True:
            stmt = sa.select(m.c.id).where(m.c.id > after, *_ready(store, queue, task)).order_by(m.c.id).limit(page)
            found = list(conn.execute(stmt).scalars())
            ids.extend(found)
            if len(found) < page:
                return ids
            after = found[-1]


def fail_unreadable_due_time(store: Store, job_id: int, stored: str, now: datetime | None = None) -> bool:
    """Archive a PENDING or RETRYABLE job whose due time holds ``stored``, which no worker reads
    or finds due, as FAILED with CorruptMessage; False if it is running or gone."""
    error = {
        "error_type": f"{CorruptMessage.__module__}.{CorruptMessage.__qualname__}",
        "error_message": (
            f"its row could not be read: next_attempt_at {stored[:200]!r} holds no time, so no worker would "
            "ever find it due; it is failed without running"
        ),
    }
    return bool(_archive_as_stored(store, [job_id], MessageState.FAILED, now or store.clock_now(), error=error))


def _archive_as_stored(
    store: Store,
    job_ids: list[int],
    state: MessageState,
    now: datetime,
    headers: dict[str, Any] | None = None,
    error: dict[str, str] | None = None,
) -> list[int]:
    """Move those of ``job_ids`` that are PENDING or RETRYABLE to the archive in ``state``, their
    values copied as stored, in one transaction; the ids moved (the rest are running or gone)."""
    m, a = store.tables.message, store.tables.archive
    columns = message_archive_columns(store.tables)
    with store.writing() as conn:
        # Every column it copies, named (untyped: nothing is read from them): on tables an upgrade
        # has yet to reach, the missing ones make the database refuse, which names the upgrade.
        named = [sa.type_coerce(m.c[name], sa.types.NullType()) for name in columns if name != "id"]
        locked = (
            sa.select(m.c.id, *named)
            .where(m.c.id.in_(job_ids), m.c.state.in_(READY_LITERALS))
            .order_by(m.c.id)
            .with_for_update()
        )
        found = [row[0] for row in conn.execute(locked)]
        if not found:
            return []
        # Copied by the database as stored, never read here: a value edited by hand that Python
        # cannot read (SQLite takes any text in any column) still moves with its job.
        ended = {
            "state": sa.literal(state.value, a.c.state.type),
            "finished_at": sa.literal(now, a.c.finished_at.type),
            "archived_at": sa.literal(now, a.c.archived_at.type),
            **{name: sa.literal(text, a.c[name].type) for name, text in (error or {}).items()},
        }
        copied = sa.select(*[ended.get(name, m.c[name]) for name in columns], *list(ended.values())[1:])
        names = [*columns, *list(ended)[1:]]
        conn.execute(sa.insert(a).from_select(names, copied.where(m.c.id.in_(found))))
        if headers:
            for job_id in found:
                try:
                    own = conn.execute(sa.select(m.c.headers).where(m.c.id == job_id)).scalar()
                except ValueError:  # not JSON (SQLite, edited by hand): the given headers replace it
                    own = None
                merged = {**(own if isinstance(own, dict) else {}), **headers}
                conn.execute(sa.update(a).where(a.c.id == job_id).values(headers=merged))
        conn.execute(sa.delete(m).where(m.c.id.in_(found)))
    return found


QUEUE_STATES = ("ready", "scheduled", "processing", "retrying", "failed")
UNKNOWN_STATE = "unknown_state"


def queue_counts(store: Store, now: datetime | None = None) -> list[dict[str, Any]]:
    """Per queue, how many messages are in each of :data:`QUEUE_STATES` and the age in seconds of
    the oldest ready one.

    The states split the active messages by what they wait for: *ready* ones are due and wait for
    a worker, *scheduled* ones wait for their time (countdown, eta, a deferral), *retrying* ones wait
    for their next attempt, *processing* ones are running. *failed* counts the queue's failed jobs
    in the archive (the dead letters). Periodic schedules are left out: ``jobqueue periodic list``
    shows them. Messages in a state jobqueue does not know (a row edited by hand), which no worker
    runs, are counted apart, as ``unknown_state``, in the rows of the queues that have any.
    """
    now = now or store.clock_now()
    m, a = store.tables.message, store.tables.archive
    due = m.c.next_attempt_at <= now
    kind = sa.case(
        (m.c.state == MessageState.PROCESSING.value, "processing"),
        (m.c.state.not_in([state.value for state in ACTIVE_STATES]), UNKNOWN_STATE),
        (due, "ready"),
        (m.c.state == MessageState.RETRYABLE.value, "retrying"),
        else_="scheduled",
    ).label("kind")
    # A ready job has waited since it fell due, or since it was enqueued if it was due before (an eta
    # in the past).
    ready_since = sa.case((m.c.next_attempt_at > m.c.created_at, m.c.next_attempt_at), else_=m.c.created_at)
    active = (
        sa.select(m.c.queue, kind, sa.func.count(), sa.func.min(sa.case((due, ready_since))))
        .where(m.c.task_name != SCHEDULE_TASK)
        .group_by(m.c.queue, kind)
    )
    failed = sa.select(a.c.queue, sa.func.count()).where(a.c.state == MessageState.FAILED.value).group_by(a.c.queue)
    queues: dict[str, dict[str, Any]] = {}

    def entry(queue: str) -> dict[str, Any]:
        empty = {"queue": queue, **dict.fromkeys(QUEUE_STATES, 0), "oldest_ready_seconds": None}
        return queues.setdefault(queue, empty)

    with store.reading() as conn:
        for queue, state, count, oldest in conn.execute(active):
            row = entry(queue)
            row[state] = row.get(state, 0) + int(count)
            if state == "ready" and oldest is not None:
                row["oldest_ready_seconds"] = max(0.0, (now - oldest).total_seconds())
        for queue, count in conn.execute(failed):
            entry(queue)["failed"] = int(count)
    return [queues[name] for name in sorted(queues)]


def archive_counts(store: Store) -> dict[str, int]:
    """How many archived jobs are in each final state (lower case), every final state named even at
    0 so that a script can read ``failed`` without a default; rows in a state jobqueue does not know
    (edited by hand) are counted together as ``unknown_state``, never under their text."""
    a = store.tables.archive
    # Known by the database's own comparison, as everything else reads them (MySQL's ignores case).
    kind = sa.case(
        (a.c.state.in_([state.value for state in FINAL_STATES]), sa.func.lower(a.c.state)), else_=UNKNOWN_STATE
    ).label("kind")
    with store.reading() as conn:
        counted = {state: int(n) for state, n in conn.execute(sa.select(kind, sa.func.count()).group_by(kind))}
    return {state.value.lower(): 0 for state in FINAL_STATES} | counted


def worker_rows(store: Store, stale_after_seconds: float) -> list[dict[str, Any]]:
    """Every registered worker process, with ``heartbeat_age_seconds`` by the lease clock and
    ``stale`` when that is over ``stale_after_seconds`` (its supervisor died or lost the database;
    its rows are pruned by the live supervisors later, or by ``jobqueue workers --prune``)."""
    w = store.tables.worker
    with store.reading() as conn:
        now = store.database_now(conn)
        rows = readable_rows(conn, sa.select(w).order_by(w.c.hostname, w.c.started_at))
    for row in rows:
        beat = row["heartbeat_at"]
        # A heartbeat that cannot be read (edited by hand) proves no process alive: stale, no age.
        age = max(0.0, (now - beat).total_seconds()) if isinstance(beat, datetime) else None
        row["heartbeat_age_seconds"] = age
        row["stale"] = age is None or age > stale_after_seconds
        since = row.get("running_since")
        row["running_seconds"] = max(0.0, (now - since).total_seconds()) if isinstance(since, datetime) else None
    return rows
