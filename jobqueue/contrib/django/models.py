"""Read-only Django models over jobqueue's message and archive tables (what the admin shows).

The tables are jobqueue's own: the app's migrations create them as ``jobqueue db init`` does, and
these models are unmanaged, so Django never creates or alters them. Their table names follow the
configured JobQueue's ``table_prefix``, and their queries go to the ``JOBQUEUE['DATABASE']``
database whatever router the project has. Jobs change only through jobqueue (retry, cancel), under
its rules: saving or deleting one of these rows is refused.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone as django_timezone

from jobqueue.job import ACTIVE_STATES, FINAL_STATES


class UTCDateTimeField(models.DateTimeField):
    """A jobqueue timestamp: naive UTC in every database, read as Django expects it.

    Django reads a naive SQLite or MySQL value in the connection's time zone (UTC unless the
    database's ``TIME_ZONE`` says otherwise) and PostgreSQL's ``timestamp without time zone``
    not at all; the value is made UTC again here, then aware under ``USE_TZ`` and local without.
    """

    def from_db_value(self, value: datetime | None, expression: Any, connection: Any) -> datetime | None:
        if value is None:
            return None
        if django_timezone.is_aware(value):
            value = django_timezone.make_naive(value, connection.timezone)
        value = value.replace(tzinfo=timezone.utc)
        return value if settings.USE_TZ else django_timezone.make_naive(value)


class JobManager(models.Manager):
    """Queries the configured JobQueue's tables on its database alias."""

    def get_queryset(self) -> models.QuerySet:
        from jobqueue.contrib.django.integration import database_alias

        bind_tables()
        return super().get_queryset().using(database_alias())


class Job(models.Model):
    """Columns that an active job and an archived one share."""

    id = models.BigIntegerField(primary_key=True)
    task_name = models.CharField("task", max_length=255)
    queue = models.CharField(max_length=100)
    priority = models.IntegerField()
    attempts_count = models.IntegerField("attempts")
    payload = models.BinaryField()
    unique_key = models.CharField(max_length=255, null=True)
    partition_key = models.CharField(max_length=255, null=True)
    created_at = UTCDateTimeField("enqueued at")
    first_attempt_at = UTCDateTimeField(null=True)
    last_attempt_at = UTCDateTimeField(null=True)

    objects = JobManager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"job {self.id} ({self.task_name})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(_READ_ONLY)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(_READ_ONLY)


_READ_ONLY = (
    "jobqueue's rows change only through jobqueue: retry or cancel a job (the admin's actions, "
    "`jobqueue jobs retry|cancel`), purge the archive with `jobqueue jobs purge`"
)


class Message(Job):
    """A job waiting to run, running or waiting for a retry: a row of the message table."""

    state = models.CharField(max_length=10, choices=[(state.value, state.public) for state in ACTIVE_STATES])
    next_attempt_at = UTCDateTimeField("next attempt at")
    worker_id = models.CharField("worker", max_length=32, null=True)
    last_error_type = models.CharField(max_length=255, null=True)
    last_error_message = models.TextField(null=True)
    last_error_traceback = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "jobqueue_message"
        verbose_name = "active job"
        verbose_name_plural = "active jobs"


class Archive(Job):
    """A job that ended (completed, failed or cancelled): a row of the archive table."""

    state = models.CharField(max_length=10, choices=[(state.value, state.public) for state in FINAL_STATES])
    finished_at = UTCDateTimeField(null=True)
    archived_at = UTCDateTimeField()
    result = models.BinaryField(null=True)
    error_type = models.CharField(max_length=255, null=True)
    error_message = models.TextField(null=True)
    error_traceback = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "jobqueue_archive"
        verbose_name = "archived job"
        verbose_name_plural = "archived jobs"


def bind_tables() -> None:
    """Point the models at the configured JobQueue's tables (its ``table_prefix``).

    The prefix is known only once the JobQueue is imported, which models.py must not do while
    Django loads the apps, so the names are set on first use. ``Meta.db_table`` keeps the default
    names: the migration state stays the same whatever the prefix.
    """
    global _bound
    if _bound:
        return
    from jobqueue.contrib.django.integration import configured_app

    tables = configured_app().tables
    Message._meta.db_table = tables.message.name
    Archive._meta.db_table = tables.archive.name
    _bound = True


_bound = False
