"""Django's side of the binding: the JOBQUEUE setting, the database URL, Django's own connection.

``JOBQUEUE = {"APP": "shop.tasks:app", "DATABASE": "default"}`` (both keys optional). The queue uses
the Django database named by ``DATABASE``: workers connect to it with jobqueue's own connections,
and ``delay()`` in a web process writes through Django's connection for that alias, so inside
``transaction.atomic()`` a rollback leaves no job.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import sqlalchemy as sa

from jobqueue.contrib import Framework
from jobqueue.errors import ConfigurationError
from jobqueue.storage.engine import absolute_url

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

SETTING_KEYS = ("APP", "DATABASE")
BACKEND = "jobqueue.contrib.django.backend.JobQueueBackend"
MISSING_TASK_API = (
    f"{BACKEND} runs Django's task API, which this project lacks: Django 6 has it as django.tasks; on "
    'Django 5.2 install the django-tasks backport (pip install django-tasks, or pip install "jobqueue[django-tasks]") '
    'and add "django_tasks" to INSTALLED_APPS'
)
VENDORS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+mysqldb", "sqlite": "sqlite"}
# OPTIONS Django reads itself; the rest are driver connection arguments, passed on to jobqueue's.
DJANGO_ONLY_OPTIONS = {
    "isolation_level",
    "assume_role",
    "pool",
    "server_side_binding",
    "transaction_mode",
    "init_command",
    "conn_max_age",
    "timeout",
}


def jobqueue_setting() -> dict[str, Any]:
    """``settings.JOBQUEUE``, checked."""
    from django.conf import settings

    value = getattr(settings, "JOBQUEUE", None) or {}
    if not isinstance(value, dict):
        raise ConfigurationError(
            "settings.JOBQUEUE must be a dict such as {'APP': 'shop.tasks:app', 'DATABASE': 'default'}"
        )
    unknown = sorted(set(value) - set(SETTING_KEYS))
    if unknown:
        raise ConfigurationError(
            f"unknown key(s) in settings.JOBQUEUE: {', '.join(unknown)}; known: {', '.join(SETTING_KEYS)}"
        )
    return value


def database_alias() -> str:
    from django.db import connections

    alias = jobqueue_setting().get("DATABASE", "default")
    if alias not in connections.settings:
        raise ConfigurationError(
            f"settings.JOBQUEUE['DATABASE'] is {alias!r}, which settings.DATABASES does not "
            f"define (it has: {', '.join(connections.settings)})"
        )
    return str(alias)


def database_url(alias: str) -> sa.URL:
    """The SQLAlchemy URL of a Django database, for jobqueue's own connections (workers, the CLI)."""
    from django.db import connections

    connection = connections[alias]
    vendor = connection.vendor
    if vendor not in VENDORS:
        raise ConfigurationError(
            f"Django database {alias!r} is {vendor}; jobqueue runs on PostgreSQL, MySQL/MariaDB and SQLite"
        )
    config = connection.settings_dict
    name = str(config.get("NAME") or "")
    options = {
        key: str(value)
        for key, value in (config.get("OPTIONS") or {}).items()
        if key not in DJANGO_ONLY_OPTIONS and isinstance(value, (str, int)) and not isinstance(value, bool)
    }
    if vendor == "sqlite" and name.startswith("file:"):
        # Django opens every SQLite name as a URI: "file:/path?mode=rwc", and the in-memory
        # databases of its test runner ("file:memorydb_default?mode=memory&cache=shared").
        name, _, query = name.partition("?")
        options.update(parse_qsl(query, keep_blank_values=True))
        options["uri"] = "true"
    port = config.get("PORT")
    host = str(config.get("HOST") or "") or None
    if host is not None and host.startswith("/"):
        # A Unix socket: its directory (PostgreSQL) or its file (MySQL), as Django takes it. A
        # URL's host cannot hold a path (read back, the path became the database's name), so the
        # driver gets it as a connection argument.
        if vendor == "postgresql":
            options["host"] = host
            if port:
                options["port"] = str(port)  # which socket of the directory
        else:
            options["unix_socket"] = host
        host = port = None
    return absolute_url(
        sa.URL.create(
            VENDORS[vendor],
            username=config.get("USER") or None,
            password=config.get("PASSWORD") or None,
            host=host,
            port=int(port) if port else None,
            database=name or None,
            query=options,
        )
    )


