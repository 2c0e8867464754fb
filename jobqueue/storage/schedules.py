"""Schedule messages in the database: read, create and update them (firing is the dialect's).

What a schedule means (its fire times, its stored definition) is ``jobqueue.periodic``'s; here
are only the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.job import SCHEDULE_TASK
from jobqueue.storage.dialects.common import READY_LITERALS
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
        m.c.task_name == SCHEDULE_TASK
    )
    with store.reading() as conn:
        return [
            StoredSchedule(row.id, row.unique_key, row.state, row.next_attempt_at, row.checkpoint, row.payload)
            for row in conn.execute(stmt)
        ]


def insert_schedule(store: Store, row: dict[str, Any]) -> bool:
    """Create a schedule's message (``row``, unique key = schedule name) unless one exists; True if
    this call created it. Any number of workers may race here: the unique index lets exactly one win."""
    with store.writing() as conn:
        return store.dialect.insert_unique(conn, row) is not None


def schedule_holding(store: Store, name: str) -> str | None:
    """The name of the active schedule message the database matches with ``name``: ``name`` itself,
    another spelling of it where the database compares text regardless of case or accents, or None."""
    m = store.tables.message
    stmt = sa.select(m.c.unique_key).where(m.c.task_name == SCHEDULE_TASK, m.c.unique_key == name).limit(1)
    with store.reading() as conn:
        found = conn.execute(stmt).scalar()
    return None if found is None else str(found)


def update_schedule(store: Store, row_id: int, payload: bytes, queue: str, next_fire: datetime) -> bool:
    """Store a changed definition and its new next fire; False while a worker is firing it."""
    m = store.tables.message
    stmt = (
        sa.update(m)
        .where(m.c.id == row_id, m.c.state.in_(READY_LITERALS))
        .values(payload=payload, queue=queue, next_attempt_at=next_fire)
    )
    with store.writing() as conn:
        return bool(conn.execute(stmt).rowcount)
