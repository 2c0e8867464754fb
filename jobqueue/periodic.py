"""Periodic tasks: schedules, their fire times, and the never-completing messages that drive them.

A schedule is a cron expression in an IANA timezone (parsed by cronsim, which follows Debian cron
through DST changes: a local time skipped by spring-forward fires just after the change, one repeated
by fall-back fires once, and wildcard-hour expressions keep firing in real time) or a fixed interval.
Times here are naive UTC, like everything stored; the math is pure and takes ``now``.

Each schedule is one message (task ``jobqueue.schedule``, unique key = schedule name) that is never
acked: firing it enqueues the real job and defers the message to the next fire time, in one fenced
transaction (:func:`fire`). Workers create, update and retire the schedule messages when they start
(:func:`sync`), and create again those deleted while they run (:class:`Keeper`).
"""

from __future__ import annotations

import base64
import difflib
import json
import logging
import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

from jobqueue.errors import ConfigurationError
from jobqueue.flow import NO_FLOW
from jobqueue.job import SCHEDULE_PRIORITY, SCHEDULE_TASK, Message, MessageState
from jobqueue.storage import jobs
from jobqueue.storage import schedules as stored

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store
    from jobqueue.task import Task

__all__ = [
    "SCHEDULE_TASK",
    "Keeper",
    "Schedule",
    "ScheduleRow",
    "SyncReport",
    "fire",
    "flow_columns",
    "schedule_rows",
    "sync",
]

logger = logging.getLogger("jobqueue.periodic")