class DjangoIntegration(Framework):
    """Binds a JobQueue to one Django database alias."""

    name = "Django"

    def __init__(self, alias: str) -> None:
        self.alias = alias
        # The app's migrations create and upgrade the tables, on this alias only.
        database = "" if alias == "default" else f" --database {alias}"
        self.schema_command = f"python manage.py migrate{database}"
        self._engine: sa.Engine | None = None

    @classmethod
    def from_settings(cls) -> DjangoIntegration:
        return cls(database_alias())

    def database_url(self) -> str:
        return database_url(self.alias).render_as_string(hide_password=False)

    @contextmanager
    def connection(self, one_statement: bool = False) -> Iterator[Any]:
        # Django's own connection for the alias, in whatever transaction Django has it in: inside
        # transaction.atomic() the job commits or rolls back with it. Outside, Django commits each
        # statement on its own: enough for one statement, but an enqueue of several (a bulk in
        # batches, a concurrency key held while its jobs go in) could leave part of its jobs behind
        # if it failed midway, so it gets a transaction of its own, committed when it is done.
        from django.db import connections, transaction

        alone = one_statement or connections[self.alias].in_atomic_block
        scope = nullcontext() if alone else transaction.atomic(using=self.alias)
        with scope, self.engine().connect() as connection:
            yield connection

    def commit_watch(self, connection: Any) -> Callable[[], bool] | None:
        # Django, not SQLAlchemy, knows the transaction: a callback on its commit says when it
        # happened, and one dropped from Django's list says the block holding the job rolled back.
        from django.db import connections, transaction

        wrapper = connections[self.alias]
        if by_hand(wrapper):
            # transaction.set_autocommit(False): Django runs no callback at a commit made by hand.
            # The job is taken for uncommitted while that connection stays out of autocommit.
            raw = wrapper.connection
            return lambda: wrapper.connection is raw and by_hand(wrapper)
        if not wrapper.in_atomic_block:
            return None  # autocommit: the job is committed already
        # One callback for the jobs enqueued in a row at the same depth of savepoints: Django drops
        # it with the innermost savepoint that rolls back, and runs it at the commit.
        last = wrapper.run_on_commit[-1] if wrapper.run_on_commit else None
        if last is not None and isinstance(last[1], CommitSeen) and last[0] == set(wrapper.savepoint_ids):
            on_commit = last[1]
        else:
            on_commit = CommitSeen()
            transaction.on_commit(on_commit, using=self.alias)
        # TestCase's block never commits, though captureOnCommitCallbacks(execute=True) runs the
        # callbacks, this one included: while that block is open, the job is not committed.
        blocks = getattr(wrapper, "atomic_blocks", None)
        test_block = blocks[0] if blocks and getattr(blocks[0], "_from_testcase", False) else None

        def still_open() -> bool:
            if test_block is not None and (wrapper.atomic_blocks or [None])[0] is test_block:
                return True
            return not on_commit.seen and any(entry[1] is on_commit for entry in wrapper.run_on_commit)

        return still_open

    def never_commits(self) -> str | None:
        # django.test.TestCase (and pytest-django's django_db without transaction=True) opens the
        # outermost atomic block of each database itself and marks it so, as Django's own check of
        # atomic(durable=True) reads it.
        from django.db import connections

        blocks = getattr(connections[self.alias], "atomic_blocks", None)
        if not blocks or not getattr(blocks[0], "_from_testcase", False):
            return None
        return (
            "this one is django.test.TestCase's, which never commits (captureOnCommitCallbacks runs "
            "the on_commit callbacks, but commits nothing either): use django.test.TransactionTestCase "
            "(pytest-django: @pytest.mark.django_db(transaction=True)), whose tests commit"
        )

    def engine(self) -> sa.Engine:
        if self._engine is None:
            from django.db import connections

            from jobqueue.storage.borrowed import borrowed_engine

            wrapper = connections[self.alias]

            def current() -> Any:
                owner = connections[self.alias]  # Django keeps one connection per thread
                owner.ensure_connection()
                return owner.connection

            self._engine = borrowed_engine(wrapper.vendor, wrapper.Database.__name__.split(".")[0], current)
        return self._engine

    @contextmanager
    def job_scope(self) -> Iterator[None]:
        # What Django does around a request: drop connections that broke or outlived CONN_MAX_AGE.
        from django.db import close_old_connections

        close_old_connections()
        try:
            yield
        finally:
            close_old_connections()

    def before_fork(self) -> None:
        # A connection opened in the supervisor must not be shared by its children.
        from django.db import connections

        connections.close_all()

    def check_worker(self) -> None:
        # Before it forks, the supervisor closes Django's connections (see before_fork): one in a
        # transaction would lose that transaction's work without a word, and on SQLite its lock
        # would hold up the worker's processes meanwhile. Refuse at once, naming the fix.
        from django.db import connections

        for wrapper in connections.all(initialized_only=True):
            if wrapper.in_atomic_block or by_hand(wrapper):
                raise ConfigurationError(
                    f"a worker cannot start inside a transaction: Django's {wrapper.alias!r} database has one "
                    f"open{_test_case_note(wrapper)}, and the worker closes Django's connections before it forks "
                    "its processes (they must not share them), which would throw that transaction's work away. "
                    "Start the worker (call_command('jobqueue', 'worker', ...)) after the transaction commits; in "
                    "tests, from a django.test.TransactionTestCase (pytest-django: "
                    "@pytest.mark.django_db(transaction=True)), or run the jobs with jobqueue.testing.drain()"
                )

    def check_drain(self) -> None:
        # drain() reads and writes on jobqueue's own connections. A transaction still open on
        # Django's connection (a TestCase runs each test in one) hides the jobs it enqueued from
        # them, and on SQLite it holds the write lock they would wait for until the busy timeout
        # and then fail: refuse at once, naming the fix.
        from django.db import connections

        wrapper = connections[self.alias]
        if not (wrapper.in_atomic_block or by_hand(wrapper)):
            return
        waits = " (on SQLite they would also wait for its lock)" if wrapper.vendor == "sqlite" else ""
        raise ConfigurationError(
            f"drain() was called inside a transaction on Django's {self.alias!r} database, which has "
            "not committed (django.test.TestCase runs every test in one, never committed): drain() runs "
            f"jobs on jobqueue's own connections, which cannot see the jobs enqueued in it{waits}; use "
            "django.test.TransactionTestCase (pytest-django: @pytest.mark.django_db(transaction=True)), "
            "or call drain() after the transaction commits"
        )


