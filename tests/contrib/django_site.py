"""A Django site on real databases, for the scenarios of tests/contrib/test_django_sites.py.

``python django_site.py <scenario>``, with ``SITE_DATABASES`` a JSON object of Django database
aliases and SQLAlchemy URLs (``{"default": "postgresql://..."}``) and ``SITE_QUEUE_ALIAS`` the
alias jobqueue uses (``SITE_SQLITE_AS_URI=1``: SQLite names are given to Django as ``file:`` URIs;
``SITE_SQLITE_TEST_FILE=1``: SQLite's test database is a file).
It migrates every alias, runs the scenario (a function below) and prints "ok".
"""

from __future__ import annotations

import json
import os
import sys
import unittest
from collections.abc import Callable
from typing import Any

import django
import sqlalchemy as sa
from django.conf import settings

ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
}


def django_database(url: str) -> dict[str, object]:
    parsed = sa.make_url(url)
    engine = ENGINES[parsed.get_backend_name()]
    if engine.endswith("sqlite3"):
        as_uri = os.environ.get("SITE_SQLITE_AS_URI")
        name = f"file:{parsed.database}?mode=rwc" if as_uri else parsed.database
        # SITE_SQLITE_TEST_FILE=1: the test database in a file (Django's is in memory by default).
        test = {"NAME": f"{parsed.database}_t.sqlite3"} if os.environ.get("SITE_SQLITE_TEST_FILE") else {}
        return {"ENGINE": engine, "NAME": name, "TEST": test}
    return {
        "ENGINE": engine,
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
        # Django's would be test_<NAME>; the test servers' user may create only jobqueue_test*.
        "TEST": {"NAME": f"{parsed.database}_t"},
    }


QUEUE_ALIAS = os.environ.get("SITE_QUEUE_ALIAS", "default")
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "jobqueue.contrib.django"],
    DATABASES={alias: django_database(url) for alias, url in json.loads(os.environ["SITE_DATABASES"]).items()},
    JOBQUEUE={"APP": "__main__:app", "DATABASE": QUEUE_ALIAS},
    USE_TZ=True,
    SECRET_KEY="test-only",
)
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402

from jobqueue import JobNotCommitted, JobQueue  # noqa: E402
from jobqueue.contrib.django.integration import DjangoIntegration  # noqa: E402
from jobqueue.errors import ConfigurationError  # noqa: E402
from jobqueue.storage.tables import SCHEMA_VERSION  # noqa: E402
from jobqueue.testing import drain  # noqa: E402

app = JobQueue()


@app.task(name="site.noop")
def noop(n: int) -> int:
    return n


def jobs() -> int:
    """How many jobs the message table holds, read on jobqueue's own connection."""
    with app.store.reading() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar_one())


# -- scenarios -------------------------------------------------------------------------------------


def bulk_outside_atomic_is_all_or_nothing() -> None:
    # The connection breaks after the first batch went in: outside transaction.atomic() Django
    # would have committed that batch on its own, leaving half a bulk that raised.
    integration = app.framework
    assert isinstance(integration, DjangoIntegration)
    engine = integration.engine()
    statements: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def break_on_second_batch(conn, cursor, statement, parameters, context, executemany):
        if "jobqueue_message" in statement:
            statements.append(statement)
            if len(statements) == 2:
                raise ConnectionError("connection lost")

    try:
        noop.bulk([(i,) for i in range(4)], batch_size=2)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the bulk should have failed")
    assert len(statements) == 2, statements
    assert jobs() == 0, f"{jobs()} jobs of a bulk that raised"

    sa.event.remove(engine, "before_cursor_execute", break_on_second_batch)
    handles = noop.bulk([(i,) for i in range(5)], batch_size=2)
    assert connections[QUEUE_ALIAS].get_autocommit() and not connections[QUEUE_ALIAS].in_atomic_block
    assert [handle.status() for handle in handles] == ["pending"] * 5  # committed, seen by another connection
    assert jobs() == 5


