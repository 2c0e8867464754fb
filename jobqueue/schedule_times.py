"""A schedule and its fire times: when a periodic task fires, checked when it is defined.

A schedule is a cron expression in an IANA timezone (parsed by cronsim, which follows Debian cron
through DST changes: a local time skipped by spring-forward fires just after the change, one repeated
by fall-back fires once, and wildcard-hour expressions keep firing in real time) or a fixed interval.
Times here are naive UTC, like everything stored; the math is pure and takes ``now``.
"""

from __future__ import annotations

import base64
import difflib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

from jobqueue.errors import ConfigurationError

CATCH_UP_GRACE_SECONDS = 60.0


# cron's nicknames, as Vixie cron and Celery's users write them.
CRON_NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _cron_hint(expression: str) -> str:
    """What a valid expression looks like, with what this one seems to have come from."""
    fields = "five fields: minute hour day-of-month month day-of-week (or six, seconds first)"
    nicknames = ", ".join(CRON_NICKNAMES)
    if expression.strip().lower() == "@reboot":
        return f"a schedule has no reboot to fire at; run the job from your deployment instead, or give {fields}"
    if expression.startswith("@"):
        return f"the nicknames are {nicknames}; or give {fields}"
    if "?" in expression:
        return f"'?' is Quartz's, not cron's: write '*' for the day you leave open; {fields}"
    return f"{fields}, or one of {nicknames}"


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
    # The flow columns (concurrency key and limits) its jobs get, as the app that defined it computed
    # them: a worker of another release, which does not know the task, fires it with these.
    flow: dict[str, Any] | None = field(default=None, hash=False)
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
            nickname = CRON_NICKNAMES.get(self.cron.strip().lower())
            if nickname is not None:
                object.__setattr__(self, "cron", nickname)  # stored as cron reads it: "@hourly" is "0 * * * *"
            try:
                CronSim(self.cron, datetime.now(self.tz))
            except CronSimError as exc:
                raise ConfigurationError(
                    f"schedule {self.name!r}: invalid cron expression {self.cron!r} ({exc}); {_cron_hint(self.cron)}"
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
            **({"flow": self.flow} if self.flow else {}),
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
            flow=_stored_flow(data.get("flow")),
        )

    def encode(self) -> bytes:
        return json.dumps(self.definition(), sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, payload: bytes) -> Schedule:
        return cls.from_definition(json.loads(payload))


FLOW_COLUMNS = frozenset({"flow_key", "concurrency_limit", "rate_interval_us"})


def _stored_flow(flow: Any) -> dict[str, Any] | None:
    """A stored definition's flow columns, refused unless they are those columns."""
    if flow is not None and (not isinstance(flow, dict) or set(flow) != FLOW_COLUMNS):
        raise ValueError(f"its flow columns are not {sorted(FLOW_COLUMNS)}: {flow!r}")
    return flow


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
