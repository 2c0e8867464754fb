"""``jobqueue db``: create, upgrade and check the tables."""

from __future__ import annotations

import click

from jobqueue.cli.state import CliState, Group
from jobqueue.storage.engine import mask_url
from jobqueue.storage.tables import SCHEMA_VERSION


@click.group(cls=Group)
def db() -> None:
    """Create, upgrade and check the jobqueue tables."""


@db.command("init")
@click.pass_obj
def init(state: CliState) -> None:
    """Create the tables if they are missing (safe to run again)."""
    app = state.app
    click.echo(f"{app.init_schema()} in {mask_url(app.database_url)}")


@db.command("upgrade")
@click.option("--dry-run", is_flag=True, help="Print the SQL it would run, and change nothing.")
@click.pass_obj
def upgrade(state: CliState, dry_run: bool) -> None:
    """Bring the tables of an older release to this one's schema, jobs and archive kept.

    Safe with workers of the older release still running; restart them on this release after.
    """
    app = state.app
    try:
        statements = app.upgrade_schema(dry_run=dry_run)
    except KeyboardInterrupt:
        click.echo(
            "\ninterrupted: the steps done so far are kept; run `jobqueue db upgrade` again to finish "
            "(a step cut off midway is done again)",
            err=True,
        )
        raise SystemExit(130) from None
    for statement in statements:
        click.echo(statement)
    if not statements:
        click.echo(f"jobqueue schema {SCHEMA_VERSION} is up to date in {mask_url(app.database_url)}")
    elif not dry_run:
        click.echo(f"upgraded to jobqueue schema {SCHEMA_VERSION} in {mask_url(app.database_url)}")


@db.command("check")
@click.pass_obj
def check(state: CliState) -> None:
    """Exit 0 if the tables exist at this release's version; else say what to run, and exit 1."""
    state.app.check_schema()
    click.echo(f"jobqueue schema {SCHEMA_VERSION} is up to date")
