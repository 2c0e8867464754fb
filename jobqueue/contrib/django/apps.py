"""The Django app config: checks the JOBQUEUE setting (and TASKS, where it uses jobqueue) when Django starts."""

from __future__ import annotations

from django.apps import AppConfig


class JobQueueConfig(AppConfig):
    name = "jobqueue.contrib.django"
    label = "jobqueue"
    verbose_name = "jobqueue"
    default = True

    def ready(self) -> None:
        from jobqueue.contrib import detect_django
        from jobqueue.contrib.django.integration import (
            check_task_backends,
            database_alias,
            release_around_test_databases,
        )
        from jobqueue.frameworks import DETECTORS

        database_alias()  # a bad JOBQUEUE setting fails at start-up, naming the fix
        check_task_backends()  # so does a TASKS setting that needs Django's task API where it is missing
        release_around_test_databases()  # so that Django's test runner can drop its test databases
        from django.db.models.signals import post_migrate

        from jobqueue.contrib.django.schema import tables_after_migrate

        post_migrate.connect(tables_after_migrate, sender=self, dispatch_uid="jobqueue.tables_after_migrate")
        if detect_django not in DETECTORS:
            DETECTORS.append(detect_django)  # a JobQueue made without a URL uses Django's database
