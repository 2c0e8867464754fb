"""A backend for Django's task API: ``@task`` functions written for ``django.tasks`` run on jobqueue.

::

    TASKS = {"default": {"BACKEND": "jobqueue.contrib.django.backend.JobQueueBackend",
                         "QUEUES": ["default", "emails"]}}

Django 6 has the API as ``django.tasks``; on Python 3.10 and 3.11 (Django 5.2) it comes from the
``django-tasks`` backport. Either works: this module uses whichever is installed, Django's own first.

Each Django task becomes a jobqueue task named by its module path (``shop.tasks.send_receipt``).
Workers know the tasks of the modules they import: ``manage.py jobqueue worker`` imports the
``tasks`` module of every installed app, so define Django tasks there (or import them from the
JobQueue's own module). Nothing is imported from a name found in the database.

Results read back through the API: ``result.refresh()``, ``task.get_result(id)``. Statuses map as
pending and retryable -> READY, processing -> RUNNING, completed -> SUCCESSFUL, failed and
cancelled -> FAILED. Failed attempts appear in ``errors``; a failed job is retried by jobqueue's
default strategy (``OPTIONS: {"RETRY_STRATEGY": NoRetryStrategy()}`` turns that off).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from jobqueue.clock import utcnow
from jobqueue.contrib.django.integration import MISSING_TASK_API, configured_app
from jobqueue.errors import ConfigurationError, JobQueueError
from jobqueue.retry import RetryStrategy, storable
from jobqueue.settings import validate_queue_name
from jobqueue.storage.tables import MAX_ID

try:  # Django 6.0+
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # the django-tasks backport (Django 5.2, Python 3.10 and 3.11)
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ModuleNotFoundError as exc:
        if exc.name != "django_tasks":
            raise
        raise ImportError(MISSING_TASK_API, name=__name__) from exc

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.task import Task as JobQueueTask

OPTION_KEYS = ("RETRY_STRATEGY",)
STATUSES = {
    "pending": TaskResultStatus.READY,
    "retryable": TaskResultStatus.READY,
    "processing": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}

# Every Django task seen by a JobQueueBackend (Django validates a task when it is defined): module
# path -> (Django task, alias of its backend). Workers register these and nothing else.
KNOWN: dict[str, tuple[Any, str]] = {}


class JobQueueBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        _check_params(alias, params)
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTION_KEYS))
        if unknown:
            raise ConfigurationError(
                f"unknown OPTIONS for TASKS[{alias!r}]: {', '.join(unknown)}; known: {', '.join(OPTION_KEYS)}"
            )
        strategy = self.options.get("RETRY_STRATEGY")
        # Given with every call, so stored with each job: one of the kinds a worker rebuilds.
        if strategy is not None and (not storable(strategy)):
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS']['RETRY_STRATEGY'] must be a strategy "
                "from jobqueue.retry, such as NoRetryStrategy()"
            )
        self.retry_strategy: RetryStrategy | None = strategy

    @property
    def app(self) -> JobQueue:
        return configured_app()

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        KNOWN[task.module_path] = (task, self.alias)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        handle = register(self.app, task.module_path).apply_async(
            args=list(args),
            kwargs=dict(kwargs),
            queue=task.queue_name,
            priority=task.priority,
            eta=task.run_after,
            retry_strategy=self.retry_strategy,
        )
        result = TaskResult(
            task=task,
            id=str(handle.id),
            status=TaskResultStatus.READY,
            enqueued_at=_aware(utcnow()),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        from jobqueue.storage.deadletter import job_row

        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not 1 <= job_id <= MAX_ID:  # no job has it, and no database could be asked for it
            raise TaskResultDoesNotExist(result_id)
        app = self.app
        found = job_row(app.store, job_id)
        if found is None:
            raise TaskResultDoesNotExist(result_id)
        where, row = found
        task = _django_task(row["task_name"], result_id)
        args, kwargs = _arguments(app, row["payload"])
        return _result(app, task, result_id, where, row, args, kwargs, self.alias)


def _check_params(alias: str, params: dict[str, Any]) -> None:
    """QUEUES and OPTIONS as Django's task API reads them, or a ConfigurationError naming the fix."""
    where = f"TASKS[{alias!r}]"
    if "QUEUES" in params:
        queues = params["QUEUES"]
        if not isinstance(queues, (list, tuple, set, frozenset)):
            # A string would be read as a set of one-letter queues, None would fail inside Django.
            raise ConfigurationError(
                f"{where}['QUEUES'] must be a list of queue names, such as ['default', 'emails'], "
                f"got {queues!r} (an empty list takes every queue)"
            )
        for queue in queues:
            try:
                validate_queue_name(queue)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{where}['QUEUES']: {exc}") from None
    options = params.get("OPTIONS", {})
    if not isinstance(options, dict):
        raise ConfigurationError(
            f"{where}['OPTIONS'] must be a dict, such as {{'RETRY_STRATEGY': NoRetryStrategy()}}, got {options!r}"
        )


