"""The Django app config: checks the JOBQUEUE setting when Django starts."""

from __future__ import annotations

from django.apps import AppConfig


class JobQueueConfig(AppConfig):
    name = "jobqueue.contrib.django"
    label = "jobqueue"
    verbose_name = "jobqueue"
    default = True

    def ready(self) -> None:
        from jobqueue.contrib.django.integration import database_alias

        database_alias()  # a bad JOBQUEUE setting fails at start-up, naming the fix
