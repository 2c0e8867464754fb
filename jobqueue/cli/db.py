"""``jobqueue db``: create and check the tables."""

from __future__ import annotations

import click

from jobqueue.cli.state import CliState, Group
from jobqueue.storage.engine import mask_url


@click.group(cls=Group)
def db() -> None:
    """Create and check the jobqueue tables."""


@db.command("init")
@click.pass_obj
def init(state: CliState) -> None:
    """Create the tables if they are missing (safe to run again)."""
    app = state.app
    click.echo(f"{app.init_schema()} in {mask_url(app.database_url)}")


@db.command("check")
@click.pass_obj
def check(state: CliState) -> None:
    """Exit 0 if the tables exist at this release's version, else say what to run."""
    state.app.check_schema()
    click.echo("jobqueue schema is up to date")
