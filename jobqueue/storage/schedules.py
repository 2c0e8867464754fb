"""Schedule messages in the database: create, update, retire, and fire them (fenced)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.job import Message, MessageState
from jobqueue.periodic import SCHEDULE_PRIORITY, SCHEDULE_TASK, Schedule, fire_key
from jobqueue.storage.dialects.base import PROCESSING, READY_LITERALS
from jobqueue.storage.store import Store


@dataclass(frozen=True)
class ScheduleRow:
    id: int
    name: str
    state: str
    next_fire: datetime
    checkpoint: bytes | None
    schedule: Schedule | None  # None when the stored definition cannot be read


def schedule_rows(store: Store) -> dict[str, ScheduleRow]:
    """The active schedule messages by schedule name."""
    m = store.tables.message
    stmt = sa.select(m.c.id, m.c.unique_key, m.c.state, m.c.next_attempt_at, m.c.checkpoint, m.c.payload).where(
        m.c.task_name == SCHEDULE_TASK)
    rows: dict[str, ScheduleRow] = {}
    with store.reading() as conn:
        for row in conn.execute(stmt):
            try:
                schedule: Schedule | None = Schedule.decode(row.payload)
            except Exception:  # written by another version, or damaged: still listed, never fired
                schedule = None
            rows[row.unique_key] = ScheduleRow(row.id, row.unique_key, row.state, row.next_attempt_at,
                                               row.checkpoint, schedule)
    return rows


def schedule_message_row(schedule: Schedule, first_fire: datetime, now: datetime) -> dict[str, Any]:
    return {
        "task_name": SCHEDULE_TASK, "queue": schedule.queue, "priority": SCHEDULE_PRIORITY,
        "state": MessageState.PENDING.value, "payload": schedule.encode(), "headers": {"schedule": schedule.name},
        "unique_key": schedule.name, "partition_key": None, "options": None, "attempts_count": 0,
        "deliveries_count": 0, "created_at": now, "next_attempt_at": first_fire,
    }


def insert_schedule(store: Store, schedule: Schedule, first_fire: datetime, now: datetime) -> bool:
    """Create the schedule's message unless one exists; True if this call created it.

    Any number of workers may race here: the unique index lets exactly one insert win. MySQL cannot
    say which (with CLIENT_FOUND_ROWS a no-op duplicate also reports one row), so the row carries a
    random marker and the winner is the one that reads its own marker back.
    """
    marker = uuid.uuid4().hex
    row = schedule_message_row(schedule, first_fire, now)
    row["headers"] = {"schedule": schedule.name, "created_by": marker}
    m = store.tables.message
    with store.writing() as conn:
        row_id = store.dialect_of(conn).insert_unique(conn, row)
        if row_id is None:
            return False
        headers = conn.execute(sa.select(m.c.headers).where(m.c.id == row_id)).scalar() or {}
    return bool(headers.get("created_by") == marker)


def update_schedule(store: Store, row_id: int, schedule: Schedule, next_fire: datetime) -> bool:
    """Store a changed definition and its new next fire; False while a worker is firing it."""
    m = store.tables.message
    stmt = (sa.update(m).where(m.c.id == row_id, m.c.state.in_(READY_LITERALS))
            .values(payload=schedule.encode(), queue=schedule.queue, next_attempt_at=next_fire))
    with store.writing() as conn:
        return bool(conn.execute(stmt).rowcount)


def fire_schedule(store: Store, message: Message, schedule: Schedule, fire: datetime, next_fire: datetime,
                  state: bytes, now: datetime) -> bool:
    """Enqueue the job for ``fire`` and defer the schedule message to ``next_fire``, in one transaction.

    Fenced like every outcome: nothing happens unless this delivery still holds the message. The
    job's unique key (schedule name and fire time) makes a second job for the same fire impossible
    while the first is active.
    """
    m = store.tables.message
    job = {
        "task_name": schedule.task_name, "queue": schedule.queue, "priority": schedule.priority,
        "state": MessageState.PENDING.value,
        "payload": schedule.payload, "headers": {"schedule": schedule.name, "fire_time": fire.isoformat()},
        "unique_key": fire_key(schedule.name, fire), "partition_key": None, "options": None,
        "attempts_count": 0, "deliveries_count": 0, "created_at": now, "next_attempt_at": now,
    }
    with store.writing() as conn:
        if not store.dialect.lock_held(conn, [(message.id, message.lease_token)]):
            return False
        store.insert_unique(conn, store.dialect, job)
        conn.execute(
            sa.update(m).where(m.c.id == message.id, m.c.lease_token == message.lease_token, m.c.state == PROCESSING)
            .values(state=MessageState.PENDING.value, next_attempt_at=next_fire, deliveries_count=0,
                    checkpoint=state, worker_id=None, lease_token=None, acquired_at=None, lease_expires_at=None))
    return True


@dataclass
class SyncReport:
    created: list[str]
    updated: list[str]
    retired: list[str]
    busy: list[str]  # being fired right now: their change applies at the next start


def sync(store: Store, schedules: dict[str, Schedule], registered_tasks: set[str], now: datetime) -> SyncReport:
    """Make the schedule messages match the schedules in code.

    A missing schedule is created (first fire: one interval from now, or the next cron time); a
    changed one gets its new definition and a next fire computed from now; one removed from code is
    retired (archived as cancelled), but only if its task is registered here: an application that
    does not know a task does not get to retire that task's schedules.
    """
    from jobqueue.storage import jobs

    report = SyncReport([], [], [], [])
    existing = schedule_rows(store)
    for name, schedule in schedules.items():
        row = existing.pop(name, None)
        if row is None:
            if insert_schedule(store, schedule, schedule.first_fire(now), now):
                report.created.append(name)
        elif row.schedule is None or row.schedule.definition() != schedule.definition():
            if update_schedule(store, row.id, schedule, schedule.first_fire(now)):
                report.updated.append(name)
            else:
                report.busy.append(name)
    for name, row in existing.items():
        if row.schedule is not None and row.schedule.task_name in registered_tasks:
            if jobs.cancel(store, row.id, now):
                report.retired.append(name)
            else:
                report.busy.append(name)
    return report
