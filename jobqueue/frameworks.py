"""What a web-framework integration provides a JobQueue, and how a JobQueue finds one.

A :class:`Framework` binds a :class:`~jobqueue.JobQueue` to a framework's database: the queue's URL
is the framework's, ``delay()`` without ``connection=`` writes through the framework's current
connection or session (so the job commits or rolls back with the request's work), and every job
runs inside the framework's per-job scope. The integrations live in ``jobqueue.contrib``; one that
can be found on its own (Django's, when its app starts) adds a detector to :data:`DETECTORS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Framework:
    """What an integration provides; the defaults do nothing."""

    name = "framework"
    # The command that creates and upgrades the jobqueue tables when the framework manages them
    # (its migrations); error messages name it. None: jobqueue's own, ``jobqueue db init``.
    schema_command: str | None = None

    def database_url(self) -> str:
        """The URL of the framework's database (workers and the CLI connect to it)."""
        raise NotImplementedError

    @contextmanager
    def connection(self, one_statement: bool = False) -> Iterator[Any]:
        """The connection or session an enqueue without ``connection=`` writes through, or None.

        ``one_statement``: the enqueue writes with a single statement, which needs no transaction
        around it; otherwise what is written must commit or roll back as a whole.
        """
        yield None

    def commit_watch(self, connection: Any) -> Callable[[], bool] | None:
        """After an enqueue through ``connection``: a function telling whether the transaction
        holding the new job is still open (None: it is committed already)."""
        from jobqueue.storage.store_base import commit_watch

        return commit_watch(connection)

    def never_commits(self) -> str | None:
        """Why the framework's transaction open now will never commit, naming the fix (a test
        framework's that rolls back every test), or None when it may commit."""
        return None

    @contextmanager
    def job_scope(self) -> Iterator[None]:
        """Wraps every job a worker process runs."""
        yield

    def job_returned(self) -> None:
        """Called in the job's scope as its function returns: raise, naming the fix, if what the job
        left would be lost as the scope ends (the job then fails, and is retried by its strategy)."""

    def before_fork(self) -> None:
        """Called in the supervisor before it forks worker processes."""

    def check_worker(self) -> None:
        """Raise, naming the fix, if a worker cannot start now in this process (before it forks)."""

    def check_drain(self) -> None:
        """Raise, naming the fix, if :func:`jobqueue.testing.drain` cannot run now: it runs jobs
        on jobqueue's own connections, beside the framework's."""


# Each returns the Framework this process runs under, or None; asked by a JobQueue made without a URL.
DETECTORS: list[Callable[[], Framework | None]] = []


def detect_framework() -> Framework | None:
    """The first framework a detector finds, or None (cheap: a JobQueue asks on first use)."""
    for detect in DETECTORS:
        framework = detect()
        if framework is not None:
            return framework
    return None


def django_unbound_warning(settings_of_django: Any) -> str | None:
    """What to say when a JobQueue made without a URL is used in a Django project that does not
    install jobqueue's Django app: its jobs go to ``jobqueue.sqlite3``, outside Django's
    transactions, without a word. None when the app is installed (Django is still starting)."""
    if any(str(name).startswith("jobqueue.contrib.django") for name in settings_of_django.INSTALLED_APPS):
        return None
    return (
        "this JobQueue has no database URL and runs in a Django project without jobqueue's Django app: its "
        "jobs go to ./jobqueue.sqlite3, outside Django's database and transactions. Add "
        "'jobqueue.contrib.django' to INSTALLED_APPS (or give the JobQueue a URL to use another database on "
        "purpose)"
    )
