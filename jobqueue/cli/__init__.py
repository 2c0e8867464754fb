"""The ``jobqueue`` command: parse options, build settings, call the library. Nothing else."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import click

from jobqueue.cli.state import CliState, Group

if TYPE_CHECKING:
    from jobqueue.app import JobQueue


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "-A",
    "--app",
    "app_spec",
    metavar="MODULE:ATTR",
    help="The JobQueue to use (or JOBQUEUE_APP); MODULE may also be a path to a .py file.",
)
@click.option(
    "--database-url",
    metavar="URL",
    help="Database URL. Precedence: this option, "
    "JOBQUEUE_DATABASE_URL, the URL given to JobQueue(...), sqlite:///jobqueue.sqlite3.",
)
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@click.option(
    "-l",
    "--log-level",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Least level logged [default: INFO]. A job's final failure is logged at ERROR, a retry at WARNING.",
)
@click.version_option(package_name="jobqueue")
@click.pass_context
def cli(
    ctx: click.Context, app_spec: str | None, database_url: str | None, log_json: bool, log_level: str | None
) -> None:
    """jobqueue: a job queue in the SQL database you already have."""
    _start(ctx, app_spec, database_url, log_json, log_level)


def _start(
    ctx: click.Context,
    app_spec: str | None,
    database_url: str | None,
    log_json: bool,
    log_level: str | None,
    app: JobQueue | None = None,
) -> None:
    state = ctx.ensure_object(CliState)
    state.app_spec = app_spec or state.app_spec
    state.database_url = database_url if database_url is not None else state.database_url
    state.log_json, state.log_level = log_json, log_level
    if app is not None:
        state.use(app)


def main() -> None:
    cli(prog_name="jobqueue")


def bound_cli(app: JobQueue, name: str = "jobqueue", cls: type[Group] = Group) -> click.Group:
    """The jobqueue commands on a given app, for ``flask jobqueue`` and ``manage.py jobqueue``.

    The same commands and global options as ``jobqueue``, less ``--app`` and ``--database-url``: the
    app is this one, on its framework's database. Both are still parsed, so that giving one fails
    with a message that says why, but the help does not offer them.
    """

    @click.pass_context
    def bound(
        ctx: click.Context, app_spec: str | None, database_url: str | None, log_json: bool, log_level: str | None
    ) -> None:
        if app_spec:
            raise click.UsageError(f"--app does not apply to {ctx.command_path}: it runs {app!r}")
        _start(ctx, None, database_url, log_json, log_level, app=app)

    return cls(
        name=name,
        commands=cli.commands,
        params=[_hidden(param) if param.name in ("app_spec", "database_url") else param for param in cli.params],
        callback=bound,
        help=cli.help,
        context_settings=cli.context_settings,
    )


def _hidden(param: click.Parameter) -> click.Parameter:
    hidden = copy.copy(param)
    if isinstance(hidden, click.Option):
        hidden.hidden = True
    return hidden


def _register() -> None:
    from jobqueue.cli import dashboard, db, enqueue, jobs, periodic, pipeline, status, topics, worker

    cli.add_command(db.db)
    cli.add_command(jobs.jobs)
    cli.add_command(periodic.periodic)
    cli.add_command(worker.worker)
    cli.add_command(enqueue.enqueue)
    cli.add_command(status.status)
    cli.add_command(status.workers)
    cli.add_command(status.health)
    cli.add_command(topics.topics)
    cli.add_command(pipeline.report)
    cli.add_command(pipeline.archive)
    cli.add_command(dashboard.dashboard)


_register()
