"""Schedule messages in the database: read, create and update them (firing is the dialect's).

What a schedule means (its fire times, its stored definition) is ``jobqueue.schedule_times``'s; here
are only the rows.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
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
    payload: bytes  # the schedule's definition, as jobqueue.schedule_times encodes it
    defined_by: str | None  # the supervisor that created it or last changed its definition


def schedule_messages(store: Store) -> list[StoredSchedule]:
    """The active schedule messages (an index range, whatever the number of other messages)."""
    m = store.tables.message
    stmt = sa.select(
        m.c.id, m.c.unique_key, m.c.state, m.c.next_attempt_at, m.c.checkpoint, m.c.payload, m.c.headers
    ).where(
        # Every schedule message has a unique key: saying so lets PostgreSQL and SQLite read the
        # schedule messages off the unique index (partial: keyed messages only), not the whole table.
        m.c.task_name == SCHEDULE_TASK,
        m.c.unique_key.isnot(None),
    )
    with store.reading() as conn:
        return [
            StoredSchedule(
                row.id,
                row.unique_key,
                row.state,
                row.next_attempt_at,
                row.checkpoint,
                row.payload,
                _writer(row.headers),
            )
            for row in conn.execute(stmt)
        ]


def _writer(headers: Any) -> str | None:
    writer = headers.get(WRITER_HEADER) if isinstance(headers, dict) else None
    return writer if isinstance(writer, str) else None


def running_supervisors(store: Store, supervisor_ids: Collection[str], stale_seconds: float) -> dict[str, str]:
    """Those of ``supervisor_ids`` whose worker processes still beat (within ``stale_seconds``), with
    their host's name."""
    w = store.tables.worker
    found: dict[str, str] = {}
    with store.reading() as conn:
        for page in _pages(supervisor_ids):
            stmt = sa.select(w.c.supervisor_id, w.c.hostname).where(
                w.c.supervisor_id.in_(page),
                w.c.heartbeat_at >= store.dialect.clock_plus(),
            )
            for row in conn.execute(stmt, store.lease_clock_binds(-stale_seconds)):
                found[str(row.supervisor_id)] = str(row.hostname)
    return found


# Names (or ids) per statement: an IN list far below every database's limit on bound parameters.
LOOKUP_PAGE = 500


def _pages(values: Collection[Any]) -> Iterator[list[Any]]:
    """``values`` in order, in lists of at most ``LOOKUP_PAGE``: one IN list each."""
    ordered = sorted(values)
    for start in range(0, len(ordered), LOOKUP_PAGE):
        yield ordered[start : start + LOOKUP_PAGE]


# The header that tells a schedule message a worker retired (its schedule gone from its code) from
# one cancelled or deleted by hand.
RETIRED_HEADER = "retired"
# The header that names the supervisor that created a schedule message or last changed its definition.
WRITER_HEADER = "defined_by"


def schedule_ids(store: Store, names: Collection[str]) -> dict[str, int]:
    """The ids of the active schedule messages named ``names``, by name: lookups of the unique index
    by name, whatever the number of other messages."""
    m = store.tables.message
    found: dict[str, int] = {}
    with store.reading() as conn:
        for page in _pages(names):
            stmt = sa.select(m.c.unique_key, m.c.id).where(m.c.task_name == SCHEDULE_TASK, m.c.unique_key.in_(page))
            found.update({str(row.unique_key): int(row.id) for row in conn.execute(stmt)})
    return found


def retired_schedules(store: Store, messages: dict[str, int]) -> set[str]:
    """Which of the schedule messages ``messages`` ({name: id}), now gone from the message table, a
    worker retired (rather than someone deleting or cancelling them): lookups of the archive by id."""
    a = store.tables.archive
    by_id = {message_id: name for name, message_id in messages.items()}
    retired: set[str] = set()
    with store.reading() as conn:
        for page in _pages(by_id):
            stmt = sa.select(a.c.id, a.c.unique_key, a.c.headers).where(
                a.c.id.in_(page), a.c.task_name == SCHEDULE_TASK
            )
            for row in conn.execute(stmt):
                # The same schedule (an archived job can share a waiting message's id on MySQL).
                if by_id.get(row.id) == row.unique_key and isinstance(row.headers, dict):
                    if row.headers.get(RETIRED_HEADER):
                        retired.add(str(row.unique_key))
    return retired


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


def update_schedule(
    store: Store,
    row_id: int,
    payload: bytes,
    queue: str,
    next_fire: datetime,
    headers: dict[str, Any],
    was: bytes,
) -> bool:
    """Store a changed definition, its new next fire and ``headers`` in place of the definition
    ``was``; False while a worker is firing it, or once another worker has changed it (workers that
    start together change it once, not each in turn)."""
    m = store.tables.message
    stmt = (
        sa.update(m)
        .where(m.c.id == row_id, m.c.state.in_(READY_LITERALS), m.c.payload == was)
        .values(payload=payload, queue=queue, next_attempt_at=next_fire, headers=headers)
    )
    with store.writing() as conn:
        return bool(conn.execute(stmt).rowcount)