CATCH_UP_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class Schedule:
    """When a task fires: ``cron`` in ``timezone``, or ``every`` fixed interval."""

    name: str
    task_name: str
    cron: str | None = None
    every_seconds: float | None = None
    timezone: str = "UTC"
    queue: str = "default"
    priority: int = 0
    payload: bytes = b""
    tz: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_seconds is None):
            raise ConfigurationError(f"schedule {self.name!r}: give cron= or every=, exactly one")
        if isinstance(self.timezone, ZoneInfo) and self.timezone.key:
            object.__setattr__(self, "timezone", self.timezone.key)  # stored by its name
        object.__setattr__(self, "tz", _zone(self.name, self.timezone))
        if self.cron is not None:
            if not isinstance(self.cron, str):
                raise ConfigurationError(
                    f"schedule {self.name!r}: cron= takes a string such as '*/5 * * * *', "
                    f"got {type(self.cron).__name__} {self.cron!r}"
                )
            try:
                CronSim(self.cron, datetime.now(self.tz))
            except CronSimError as exc:
                raise ConfigurationError(
                    f"schedule {self.name!r}: invalid cron expression {self.cron!r} ({exc}); "
                    "five fields: minute hour day-of-month month day-of-week"
                ) from None
        else:
            self._check_every()

    def _check_every(self) -> None:
        every = self.every_seconds
        if isinstance(every, bool) or not isinstance(every, (int, float)):
            raise ConfigurationError(
                f"schedule {self.name!r}: every= takes a timedelta or a number of seconds, "
                f"got {type(every).__name__} {every!r}"
            )
        try:
            finite = math.isfinite(every)  # an integer too large for a float raises
        except OverflowError:
            finite = True  # and is too long, said below
        if not finite or every <= 0:
            raise ConfigurationError(f"schedule {self.name!r}: every= must be a positive duration, got {every!r}")
        # Fire times are stored to the microsecond: a shorter step would fire one time over and over.
        try:
            step = timedelta(seconds=every)
            datetime.now() + step
        except OverflowError:
            raise ConfigurationError(
                f"schedule {self.name!r}: every={every!r} seconds is too long: its first fire would be "
                "past the year 9999"
            ) from None
        if step < timedelta(microseconds=1):
            raise ConfigurationError(
                f"schedule {self.name!r}: every={every!r} seconds is shorter than a microsecond, the "
                "precision of stored fire times; give a longer interval"
            )

    @property
    def expression(self) -> str:
        """The schedule as people read it: the cron expression, or ``every 300 s``."""
        return self.cron if self.cron is not None else f"every {self.every_seconds:g} s"

    @property
    def description(self) -> str:
        """The schedule in words: "At 09:00 on Monday through Friday (Europe/Paris)", "Every 300 s"."""
        if self.cron is None:
            return f"Every {self.every_seconds:g} s"
        return f"{CronSim(self.cron, datetime.now(self.tz)).explain()} ({self.timezone})"

    # -- fire times (naive UTC in, naive UTC out) --------------------------------------------------
    def first_fire(self, now: datetime) -> datetime:
        """The first fire time of a schedule created at ``now``: an interval later, or the next cron time."""
        return self.next_fire(now)

    def next_fire(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after``."""
        if self.every_seconds is not None:
            return after + timedelta(seconds=self.every_seconds)
        local = after.replace(tzinfo=timezone.utc).astimezone(self.tz)
        return _utc(next(iter(CronSim(self.cron or "", local))))

    def fires(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after``, in order."""
        if self.every_seconds is not None:
            step = timedelta(seconds=self.every_seconds)
            at = after + step
            while True:
                yield at
                at += step
        local = after.replace(tzinfo=timezone.utc).astimezone(self.tz)
        for when in CronSim(self.cron or "", local):
            yield _utc(when)

    def latest_fire(self, scheduled: datetime, now: datetime) -> datetime:
        """The last fire time at or before ``now``, counting from ``scheduled`` (itself a fire time)."""
        if self.every_seconds is not None:
            step = self.every_seconds
            return scheduled + timedelta(seconds=step * ((now - scheduled).total_seconds() // step))
        # The last cron time at or before ``now`` (cronsim walks backwards from just after it).
        local = (now + timedelta(microseconds=1)).replace(tzinfo=timezone.utc).astimezone(self.tz)
        latest = max(_utc(next(iter(CronSim(self.cron or "", local, reverse=True)))), scheduled)
        # Backwards, cronsim reads a local time in the hour repeated when clocks go back as its first
        # occurrence, and can answer a day early: the fires forward from there that are due settle it.
        for later in self.fires(latest):
            if later > now:
                return latest
            latest = later
        return latest

    def to_fire(self, scheduled: datetime, now: datetime, grace_seconds: float) -> datetime:
        """Which fire time a run at ``now`` of the message due at ``scheduled`` stands for.

        A few seconds late (within ``grace_seconds``, which covers a crashed worker's lease running
        out), it is ``scheduled`` itself: every fire time gets its job. Later than that, the workers
        were down: one catch-up run for the latest missed fire, not one per missed fire.
        """
        if (now - scheduled).total_seconds() <= grace_seconds:
            return scheduled
        return self.latest_fire(scheduled, now)

    # -- the stored form ---------------------------------------------------------------------------
    def definition(self) -> dict[str, Any]:
        """What the schedule message stores; comparing it tells whether code changed the schedule."""
        return {
            "name": self.name,
            "task": self.task_name,
            "cron": self.cron,
            "every_seconds": self.every_seconds,
            "timezone": self.timezone,
            "queue": self.queue,
            "priority": self.priority,
            "payload": base64.b64encode(self.payload).decode("ascii"),
        }

    @classmethod
    def from_definition(cls, data: dict[str, Any]) -> Schedule:
        return cls(
            name=data["name"],
            task_name=data["task"],
            cron=data.get("cron"),
            every_seconds=data.get("every_seconds"),
            timezone=data.get("timezone", "UTC"),
            queue=data.get("queue", "default"),
            priority=data.get("priority", 0),
            payload=base64.b64decode(data.get("payload", "")),
        )

    def encode(self) -> bytes:
        return json.dumps(self.definition(), sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, payload: bytes) -> Schedule:
        return cls.from_definition(json.loads(payload))


# Names the zoneinfo database offers that are not one place's time.
_HOSTS_DISAGREE = "workers on hosts set differently would fire the schedule at different times"
HOST_ZONES = {
    "localtime": f"is a link to each host's own /etc/localtime: {_HOSTS_DISAGREE}",
    "posixrules": f"holds each host's default rules for POSIX TZ strings: {_HOSTS_DISAGREE}",
    "factory": "is the placeholder of a host whose timezone was never set, not a place",
}
# Directories of some hosts' zoneinfo database only (the tzdata package has neither): ``right/``
# zones count leap seconds (their times are 27 s off), ``posix/`` ones repeat the plain names.
HOST_ZONE_DIRECTORIES = ("posix/", "right/")
_IANA_EXAMPLE = "an IANA name such as 'Europe/Paris', or 'UTC'"


def _zone(name: str, zone: Any) -> ZoneInfo:
    """The timezone of schedule ``name``, refused unless every worker, on any host, reads it the same."""
    if isinstance(zone, ZoneInfo):  # one with no name: read from a file
        raise ConfigurationError(f"schedule {name!r}: timezone {zone!r} has no name to store; give {_IANA_EXAMPLE}")
    if isinstance(zone, str) and zone.lower() in HOST_ZONES:
        raise ConfigurationError(
            f"schedule {name!r}: timezone {zone!r} {HOST_ZONES[zone.lower()]}; give {_IANA_EXAMPLE}"
        )
    if isinstance(zone, str) and zone.startswith(HOST_ZONE_DIRECTORIES):
        directory, plain = zone.split("/", 1)
        why = ", and its zones count leap seconds (27 s off)" if directory == "right" else ""
        raise ConfigurationError(
            f"schedule {name!r}: timezone {zone!r} is in the {directory}/ directory, which only some hosts' "
            f"zoneinfo database has{why}; give the plain IANA name {plain!r}"
        )
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, TypeError, IsADirectoryError):  # TypeError: None, a number
        close = (
            difflib.get_close_matches(zone, sorted(_place_zones()), n=1, cutoff=0.8) if isinstance(zone, str) else []
        )
        hint = f"did you mean {close[0]!r}? Give" if close else "give"
        raise ConfigurationError(f"schedule {name!r}: unknown timezone {zone!r}; {hint} {_IANA_EXAMPLE}") from None


def _place_zones() -> set[str]:
    return {
        zone
        for zone in available_timezones()
        if zone.lower() not in HOST_ZONES and not zone.startswith(HOST_ZONE_DIRECTORIES)
    }


def _utc(when: datetime) -> datetime:
    return when.astimezone(timezone.utc).replace(tzinfo=None)


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
    name = check_key("schedule name", name or task.name)  # it is its message's unique key
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    try:
        if task.checker is not None:
            task.checker(*args, **dict(kwargs or {}))
    except TypeError as exc:
        raise ConfigurationError(f"@app.periodic(args=, kwargs=) do not fit task {task.name}: {exc}") from None
    task.flow.key_for(tuple(args), dict(kwargs or {}))  # a concurrency_key function that fails, fails here
    payload = dumps_call(app.serializer, tuple(args), dict(kwargs or {}))
    return Schedule(
        name=name,
        task_name=task.name,
        cron=cron,
        every_seconds=seconds,
        timezone=timezone_name,  # type: ignore[arg-type]  # a ZoneInfo is stored by its name
        queue=task.queue,
        priority=task.options.priority,
        payload=payload,
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
    A task this app does not register gets none (its own app's workers would refuse it anyway)."""
    if task is None or not task.flow.enabled:
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
        "headers": {"schedule": schedule.name, "fire_time": when.isoformat()},
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


@dataclass
class SyncReport:
    created: list[str]
    updated: list[str]
    retired: list[str]
    # Held by a delivery (being fired, or by a dead worker until its lease runs out), or changed by
    # another worker meanwhile.
    busy: list[str]
    # A schedule in code that the database takes for another one it holds: {name in code: name stored}.
    clashing: dict[str, str] = field(default_factory=dict)
    # Schedules this code changes or retires that another running worker defined otherwise.
    contested: dict[str, Contest] = field(default_factory=dict)

    def clash_message(self) -> str:
        return (
            "; ".join(
                f"schedule {name!r} is the schedule {other!r} on this database, which compares names regardless "
                "of case and accents (MariaDB's default collation)"
                for name, other in sorted(self.clashing.items())
            )
            + ": give each schedule a name that differs in more than that (@app.periodic(name=...))"
        )


@dataclass(frozen=True)
class Contest:
    """A schedule defined one way by a running worker (``supervisor`` on ``host``), another way by this
    code (``ours``: None where this code has no such schedule)."""

    name: str
    theirs: Schedule | None
    ours: Schedule | None
    supervisor: str
    host: str

    def message(self) -> str:
        def said(schedule: Schedule | None) -> str:
            if schedule is None:
                return "no such schedule"
            return f"{schedule.expression} ({schedule.timezone}) for task {schedule.task_name}"

        other = f"a running worker (supervisor {self.supervisor[:8]} on host {self.host})"
        rename = (
            "If these are two different schedules (two apps on one database), give one of them another name with "
            "@app.periodic(name=...): schedule names are shared by every app on the database"
        )
        if self.ours is None:
            return (
                f"schedule {self.name!r} ({said(self.theirs)}) is not in this app's code, but {other} defines it. "
                "This worker's start retires it, as every worker start retires a schedule removed from its code; "
                f"that worker's next start will create it again. {rename}"
            )
        return (
            f"schedule {self.name!r} is defined differently by {other}: it has {said(self.theirs)}, this app's code "
            f"has {said(self.ours)}. This worker's start applies this code's definition, as every worker start "
            f"does; that worker's next start will apply its own again. {rename}"
        )


def sync(
    store: Store,
    schedules: dict[str, Schedule],
    registered_tasks: set[str],
    now: datetime,
    writer: str | None = None,
    stale_seconds: float = 30.0,
    only: Collection[str] | None = None,
) -> SyncReport:
    """Make the schedule messages match the schedules in code, as supervisor ``writer``.

    A schedule removed from code is retired (archived as cancelled), but only if its task is
    registered here: an application that does not know a task does not get to retire that task's
    schedules. Then a missing schedule is created (first fire: one interval from now, or the next
    cron time), and a changed one gets its new definition and a next fire computed from now. Retiring
    first lets a schedule renamed only in case take the place of its old name on a database that
    compares names regardless of case.

    Every worker start applies its code's definitions, so an edited schedule takes effect at the next
    start. One whose definition another supervisor wrote while its worker processes still beat
    (within ``stale_seconds``) is changed or retired all the same, and reported as contested: two
    apps that define one schedule name differently take it from each other at each start, which
    their operators should hear of. A change is a compare-and-set on the stored definition, so
    workers that start together apply it once.

    ``only`` limits the sync to those schedule names (a running worker looking again at the ones
    that were busy when it started); None syncs them all.
    """
    report = SyncReport([], [], [], [])
    existing = schedule_rows(store)
    if only is not None:
        existing = {name: row for name, row in existing.items() if name in only}
        schedules = {name: schedule for name, schedule in schedules.items() if name in only}
    others = {row.defined_by for row in existing.values() if row.defined_by and row.defined_by != writer}
    running = stored.running_supervisors(store, others, stale_seconds) if writer and others else {}

    def contest(name: str, row: ScheduleRow) -> None:
        """Report ``row`` as contested if it is another running worker's definition."""
        if row.defined_by in running and row.schedule is not None:  # unreadable: whoever reads it, fixes it
            host = running[row.defined_by]
            report.contested[name] = Contest(name, row.schedule, schedules.get(name), row.defined_by, host)

    for name, gone in existing.items():
        if name not in schedules and gone.schedule is not None and gone.schedule.task_name in registered_tasks:
            contest(name, gone)
            if jobs.cancel(store, gone.id, now, headers={stored.RETIRED_HEADER: True}):
                report.retired.append(name)
            else:
                report.busy.append(name)
    for name, schedule in schedules.items():
        row = existing.get(name)
        if row is None:
            if stored.insert_schedule(store, message_row(schedule, schedule.first_fire(now), now, writer)):
                report.created.append(name)
                continue
            holder = stored.schedule_holding(store, name)
            if holder in report.busy:
                report.busy.append(name)  # its old spelling, retired once its lease runs out
            elif holder is not None and holder != name:
                report.clashing[name] = holder
            elif holder == name:
                report.busy.append(name)  # created by another worker meanwhile: compared on the next look
        elif row.schedule is None or row.schedule.definition() != schedule.definition():
            contest(name, row)
            headers = message_headers(schedule, writer)
            if stored.update_schedule(
                store, row.id, schedule.encode(), schedule.queue, schedule.first_fire(now), headers, row.payload
            ):
                report.updated.append(name)
            else:
                report.busy.append(name)
    return report


@dataclass
class Keeper:
    """Keeps the schedule messages of an app's schedules while its worker runs.

    A schedule message deleted (a ``DELETE`` by hand, ``jobqueue jobs cancel``, a message failed as
    unreadable) is created again, its first fire counted from then, as when a worker first creates
    it: fire times that came due while it was missing are not made up. One retired by another worker,
    whose code no longer defines the schedule (a newer release rolling out), stays retired: the
    worker has the last word. Each check looks the schedules up by name on the unique index, so it
    costs the same whatever the backlog; any number of workers may run it at once, the unique index
    lets one of them create each message.
    """

    schedules: dict[str, Schedule]
    writer: str | None = None  # the supervisor that runs it
    seen: dict[str, int] = field(default_factory=dict)  # name: id of its message when last seen
    retired: set[str] = field(default_factory=set)  # retired by another worker since this one started

    def check(self, store: Store, now: datetime) -> tuple[list[str], list[str]]:
        """Create the missing schedule messages; (those created, those newly found retired)."""
        found = stored.schedule_ids(store, self.schedules)
        self.retired -= found.keys()  # created again (by a worker of a release that has it again)
        missing = [name for name in self.schedules if name not in found and name not in self.retired]
        gone = {name: self.seen[name] for name in missing if name in self.seen}
        retired = stored.retired_schedules(store, gone) if gone else set()
        self.retired |= retired
        created = []
        for name in missing:
            schedule = self.schedules[name]
            if name not in retired and stored.insert_schedule(
                store, message_row(schedule, schedule.first_fire(now), now, self.writer)
            ):
                created.append(name)
        self.seen = found
        return created, sorted(retired)


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
