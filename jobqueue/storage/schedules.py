"""Schedule messages in the database: read, create, update and fire them (fenced).

What a schedule means (its fire times, its stored definition) is ``jobqueue.periodic``'s; here
are only the rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.job import SCHEDULE_TASK, Message, MessageState
from jobqueue.storage.dialects.base import PROCESSING, READY_LITERALS
from jobqueue.storage.outcomes import RELEASED
from jobqueue.storage.store import Store


@dataclass(frozen=True)
class StoredSchedule:
    id: int
    name: str
    state: str
    next_fire: datetime
    checkpoint: bytes | None
    payload: bytes  # the schedule's definition, as jobqueue.periodic encodes it


def schedule_messages(store: Store) -> list[StoredSchedule]:
    """The active schedule messages."""
    m = store.tables.message
    stmt = sa.select(m.c.id, m.c.unique_key, m.c.state, m.c.next_attempt_at, m.c.checkpoint, m.c.payload).where(
        m.c.task_name == SCHEDULE_TASK)
    with store.reading() as conn:
        return [StoredSchedule(row.id, row.unique_key, row.state, row.next_attempt_at, row.checkpoint, row.payload)
                for row in conn.execute(stmt)]


def insert_schedule(store: Store, row: dict[str, Any]) -> bool:
    """Create a schedule's message (``row``, unique key = schedule name) unless one exists; True if
    this call created it.

    Any number of workers may race here: the unique index lets exactly one insert win. MySQL cannot
    say which (with CLIENT_FOUND_ROWS a no-op duplicate also reports one row), so the row carries a
    random marker and the winner is the one that reads its own marker back.
    """
    marker = uuid.uuid4().hex
    row = {**row, "headers": {**(row.get("headers") or {}), "created_by": marker}}
    m = store.tables.message
    with store.writing() as conn:
        row_id = store.dialect_of(conn).insert_unique(conn, row)
        if row_id is None:
            return False
        headers = conn.execute(sa.select(m.c.headers).where(m.c.id == row_id)).scalar() or {}
    return bool(headers.get("created_by") == marker)


def update_schedule(store: Store, row_id: int, payload: bytes, queue: str, next_fire: datetime) -> bool:
    """Store a changed definition and its new next fire; False while a worker is firing it."""
    m = store.tables.message
    stmt = (sa.update(m).where(m.c.id == row_id, m.c.state.in_(READY_LITERALS))
            .values(payload=payload, queue=queue, next_attempt_at=next_fire))
    with store.writing() as conn:
        return bool(conn.execute(stmt).rowcount)


def fire_schedule(store: Store, message: Message, job: dict[str, Any], next_fire: datetime, state: bytes) -> bool:
    """Enqueue ``job`` and defer the schedule message to ``next_fire``, in one transaction.

    Fenced like every outcome: nothing happens unless this delivery still holds the message. The
    job's unique key (schedule name and fire time) makes a second job for the same fire impossible
    while the first is active.
    """
    m = store.tables.message
    with store.writing() as conn:
        if not store.dialect.lock_held(conn, [(message.id, message.lease_token)]):
            return False
        store.insert_unique(conn, store.dialect, job)
        conn.execute(
            sa.update(m).where(m.c.id == message.id, m.c.lease_token == message.lease_token, m.c.state == PROCESSING)
            .values(state=MessageState.PENDING.value, next_attempt_at=next_fire, deliveries_count=0, checkpoint=state,
                    **RELEASED))
    return True
