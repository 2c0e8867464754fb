"""``python manage.py jobqueue <command>``: the jobqueue CLI on the project's JobQueue and database.

Django's own options (``--settings``, ``-v 0``, ``--skip-checks``...) may stand anywhere on the line,
before the jobqueue command or after it, as ``manage.py`` itself allows for ``--settings`` and
``--pythonpath``: they are taken out and applied by Django, and the jobqueue CLI gets the rest.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError

from jobqueue.cli.state import Group

# Django's options on every command (its --version gives way to jobqueue's), each with whether it
# takes a value.
DJANGO_OPTIONS = {
    "-v": True,
    "--verbosity": True,
    "--settings": True,
    "--pythonpath": True,
    "--traceback": False,
    "--no-color": False,
    "--force-color": False,
    "--skip-checks": False,
}
DJANGO_HELP = (
    (
        "-v, --verbosity [0|1|2|3]",
        "jobqueue's log level: 0 errors only, 2 INFO, 3 DEBUG; 1 (the default) leaves it to "
        "settings.LOGGING. --log-level outranks it.",
    ),
    ("--settings SETTINGS", 'The settings module, e.g. "myproject.settings.main" [default: DJANGO_SETTINGS_MODULE].'),
    ("--pythonpath PYTHONPATH", 'A directory to add to the Python path, e.g. "/home/djangoprojects/myproject".'),
    ("--traceback", "On an error, show the full stack trace, not one line."),
    ("--no-color", "Don't colorize the output."),
    ("--force-color", "Colorize the output even when it is not a terminal."),
    ("--skip-checks", "Skip Django's system checks."),
)
LOG_LEVELS = {0: "ERROR", 2: "INFO", 3: "DEBUG"}  # by verbosity; 1 sets none


class Command(BaseCommand):
    help = (
        "Run a jobqueue command (worker, status, jobs, periodic, enqueue, workers, db) on the JobQueue "
        "and database named by settings.JOBQUEUE. `manage.py jobqueue --help` lists them."
    )
    _arguments: list[str] | None = None  # the jobqueue CLI's part of the command line
    _prog_name = "manage.py jobqueue"

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the jobqueue command and its options")

    def run_from_argv(self, argv: list[str]) -> None:
        # Django parses and applies its own options (settings, system checks, colour, --traceback)
        # as for any command, then calls handle(); the jobqueue CLI gets the rest, --help included.
        django_argv, self._arguments = split_options(argv[2:])
        self._prog_name = f"{os.path.basename(argv[0])} {argv[1]}"
        super().run_from_argv([*argv[:2], *django_argv])

    def print_help(self, prog_name: str, subcommand: str) -> None:
        # `manage.py help jobqueue` shows what `manage.py jobqueue --help` shows.
        name = f"{os.path.basename(prog_name)} {subcommand}"
        group = self._cli()
        with click.Context(group, info_name=name, **group.context_settings) as ctx:
            click.echo(group.get_help(ctx))

    def handle(self, *args: Any, **options: Any) -> None:
        on_command_line = self._arguments is not None
        arguments = [*(self._arguments or []), *args, *(options.get("arguments") or [])]
        level = LOG_LEVELS.get(options["verbosity"])
        if level is not None:
            arguments = ["--log-level", level, *arguments]  # an explicit --log-level comes later and wins
        color = True if options["force_color"] else False if options["no_color"] else None
        if on_command_line and not options["traceback"]:
            self._run_standalone(arguments, color)
        else:
            self._run(arguments, color)

    def _run_standalone(self, arguments: list[str], color: bool | None) -> None:
        """Run as a command line: click's own messages and exit statuses (usage errors, --help, "Error: ...")."""
        from jobqueue.errors import JobQueueError

        try:
            group = self._cli()
        except JobQueueError as exc:
            raise SystemExit(f"Error: {exc}") from None
        group.main(args=arguments, prog_name=self._prog_name, color=color)

    def _run(self, arguments: list[str], color: bool | None) -> None:
        """Run for call_command() or --traceback: an error is raised, as a CommandError."""
        from jobqueue.errors import JobQueueError

        try:
            code = self._cli().main(args=arguments, prog_name=self._prog_name, standalone_mode=False, color=color)
        except click.ClickException as exc:
            exc.__suppress_context__ = False  # --traceback shows the jobqueue error behind the message
            raise CommandError(exc.format_message()) from exc
        except JobQueueError as exc:
            raise CommandError(str(exc)) from exc
        except SystemExit as exc:
            # Commands that end with an exit status (worker, status, jobs retry...) must not end
            # the program that called them: success returns, a failure is a CommandError.
            code = exc.code
            if isinstance(code, str):
                raise CommandError(code) from None
        if isinstance(code, int) and code != 0:
            raise CommandError(f"jobqueue {' '.join(arguments)} exited with status {code}")

    def _cli(self) -> click.Group:
        from jobqueue.cli import bound_cli
        from jobqueue.contrib.django.integration import configured_app

        return bound_cli(configured_app(), "jobqueue", cls=DjangoGroup)


class DjangoGroup(Group):
    """The jobqueue CLI whose help lists Django's options too."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        click.Command.format_options(self, ctx, formatter)
        with formatter.section("Django's options (before or after COMMAND)"):
            formatter.write_dl(DJANGO_HELP)
        self.format_commands(ctx, formatter)


def split_options(line: list[str]) -> tuple[list[str], list[str]]:
    """Split a command line into Django's options (with their values) and the rest, in order.

    Django's options are found wherever they stand, up to a ``--`` (after it everything is the
    jobqueue CLI's): the way ``manage.py`` finds ``--settings`` and ``--pythonpath``, which it has
    already applied when a command starts.
    """
    django: list[str] = []
    rest: list[str] = []
    tokens = iter(line)
    for token in tokens:
        if token == "--":
            rest += [token, *tokens]
            break
        name, equals, _ = token.partition("=")
        if name in DJANGO_OPTIONS:
            django.append(token)
            value = next(tokens, None) if DJANGO_OPTIONS[name] and not equals else None
            if value is not None:
                django.append(value)  # (argparse reports a missing one)
        elif token.startswith("-v") and token[2:].isdigit():  # -v0
            django.append(token)
        else:
            rest.append(token)
    return django, rest
