"""Django sites on each database, each scenario in a process of its own (Django is configured once
per process): tests/contrib/django_site.py runs it on fresh databases and prints "ok" last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import servers
from tests.acceptance.cli import ROOT
from tests.conftest import only

SITE = Path(__file__).resolve().parent / "django_site.py"


def run_site(scenario: str, backend: str, tmp_path: Path, aliases: tuple[str, ...] = ("default",), **env: str) -> None:
    """Run ``scenario`` on a fresh database of ``backend`` for each alias; jobqueue uses the last.
    ``env``: more environment variables for the site."""
    urls: dict[str, str] = {}
    try:
        for alias in aliases:
            folder = tmp_path / alias
            folder.mkdir()
            urls[alias] = servers.create_database(backend, str(folder))
        site_env = dict(os.environ, PYTHONPATH=str(ROOT), SITE_DATABASES=json.dumps(urls), SITE_QUEUE_ALIAS=aliases[-1])
        for name in ("JOBQUEUE_DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
            site_env.pop(name, None)
        result = subprocess.run(
            [sys.executable, str(SITE), scenario],
            cwd=tmp_path,
            env={**site_env, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for url in urls.values():
            servers.drop_database(backend, url)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and lines[-1:] == ["ok"], f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_a_bulk_outside_atomic_commits_all_its_batches_or_none(backend: str, tmp_path: Path) -> None:
    run_site("bulk_outside_atomic_is_all_or_nothing", backend, tmp_path)


def test_jobqueue_opens_an_sqlite_name_given_as_a_uri_as_django_does(tmp_path: Path) -> None:
    run_site("sqlite_names_are_uris", "sqlite", tmp_path, SITE_SQLITE_AS_URI="1")


def test_an_in_memory_test_database_is_refused_naming_the_fix_when_jobqueue_connects(tmp_path: Path) -> None:
    # Jobs are enqueued through Django's connection as always; reading them back on jobqueue's own
    # connections would need a database those can share, which a TEST NAME gives.
    run_site("in_memory_test_database", "sqlite", tmp_path)


def test_bad_queues_or_options_for_djangos_task_api_are_refused_naming_the_fix(tmp_path: Path) -> None:
    run_site("task_backend_settings", "sqlite", tmp_path)


def test_reading_a_job_inside_the_transaction_that_enqueued_it_on_a_new_sqlite_database(tmp_path: Path) -> None:
    run_site("uncommitted_job_on_a_new_sqlite_database", "sqlite", tmp_path)


def test_call_command_jobqueue_returns_or_raises_command_error(backend: str, tmp_path: Path) -> None:
    run_site("call_command_returns", backend, tmp_path)


def test_missing_or_older_tables_under_django_name_manage_py_migrate(backend: str, tmp_path: Path) -> None:
    run_site("schema_errors_name_migrate", backend, tmp_path)


def test_the_migrate_named_for_missing_tables_names_the_jobqueue_database_alias(tmp_path: Path) -> None:
    run_site("schema_errors_name_migrate", "sqlite", tmp_path, aliases=("default", "queue"))


@only("postgresql", "mysql")
def test_djangos_test_runner_drops_its_test_database_while_jobqueue_used_it(backend: str, tmp_path: Path) -> None:
    # SQLite's test database is in memory (or a file, removed whoever has it open).
    run_site("test_database_lifecycle", backend, tmp_path)


def test_drain_in_a_django_test_case_says_at_once_to_use_transaction_test_case(backend: str, tmp_path: Path) -> None:
    run_site("drain_in_django_tests", backend, tmp_path)


def test_tests_run_in_parallel_processes_each_on_its_own_clone_of_the_test_database(
    backend: str, tmp_path: Path
) -> None:
    # On SQLite a test database shared by processes must be a file (jobqueue refuses one in memory).
    run_site("in_parallel_test_processes", backend, tmp_path, SITE_SQLITE_TEST_FILE="1")


def test_a_worker_or_drain_inside_an_open_transaction_is_refused_naming_the_fix(backend: str, tmp_path: Path) -> None:
    run_site("open_transactions_are_refused_by_the_worker_and_drain", backend, tmp_path)


@only("sqlite")
def test_jobs_enqueued_in_a_row_inside_atomic_add_one_on_commit_callback(tmp_path: Path) -> None:
    run_site("one_on_commit_callback_per_transaction", "sqlite", tmp_path)
