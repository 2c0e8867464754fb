"""Making the schedule messages match an app's code: at a worker's start (:func:`sync`), and
while it runs, creating again those deleted by hand (:class:`Keeper`). What a schedule is is
``jobqueue.schedule_times``'s, and how it fires ``jobqueue.periodic``'s."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobqueue.periodic import ScheduleRow, message_headers, message_row, schedule_rows
from jobqueue.schedule_times import Schedule
from jobqueue.storage import jobs
from jobqueue.storage import schedules as stored

if TYPE_CHECKING:
    from jobqueue.storage.store import Store


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
                f"schedule {name!r} is the schedule {other!r} on this database, whose message table compares "
                "unique keys regardless of case or accents (a collation changed by hand from the binary one "
                "jobqueue gives the unique_key column)"
                for name, other in sorted(self.clashing.items())
            )
            + ": give the column its binary collation back (as `jobqueue db init` creates it), or give each "
            "schedule a name that differs in more than that (@app.periodic(name=...))"
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
        elif row.schedule is not None and _apart_from_flow(row.schedule) == _apart_from_flow(schedule):
            if row.schedule.flow != schedule.flow:
                # Only the flow columns stored with it differ (stored by an earlier release without
                # them, or a changed limit): stored quietly, its next fire and its writer kept.
                headers = message_headers(schedule, row.defined_by)
                stored.update_schedule(
                    store, row.id, schedule.encode(), schedule.queue, row.next_fire, headers, row.payload
                )
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


def _apart_from_flow(schedule: Schedule) -> dict[str, Any]:
    """What makes a schedule fire when it does, and what: its definition but the flow columns."""
    definition = schedule.definition()
    definition.pop("flow", None)
    return definition
