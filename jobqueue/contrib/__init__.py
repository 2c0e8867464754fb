"""Integrations with web frameworks: enqueue inside the application's own transaction.

A :class:`Framework` binds a :class:`~jobqueue.JobQueue` to a framework's database: the queue's URL
is the framework's, ``delay()`` without ``connection=`` writes through the framework's current
connection or session (so the job commits or rolls back with the request's work), and every job
runs inside the framework's per-job scope. ``jobqueue.contrib.django`` and ``jobqueue.contrib.flask``
are the two integrations.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator


class Framework:
    """What an integration provides; the defaults do nothing."""

    name = "framework"

    def database_url(self) -> str:
        """The URL of the framework's database (workers and the CLI connect to it)."""
        raise NotImplementedError

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """The connection or session an enqueue without ``connection=`` writes through, or None."""
        yield None

    @contextmanager
    def job_scope(self) -> Iterator[None]:
        """Wraps every job a worker process runs."""
        yield

    def before_fork(self) -> None:
        """Called in the supervisor before it forks worker processes."""


def detect_framework() -> Framework | None:
    """The Django integration when this process runs a Django project that installed it, else None.

    Cheap when Django is not imported: a JobQueue created without a URL asks this on first use.
    """
    conf = sys.modules.get("django.conf")
    if conf is None:
        return None
    settings: Any = conf.settings
    if not settings.configured:
        return None
    if not any(str(name).startswith("jobqueue.contrib.django") for name in settings.INSTALLED_APPS):
        return None
    from jobqueue.contrib.django.integration import DjangoIntegration

    return DjangoIntegration.from_settings()
