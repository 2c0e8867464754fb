"""``jobqueue worker``: start a supervisor and its worker processes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import click

from jobqueue.cli.state import CliState
from jobqueue.errors import ConfigurationError
from jobqueue.settings import worker_fields

# Short forms a Celery user types without thinking.
SHORT_FLAGS = {"concurrency": ("-c",), "queues": ("-Q",)}


def _option_for(f: dataclasses.Field[Any]) -> Callable[[Any], Any]:
    """A --dashed option for a Settings field; unset options leave the app's value alone."""
    flag = "--" + f.name.replace("_", "-")
    short = SHORT_FLAGS.get(f.name, ())
    kind = str(f.type)
    help_text = f.metadata["help"] + (f" [default: {f.default}]" if f.default is not None else "")
    if kind.startswith("bool"):
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=help_text)
    if kind.startswith("tuple"):
        return click.option(*short, flag, f.name, default=None, metavar="A,B", help=help_text)
    click_type = click.INT if kind.startswith("int") else click.STRING if kind.startswith("str") else click.FLOAT
    return click.option(*short, flag, f.name, type=click_type, default=None, help=help_text)


def worker_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for f in reversed(worker_fields()):
        fn = _option_for(f)(fn)
    return fn


@click.command()
@worker_options
@click.option(
    "--burst",
    is_flag=True,
    help="Exit 0 once no message in the served queues is processing or due within 5 s (for scripts, tests and demos).",
)
@click.option("--progress", is_flag=True, help="Show runs done (retries count again), jobs left and the rate.")
@click.pass_obj
def worker(state: CliState, /, burst: bool, progress: bool, **options: Any) -> None:
    """Start a supervisor that forks worker processes and runs jobs until stopped.

    SIGTERM or SIGINT stops it warmly (running jobs finish within --graceful-timeout, buffered
    messages go back unstarted); a second signal stops it at once.
    """
    changes = {name: value for name, value in options.items() if value is not None}
    for name in ("queues", "groups"):
        if name in changes and not changes[name].replace(",", "").strip():  # -Q "$QUEUES", the variable unset
            raise click.UsageError(f"--{name} names no {name[:-1]}; leave it out for every {name[:-1]}")
    app = state.app  # an --app that cannot be loaded is not a usage error of this command
    try:
        app.configure(**changes)
    except ConfigurationError as exc:  # an option's value out of range: say which, before any work
        raise click.UsageError(_as_option(str(exc), options)) from None
    code = app.run_worker(burst=burst, progress=progress)
    raise SystemExit(code)


def _as_option(message: str, options: dict[str, Any]) -> str:
    """A setting's error as the command line reads it: ``--fetch-batch-size``, not ``fetch_batch_size``,
    for every option the message names, and no ``None`` (leaving the option out is how a command
    line says it)."""

    def option(found: re.Match[str]) -> str:
        return "--" + found.group(0).replace("_", "-")

    # Names of two words or more wherever they are; one-word names ("queues") only as the subject.
    joined = "|".join(re.escape(name) for name in sorted(options, key=len, reverse=True) if "_" in name)
    spelled = re.sub(rf"\b({joined})\b", option, message) if joined else message
    spelled = re.sub(rf"^({'|'.join(re.escape(name) for name in options)})\b", option, spelled)
    return spelled.replace(" or None, got", ", got")