def sqlite_names_are_uris() -> None:
    # Django opens every SQLite name as a URI: jobqueue's own connections must open the same file.
    name = settings.DATABASES[QUEUE_ALIAS]["NAME"]
    assert name.startswith("file:/") and name.endswith("?mode=rwc"), name
    handle = noop.delay(1)  # through Django's connection
    assert jobs() == 1  # through jobqueue's own
    assert [done.id for done in drain(app)] == [handle.id] and handle.status() == "completed"
    assert not [entry for entry in os.listdir(".") if entry.startswith("file:")]


def in_memory_test_database() -> None:
    # What Django's test runner does to an SQLite database without a TEST NAME.
    connection = connections[QUEUE_ALIAS]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    assert connection.is_in_memory_db()
    with transaction.atomic():  # as in a TestCase: the job is written through Django's connection
        handle = noop.delay(1)
        refused(handle.status)
        transaction.set_rollback(True)
    noop.delay(2)  # as in a TransactionTestCase
    refused(lambda: drain(app))
    assert not [entry for entry in os.listdir(".") if entry.startswith("file:")]  # no file of that name


def uncommitted_job_on_a_new_sqlite_database() -> None:
    # As in a Django TestCase on the SQLite file Django's test runner made (not in WAL mode yet):
    # the test's transaction holds the write lock while the test reads the job back.
    with transaction.atomic():
        handle = noop.delay(1)
        try:
            handle.status()
        except JobNotCommitted as exc:
            # A transaction of the application's own, which will commit: the advice is to wait for it.
            assert "read its status after the commit" in str(exc) and "TestCase" not in str(exc), exc
        else:
            raise AssertionError("an uncommitted job was read")
        transaction.set_rollback(True)
    assert jobs() == 0


def call_command_returns() -> None:
    # call_command("jobqueue", ...) in a test or in a command of the project's: it returns when the
    # jobqueue command succeeds and raises CommandError when it fails, as Django's commands do.
    from django.core.management.base import CommandError

    handle = noop.delay(1)
    call_command("jobqueue", "worker", "--burst", "--concurrency", "1")
    assert handle.status() == "completed"
    call_command("jobqueue", "status")
    waiting = noop.delay(2)
    try:
        call_command("jobqueue", "jobs", "retry", str(waiting.id))  # a pending job is not retried
    except CommandError as exc:
        assert "exited with status 1" in str(exc), exc
    else:
        raise AssertionError("the refused retry did not raise")


def open_transactions_are_refused_by_the_worker_and_drain() -> None:
    # A worker started inside a transaction closed Django's connections before it forked: the
    # transaction's work was thrown away without a word (on SQLite its lock held the worker's
    # processes up for minutes). A transaction managed by hand (set_autocommit(False)) went unseen
    # by drain() and by a handle, which called its uncommitted job one that never existed.
    from django.core.management.base import CommandError

    from jobqueue import JobNotFound

    wrapper = connections[QUEUE_ALIAS]
    with transaction.atomic(using=QUEUE_ALIAS):
        wrapper.cursor().execute("SELECT 1")
        kept = noop.delay(1)
        try:
            call_command("jobqueue", "worker", "--burst", "--concurrency", "1")
        except CommandError as exc:
            assert "a worker cannot start inside a transaction" in str(exc), exc
            assert f"Django's {QUEUE_ALIAS!r} database" in str(exc), exc
        else:
            raise AssertionError("the worker started inside a transaction")
        assert wrapper.in_atomic_block and wrapper.connection is not None
    assert kept.status() == "pending", "the transaction's work was lost"

    transaction.set_autocommit(False, using=QUEUE_ALIAS)
    try:
        by_hand = noop.delay(2)
        try:
            by_hand.status()
        except JobNotCommitted as exc:
            assert "has not committed yet" in str(exc), exc
        else:
            raise AssertionError("a job in a transaction managed by hand was taken for committed")
        for refused in (lambda: drain(app), lambda: call_command("jobqueue", "worker", "--burst", "-c", "1")):
            try:
                refused()
            except (ConfigurationError, CommandError) as exc:
                assert "transaction" in str(exc), exc
            else:
                raise AssertionError("drain() or a worker ran inside a transaction managed by hand")
        transaction.commit(using=QUEUE_ALIAS)
        committed = noop.delay(3)
        transaction.rollback(using=QUEUE_ALIAS)
    finally:
        transaction.set_autocommit(True, using=QUEUE_ALIAS)
    assert by_hand.status() == "pending"
    try:
        committed.status()
    except JobNotCommitted:
        raise AssertionError("a rolled-back job was taken for uncommitted") from None
    except JobNotFound:
        pass
    else:
        raise AssertionError("a rolled-back job was found")
    call_command("jobqueue", "worker", "--burst", "--concurrency", "1")
    assert [kept.status(), by_hand.status()] == ["completed", "completed"]


