"""Reading and changing single jobs from outside a worker: status, outcome, cancel, queue counts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.job import SCHEDULE_TASK, MessageState
from jobqueue.storage.dialects.common import READY_LITERALS
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
    return MessageState(state) if state is not None else None


def archived_job(store: Store, job_id: int) -> ArchivedJob | None:
    a = store.tables.archive
    stmt = sa.select(a.c.id, a.c.state, a.c.result, a.c.error_type, a.c.error_message, a.c.error_traceback)
    with store.reading() as conn:
        row = conn.execute(stmt.where(a.c.id == job_id)).first()
    if row is None:
        return None
    return ArchivedJob(
        row.id, MessageState(row.state), row.result, row.error_type, row.error_message, row.error_traceback
    )


def cancel(store: Store, job_id: int, now: datetime | None = None) -> bool:
    """Archive a PENDING or RETRYABLE job as CANCELLED; False if it is running or gone."""
    now = now or utcnow()
    m, a = store.tables.message, store.tables.archive
    columns = message_archive_columns(store.tables)
    with store.writing() as conn:
        row = (
            conn.execute(
                sa.select(*[m.c[name] for name in columns])
                .where(m.c.id == job_id, m.c.state.in_(READY_LITERALS))
                .with_for_update()
            )
            .mappings()
            .first()
        )
        if row is None:
            return False
        conn.execute(sa.delete(m).where(m.c.id == job_id))
        archived: dict[str, Any] = dict(row)
        archived.update(state=MessageState.CANCELLED.value, finished_at=now, archived_at=now)
        conn.execute(sa.insert(a), archived)
    return True


def queue_counts(store: Store, now: datetime | None = None) -> list[dict[str, Any]]:
    """Per queue: messages per state and the age in seconds of the oldest ready one."""
    now = now or utcnow()
    m = store.tables.message
    ready = sa.and_(m.c.state.in_(READY_LITERALS), m.c.next_attempt_at <= now)
    stmt = (
        sa.select(m.c.queue, m.c.state, sa.func.count(), sa.func.min(sa.case((ready, m.c.next_attempt_at))))
        .where(m.c.task_name != SCHEDULE_TASK)  # schedules are listed by `jobqueue periodic list`
        .group_by(m.c.queue, m.c.state)
        .order_by(m.c.queue, m.c.state)
    )
    queues: dict[str, dict[str, Any]] = {}
    with store.reading() as conn:
        for queue, state, count, oldest in conn.execute(stmt):
            entry = queues.setdefault(
                queue, {"queue": queue, "pending": 0, "processing": 0, "retryable": 0, "oldest_ready_seconds": None}
            )
            entry[state.lower()] = int(count)
            if oldest is not None:
                age = (now - oldest).total_seconds()
                previous = entry["oldest_ready_seconds"]
                entry["oldest_ready_seconds"] = age if previous is None else max(previous, age)
    return list(queues.values())


def archive_counts(store: Store) -> dict[str, int]:
    a = store.tables.archive
    with store.reading() as conn:
        return {
            state.lower(): int(n)
            for state, n in conn.execute(sa.select(a.c.state, sa.func.count()).group_by(a.c.state))
        }


def live_workers(store: Store) -> list[dict[str, Any]]:
    w = store.tables.worker
    with store.reading() as conn:
        return [dict(row) for row in conn.execute(sa.select(w).order_by(w.c.hostname, w.c.started_at)).mappings()]
