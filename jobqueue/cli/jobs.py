"""``jobqueue jobs``: list, show, retry, cancel and purge jobs; the archive is the dead-letter queue."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import click

from jobqueue.cli.output import echo_json, print_table, printable, progress_bar, timestamp
from jobqueue.cli.state import NAME_TEXT, Age, CliState, Group
from jobqueue.errors import JobNotFound
from jobqueue.job import SCHEDULE_TASK
from jobqueue.periodic import schedule_message_contents
from jobqueue.serialization import decode_row
from jobqueue.storage import deadletter, waiting
from jobqueue.storage import jobs as job_queries
from jobqueue.storage.deadletter import UNKNOWN_STATE_NOTE, UnknownState
from jobqueue.storage.readable import Unreadable
from jobqueue.storage.tables import MAX_ID

STATES = ["pending", "processing", "retryable", "completed", "failed", "cancelled"]
ARCHIVED_STATES = ["completed", "failed", "cancelled"]
ACTIVE_STATES = set(STATES) - set(ARCHIVED_STATES)


# Ids of jobs: no job has one out of this range, which some databases cannot even compare.
class JobId(click.IntRange):
    """A job's id: "'abc' is not a valid job id", where click would say "integer range"."""

    name = "job id"


JOB_ID = JobId(1, MAX_ID)


@click.group(cls=Group)
def jobs() -> None:
    """Inspect jobs and work the dead-letter queue (failed jobs in the archive)."""


@jobs.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([*STATES, "unknown"]),
    help="Repeatable; default: all. unknown: states jobqueue does not know (edited by hand), which no worker runs.",
)
@click.option("--task", type=NAME_TEXT, help="Only jobs of this task.")
@click.option("--queue", type=NAME_TEXT, help="Only jobs in this queue.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(
    state: CliState, /, states: tuple[str, ...], task: str | None, queue: str | None, limit: int, as_json: bool
) -> None:
    """The newest jobs first, with their last error and what holds a waiting one back."""
    rows = deadletter.list_jobs(state.app.store, states, task, queue, limit)
    waits = waiting.explain(state.app.store, [row for row in rows if row["state"] in ACTIVE_STATES])
    for row in rows:
        wait = waits.get(row["id"])
        row["waiting"] = wait.reason if wait else None
    if as_json:
        echo_json(rows)
    else:
        print_table(
            rows,
            [
                "id",
                "task_name",
                "queue",
                "state",
                "attempts_count",
                "created_at",
                "when",
                "error_type",
                "error",
                "waiting",
            ],
            empty="no jobs match",
        )


def _flow_line(flow: dict[str, Any]) -> str:
    limit = flow["limit"]
    text = f"{flow['key']!r}: {flow['running']} running" + (f" of at most {limit}" if limit is not None else "")
    if flow["next_start_at"] is not None:
        text += f"; its rate allows the next start at {flow['next_start_at']}"
    return text