def one_on_commit_callback_per_transaction() -> None:
    # Each delay() inside atomic() added a callback of its own to Django's list, which
    # captureOnCommitCallbacks showed (and a loop of delays made long).
    from django.test import TestCase

    class Callbacks(TestCase):  # type: ignore[misc]  # Django has no type hints here
        databases = {QUEUE_ALIAS}

        def runTest(self) -> None:
            with self.captureOnCommitCallbacks(using=QUEUE_ALIAS) as callbacks:
                with transaction.atomic(using=QUEUE_ALIAS):
                    [noop.delay(n) for n in range(5)]
                    with transaction.atomic(using=QUEUE_ALIAS):
                        [noop.delay(n) for n in range(5)]
            assert len(callbacks) == 2, callbacks  # one per depth of savepoints
            assert "jobqueue" in repr(callbacks[0]), callbacks

    outcome = unittest.TextTestRunner(stream=sys.stdout, verbosity=0).run(Callbacks())
    assert outcome.wasSuccessful(), outcome.failures + outcome.errors


def schema_errors_name_migrate() -> None:
    # Under Django the app's migrations make the tables: every error about them names migrate,
    # with the alias jobqueue uses when it is not Django's default.
    from jobqueue import SchemaError
    from jobqueue.handle import JobHandle

    database = "" if QUEUE_ALIAS == "default" else f" --database {QUEUE_ALIAS}"
    command = f"`python manage.py migrate{database}`"
    uses: list[Callable[[], object]] = [
        lambda: noop.delay(1),  # through Django's connection
        lambda: noop.bulk([(1,), (2,)]),
        app.check_schema,  # what a worker checks as it starts
        app.upgrade_schema,
        lambda: drain(app),  # jobqueue's own connections
        lambda: JobHandle(app, 1).status(),
    ]

    def says(fix: str) -> None:
        for use in uses:
            try:
                use()
            except SchemaError as exc:
                assert fix in str(exc) and "jobqueue db" not in str(exc), str(exc)
            else:
                raise AssertionError(f"{use} found no fault with the tables")

    call_command("migrate", "jobqueue", "zero", database=QUEUE_ALIAS, verbosity=0)
    says(f"; run {command} to create them")
    # Tables of an older schema, as after installing a newer jobqueue, before migrating.
    call_command("migrate", "jobqueue", database=QUEUE_ALIAS, verbosity=0)
    from jobqueue.storage.migrations import stamp

    with app.store.writing() as conn:
        conn.execute(sa.delete(app.tables.schema_version))
        stamp(conn, app.tables, 1)
    uses = [app.check_schema]  # what a worker checks as it starts
    says(f"are at schema version 1, this release needs {SCHEMA_VERSION}; run {command} (see docs/upgrading.md)")


def test_database_lifecycle() -> None:
    # What Django's test runner (and pytest-django) do around a test run, with no app.close()
    # anywhere: jobqueue's pool must not keep the test database from being dropped, nor keep
    # reading the real database once the test database exists.
    connection = connections[QUEUE_ALIAS]
    real_name = connection.settings_dict["NAME"]
    noop.delay(1)
    assert jobs() == 1  # jobqueue's own pool is connected to the real database now
    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        assert jobs() == 0, "jobqueue reads the real database during the tests"
        handle = noop.delay(2)
        assert [done.id for done in drain(app)] == [handle.id] and handle.status() == "completed"
    finally:
        try:
            connection.creation.destroy_test_db(real_name, verbosity=0)
        except Exception:
            app.close()  # leave no test database behind on the server, then fail
            connection.creation.destroy_test_db(real_name, verbosity=0)
            raise
    assert not database_exists(test_name), f"{test_name} was not dropped"
    assert jobs() == 1  # back on the real database, as Django is


