"""JobQueue: the application object holding settings, the task registry and the storage."""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload
from zoneinfo import ZoneInfo

import sqlalchemy as sa

from jobqueue.errors import ConfigurationError, UnknownTaskError
from jobqueue.handle import JobHandle
from jobqueue.periodic import make_schedule
from jobqueue.schedule_times import Schedule
from jobqueue.serialization import get_serializer
from jobqueue.settings import (
    DATABASE_URL_ENV,
    DEFAULT_DATABASE_URL,
    Settings,
    parse_queues,
    resolve_database_url,
    setting_names,
)
from jobqueue.storage import schema_manager
from jobqueue.storage.engine import BLANK_URL, create_engine, mask_url, same_database
from jobqueue.storage.store import Store
from jobqueue.storage.store_base import commit_watch
from jobqueue.storage.tables import MAX_ID, Tables, build_tables
from jobqueue.storage.topics import START_LATEST, TopicStore
from jobqueue.task import Task
from jobqueue.task_options import build_options, origin, unknown_names
from jobqueue.topics import Consumer, Topic, check_consumer, make_consumer, parse_groups

if TYPE_CHECKING:
    from jobqueue.frameworks import Framework

logger = logging.getLogger("jobqueue")


class JobQueue:
    """A job queue on one database.

    Args:
        database_url: SQLAlchemy URL of the database. ``--database-url`` and
            ``JOBQUEUE_DATABASE_URL`` take precedence; without any, ``sqlite:///jobqueue.sqlite3``.
        **settings: any :class:`jobqueue.settings.Settings` field (worker tuning, table prefix,
            serializer, archive retention...). An unknown name raises ConfigurationError.
    """

    def __init__(self, database_url: str | None = None, **settings: Any) -> None:
        if "queues" in settings:
            settings["queues"] = parse_queues(settings["queues"])
        if "groups" in settings:
            settings["groups"] = parse_groups(settings["groups"])
        unknown = sorted(set(settings) - set(setting_names()))
        if unknown:
            raise ConfigurationError(
                f"unknown JobQueue setting(s): {unknown_names(unknown, setting_names())}; "
                f"known: {', '.join(setting_names())}"
            )
        self.settings = Settings(database_url=_not_blank(database_url), **settings)
        self.serializer = get_serializer(self.settings.serializer)
        self.registry: dict[str, Task] = {}
        self.schedules: dict[str, Schedule] = {}
        self.consumers: dict[tuple[str, str], Consumer] = {}
        self._url_override: str | None = None
        self._store: Store | None = None
        self._tables: Tables | None = None
        self._framework: Framework | None = None
        self._unbound_said = False  # used in a Flask app it is not bound to: said once
        INSTANCES.add(self)

    def __repr__(self) -> str:
        return f"<JobQueue {mask_url(self.database_url)} tasks={len(self.registry)}>"

    # -- configuration -----------------------------------------------------------------------------
    @property
    def database_url(self) -> str:
        framework = self.framework
        if framework is None:
            return resolve_database_url(self._url_override, self.settings.database_url)
        url = framework.database_url()
        for source, other in (
            ("--database-url", self._url_override),
            (DATABASE_URL_ENV, os.environ.get(DATABASE_URL_ENV)),
            ("the URL given to JobQueue()", self.settings.database_url),
        ):
            if other and not same_database(other, url):
                raise ConfigurationError(
                    f"{source} names {mask_url(other)}, but under {framework.name} jobqueue uses "
                    f"{framework.name}'s database ({mask_url(url)}), so that jobs commit with your data; "
                    f"remove {source} or point {framework.name} at that database"
                )
        return url

    # -- frameworks --------------------------------------------------------------------------------
    @property
    def framework(self) -> Framework | None:
        """The web framework integration this queue is bound to (Django is found on its own)."""
        if self._framework is None and self.settings.database_url is None:
            from jobqueue.frameworks import detect_framework

            framework = detect_framework()
            if framework is not None:
                self.bind_framework(framework)
            elif not self._unbound_said and (flask := sys.modules.get("flask")) is not None and flask.has_app_context():
                # In a Flask app's context (a ContextVar read: the cheap test comes first), once.
                self._unbound_said = True
                url = resolve_database_url(self._url_override, None)
                if url == DEFAULT_DATABASE_URL:  # not a database chosen on purpose (JOBQUEUE_DATABASE_URL)
                    from jobqueue.contrib.flask import unbound_warning

                    said = unbound_warning(url)
                    if said:
                        logger.warning("%s", said)
            elif (
                not self._unbound_said
                and (django := sys.modules.get("django.conf")) is not None
                and django.settings.configured
            ):
                self._unbound_said = True  # looked at once Django is configured: its settings do not change
                if resolve_database_url(self._url_override, None) == DEFAULT_DATABASE_URL:
                    from jobqueue.frameworks import django_unbound_warning

                    said = django_unbound_warning(settings_of_django=django.settings)
                    if said:
                        logger.warning("%s", said)
        return self._framework

    def bind_framework(self, framework: Framework) -> None:
        """Use ``framework``'s database, connection and job scope (what ``init_app`` does).

        Binding again to the same framework replaces the binding (the last Flask app made by an
        app factory wins); binding to another framework is an error.
        """
        if self._framework is not None and self._framework.name != framework.name:
            raise ConfigurationError(
                f"this JobQueue is bound to {self._framework.name}; it cannot also use {framework.name}"
            )
        self.close()
        self._framework = framework
        self.database_url  # noqa: B018 -- a URL naming another database fails now, not at first use

    def init_app(self, flask_app: Any, db: Any = None) -> None:
        """Flask: use Flask-SQLAlchemy's database and session (``db``, or the one registered on the app)."""
        from jobqueue.contrib.flask import init_app

        init_app(self, flask_app, db)

    @contextmanager
    def enqueue_connection(self, connection: Any = None, one_statement: bool = False) -> Iterator[Any]:
        """The connection an enqueue writes through: the caller's, the framework's, or None (our own).

        ``one_statement``: the enqueue is a single statement (see :meth:`Framework.connection`).
        """
        framework = self.framework if connection is None else None
        if framework is None:
            yield connection
            return
        with framework.connection(one_statement=one_statement) as ambient:
            yield ambient

    def commit_watch(self, given: Any, used: Any) -> Callable[[], bool] | None:
        """After an enqueue through ``given`` (the caller's connection) or ``used`` (the framework's):
        a function telling whether the transaction holding the job is still open, or None."""
        if given is not None:
            return commit_watch(given)
        if self._framework is not None and used is not None:
            return self._framework.commit_watch(used)
        return None

    @property
    def has_job_scope(self) -> bool:
        """Whether :meth:`job_scope` does anything (a framework is bound); a worker skips it if not."""
        return self._framework is not None

    @contextmanager
    def job_scope(self) -> Iterator[None]:
        """The framework's per-job scope (Flask's app context, Django's connection hygiene)."""
        if self._framework is None:
            yield
            return
        with self._framework.job_scope():
            yield

    def job_returned(self) -> None:
        """As a job's function returns, inside its scope: the framework's check of what it left."""
        if self._framework is not None:
            self._framework.job_returned()

    def before_fork(self) -> None:
        """In the supervisor, before forking: let the framework drop connections a child must not share."""
        if self._framework is not None:
            self._framework.before_fork()

    def configure(self, *, database_url: str | None = None, **changes: Any) -> None:
        """Change settings after creation (the CLI applies its options here).

        ``database_url`` given here outranks the environment and the URL given in code.
        """
        if "queues" in changes:
            changes["queues"] = parse_queues(changes["queues"])
        if "groups" in changes:
            changes["groups"] = parse_groups(changes["groups"])
        if _not_blank(database_url) is not None and database_url != self._url_override:
            self._url_override = database_url
            self.close()
        if changes:
            if "table_prefix" in changes:
                self.close()
            self.settings = self.settings.replace(**changes)
            self.serializer = get_serializer(self.settings.serializer)

    @property
    def tables(self) -> Tables:
        if self._tables is None or self._tables.prefix != self.settings.table_prefix:
            self._tables = build_tables(self.settings.table_prefix)
        return self._tables

    @property
    def store(self) -> Store:
        """The storage, connected on first use."""
        if self._store is None:
            url = self.database_url  # binds the framework, if one is found
            self._store = Store(create_engine(url), self.tables, schema_command=self._schema_command())
        return self._store

    @property
    def topic_store(self) -> TopicStore:
        return TopicStore(self.store)

    @property
    def engine(self) -> sa.Engine:
        return self.store.engine

    def close(self) -> None:
        """Close every pooled connection (a later use reconnects)."""
        if self._store is not None:
            self._store.dispose()
            self._store = None

    def after_fork(self) -> None:
        """In a forked child: drop the parent's pooled connections without closing them under it."""
        if self._store is not None:
            self._store.dispose(close=False)

    # -- schema ------------------------------------------------------------------------------------
    def _schema_command(self) -> str | None:
        """What schema errors tell to run where the framework manages the tables (``python manage.py
        migrate`` under Django); None: jobqueue's own commands (``jobqueue db init``)."""
        framework = self.framework
        return None if framework is None else framework.schema_command

    def init_schema(self) -> str:
        """Create the tables if missing (what ``jobqueue db init`` runs); return what was done."""
        return schema_manager.init_schema(self.engine, self.tables)

    def upgrade_schema(self, dry_run: bool = False) -> list[str]:
        """Bring older tables to this release's schema (``jobqueue db upgrade``); return the SQL run."""
        from jobqueue.storage.migrations import upgrade

        return upgrade(self.engine, self.tables, dry_run=dry_run, schema_command=self._schema_command())

    def check_schema(self, beyond_tables: bool = True) -> None:
        """Raise SchemaError unless the tables exist at this release's version.

        ``beyond_tables=False``: what `jobqueue db init` makes beyond the tables (PostgreSQL's
        wake-up trigger, without which new jobs wait for the next poll) is not asked for.
        """
        schema_manager.check_schema(self.engine, self.tables, self._schema_command(), beyond_tables)

    # -- tasks -------------------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(self, fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], Task]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(name=..., queue=..., ...)``.

        Options are checked now: an unknown or invalid one raises ConfigurationError at import.
        """

        def register(func: Callable[..., Any]) -> Task:
            if isinstance(func, Task):
                raise ConfigurationError(f"{func.name} is already a task; apply @app.task once")
            if not callable(func):
                raise ConfigurationError(
                    f"@app.task decorates a function, got {type(func).__name__} {func!r}; "
                    "give options by name: @app.task(name=...)"
                )
            task = Task(self, func, build_options(func, options))
            existing = self.registry.get(task.name)
            if existing is not None and existing.fn is not func and origin(existing.fn) != origin(func):
                raise ConfigurationError(
                    f"task name {task.name!r} is already registered by {origin(existing.fn)}; "
                    "give one of them another name="
                )
            self.registry[task.name] = task
            return task

        if fn is not None:
            if options:
                raise ConfigurationError("use @app.task or @app.task(**options), not both")
            return register(fn)
        return register

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        timezone: str | ZoneInfo = "UTC",
        name: str | None = None,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Callable[[Task], Task]:
        """Run a task on a schedule: ``@app.periodic(cron="*/5 * * * *", timezone="Europe/Paris")`` or
        ``@app.periodic(every=timedelta(minutes=5))``, written above ``@app.task``.

        ``args``/``kwargs`` are passed to each run; ``name`` (default: the task's name) identifies the
        schedule, so one task can have several. Checked now: a bad expression or timezone raises
        ConfigurationError at import. Workers create the schedule when they start.
        """

        def register(task: Task) -> Task:
            schedule = make_schedule(self, task, cron, every, timezone, name, args, kwargs)
            if schedule.name in self.schedules:
                raise ConfigurationError(f"schedule {schedule.name!r} is defined twice; give one of them name=")
            self.schedules[schedule.name] = schedule
            return task

        return register

    # -- topics ------------------------------------------------------------------------------------
    def topic(self, name: str) -> Topic:
        """The topic ``name``: ``app.topic("orders").publish({"id": 7}, key="customer-7")``."""
        return Topic(self, name)

    def consumer(
        self, topic: str, *, group: str, start: str = START_LATEST, **options: Any
    ) -> Callable[[Callable[..., Any]], Consumer]:
        """Register a consumer group's handler: ``@app.consumer("orders", group="billing")``.

        Every group gets every message of the topic, with its own deliveries, retries and dead
        letters. A new group starts at the messages published once a worker first runs it
        (``start="latest"``) or at the oldest message the log still holds (``start="earliest"``).
        Options: retry_strategy, retry_on, ack_policy, timeout, soft_timeout, max_deliveries, bind.
        """

        check_consumer(topic, group, start, options)

        def register(fn: Callable[..., Any]) -> Consumer:
            consumer = make_consumer(self, fn, topic, group, start, options)
            if (consumer.topic, consumer.group) in self.consumers:
                raise ConfigurationError(
                    f"group {consumer.group!r} of topic {consumer.topic!r} already has a consumer (one handler a group)"
                )
            self.consumers[(consumer.topic, consumer.group)] = consumer
            self.registry[consumer.task.name] = consumer.task
            return consumer

        return register

    def get_task(self, name: str) -> Task:
        """Return the task registered as ``name``; raise UnknownTaskError naming it otherwise."""
        task = self.registry.get(name)
        if task is None:
            known = ", ".join(sorted(self.registry)) or "none"
            raise UnknownTaskError(f"task {name!r} is not registered in this app (registered: {known})")
        return task

    def job(self, job_id: int | str) -> JobHandle:
        """Return a handle on an existing job by id (an integer, or its digits as a string).

        Raises TypeError or ValueError for what cannot be a job id: a float would have been
        truncated to another job's id, and SQLite cannot even look up one past 64 bits.
        """
        if isinstance(job_id, bool) or not isinstance(job_id, (int, str)):
            raise TypeError(f"app.job() takes a job id, an integer, got {type(job_id).__name__} {job_id!r}")
        number = int(job_id)
        if not 1 <= number <= MAX_ID:
            raise ValueError(f"job ids run from 1 to {MAX_ID}, got {job_id!r}")
        return JobHandle(self, number)

    # -- worker ------------------------------------------------------------------------------------
    def run_worker(self, **overrides: Any) -> int:
        """Run a supervisor and its worker processes in this process until stopped; return the exit code.

        ``overrides`` are worker settings (``concurrency=2``, ``burst=True``, ``progress=True``, ...).
        """
        from jobqueue.runtime.supervisor import run_supervisor

        burst = bool(overrides.pop("burst", False))
        progress = bool(overrides.pop("progress", False))
        if overrides:
            self.configure(**overrides)
        return run_supervisor(self, burst=burst, progress=progress)


INSTANCES: weakref.WeakSet[JobQueue] = weakref.WeakSet()  # every JobQueue made, for integrations to find


def _forget_parent_connections() -> None:
    """In a process just forked (a job's multiprocessing pool, a pre-forking web server): the
    pooled connections are the parent's, and two processes talking down one socket read each
    other's replies. The child opens its own when it first needs one."""
    for app in list(INSTANCES):
        app.after_fork()


os.register_at_fork(after_in_child=_forget_parent_connections)


def _not_blank(database_url: str | None) -> str | None:
    """``database_url``, unless it is given and blank (``os.environ.get("DATABASE_URL", "")`` with the
    variable unset): ConfigurationError, where it would have fallen back to the default SQLite file."""
    if isinstance(database_url, str) and not database_url.strip():
        raise ConfigurationError(BLANK_URL)
    return database_url
