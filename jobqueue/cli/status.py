"""``jobqueue status``, ``jobqueue workers`` and ``jobqueue health``: what is queued, who is
working, and whether this deployment is alive (for container probes)."""

from __future__ import annotations

import time
from typing import Any

import click
import sqlalchemy as sa

from jobqueue.cli.output import console, echo_json, print_table, shown_key
from jobqueue.cli.state import CliState, FiniteSeconds, mask_secrets
from jobqueue.errors import JobQueueError
from jobqueue.runtime.oscalls import host_name
from jobqueue.storage import jobs, waiting
from jobqueue.storage.dialects.connector import first_line

QUEUE_COLUMNS = ["queue", *jobs.QUEUE_STATES, "oldest_ready_seconds"]
WORKER_COLUMNS = [
    "hostname",
    "pid",
    "queues",
    "status",
    "running_job_id",
    "running_seconds",
    "jobs_done",
    "heartbeat_age_seconds",
]


def status_data(state: CliState) -> dict[str, Any]:
    app = state.app
    store = app.store
    workers = jobs.worker_rows(store, app.settings.worker_stale_after)
    return {
        "queues": jobs.queue_counts(store),
        "archive": jobs.archive_counts(store),
        "workers": sum(not row["stale"] for row in workers),
        "stale_workers": sum(row["stale"] for row in workers),
        "held_keys": waiting.blocked_keys(store),
    }


def _print_status(data: dict[str, Any]) -> None:
    out = console()
    print_table(data["queues"], QUEUE_COLUMNS, empty="no active messages")
    unknown = sum(row.get(jobs.UNKNOWN_STATE, 0) for row in data["queues"])
    if unknown:
        out.print(
            f"{unknown} job(s) in a state jobqueue does not know (edited by hand?), which no worker runs: "
            "`jobqueue jobs list --state unknown` lists them; set their state to PENDING to run them"
        )
    if data["held_keys"]:
        out.print("")
        out.print("jobs held back by their keys (the most waiting first):")
        held = [{**row, "key": shown_key(row["key"])} for row in data["held_keys"]]
        print_table(held, ["kind", "key", "waiting", "reason"])
    out.print("")
    totals = ", ".join(f"{name} {count}" for name, count in sorted(data["archive"].items()) if count) or "empty"
    out.print(f"archive: {totals}")
    stale = f" ({data['stale_workers']} stale: see `jobqueue workers`)" if data["stale_workers"] else ""
    out.print(f"live worker processes: {data['workers']}{stale}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("-w", "--watch", is_flag=True, help="Refresh until interrupted (Ctrl-C).")
@click.option("--interval", default=2.0, show_default=True, type=FiniteSeconds(0.2), help="Seconds between refreshes.")
@click.pass_obj
def status(state: CliState, as_json: bool, watch: bool, interval: float) -> None:
    """Per queue: ready (due, waiting for a worker), scheduled (waiting for their time), processing,
    retrying (waiting for their next attempt) and failed (dead letters in the archive), with the
    oldest ready job's age; keys that hold jobs back; archive totals; live worker processes."""
    if not watch:
        data = status_data(state)
        echo_json(data) if as_json else _print_status(data)
        return
    if as_json:
        raise click.UsageError("--watch is for people; for scripts, run `jobqueue status --json` as often as needed")
    out = console()
    try:
        while True:
            data = status_data(state)
            out.clear()
            out.print(f"jobqueue status, every {interval:g} s (Ctrl-C to stop)\n")
            _print_status(data)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--prune", is_flag=True, help="Delete the rows of stale worker processes.")
@click.pass_obj
def workers(state: CliState, as_json: bool, prune: bool) -> None:
    """Each worker process: host, pid, queues, busy (with which job, for how long) or idle, jobs
    done, seconds since its last heartbeat. A process whose heartbeat is older than its lease
    (release_stuck_timeout) is stale: its supervisor was killed or lost the database. Live
    supervisors delete stale rows after a while; --prune deletes them now."""
    app = state.app
    stale_after = app.settings.worker_stale_after
    rows = jobs.worker_rows(app.store, stale_after)
    for row in rows:
        row["status"] = "stale" if row["stale"] else "busy" if row["running_job_id"] is not None else "idle"
    pruned = app.store.prune_workers(stale_after) if prune else 0
    if as_json:
        echo_json({"workers": rows, "pruned": pruned} if prune else rows)
        return
    print_table(rows, WORKER_COLUMNS, empty="no worker processes")
    if prune:
        console().print(f"pruned {pruned} stale worker process row(s)")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--max-heartbeat-age",
    type=FiniteSeconds(0),
    default=None,
    help="Seconds a heartbeat may be old [default: the lease, release_stuck_timeout].",
)
@click.option("--this-host", is_flag=True, help="Require a live worker process on this host (a container's own probe).")
@click.option("--no-workers", is_flag=True, help="Check only the database and the schema (a web process's probe).")
@click.pass_obj
def health(state: CliState, as_json: bool, max_heartbeat_age: float | None, this_host: bool, no_workers: bool) -> None:
    """Exit 0 when the database answers, the schema is current and a worker process's heartbeat is
    fresh; else exit 1, saying which check failed. For container liveness and readiness probes."""
    app = state.app
    checks: list[dict[str, Any]] = []

    def check(name: str, probe: Any) -> bool:
        started = time.monotonic()
        try:
            detail = probe()
            ok = True
        except Exception as exc:  # a probe reports every failure, whatever raised it
            detail = first_line(exc)  # a driver's error: its first line, and what it means
            explained = app.store.explain(exc) if isinstance(exc, sa.exc.DBAPIError) else None
            if explained:
                detail += f": {explained}"
            detail = mask_secrets(detail, click.get_current_context())
            ok = False
        checks.append({"check": name, "ok": ok, "detail": detail, "ms": round((time.monotonic() - started) * 1000, 1)})
        return ok

    def fresh_worker() -> str:
        limit = max_heartbeat_age if max_heartbeat_age is not None else app.settings.worker_stale_after
        host = host_name() if this_host else None
        rows = [r for r in jobs.worker_rows(app.store, limit) if host is None or r["hostname"] == host]
        live = [r for r in rows if not r["stale"]]
        where = f" on {host}" if host else ""
        if not live:
            newest = min((r["heartbeat_age_seconds"] for r in rows), default=None)
            seen = f"; the newest heartbeat{where} is {newest:.0f} s old" if newest is not None else ""
            raise JobQueueError(f"no worker process{where} has a heartbeat under {limit:g} s old{seen}")
        return f"{len(live)} live worker process(es){where}"

    def answers() -> str:
        app.store.ping()
        return "answers"

    def current() -> str:
        app.check_schema(beyond_tables=False)  # a worker runs without the trigger too
        return "current"

    if check("database", answers) and check("schema", current):
        if not no_workers:
            check("workers", fresh_worker)
    healthy = all(c["ok"] for c in checks) and len(checks) == (2 if no_workers else 3)
    if as_json:
        echo_json({"healthy": healthy, "checks": checks})
    else:
        for c in checks:
            click.echo(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']}: {c['detail']}")
    raise SystemExit(0 if healthy else 1)