def database_exists(name: str) -> bool:
    query = {
        "postgresql": "SELECT 1 FROM pg_database WHERE datname = %s",
        "mysql": "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
    }[connections[QUEUE_ALIAS].vendor]
    with connections[QUEUE_ALIAS].cursor() as cursor:
        cursor.execute(query, [name])
        return cursor.fetchone() is not None


def drain_in_django_tests() -> None:
    # A TestCase's transaction hides its jobs from drain()'s connections (and on SQLite holds the
    # lock they would wait for): drain() says so at once. A TransactionTestCase runs them.
    import time
    import unittest

    from django.test import TestCase, TransactionTestCase
    from django.test.utils import setup_test_environment

    class InATestCase(TestCase):  # type: ignore[misc]  # Django has no type hints here
        databases = {QUEUE_ALIAS}

        def test_drain(self) -> None:
            noop.delay(1)
            started = time.monotonic()
            with self.assertRaises(ConfigurationError) as caught:
                drain(app)
            self.assertLess(time.monotonic() - started, 1.0)
            said = str(caught.exception)
            self.assertIn(f"inside a transaction on Django's {QUEUE_ALIAS!r} database", said)
            self.assertIn("use django.test.TransactionTestCase", said)
            self.assertIn("@pytest.mark.django_db(transaction=True)", said)

        def test_status_and_get(self) -> None:
            # The test's transaction never commits: waiting for the commit is no advice here.
            handle = noop.delay(3)
            for read in (handle.status, lambda: handle.get(timeout=0)):
                with self.assertRaises(JobNotCommitted) as caught:
                    read()
                said = str(caught.exception)
                self.assertIn("django.test.TestCase", said)
                self.assertIn("never commits", said)
                self.assertIn("use django.test.TransactionTestCase", said)
                self.assertIn("@pytest.mark.django_db(transaction=True)", said)
                self.assertNotIn("read its status after the commit", said)

        def test_status_after_the_on_commit_callbacks_ran(self) -> None:
            # captureOnCommitCallbacks(execute=True) runs them, but commits nothing: the handle
            # said the job never existed.
            with self.captureOnCommitCallbacks(execute=True):
                handle = noop.delay(4)
            with self.assertRaises(JobNotCommitted) as caught:
                handle.status()
            self.assertIn("never commits", str(caught.exception))

    class InATransactionTestCase(TransactionTestCase):  # type: ignore[misc]
        databases = {QUEUE_ALIAS}

        def test_drain(self) -> None:
            handle = noop.delay(2)
            self.assertEqual([done.id for done in drain(app)], [handle.id])
            self.assertEqual(handle.get(timeout=0), 2)

    setup_test_environment()
    suite = unittest.TestSuite(
        unittest.defaultTestLoader.loadTestsFromTestCase(case) for case in (InATestCase, InATransactionTestCase)
    )
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    assert result.wasSuccessful() and result.testsRun == 4, result


def in_parallel_test_processes() -> None:
    # manage.py test --parallel 2: Django clones the test database once per process and points
    # each process's connection at its clone. Jobs enqueued there must be read and run there by
    # jobqueue's own connections, even when the runner's process used jobqueue before it forked.
    from django.test.runner import DiscoverRunner, partition_suite_by_case

    class Runner(DiscoverRunner):  # type: ignore[misc]
        def build_suite(self, *args: Any, **kwargs: Any) -> Any:
            loader = unittest.defaultTestLoader
            suite = unittest.TestSuite(loader.loadTestsFromTestCase(case) for case in (ParallelOne, ParallelTwo))
            return self.parallel_test_suite(partition_suite_by_case(suite), 2, self.failfast, False, False)

        def setup_databases(self, **kwargs: Any) -> Any:
            databases = super().setup_databases(**kwargs)
            assert jobs() == 0  # the runner's process reads the test database through jobqueue
            return databases

    # Twice: a run leaves nothing behind that the next run's clones would start from (the test
    # processes end without closing jobqueue's connections, whose journal files stayed beside the
    # clones that Django removed, and were read into the next run's clones of the same names).
    for _ in range(2):
        failures = Runner(parallel=2, verbosity=2, interactive=False).run_tests([])
        assert failures == 0, f"{failures} failure(s) in the parallel test processes (above)"