class CommitSeen:
    """An on_commit callback that notes the commit of the jobs enqueued before it."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self) -> None:
        self.seen = True

    def __repr__(self) -> str:  # as captureOnCommitCallbacks lists it
        return "<jobqueue: notes that the jobs enqueued in this transaction committed>"


def by_hand(wrapper: Any) -> bool:
    """Whether a Django connection is in a transaction managed by hand
    (``transaction.set_autocommit(False)``): out of autocommit, and not in an atomic block that
    commits as it ends (inside one, Django turns autocommit off itself)."""
    if wrapper.connection is None or wrapper.autocommit:
        return False
    return not wrapper.in_atomic_block or not wrapper.commit_on_exit


def _test_case_note(wrapper: Any) -> str:
    blocks = getattr(wrapper, "atomic_blocks", None)
    if blocks and getattr(blocks[0], "_from_testcase", False):
        return " (django.test.TestCase runs every test in one, never committed)"
    return ""


def check_task_backends() -> None:
    """Fail at start-up, naming the fix, if ``settings.TASKS`` uses JobQueueBackend without Django's task API."""
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None) or {}
    uses = [alias for alias, config in tasks.items() if isinstance(config, dict) and config.get("BACKEND") == BACKEND]
    if uses and not has_task_api():
        raise ConfigurationError(f"settings.TASKS[{uses[0]!r}]: {MISSING_TASK_API}")


def has_task_api() -> bool:
    """Whether Django's task API can be imported: Django 6's own, or the django-tasks backport."""
    return any(importlib.util.find_spec(name) is not None for name in ("django.tasks", "django_tasks"))


_default_app: JobQueue | None = None
_default_lock = threading.Lock()


def default_app() -> JobQueue:
    """The JobQueue used when the project defines none (nor ``JOBQUEUE['APP']``)."""
    global _default_app
    with _default_lock:
        if _default_app is None:
            from jobqueue.app import JobQueue

            _default_app = JobQueue()
        return _default_app


def configured_app() -> JobQueue:
    """The JobQueue the Django project uses: ``JOBQUEUE['APP']``, else the one its modules made.

    ``tasks`` modules of the installed apps are imported first (as Celery's autodiscovery does), so
    their tasks, including those written for Django's task API, are registered.
    """
    from django.utils.module_loading import autodiscover_modules

    from jobqueue.app import INSTANCES
    from jobqueue.cli.state import load_app

    autodiscover_modules("tasks")
    spec = jobqueue_setting().get("APP")
    if spec:
        app = load_app(str(spec), named_by="settings.JOBQUEUE['APP']")
    else:
        fallback = default_app()
        candidates = [jq for jq in INSTANCES if jq is not fallback and jq.settings.database_url is None and jq.registry]
        if len(candidates) > 1:
            raise ConfigurationError(
                f"this project has {len(candidates)} JobQueue objects with tasks; name the one to use in "
                "settings.JOBQUEUE = {'APP': 'module:attribute'}"
            )
        app = candidates[0] if candidates else fallback
    bind(app)
    # Django tasks exist only where Django loaded JobQueueBackend, which needs Django's task API:
    # without the backend loaded there are none to register, and no reason to import that API.
    backend = sys.modules.get("jobqueue.contrib.django.backend")
    if backend is not None:
        backend.register_known(app)
    return app


