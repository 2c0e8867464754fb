"""The Django admin for jobqueue: active and archived jobs, with retry and cancel actions.

Django imports this module when ``django.contrib.admin`` is installed (its autodiscovery); the
models are registered only then. Lists, filters, search and detail pages read the configured
JobQueue's tables on its database and are read-only. The actions change jobs through jobqueue, as
``jobqueue jobs retry`` and ``jobqueue jobs cancel`` do: each job in its own transaction, on
jobqueue's own connection, committed at once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone
from django.utils.html import format_html

from jobqueue.contrib.django.models import Archive, Message
from jobqueue.job import SCHEDULE_TASK

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store

SHOWN_CHARS = 10_000  # of a call or a result on a detail page
LISTED_IDS = 20  # job ids named in a message, the rest counted
MAX_ID_DIGITS = 18  # a longer number is no job id (ids are 64-bit)


def _time_column(name: str, description: str) -> Any:
    """A column or detail field showing a time to the second, with its time zone."""

    def show(model_admin: JobAdmin, obj: Any) -> str:
        value = getattr(obj, name)
        if value is None:
            return "-"
        local = timezone.localtime(value) if timezone.is_aware(value) else value  # naive: USE_TZ is off
        return str(local.strftime("%Y-%m-%d %H:%M:%S %Z")).strip()

    return admin.display(description=description, ordering=name)(show)


class JobAdmin(admin.ModelAdmin):
    """What both tables' pages share: read-only, filtered by state, queue and task, newest first."""

    list_filter = ("state", "queue", "task_name")
    search_fields = ("task_name",)  # in any case, and a number finds the job of that id: see get_search_results
    search_help_text = "A task name or part of one, or a job id."
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False  # one COUNT of a table that may be large, not two
    traceback_field = ""  # each table's admin names its column

    def get_queryset(self, request: Any) -> Any:
        # A list shows neither arguments nor tracebacks: a detail page reads them.
        return super().get_queryset(request).defer("payload", self.traceback_field)

    def get_search_results(self, request: Any, queryset: Any, search_term: str) -> tuple[Any, bool]:
        """Jobs whose task name holds each word of the term, in any case, or whose id it is.

        Not Django's ``icontains``: on MySQL and MariaDB it leaves case to the column's collation,
        and task names have a binary one there (they are compared exactly), so it would match only
        the case typed. Task names are ASCII: lower-cased alike by Python and every database.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        matches = Q(*(Q(lowered_task__contains=word) for word in term.lower().split()))
        if term.isdecimal() and len(term) <= MAX_ID_DIGITS:
            matches |= Q(pk=int(term))
        return queryset.alias(lowered_task=Lower("task_name")).filter(matches), False

    def has_add_permission(self, request: Any) -> bool:
        return False  # jobs are enqueued by code, `jobqueue enqueue` or Django's task API

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        # A job changes only through the actions, under jobqueue's rules: a detail page is
        # read-only, and the change permission is what the actions require.
        return obj is None and bool(super().has_change_permission(request))

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # an active job is cancelled; `jobqueue jobs purge` deletes ended ones

    @admin.display(description="call")
    def call(self, obj: Any) -> str:
        from jobqueue.serialization import loads_call

        try:
            args, kwargs = loads_call(_app().serializer, bytes(obj.payload))
        except Exception as exc:  # a payload this app cannot read leaves the rest worth showing
            return f"<cannot decode the arguments: {exc}>"
        shown = [_text(value) for value in args] + [f"{key}={_text(value)}" for key, value in kwargs.items()]
        return _cut(f"{obj.task_name}({', '.join(shown)})")

    @admin.display(description="traceback")
    def traceback(self, obj: Any) -> str:
        text = getattr(obj, self.traceback_field)
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', text) if text else "-"

    enqueued = _time_column("created_at", "enqueued at")
    first_attempt = _time_column("first_attempt_at", "first attempt at")
    last_attempt = _time_column("last_attempt_at", "last attempt at")

    def _error(self, error_type: str | None, message: str | None) -> str:
        if not error_type:
            return ""
        text = f"{error_type}: {message}" if message else error_type
        return text if len(text) <= 100 else text[:99] + "…"


class MessageAdmin(JobAdmin):
    list_display = (
        "id",
        "task_name",
        "queue",
        "state",
        "priority",
        "attempts_count",
        "next_attempt",
        "last_error",
    )
    fieldsets = (
        (None, {"fields": ("id", "task_name", "queue", "state", "priority", "attempts_count", "worker_id")}),
        ("Times", {"fields": ("enqueued", "first_attempt", "last_attempt", "next_attempt")}),
        ("Call", {"fields": ("call", "unique_key", "partition_key")}),
        ("Last error", {"fields": ("last_error_type", "last_error_message", "traceback")}),
    )
    readonly_fields = tuple(name for _, section in fieldsets for name in section["fields"])
    traceback_field = "last_error_traceback"
    actions = ("cancel_jobs",)
    next_attempt = _time_column("next_attempt_at", "next attempt at")

    def get_queryset(self, request: Any) -> Any:
        # The messages that drive periodic tasks are listed by `jobqueue periodic list`, not here.
        return super().get_queryset(request).exclude(task_name=SCHEDULE_TASK)

    @admin.display(description="last error")
    def last_error(self, obj: Any) -> str:
        return self._error(obj.last_error_type, obj.last_error_message)

    @admin.action(description="Cancel the selected jobs (pending or retryable ones)", permissions=["change"])
    def cancel_jobs(self, request: Any, queryset: Any) -> None:
        from jobqueue.storage.jobs import cancel

        store = _app().store
        found, gone = _selected(request, queryset)
        cancelled: list[int] = []
        skipped: dict[int, str] = {}
        for job_id in found:
            if cancel(store, job_id):
                cancelled.append(job_id)
            else:
                skipped[job_id] = _now(store, job_id) + "; only pending or retryable jobs are cancelled"
        skipped.update({job_id: _changed(store, job_id) for job_id in gone})
        _report(self, request, found, "Cancelled", cancelled, "Not cancelled", skipped)


class ArchiveAdmin(JobAdmin):
    list_display = ("id", "task_name", "queue", "state", "priority", "attempts_count", "finished", "error")
    fieldsets = (
        (None, {"fields": ("id", "task_name", "queue", "state", "priority", "attempts_count")}),
        ("Times", {"fields": ("enqueued", "first_attempt", "last_attempt", "finished", "archived")}),
        ("Call", {"fields": ("call", "outcome", "unique_key", "partition_key")}),
        ("Error", {"fields": ("error_type", "error_message", "traceback")}),
    )
    readonly_fields = tuple(name for _, section in fieldsets for name in section["fields"])
    traceback_field = "error_traceback"
    actions = ("retry_jobs",)
    finished = _time_column("finished_at", "finished at")
    archived = _time_column("archived_at", "archived at")

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).defer("result")

    @admin.display(description="error")
    def error(self, obj: Any) -> str:
        return self._error(obj.error_type, obj.error_message)

    @admin.display(description="result")
    def outcome(self, obj: Any) -> str:
        if obj.result is None:
            return "-"
        try:
            return _cut(_text(_app().serializer.loads(bytes(obj.result))))
        except Exception as exc:
            return f"<cannot decode the result: {exc}>"

    @admin.action(description="Retry the selected jobs (failed or cancelled ones)", permissions=["change"])
    def retry_jobs(self, request: Any, queryset: Any) -> None:
        from jobqueue.storage.deadletter import retry

        store = _app().store
        found, gone = _selected(request, queryset)
        report = retry(store, list(found))
        skipped = dict(report.refused)
        skipped.update({job_id: _changed(store, job_id) for job_id in gone})
        _report(self, request, found, "Retried", report.retried, "Not retried", skipped)


def _app() -> JobQueue:
    from jobqueue.contrib.django.integration import configured_app

    return configured_app()


def _selected(request: Any, queryset: Any) -> tuple[dict[int, Any], list[int]]:
    """The selected jobs still listed, by id, and the ids of those no longer listed (they changed)."""
    found = {job.pk: job for job in queryset.only("id", "task_name").order_by("id")}
    posted = {int(value) for value in request.POST.getlist(ACTION_CHECKBOX_NAME) if value.isdecimal()}
    return found, sorted(posted - set(found))


def _now(store: Store, job_id: int) -> str:
    from jobqueue.storage.jobs import job_state

    state = job_state(store, job_id)
    return "it no longer exists" if state is None else f"it is {state.public}"


def _changed(store: Store, job_id: int) -> str:
    return _now(store, job_id) + " (it changed after the page was shown)"


def _report(
    model_admin: JobAdmin,
    request: Any,
    found: dict[int, Any],
    done_verb: str,
    done: list[int],
    skipped_verb: str,
    skipped: dict[int, str],
) -> None:
    """Tell the user what was done and what was not, and why; keep who did what in the admin's log."""
    for job_id in done:
        model_admin.log_change(request, found[job_id], done_verb)
    if done:
        model_admin.message_user(request, f"{done_verb} {_jobs(done)}.", messages.SUCCESS)
    if skipped:
        reasons = [f"job {job_id}: {reason}" for job_id, reason in sorted(skipped.items())[:LISTED_IDS]]
        more = f"; and {len(skipped) - LISTED_IDS} more" if len(skipped) > LISTED_IDS else ""
        model_admin.message_user(request, f"{skipped_verb}: {'; '.join(reasons)}{more}.", messages.WARNING)


def _jobs(ids: list[int]) -> str:
    named = ", ".join(str(job_id) for job_id in ids[:LISTED_IDS])
    more = f" and {len(ids) - LISTED_IDS} more" if len(ids) > LISTED_IDS else ""
    return f"{len(ids)} job{'' if len(ids) == 1 else 's'} ({named}{more})"


def _text(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


if apps.is_installed("django.contrib.admin"):
    admin.site.register(Message, MessageAdmin)
    admin.site.register(Archive, ArchiveAdmin)
