"""The Django app config: checks the JOBQUEUE setting when Django starts."""

from __future__ import annotations

from django.apps import AppConfig


class JobQueueConfig(AppConfig):
    name = "jobqueue.contrib.django"
    label = "jobqueue"
    verbose_name = "jobqueue"
    default = True

    def ready(self) -> None:
        from jobqueue.contrib import detect_django
        from jobqueue.contrib.django.integration import database_alias
        from jobqueue.frameworks import DETECTORS

        database_alias()  # a bad JOBQUEUE setting fails at start-up, naming the fix
        if detect_django not in DETECTORS:
            DETECTORS.append(detect_django)  # a JobQueue made without a URL uses Django's database
