"""``jobqueue topics``: each topic's consumer groups, how far behind they are, and their dead letters."""

from __future__ import annotations

import sys

import click

from jobqueue.cli.output import echo_json, print_table
from jobqueue.cli.state import UTF8_TEXT, CliState

COLUMNS = ["topic", "group", "lag", "in_flight", "retrying", "dead_letters", "oldest_unfinished_seconds", "kept"]


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def topics(ctx: click.Context, as_json: bool) -> None:
    """Per topic and consumer group: lag (messages not finished yet), in flight, retrying, dead
    letters, the oldest unfinished message's age, and how many messages the topic's log keeps.

    A group's dead letters are jobs of its queue (topic:<topic>:<group>) in the archive: list them
    with `jobqueue jobs list --state failed --queue topic:<topic>:<group>` and retry them with
    `jobqueue jobs retry`.
    """
    if ctx.invoked_subcommand is not None:
        return
    state: CliState = ctx.obj
    rows = state.app.topic_store.stats()
    if as_json:
        echo_json(rows)
        return
    print_table(rows, COLUMNS, empty="no topics")


@topics.command("drop-group")
@click.argument("topic", type=UTF8_TEXT)
@click.argument("group", type=UTF8_TEXT)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def drop_group(state: CliState, topic: str, group: str, yes: bool) -> None:
    """Remove GROUP from TOPIC: it gets no more messages, its deliveries are deleted (one running
    now finishes, and is neither retried nor delivered again), and the log no longer keeps
    messages for it. A worker that still runs the group adds it again when it starts, from
    where the group's start= says: "latest", the next message published; "earliest", every
    message the log still holds (which runs again those the group had run)."""
    missing = click.ClickException(f"topic {topic!r} has no group {group!r}; `jobqueue topics` lists them")
    if not yes:
        if not any(row["topic"] == topic and row["group"] == group for row in state.app.topic_store.stats()):
            raise missing
        what = f"group {group!r} of topic {topic!r} and delete its waiting deliveries"
        if not sys.stdin.isatty():
            raise click.UsageError(f"drop-group would drop {what}; add --yes to confirm")
        click.confirm(f"Drop {what}?", abort=True, err=True)
    deleted = state.app.topic_store.drop(topic, group)
    if deleted < 0:
        raise missing
    deliveries = "1 waiting delivery" if deleted == 1 else f"{deleted} waiting deliveries"
    click.echo(f"dropped group {group!r} of topic {topic!r}; {deliveries} deleted")
