"""Periodic tasks: their schedules, made by ``@app.periodic``, and the messages that drive them.

What a schedule is and when it fires is ``jobqueue.schedule_times``'s (``Schedule`` is importable
from here too).

Each schedule is one message (task ``jobqueue.schedule``, unique key = schedule name) that is never
acked: firing it enqueues the real job and defers the message to the next fire time, in one fenced
transaction (:func:`fire`). Workers create, update and retire the schedule messages when they start
(see ``jobqueue.schedule_sync``), and create again those deleted while they run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from jobqueue.errors import ConfigurationError
from jobqueue.flow import NO_FLOW
from jobqueue.job import SCHEDULE_PRIORITY, SCHEDULE_TASK, Message, MessageState
from jobqueue.schedule_times import Schedule
from jobqueue.storage import schedules as stored

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store
    from jobqueue.task import Task

__all__ = [
    "SCHEDULE_TASK",
    "Schedule",
    "ScheduleRow",
    "fire",
    "flow_columns",
    "schedule_rows",
]

logger = logging.getLogger("jobqueue.periodic")

MAX_SCHEDULE_NAME = 200  # its jobs' unique keys add "@" and the fire time (255 in all)


def fire_key(name: str, fire: datetime) -> str:
    """The unique key of the job a schedule enqueues for one fire time."""
    return f"{name}@{fire.isoformat()}"


def schedule_state(checkpoint: bytes | None) -> dict[str, Any]:
    return json.loads(checkpoint) if checkpoint else {}


def encode_state(last_fire: datetime) -> bytes:
    return json.dumps({"last_fire": last_fire.isoformat()}).encode("utf-8")


def make_schedule(
    app: JobQueue,
    task: Task,
    cron: str | None,
    every: timedelta | float | None,
    timezone_name: str | ZoneInfo,
    name: str | None,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any] | None,
) -> Schedule:
    """Build and check a task's schedule when ``@app.periodic`` runs (errors surface at import)."""
    from jobqueue.serialization import dumps_call
    from jobqueue.task import Task as TaskClass
    from jobqueue.task import check_key

    if not isinstance(task, TaskClass):
        raise ConfigurationError("@app.periodic goes above @app.task: it schedules a task, not a plain function")
    # Its message's unique key; its jobs' keys add "@" and the fire time.
    name = check_key("schedule name", name or task.name, longest=MAX_SCHEDULE_NAME)
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    try:
        if task.checker is not None:
            task.checker(*args, **dict(kwargs or {}))
    except TypeError as exc:
        raise ConfigurationError(f"@app.periodic(args=, kwargs=) do not fit task {task.name}: {exc}") from None
    key = task.flow.key_for(tuple(args), dict(kwargs or {}))  # a concurrency_key function that fails, fails here
    payload = dumps_call(app.serializer, tuple(args), dict(kwargs or {}))
    flow = task.flow.columns(key) if task.flow.enabled else None
    return Schedule(
        name=name,
        task_name=task.name,
        cron=cron,
        every_seconds=seconds,
        timezone=timezone_name,  # type: ignore[arg-type]  # a ZoneInfo is stored by its name
        queue=task.queue,
        priority=task.options.priority,
        payload=payload,
        flow=flow if flow and flow != NO_FLOW else None,
    )


# -- schedule messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleRow:
    id: int
    name: str
    state: str
    next_fire: datetime
    checkpoint: bytes | None
    schedule: Schedule | None  # None when the stored definition cannot be read
    defined_by: str | None = None  # the supervisor that created it or last changed its definition
    payload: bytes = b""  # the stored definition, as stored


def schedule_rows(store: Store) -> dict[str, ScheduleRow]:
    """The active schedule messages by schedule name, their definitions read back."""
    rows: dict[str, ScheduleRow] = {}
    for row in stored.schedule_messages(store):
        try:
            schedule: Schedule | None = Schedule.decode(row.payload)
        except Exception:  # written by another version, or damaged: still listed, never fired
            schedule = None
        rows[row.name] = ScheduleRow(
            row.id, row.name, row.state, row.next_fire, row.checkpoint, schedule, row.defined_by, row.payload
        )
    return rows


def message_headers(schedule: Schedule, writer: str | None) -> dict[str, Any]:
    """A schedule message's headers: its schedule's name, and the supervisor that wrote its definition."""
    return {"schedule": schedule.name, **({stored.WRITER_HEADER: writer} if writer else {})}


def message_row(schedule: Schedule, first_fire: datetime, now: datetime, writer: str | None = None) -> dict[str, Any]:
    """The never-completing message that drives ``schedule``, written by the supervisor ``writer``."""
    return {
        "task_name": SCHEDULE_TASK,
        "queue": schedule.queue,
        "priority": SCHEDULE_PRIORITY,
        "state": MessageState.PENDING.value,
        "payload": schedule.encode(),
        "headers": message_headers(schedule, writer),
        "unique_key": schedule.name,
        "partition_key": None,
        "options": None,
        "attempts_count": 0,
        "deliveries_count": 0,
        "created_at": now,
        "next_attempt_at": first_fire,
    }


def flow_columns(task: Task | None, schedule: Schedule) -> dict[str, Any]:
    """The flow columns (concurrency key and limits) of the jobs ``schedule`` enqueues for ``task``,
    as ``delay()`` would give them: a task with ``concurrency_limit=1`` never runs two fires at once.
    A task this app does not register (another release's, while two run) gets those the app that
    defined the schedule stored with it."""
    if task is None:
        return dict(schedule.flow) if schedule.flow else NO_FLOW
    if not task.flow.enabled:
        return NO_FLOW
    from jobqueue.serialization import loads_call

    args, kwargs = loads_call(task.app.serializer, schedule.payload)
    return task.flow.columns(task.flow.key_for(args, kwargs))


def fire(
    store: Store,
    message: Message,
    schedule: Schedule,
    when: datetime,
    next_fire: datetime,
    now: datetime,
    flow: dict[str, Any] = NO_FLOW,
) -> bool:
    """Enqueue the job for fire time ``when`` (with the flow columns ``flow``) and defer the schedule
    message to ``next_fire``, fenced; False if this delivery no longer holds the message."""
    job = {
        "task_name": schedule.task_name,
        "queue": schedule.queue,
        "priority": schedule.priority,
        "state": MessageState.PENDING.value,
        "payload": schedule.payload,
        "headers": {"schedule": schedule.name, "fire_time": when.replace(tzinfo=timezone.utc).isoformat()},
        "unique_key": fire_key(schedule.name, when),
        "partition_key": None,
        **flow,
        "options": None,
        "attempts_count": 0,
        "deliveries_count": 0,
        "created_at": now,
        "next_attempt_at": now,
    }
    return store.fire_schedule(message, job, next_fire, encode_state(when))


def schedule_message_contents(serializer: Any, payload: bytes) -> dict[str, Any]:
    """What a schedule message holds, for people: its schedule, and the arguments of the job it
    fires (a part that cannot be read is a ``<cannot decode: ...>`` string)."""
    from jobqueue.serialization import loads_call

    try:
        schedule = Schedule.decode(payload)
    except Exception as exc:
        return {"schedule": f"<cannot decode: {exc}>"}
    found: dict[str, Any] = {
        "schedule": {
            "name": schedule.name,
            "task": schedule.task_name,
            "expression": schedule.expression,
            "timezone": schedule.timezone,
        }
    }
    try:
        found["args"], found["kwargs"] = loads_call(serializer, schedule.payload)
    except Exception as exc:
        found["args"] = found["kwargs"] = f"<cannot decode: {exc}>"
    return found
