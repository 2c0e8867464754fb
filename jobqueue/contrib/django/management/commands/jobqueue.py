"""``python manage.py jobqueue <command>``: the jobqueue CLI on the project's JobQueue and database."""

from __future__ import annotations

import argparse
import os
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Run a jobqueue command (worker, status, jobs, periodic, enqueue, workers, db) on the JobQueue "
        "and database named by settings.JOBQUEUE. `manage.py jobqueue --help` lists them."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the jobqueue command and its options")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after "jobqueue" goes to the jobqueue CLI untouched, --help included.
        from jobqueue.errors import JobQueueError

        try:
            command = _cli(argv[1])
        except JobQueueError as exc:
            raise SystemExit(f"Error: {exc}") from None
        command.main(args=argv[2:], prog_name=f"{os.path.basename(argv[0])} {argv[1]}")

    def handle(self, *args: Any, **options: Any) -> None:
        # call_command("jobqueue", "worker", "--burst"), from code or tests.
        arguments = list(args) + list(options.get("arguments") or [])
        from jobqueue.errors import JobQueueError

        try:
            code = _cli("jobqueue").main(args=arguments, prog_name="manage.py jobqueue", standalone_mode=False)
        except click.ClickException as exc:
            raise CommandError(exc.format_message()) from None
        except JobQueueError as exc:
            raise CommandError(str(exc)) from None
        if isinstance(code, int) and code != 0:
            raise CommandError(f"jobqueue {' '.join(arguments)} exited with status {code}")


def _cli(name: str) -> click.Group:
    from jobqueue.cli import bound_cli
    from jobqueue.contrib.django.integration import configured_app

    return bound_cli(configured_app(), name)
