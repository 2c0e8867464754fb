"""``jobqueue status`` and ``jobqueue workers``: what is queued, what has ended, who is working."""

from __future__ import annotations

import click

from jobqueue.cli.output import echo_json, table
from jobqueue.cli.state import CliState
from jobqueue.storage import jobs, waiting


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(state: CliState, as_json: bool) -> None:
    """Messages per queue and state, the oldest ready message's age, keys that hold jobs back,
    archive totals and live workers."""
    store = state.app.store
    queues = jobs.queue_counts(store)
    archive = jobs.archive_counts(store)
    workers = jobs.live_workers(store)
    keys = waiting.blocked_keys(store)
    if as_json:
        echo_json({"queues": queues, "archive": archive, "workers": len(workers), "held_keys": keys})
        return
    click.echo(
        table(
            queues, ["queue", "pending", "processing", "retryable", "oldest_ready_seconds"], empty="no active messages"
        )
    )
    if keys:
        click.echo("")
        click.echo("jobs held back by their keys (the most waiting first):")
        click.echo(table(keys, ["kind", "key", "waiting", "reason"]))
    click.echo("")
    totals = ", ".join(f"{state_name} {count}" for state_name, count in sorted(archive.items())) or "empty"
    click.echo(f"archive: {totals}")
    click.echo(f"live worker processes: {len(workers)}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def workers(state: CliState, as_json: bool) -> None:
    """Live worker processes: host, pid, queues, the job each runs (and since when), jobs done, last heartbeat."""
    rows = jobs.live_workers(state.app.store)
    if as_json:
        echo_json(rows)
        return
    click.echo(
        table(
            rows,
            ["hostname", "pid", "queues", "running_job_id", "running_since", "jobs_done", "heartbeat_at", "version"],
            empty="no live worker processes",
        )
    )
