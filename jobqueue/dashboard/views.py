"""The dashboard's pages (overview, failed jobs, one job) and its two actions (retry, cancel).

Views only read and call the storage functions the ``jobqueue`` commands use, so a page and
``jobqueue status`` / ``jobqueue jobs show`` never disagree. Every action is a POST (checked for its
CSRF token before it gets here) that redirects back, so reloading a page never repeats it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from markupsafe import Markup
from werkzeug.wrappers import Response

from jobqueue.clock import utcnow
from jobqueue.dashboard.formatting import CHART_HEIGHT, CHART_WIDTH, chart
from jobqueue.job import SCHEDULE_TASK
from jobqueue.periodic import schedule_message_contents
from jobqueue.serialization import decode_row
from jobqueue.storage import deadletter, history, jobs
from jobqueue.storage.engine import mask_url
from jobqueue.storage.readable import Unreadable
from jobqueue.storage.tables import MAX_ID

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

pages = Blueprint("pages", __name__)

# Queue columns in the order shown. The storage layer has named the message states two ways
# ("pending"/"retryable", then "ready"/"scheduled"/"retrying" with "failed" from the archive); the
# table shows those of the names it reports, so it reads right against either.
QUEUE_COLUMNS = jobs.QUEUE_STATES
AUTO_REFRESH_SECONDS = (5, 30)
CANCELLABLE = ("pending", "retryable")
RETRYABLE = tuple(state.lower() for state in deadletter.RETRYABLE_FROM_ARCHIVE)


@dataclass(frozen=True)
class Dashboard:
    """What the views need: the queue they show and how many failed jobs a page lists."""

    queue: JobQueue
    page_size: int = 50


def _dashboard() -> Dashboard:
    found = current_app.extensions["jobqueue_dashboard"]
    assert isinstance(found, Dashboard)
    return found


@pages.get("/")
def overview() -> str:
    queue = _dashboard().queue
    store = queue.store
    refresh = request.args.get("refresh", type=int)
    return render_overview(
        jobs.queue_counts(store),
        jobs.archive_counts(store),
        jobs.worker_rows(store, queue.settings.worker_stale_after),
        history.throughput(store),
        refresh if refresh in AUTO_REFRESH_SECONDS else None,
    )


def render_overview(
    queues: list[dict[str, Any]],
    archive: dict[str, int],
    workers: list[dict[str, Any]],
    minutes: list[history.MinuteCount],
    refresh: int | None = None,
) -> str:
    """The overview page of these counts, workers and minutes (as the storage functions return them)."""
    bars, peak = chart(minutes)
    return render_template(
        "overview.html",
        queues=queues,
        queue_columns=QUEUE_COLUMNS,
        unknown_state=sum(row.get(jobs.UNKNOWN_STATE, 0) for row in queues),
        archive=archive,
        workers=workers,
        bars=bars,
        peak=peak,
        chart_width=CHART_WIDTH,
        chart_height=CHART_HEIGHT,
        first_minute=minutes[0].minute,
        completed_last_hour=sum(m.completed for m in minutes),
        failed_last_hour=sum(m.failed for m in minutes),
        refresh=refresh,
        refresh_choices=AUTO_REFRESH_SECONDS,
    )


@pages.get("/failed")
def failed() -> str:
    dashboard = _dashboard()
    store = dashboard.queue.store
    task = request.args.get("task") or None
    queue = request.args.get("queue") or None
    before = request.args.get("before", type=int)
    if before is not None and not 0 < before <= MAX_ID:
        before = None  # no job has an id out of that range (SQLite could not even compare it)
    # No task or queue name holds a NUL, which PostgreSQL could not even be sent: nothing matches.
    impossible = "\x00" in f"{task}{queue}"
    rows = [] if impossible else deadletter.list_jobs(store, ["failed"], task, queue, dashboard.page_size + 1, before)
    more = len(rows) > dashboard.page_size
    rows = rows[: dashboard.page_size]
    return render_template(
        "failed.html",
        rows=rows,
        task=task,
        queue=queue,
        first_page=before is None,
        next_before=rows[-1]["id"] if more else None,
        # count_archived has no queue filter: a total is shown only where it would be right.
        total=None if queue or impossible else deadletter.count_archived(store, "failed", task),
    )


@pages.get(f"/jobs/<int(max={MAX_ID}):job_id>")
def job(job_id: int) -> str:
    queue = _dashboard().queue
    found = deadletter.job_row(queue.store, job_id)
    if found is None:
        abort(404, f"job {job_id} not found: it never existed, was purged, or was not kept in the archive")
    where, row = found
    unknown = isinstance(row["state"], deadletter.UnknownState)
    state = str(row["state"]) if unknown else row["state"].lower()
    archived = where == "archive"
    return render_template(
        "job.html",
        job=row,
        state=state,
        archived=archived,
        decoded=_decoded(queue, row),
        error_type=row.get("error_type" if archived else "last_error_type"),
        error_message=row.get("error_message" if archived else "last_error_message"),
        traceback=row.get("error_traceback" if archived else "last_error_traceback"),
        history=_history(row.get("history")),
        unknown_state=deadletter.UNKNOWN_STATE_NOTE if unknown else None,
        can_retry=archived and state in RETRYABLE,
        can_cancel=not archived and state in CANCELLABLE,
    )


def _decoded(queue: JobQueue, row: dict[str, Any]) -> dict[str, Any]:
    """The job's arguments, result and checkpoint; for a periodic schedule's message, its schedule
    and the arguments of the jobs it fires."""
    decoded = decode_row(queue.serializer, row)
    if row["task_name"] == SCHEDULE_TASK:
        decoded.update(schedule_message_contents(queue.serializer, row["payload"]))
    return decoded


def _history(stored: Any) -> list[dict[str, Any]] | str:
    """The job's earlier failures, or, when the stored history is not a list of entries (edited by
    hand), that value as text, so the page says what is wrong instead of failing."""
    if not stored:
        return []
    if isinstance(stored, list) and all(isinstance(entry, dict) for entry in stored):
        return stored
    return stored if isinstance(stored, Unreadable) else Unreadable(stored)


@pages.post(f"/jobs/<int(max={MAX_ID}):job_id>/retry")
def retry(job_id: int) -> Response:
    report = deadletter.retry(_dashboard().queue.store, [job_id])
    if job_id in report.retried:
        flash(f"job {job_id} is back in its queue, attempts reset", "ok")
    else:
        # The reason may quote the stored state (a row edited by hand): isolated, as every value from a job.
        reason = report.refused.get(job_id, "unknown reason")
        flash(Markup("job {} not retried: <bdi>{}</bdi>").format(job_id, reason), "error")
    return _back(job_id)


@pages.post(f"/jobs/<int(max={MAX_ID}):job_id>/cancel")
def cancel(job_id: int) -> Response:
    if jobs.cancel(_dashboard().queue.store, job_id):
        flash(f"job {job_id} cancelled: archived, it will not run", "ok")
    else:
        flash(f"job {job_id} not cancelled: it is running, has ended or does not exist", "error")
    return _back(job_id)


def _back(job_id: int) -> Response:
    """Redirect to the form's ``next`` page if it is one of ours, else to the job's page."""
    target = request.form.get("next", "")
    # Browsers drop tabs and newlines from a Location, so "/<tab>/evil.example" would lead to another
    # site: a target with any control character or space is not taken.
    if not target.startswith("/") or target.startswith("//") or "\\" in target or not _plain(target):
        target = url_for("pages.job", job_id=job_id)
    return redirect(target, code=303)


def _plain(text: str) -> bool:
    return text.isprintable() and " " not in text


def context() -> dict[str, Any]:
    """Template values every page has: the time of the page and the database it shows (masked)."""
    return {"generated_at": utcnow(), "database": mask_url(_dashboard().queue.database_url)}
