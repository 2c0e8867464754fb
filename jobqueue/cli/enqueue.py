"""``jobqueue enqueue``: enqueue one job from the shell."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from jobqueue.cli.output import echo_json
from jobqueue.cli.state import UTF8_TEXT, CliState
from jobqueue.errors import ConfigurationError, UnknownTaskError
from jobqueue.storage.topics import DELIVERY_PREFIX


def _json_arg(value: str | None, kind: type, name: str) -> Any:
    if value is None:
        return kind()
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=name) from None
    except RecursionError:
        raise click.BadParameter("nested too deeply to be read as JSON", param_hint=name) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"must be a JSON {'array' if kind is list else 'object'}", param_hint=name)
    return parsed


class IsoTime(click.ParamType):
    """An ISO 8601 time: UTC when it gives no offset."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return datetime.fromisoformat(str(value).strip())
        except ValueError:
            self.fail(
                f"{value!r} is no ISO 8601 time: write 2030-01-01T09:00:00 (UTC), or give its offset, "
                "2030-01-01T10:00:00+01:00 or 2030-01-01T09:00:00Z",
                param,
                ctx,
            )


@click.command()
@click.argument("task_name", metavar="TASK", type=UTF8_TEXT)
@click.option("--args", "args_json", type=UTF8_TEXT, metavar="JSON", help="Positional arguments as a JSON array.")
@click.option("--kwargs", "kwargs_json", type=UTF8_TEXT, metavar="JSON", help="Keyword arguments as a JSON object.")
@click.option("--queue", type=UTF8_TEXT, help="Queue (default: the task's).")
@click.option("--priority", type=int, help="Higher runs first.")
@click.option("--countdown", type=float, metavar="SECONDS", help="Run no sooner than this many seconds from now.")
@click.option(
    "--eta",
    type=IsoTime(),
    help="Run no sooner than this time, ISO 8601: UTC without an offset (2030-01-01T09:00:00), or with "
    "one (2030-01-01T10:00:00+01:00, ...Z), as --json prints times.",
)
@click.option(
    "--unique-key",
    type=UTF8_TEXT,
    help="While a job of TASK with this key is pending, running or retrying, add none: name that job "
    "(exit 0; --json gives existing: true).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_obj
def enqueue(
    state: CliState,
    task_name: str,
    args_json: str | None,
    kwargs_json: str | None,
    queue: str | None,
    priority: int | None,
    countdown: float | None,
    eta: datetime | None,
    unique_key: str | None,
    as_json: bool,
) -> None:
    """Enqueue a call of TASK, one of the app's registered tasks."""
    args = _json_arg(args_json, list, "--args")
    kwargs = _json_arg(kwargs_json, dict, "--kwargs")
    if task_name.startswith(DELIVERY_PREFIX):
        # Its jobs are made from the topic's log: one enqueued by hand is no message of the topic.
        topic = task_name[len(DELIVERY_PREFIX) :].partition(":")[0]
        raise click.UsageError(
            f"{task_name!r} is what a consumer group runs for each message published to a topic, not a task "
            f"to enqueue: publish the message to the topic instead (app.topic({topic!r}).publish(payload))"
        )
    try:
        task = state.app.get_task(task_name)
    except UnknownTaskError as exc:
        if not state.has_app:
            raise ConfigurationError(
                f"task {task_name!r} is unknown: no app was given; pass --app module:attr "
                "(or set JOBQUEUE_APP) so jobqueue knows the registered tasks"
            ) from None
        raise exc
    try:
        handle = task.apply_async(
            args, kwargs, queue=queue, priority=priority, countdown=countdown, eta=eta, unique_key=unique_key
        )
    except TypeError as exc:  # the arguments do not fit the task's signature; nothing was written
        raise click.UsageError(f"{exc} (fix --args/--kwargs)") from None
    except ValueError as exc:  # e.g. a countdown that is no finite time from now; nothing was written
        raise click.UsageError(str(exc)) from None
    if as_json:
        echo_json({"id": handle.id, "task": task.name, "status": handle.status(), "existing": handle.existing})
    elif handle.existing:
        # As apply_async: the key's job is the answer, so this is no failure (exit 0), but nothing was added.
        click.echo(
            f"job {handle.id} ({task.name}) with unique key {unique_key!r} already exists and has not ended; "
            "nothing was enqueued"
        )
    else:
        click.echo(f"enqueued job {handle.id} ({task.name})")