def register(app: JobQueue, module_path: str) -> JobQueueTask:
    """The jobqueue task that runs the Django task ``module_path``, registered on first use."""
    existing = app.registry.get(module_path)
    if existing is not None:
        return existing

    def run(*args: Any, **kwargs: Any) -> Any:
        return _run(app, module_path, args, kwargs)

    run.__module__, run.__qualname__ = __name__, f"django_task[{module_path}]"
    return app.task(name=module_path)(run)


def register_known(app: JobQueue) -> None:
    """Register every Django task this process has seen (a worker does this before it forks)."""
    for module_path, (_task, _alias) in sorted(KNOWN.items()):
        register(app, module_path)


def _run(app: JobQueue, module_path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from jobqueue.context import current_job

    task, alias = KNOWN[module_path]
    job = current_job()
    label = f"{socket.gethostname()}:{os.getpid()}"
    now = _aware(utcnow())
    result = TaskResult(
        task=task,
        id=str(job.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(args),
        kwargs=dict(kwargs),
        backend=alias,
        errors=[],
        worker_ids=[label] * job.attempt,
    )
    backend = type(task.get_backend())
    task_started.send(sender=backend, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except BaseException:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        raise
    else:
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
        return value
    finally:
        object.__setattr__(result, "finished_at", _aware(utcnow()))
        task_finished.send(sender=backend, task_result=result)


def _django_task(module_path: str, result_id: str) -> Any:
    if module_path not in KNOWN:
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("tasks")
    if module_path not in KNOWN:
        raise TaskResultDoesNotExist(
            f"{result_id} is a job of {module_path!r}, which is not a Django task known here "
            "(define it in an installed app's tasks module)"
        )
    return KNOWN[module_path][0]


def _arguments(app: JobQueue, payload: bytes) -> tuple[list[Any], dict[str, Any]]:
    from jobqueue.serialization import loads_call

    try:
        return loads_call(app.serializer, payload)
    except JobQueueError:
        return [], {}


def _result(
    app: JobQueue,
    task: Any,
    result_id: str,
    where: str,
    row: dict[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
    alias: str,
) -> Any:
    state = row["state"].lower()
    errors = [
        TaskError(exception_class_path=_class_path(entry["error_type"]), traceback=entry.get("error_traceback") or "")
        for entry in row.get("history") or []
        if entry.get("error_type")
    ]
    prefix = "" if where == "archive" else "last_"
    if row.get(f"{prefix}error_type"):
        errors.append(
            TaskError(
                exception_class_path=_class_path(row[f"{prefix}error_type"]),
                traceback=row.get(f"{prefix}error_traceback") or "",
            )
        )
    attempts = int(row.get("attempts_count") or 0)
    result = TaskResult(
        task=task,
        id=result_id,
        status=STATUSES[state],
        enqueued_at=_aware(row["created_at"]),
        started_at=_aware(row.get("first_attempt_at")),
        finished_at=_aware(row.get("finished_at")),
        last_attempted_at=_aware(row.get("last_attempt_at")),
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=errors,
        worker_ids=[row.get("worker_id") or ""] * attempts,
    )
    if state == "completed" and row.get("result") is not None:
        object.__setattr__(result, "_return_value", app.serializer.loads(row["result"]))
    return result


def _class_path(error_type: str) -> str:
    """jobqueue stores builtins unqualified ("ValueError"); Django wants "builtins.ValueError"."""
    return error_type if "." in error_type else f"builtins.{error_type}"


def _aware(value: datetime | None) -> datetime | None:
    """jobqueue stores naive UTC; Django (USE_TZ) expects aware datetimes."""
    if value is None:
        return None
    from django.conf import settings

    aware = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    return aware if settings.USE_TZ else aware.replace(tzinfo=None)