@jobs.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(state: CliState, /, job_id: int, as_json: bool) -> None:
    """One job: arguments, state, attempts, result or error with traceback, and its history."""
    found = deadletter.job_row(state.app.store, job_id)
    if found is None:
        raise JobNotFound(f"job {job_id} not found: it never existed, was purged, or was not retained")
    where, row = found
    decoded = decode_row(state.app.serializer, row)
    if row["task_name"] == SCHEDULE_TASK:  # its payload is the schedule, which holds the call
        decoded.update(schedule_message_contents(state.app.serializer, row["payload"]))
    wait = waiting.explain(state.app.store, [row]).get(job_id) if where == "message" else None
    holder, flow = (wait.holder, wait.flow) if wait else (None, None)
    if as_json:
        data = {k: v for k, v in row.items() if not isinstance(v, bytes)}
        shown_state = str(row["state"]) if isinstance(row["state"], UnknownState) else row["state"].lower()
        data.update(decoded, table=where, state=shown_state, waiting_for=holder, flow=flow)
        data["waiting"] = wait.reason if wait else None
        echo_json(data)
        return
    error_type = row.get("error_type") or row.get("last_error_type")
    error_message = row.get("error_message") or row.get("last_error_message")
    traceback = row.get("error_traceback") or row.get("last_error_traceback")
    lines = [
        f"job {row['id']}  {row['task_name']}  {row['state']}  ({'active' if where == 'message' else 'archived'})",
        f"queue {row['queue']}  priority {row['priority']}  attempts {row['attempts_count']}  "
        f"deliveries {row['deliveries_count']}",
        f"created      {_utc(row['created_at'])}",
        f"first try    {_utc(row.get('first_attempt_at'))}",
        f"last try     {_utc(row.get('last_attempt_at'))}",
    ]
    if isinstance(row["state"], UnknownState):
        lines.append(f"state        {UNKNOWN_STATE_NOTE}")
    if where == "message":
        lines.append(f"next try     {_utc(row['next_attempt_at'])}")
    if flow is not None:
        lines.append(f"flow key     {_flow_line(flow)}")
    if wait is not None and wait.reason:
        lines.append(f"waiting      {wait.reason}")
    if where != "message":
        lines.append(f"finished     {_utc(row.get('finished_at'))}  (archived {_utc(row['archived_at'])})")
    if "schedule" in decoded:
        schedule = decoded["schedule"]
        lines.append(
            f"schedule     {schedule['name']}: {schedule['task']}, {schedule['expression']} ({schedule['timezone']})"
            if isinstance(schedule, dict)
            else f"schedule     {schedule}"
        )
    for label in ("args", "kwargs", "result", "checkpoint"):
        if label in decoded:
            lines.append(f"{label:<12} {_clipped(json.dumps(decoded[label], default=str))}")
    for label in ("headers", "unique_key", "partition_key"):
        if row.get(label):
            lines.append(f"{label:<12} {_clipped(str(row[label]))}")
    if error_type:
        label = "last error" if where == "message" else "error"
        lines.append(f"{label:<12} {error_type}: {error_message}")  # the archive keeps 10,000 characters
    if traceback:
        lines.append("traceback:")
        lines.extend("  " + line for line in traceback.rstrip().splitlines())
    history = row.get("history") or []
    if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
        shown = history if isinstance(history, Unreadable) else Unreadable(history)
        lines.append(f"history      {shown}")
        history = []
    for number, entry in enumerate(history, 1):
        lines.append(
            f"history {number}: {entry.get('state')} after {entry.get('attempts')} attempt(s), archived "
            f"{entry.get('archived_at')}: {entry.get('error_type')}: {entry.get('error_message')}"
        )
    click.echo(printable("\n".join(lines)))


# A value longer than this is cut in the text view (a megabyte of arguments would flood the terminal).
SHOWN_CHARACTERS = 2_000


def _clipped(text: str) -> str:
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}... ({len(text) - SHOWN_CHARACTERS:,} more characters: --json shows all)"


def _warn_of_unknown_tasks(state: CliState, tasks: dict[int, str]) -> None:
    """Say which retried jobs the app given registers no task for: its workers would fail them
    again at once, as unknown."""
    if not state.has_app:
        return  # no app given: which tasks exist is not known here
    unknown: dict[str, list[int]] = {}
    for job_id, name in tasks.items():
        if name not in state.app.registry and name != SCHEDULE_TASK:
            unknown.setdefault(name, []).append(job_id)
    for name, ids in unknown.items():
        click.echo(
            printable(
                f"warning: task {name!r} is not registered in this app: its workers fail job(s) {_ids(ids)} "
                "again at once; run them with workers of an app that has the task"
            ),
            err=True,
        )


def _utc(value: Any) -> str:
    """A stored time (UTC), to the microsecond and marked as UTC, as ``jobs list`` marks its own."""
    if isinstance(value, datetime):
        value = value.astimezone(timezone.utc) if value.tzinfo is not None else value
        return str(value.strftime("%Y-%m-%d %H:%M:%S.%fZ"))
    return "-" if value is None else str(value)


