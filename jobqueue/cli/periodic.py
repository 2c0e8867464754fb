"""``jobqueue periodic``: the schedules, with their next and last fire times."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import click

from jobqueue.cli.output import echo_json, print_table
from jobqueue.cli.state import CliState, Group
from jobqueue.periodic import schedule_rows, schedule_state
from jobqueue.storage.readable import Unreadable


@click.group(cls=Group)
def periodic() -> None:
    """Periodic tasks (schedules are created by workers when they start)."""


def _last_fire(checkpoint: bytes | None) -> datetime | str | None:
    """When the schedule last fired, as its message's state records it; a state that cannot be
    read (edited by hand) is shown as it is stored."""
    try:
        last = schedule_state(checkpoint).get("last_fire")
        return datetime.fromisoformat(last) if last else None
    except (ValueError, TypeError, AttributeError):
        return str(Unreadable(checkpoint))


def _local(when: datetime | str | None, zone: str) -> str | None:
    if when is None or isinstance(when, str):
        return when
    local = when.replace(tzinfo=timezone.utc).astimezone(ZoneInfo(zone))
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


@periodic.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in UTC, ISO 8601).")
@click.pass_obj
def list_(state: CliState, /, as_json: bool) -> None:
    """Every schedule: its task, expression in words, timezone, next and last fire (in its own timezone)."""
    app = state.app
    rows = schedule_rows(app.store)
    out: list[dict[str, Any]] = []
    for name in sorted(set(rows) | set(app.schedules)):
        row = rows.get(name)
        schedule = (row.schedule if row is not None else None) or app.schedules.get(name)
        last_fire = _last_fire(row.checkpoint) if row is not None else None
        if row is None:
            status = "not created yet (a worker creates it when it starts)"
        elif name not in app.schedules and app.schedules:
            # Retired by a worker only when that worker knows its task; a renamed or deleted task's
            # schedule would fire jobs nobody runs until retired by hand.
            status = f"not in this app's code: if no other app defines it, `jobqueue jobs cancel {row.id}` retires it"
        else:
            status = "firing" if row.state == "PROCESSING" else "scheduled"
        out.append(
            {
                "id": row.id if row is not None else None,
                "name": name,
                "task": schedule.task_name if schedule else None,
                "expression": schedule.expression if schedule else None,
                "description": schedule.description if schedule else None,
                "timezone": schedule.timezone if schedule else None,
                "next_fire": row.next_fire if row is not None else None,
                "last_fire": last_fire,
                "status": status,
            }
        )
    if as_json:
        echo_json(out)
        return
    for entry in out:
        zone = entry["timezone"] or "UTC"
        entry["next_fire"] = _local(entry["next_fire"], zone)
        entry["last_fire"] = _local(entry["last_fire"], zone)
    print_table(
        out,
        ["name", "task", "expression", "description", "next_fire", "last_fire", "status"],
        empty="no schedules: define them with @app.periodic above @app.task",
    )