def bind(app: JobQueue) -> None:
    """Bind ``app`` to the configured Django database (a JobQueue made without a URL binds itself)."""
    if app.framework is None:
        app.bind_framework(DjangoIntegration.from_settings())


def release_queues() -> None:
    """Close the pooled connections of every JobQueue bound to Django (a later use reconnects)."""
    from jobqueue.app import INSTANCES

    for app in list(INSTANCES):
        # Read the binding as it is: asking app.framework would bind an unbound queue now.
        if isinstance(app._framework, DjangoIntegration):
            app.close()


def release_around_test_databases() -> None:
    """Release jobqueue's pooled connections when Django creates, destroys or clones a test database.

    Django's test runner and pytest-django both go through ``creation.create_test_db`` and
    ``destroy_test_db``, and Django sends no signal there. Before a test database is dropped,
    jobqueue's connections to it must be closed (PostgreSQL refuses to drop a database others are
    connected to); before one is created, connections opened earlier to the real database must go,
    so that the tests' jobs are read and run in the test database. With ``--parallel``, each test
    process points its connection at its own clone (``setup_worker_connection``): the connections
    it inherited from the runner's process (the parent's, dropped at the fork without being closed)
    led to the test database the runner made, not to the clone its jobs go to. Wraps the methods
    once, on the base class and on the classes of the configured databases that have their own.
    """
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections
    from django.db.backends.base.creation import BaseDatabaseCreation

    classes = {BaseDatabaseCreation}
    for alias in connections:
        try:
            classes.add(type(connections[alias].creation))
        except ImproperlyConfigured:  # a backend that cannot load: Django says so when it is used
            continue
    for cls in classes:
        for name in ("create_test_db", "destroy_test_db", "setup_worker_connection"):
            method = cls.__dict__.get(name)
            if method is None or getattr(method, "releases_jobqueue", False):
                continue  # inherited (wrapped where it is defined), absent (older Django), or wrapped
            setattr(cls, name, _releasing(method))
        if hasattr(cls, "is_in_memory_db"):  # SQLite's
            for name, wrap in (
                ("_create_test_db", _journals_gone_after_create),
                ("_clone_test_db", _journals_gone_before_clone),
                ("_destroy_test_db", _journals_gone_after_destroy),
            ):
                method = cls.__dict__.get(name)
                if method is not None and not getattr(method, "releases_jobqueue", False):
                    wrapped = functools.wraps(method)(wrap(method))
                    wrapped.releases_jobqueue = True  # type: ignore[attr-defined]
                    setattr(cls, name, wrapped)


def _releasing(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        release_queues()
        return original(self, *args, **kwargs)

    wrapper.releases_jobqueue = True  # type: ignore[attr-defined]
    return wrapper


# SQLite test databases: jobqueue's connections put them in WAL mode, whose journal files (-wal,
# -shm) lie beside the database. Django removes a test database's file, not those: the test
# processes of --parallel end without closing jobqueue's connections, and a journal left beside a
# clone's name was read into the next run's clone of that name (an earlier run's jobs in it, or
# "disk I/O error"). Those of a file Django removes or replaces are removed with it.


def _remove_journals(path: str) -> None:
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def _journals_gone_after_create(original: Callable[..., Any]) -> Callable[..., Any]:
    def create(self: Any, verbosity: int, autoclobber: bool, keepdb: bool = False) -> Any:
        name = original(self, verbosity, autoclobber, keepdb)
        if not keepdb and name and not self.is_in_memory_db(name) and not os.path.exists(name):
            _remove_journals(name)  # the old file is gone, the new one not made yet
        return name

    return create


def _journals_gone_before_clone(original: Callable[..., Any]) -> Callable[..., Any]:
    def clone(self: Any, suffix: Any, verbosity: int, keepdb: bool = False) -> Any:
        source = self.connection.settings_dict["NAME"]
        if source and not self.is_in_memory_db(source):
            target = self.get_test_db_clone_settings(suffix)["NAME"]
            if not (keepdb and os.path.exists(target)):  # a kept clone keeps its journal
                _remove_journals(target)
        return original(self, suffix, verbosity, keepdb)

    return clone


def _journals_gone_after_destroy(original: Callable[..., Any]) -> Callable[..., Any]:
    def destroy(self: Any, test_database_name: str, verbosity: int) -> Any:
        result = original(self, test_database_name, verbosity)
        if (
            test_database_name
            and not self.is_in_memory_db(test_database_name)
            and not os.path.exists(test_database_name)
        ):
            _remove_journals(test_database_name)
        return result

    return destroy