@jobs.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@click.option("--all-failed", is_flag=True, help="Retry every failed job (with --task: of that task).")
@click.option("--task", type=NAME_TEXT, help="With --all-failed: only this task's failed jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def retry(state: CliState, /, job_ids: tuple[int, ...], all_failed: bool, task: str | None, as_json: bool) -> None:
    """Move failed or cancelled jobs back to the queue, same id, attempts reset, history kept."""
    if task and not all_failed:
        raise click.UsageError(f"--task goes with --all-failed: jobs retry --all-failed --task {task}")
    if job_ids and all_failed:
        raise click.UsageError("give job ids or --all-failed, not both")
    if not job_ids and not all_failed:
        raise click.UsageError("give the ids of the jobs to retry, or --all-failed (optionally with --task)")
    store = state.app.store
    if all_failed:
        report = deadletter.RetryReport()
        total = deadletter.count_archived(store, "failed", task)
        with progress_bar(total, "retrying failed jobs") as bar, _interrupted("retried", lambda: len(report.retried)):
            after = 0
            while ids := deadletter.archived_ids(store, "failed", task, limit=deadletter.RETRY_BATCH, after_id=after):
                report.add(deadletter.retry(store, ids))
                bar.update(len(ids))
                after = ids[-1]
    else:
        report = deadletter.retry(store, list(dict.fromkeys(job_ids)))  # each id once, however often given
    if as_json:
        echo_json({"retried": report.retried, "refused": report.refused})
    else:
        click.echo(f"retried {len(report.retried)} job(s)" + (f": {_ids(report.retried)}" if report.retried else ""))
        for job_id, reason in report.refused.items():
            click.echo(printable(f"job {job_id} not retried: {reason}"), err=True)
        _warn_of_unknown_tasks(state, report.tasks)
    if report.refused:
        raise SystemExit(1)


@jobs.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@click.option("--queue", type=NAME_TEXT, help="Cancel this queue's pending and retryable jobs.")
@click.option("--task", type=NAME_TEXT, help="Cancel this task's pending and retryable jobs (in --queue if given).")
@click.option("--all", "every", is_flag=True, help="Cancel every pending and retryable job.")
@click.option("--dry-run", is_flag=True, help="Only count what would be cancelled.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def cancel(
    state: CliState,
    /,
    job_ids: tuple[int, ...],
    queue: str | None,
    task: str | None,
    every: bool,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Cancel pending or retryable jobs: archived as cancelled, never run. Give their ids, or
    --queue and/or --task (or --all) to cancel every such job; that asks first (unless --yes),
    --dry-run only counts. Running jobs are left alone, and so are periodic schedules but for
    one given by its id (which retires it)."""
    filtered = queue is not None or task is not None
    if job_ids and (filtered or every):
        raise click.UsageError("give job ids, or --queue/--task/--all, not both")
    if every and filtered:
        raise click.UsageError("--all cancels every pending job: leave out --queue and --task, or --all")
    if not job_ids and not (filtered or every):
        raise click.UsageError("give the ids of the jobs to cancel, or --queue and/or --task, or --all")
    if job_ids:
        if dry_run or yes:
            raise click.UsageError("--dry-run and --yes go with --queue, --task or --all")
        _cancel_ids(state, job_ids, as_json)
    else:
        _cancel_matching(state, queue, task, dry_run, yes, as_json)


class _NoBar:
    """A progress bar for a few jobs: none."""

    def update(self, count: int) -> None:
        pass


def _cancel_ids(state: CliState, job_ids: tuple[int, ...], as_json: bool) -> None:
    store = state.app.store
    wanted = list(dict.fromkeys(job_ids))  # each id once
    cancelled: set[int] = set()
    many = len(wanted) > job_queries.CANCEL_BATCH
    bar_shown = progress_bar(len(wanted), "cancelling jobs") if many else nullcontext(_NoBar())
    with bar_shown as bar, _interrupted("cancelled", lambda: len(cancelled)):
        for batch in _batches(wanted):
            cancelled.update(job_queries.cancel_many(store, batch))
            bar.update(len(batch))
    if as_json:
        echo_json(
            {
                "cancelled": [j for j in wanted if j in cancelled],
                "not_cancelled": [j for j in wanted if j not in cancelled],
            }
        )
    else:
        for job_id in wanted:
            click.echo(
                f"job {job_id} cancelled"
                if job_id in cancelled
                else f"job {job_id} not cancelled: it is running, has ended or does not exist",
                err=job_id not in cancelled,
            )
    if len(cancelled) < len(wanted):
        raise SystemExit(1)


def _batches(ids: Sequence[int]) -> Iterator[list[int]]:
    """``ids`` a transaction's worth at a time."""
    for start in range(0, len(ids), job_queries.CANCEL_BATCH):
        yield list(ids[start : start + job_queries.CANCEL_BATCH])


def _cancel_matching(
    state: CliState, queue: str | None, task: str | None, dry_run: bool, yes: bool, as_json: bool
) -> None:
    """Cancel every pending or retryable job of ``queue`` and ``task`` (every one where neither
    is given) there is now, a batch of ids to a transaction; a job that started meanwhile is left
    to run, and one enqueued or retried meanwhile is not among them."""
    store = state.app.store
    ids = job_queries.ready_ids(store, queue, task)
    total = len(ids)
    where = " and ".join(
        [*([f"of queue {queue!r}"] if queue is not None else []), *([f"of task {task!r}"] if task is not None else [])]
    )
    what = printable(f"{total} pending or retryable job(s){f' {where}' if where else ''}")
    asked = Asked("cancel", "cancel", f"Cancel {what}?", {"cancelled": 0, "queue": queue, "task": task})
    if not _go_ahead(asked, what, total, dry_run, yes, as_json):
        return
    cancelled = [0]
    with progress_bar(total, "cancelling jobs") as bar, _interrupted("cancelled", lambda: cancelled[0]):
        for batch in _batches(ids):
            cancelled[0] += len(job_queries.cancel_many(store, batch))
            bar.update(len(batch))
    if as_json:
        echo_json({"cancelled": cancelled[0], "would_cancel": total, "queue": queue, "task": task})
    else:
        click.echo(printable(f"cancelled {cancelled[0]} job(s){f' {where}' if where else ''}"))


@jobs.command()
@click.option("--state", "state_name", required=True, type=click.Choice(ARCHIVED_STATES))
@click.option("--older-than", required=True, type=Age(), help="Archived longer ago than this: 90s, 30m, 24h, 7d, 2w.")
@click.option("--task", type=NAME_TEXT, help="Only this task's jobs.")
@click.option("--batch-size", default=1000, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def purge(
    state: CliState,
    /,
    state_name: str,
    older_than: timedelta,
    task: str | None,
    batch_size: int,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete archived jobs for good, in batches of short transactions. Asks first (unless --yes);
    --dry-run only counts."""
    store = state.app.store
    before = store.clock_now() - older_than
    total = deadletter.count_archived(store, state_name, task, before)
    of_task = f" of task {task}" if task else ""
    what = printable(f"{total} {state_name} job(s){of_task} archived before {timestamp(before)}")
    report = {"purged": 0, "state": state_name, "archived_before": before}
    if not _go_ahead(Asked("purge", "delete", f"Delete {what} for good?", report), what, total, dry_run, yes, as_json):
        return
    done = [0]

    def progress(count: int) -> None:
        done[0] += count
        bar.update(count)

    with progress_bar(total, f"purging {state_name} jobs") as bar, _interrupted("purged", lambda: done[0]):
        deleted = deadletter.purge(store, state_name, before, task, batch_size, progress=progress)
    if as_json:
        echo_json({"purged": deleted, "would_purge": total, "state": state_name, "archived_before": before})
    else:
        click.echo(f"purged {deleted} {state_name} job(s) archived before {timestamp(before)}")


@dataclass(frozen=True)
class Asked:
    """What a command that changes many jobs at once says before it does: its name, what it does
    to them, the question it asks on a terminal, and its --json report when it does nothing."""

    command: str
    does: str
    question: str
    report: dict[str, Any]


def _go_ahead(asked: Asked, what: str, total: int, dry_run: bool, yes: bool, as_json: bool) -> bool:
    """Whether to change ``what`` (``total`` jobs): not for --dry-run or when there is nothing to
    change (it says what it would do), and only once confirmed: --yes, or asked on a terminal."""
    if dry_run or total == 0:
        if as_json:
            echo_json({**asked.report, f"would_{asked.command}": total})
        else:
            click.echo(f"{f'would {asked.command}' if dry_run else f'nothing to {asked.command}:'} {what}")
        return False
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(
                f"{asked.command} would {asked.does} {what}; add --yes to confirm (or --dry-run to count only)"
            )
        click.confirm(asked.question, abort=True, err=True)
    return True


@contextmanager
def _interrupted(did: str, done: Callable[[], int]) -> Iterator[None]:
    """Ctrl-C during a long command: say how far it went (each batch is whole), exit 130. An
    error (a lock timeout, a lost server) after some batches is said with how far it went too."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: {did} {done()} job(s) before it stopped; run the command again to go on", err=True)
        raise SystemExit(130) from None
    except Exception:
        if done():
            click.echo(
                f"\nstopped by the error below: {did} {done()} job(s) before it; run the command again to go on",
                err=True,
            )
        raise


def _ids(ids: list[int], most: int = 20) -> str:
    shown = ", ".join(map(str, ids[:most]))
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")