class InParallel:
    """One test process's work: its jobs are in its own database, seen and run by jobqueue there."""

    databases = {QUEUE_ALIAS}

    def test_jobs_go_to_this_process_database(self) -> None:
        try:
            self.check_jobs()
        except BaseException:  # the parallel runner cannot send a traceback back: it is printed here
            import traceback

            traceback.print_exc()
            raise AssertionError("see the traceback above") from None

    def check_jobs(self) -> None:
        name = connections[QUEUE_ALIAS].settings_dict["NAME"]
        assert name.removesuffix(".sqlite3").endswith(("_1", "_2")), f"not a clone: {name}"
        assert sa.make_url(app.database_url).database == name, app.database_url
        with app.store.reading() as conn:
            archived = conn.execute(sa.select(sa.func.count()).select_from(app.tables.archive)).scalar_one()
        assert (jobs(), archived) == (0, 0), (
            f"the clone holds an earlier run's jobs: {jobs()} queued, {archived} archived"
        )
        handles = [noop.delay(n) for n in range(3)]
        assert jobs() == 3
        assert sorted(done.id for done in drain(app)) == sorted(h.id for h in handles)
        assert [h.get(timeout=0) for h in handles] == [0, 1, 2]


def refused(read: Callable[[], object]) -> None:
    """``read`` (on jobqueue's own connections) is refused, naming the fix."""
    try:
        read()
    except ConfigurationError as exc:
        assert "in-memory SQLite database" in str(exc) and "['TEST']['NAME']" in str(exc), exc
    else:
        raise AssertionError(f"{read} read an in-memory database of its own")


def task_backend_settings() -> None:
    # Bad QUEUES and OPTIONS in a TASKS entry: refused when Django loads the backend, naming the fix.
    from jobqueue.contrib.django.backend import JobQueueBackend
    from jobqueue.retry import NoRetryStrategy

    queues = "TASKS['default']['QUEUES'] must be a list of queue names, such as ['default', 'emails']"
    bad: list[tuple[dict[str, Any], str]] = [
        ({"QUEUES": None}, queues),
        ({"QUEUES": "emails"}, queues),  # not the queues "e", "m", "a", "i", "l" and "s"
        ({"QUEUES": {"emails": 1}}, queues),
        ({"QUEUES": ["emails", 1]}, "TASKS['default']['QUEUES']: invalid queue name 1"),
        ({"QUEUES": ["bulk mail"]}, "TASKS['default']['QUEUES']: invalid queue name 'bulk mail'"),
        ({"OPTIONS": "RETRY_STRATEGY"}, "TASKS['default']['OPTIONS'] must be a dict, such as"),
        ({"OPTIONS": {"RETRY_STRATEGY": NoRetryStrategy}}, "must be a strategy from jobqueue.retry"),
    ]
    for params, fix in bad:
        try:
            JobQueueBackend("default", {"BACKEND": "jobqueue.contrib.django.backend.JobQueueBackend", **params})
        except ConfigurationError as exc:
            assert fix in str(exc), (params, str(exc))
        else:
            raise AssertionError(f"{params} was taken")
    good: list[dict[str, Any]] = [{}, {"QUEUES": []}, {"QUEUES": ("default", "emails")}, {"QUEUES": {"default"}}]
    for params in good:
        backend = JobQueueBackend("default", {"OPTIONS": {"RETRY_STRATEGY": NoRetryStrategy()}, **params})
        assert backend.retry_strategy == NoRetryStrategy()


# Test cases of the parallel scenario, importable by name in the test processes.
from django.test import TransactionTestCase  # noqa: E402


class ParallelOne(InParallel, TransactionTestCase):  # type: ignore[misc]
    pass


class ParallelTwo(InParallel, TransactionTestCase):  # type: ignore[misc]
    pass


if __name__ == "__main__":
    for alias in settings.DATABASES:
        call_command("migrate", database=alias, verbosity=0)
    globals()[sys.argv[1]]()
    print("ok")
