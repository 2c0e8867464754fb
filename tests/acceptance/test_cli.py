"""The CLI as a user runs it: db init, worker --burst, enqueue, status, against every backend."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobqueue import JobFailed, JobQueue, SerializationError
from jobqueue.errors import ConfigurationError, SchemaError
from tests import servers
from tests.acceptance.cli import ROOT, jobqueue
from tests.apps import basic
from tests.conftest import only
from tests.runtime.harness import wait_for


def count(app: JobQueue, table: str) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(getattr(app.tables, table))).scalar_one())


def test_db_init_is_idempotent(db_url: str) -> None:
    first = jobqueue("db", "init")
    again = jobqueue("db", "init")
    assert "up to date" in again.stdout
    assert "***" in first.stdout or "sqlite" in first.stdout  # the URL is shown masked
    assert "jobqueue_test:jobqueue_test@" not in first.stdout + again.stdout
    assert jobqueue("db", "check").returncode == 0


@only("postgresql", "mysql")
def test_db_init_run_by_several_processes_at_once_succeeds_in_each(backend: str, tmp_path) -> None:
    """As every container of a deployment runs it as it starts: they take turns, and the ones
    after the first find the schema up to date."""
    url = servers.create_database(backend, str(tmp_path))
    try:
        command = [sys.executable, "-m", "jobqueue", "--app", "tests.apps.basic:app", "--database-url", url]
        command += ["db", "init"]
        output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
        inits = [subprocess.Popen(command, cwd=ROOT, **output) for _ in range(5)]  # type: ignore[call-overload]
        outputs = [(init.wait(120), init.stdout.read()) for init in inits if init.stdout is not None]
        assert [code for code, _ in outputs] == [0] * 5, outputs
        said = [text for _, text in outputs]
        assert sum("created jobqueue schema" in text for text in said) == 1, said
        assert sum("is up to date" in text for text in said) == 4, said
    finally:
        servers.drop_database(backend, url)


def test_1000_jobs_through_delay_and_bulk(app: JobQueue) -> None:
    handles = [basic.add.delay(i, i) for i in range(500)]
    handles += basic.add.bulk([(i, 1) for i in range(500, 1000)])
    result = jobqueue("worker", "--burst", "--concurrency", "2")
    assert result.returncode == 0
    assert [h.get(timeout=5) for h in handles] == [2 * i for i in range(500)] + [i + 1 for i in range(500, 1000)]
    assert {h.status() for h in handles} == {"completed"}
    assert count(app, "message") == 0 and count(app, "archive") == 1000


def test_failures_and_retries_end_in_the_archive(app: JobQueue) -> None:
    flaky = basic.flaky.delay(2)
    failing = basic.fail.delay("no luck")
    jobqueue("worker", "--burst", "--concurrency", "2")
    assert flaky.get(timeout=5) == 3  # failed twice, succeeded on attempt 3
    with pytest.raises(JobFailed) as info:
        failing.get(timeout=5)
    assert "ValueError" in str(info.value) and "no luck" in str(info.value)
    assert "Traceback" in info.value.traceback and "raise ValueError(message)" in info.value.traceback


def test_a_message_for_an_unregistered_task_fails_and_the_rest_complete(app: JobQueue, db_url: str) -> None:
    other = JobQueue(db_url)

    @other.task(name="ghost.task")
    def ghost() -> None: ...

    lost = ghost.delay()
    good = [basic.add.delay(i, 1) for i in range(20)]
    said = jobqueue("worker", "--burst", "--concurrency", "2")
    # Its log line says it never ran (it said "failed on attempt 0 after 0.0 ms").
    assert f"job {lost.id} ghost.task failed without running: " in said.stderr, said.stderr[-3000:]
    assert "attempt 0" not in said.stderr, said.stderr[-3000:]
    with pytest.raises(JobFailed, match="ghost.task") as info:
        lost.get(timeout=5)
    assert info.value.error_type == "jobqueue.errors.UnknownTaskError"
    # What it says to do works (it said to cancel the job, which had ended: cancel refused it).
    advice = str(info.value)
    assert "queue 'default', and have the module --app names import the module that defines it" in advice
    assert f"then run the job again: jobqueue jobs retry {lost.id}" in advice
    jobqueue("jobs", "retry", str(lost.id))
    assert lost.status() == "pending"
    assert [h.get(timeout=5) for h in good] == [i + 1 for i in range(20)]
    other.close()


def test_enqueue_from_the_command_line(app: JobQueue) -> None:
    out = jobqueue("enqueue", "basic.add", "--args", "[20, 22]", "--json")
    job = json.loads(out.stdout)
    assert job["status"] == "pending" and job["task"] == "basic.add"
    jobqueue("worker", "--burst", "--concurrency", "1")
    assert app.job(job["id"]).get(timeout=5) == 42


def test_enqueue_takes_an_eta_as_the_json_output_prints_times(app: JobQueue) -> None:
    """--eta took only 2030-01-01T09:00:00: a time printed with its offset, or Z, or fractions of a
    second, as `jobs show --json` prints them, could not be given back."""
    given = {
        "2030-01-01T09:00:00": datetime(2030, 1, 1, 9),  # UTC
        "2030-01-01 09:00:00": datetime(2030, 1, 1, 9),
        "2030-01-01T09:00:00Z": datetime(2030, 1, 1, 9),
        "2030-01-01T10:00:00+01:00": datetime(2030, 1, 1, 9),
        "2030-01-01T09:00:00.250000+00:00": datetime(2030, 1, 1, 9, 0, 0, 250000),
    }
    for text, due in given.items():
        job = json.loads(jobqueue("enqueue", "basic.add", "--args", "[1, 2]", "--eta", text, "--json").stdout)
        with app.engine.connect() as conn:
            table = app.tables.message
            stored = conn.execute(sa.select(table.c.next_attempt_at).where(table.c.id == job["id"])).scalar_one()
        assert stored.replace(tzinfo=None) == due, (text, stored)
    refused = jobqueue("enqueue", "basic.add", "--args", "[1, 2]", "--eta", "tomorrow", check=False)
    assert refused.returncode == 2 and "'tomorrow' is no ISO 8601 time" in refused.stderr, refused.stderr


def test_enqueue_with_a_unique_key_already_held_names_that_job_and_adds_none(app: JobQueue) -> None:
    """It printed "enqueued" as if a row had been made."""
    first = jobqueue("enqueue", "basic.add", "--args", "[1, 2]", "--unique-key", "K")
    assert first.stdout.startswith("enqueued job ")
    job_id = int(first.stdout.split()[2])
    again = jobqueue("enqueue", "basic.add", "--args", "[3, 4]", "--unique-key", "K")
    assert again.returncode == 0  # as apply_async, which returns the job: no failure, nothing added
    assert "enqueued job" not in again.stdout, again.stdout
    assert f"job {job_id} (basic.add) with unique key 'K' already exists" in again.stdout, again.stdout
    assert "nothing was enqueued" in again.stdout
    as_json = json.loads(jobqueue("enqueue", "basic.add", "--args", "[5, 6]", "--unique-key", "K", "--json").stdout)
    assert as_json == {"id": job_id, "task": "basic.add", "status": "pending", "existing": True}
    other = json.loads(jobqueue("enqueue", "basic.add", "--args", "[5, 6]", "--unique-key", "L", "--json").stdout)
    assert other["existing"] is False and other["id"] != job_id
    assert count(app, "message") == 2


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("enqueue", "no.such.task"), "no.such.task"),
        (("enqueue", "basic.add", "--args", "{not json"), "not valid JSON"),
        (("enqueue", "basic.add", "--args", '{"x": 1}'), "JSON array"),
        (("enqueue", "basic.add", "--queue", "bad queue"), "invalid queue name"),
        (("enqueue", "basic.add", "--args", "[1]"), "task basic.add: add() missing 1 required positional argument"),
        (("enqueue", "basic.add", "--kwargs", '{"x": 1, "z": 2}'), "unexpected keyword argument 'z'"),
        (("enqueue", "basic.add", "--args", "[1, 2]", "--countdown", "nan"), "countdown must be a finite number"),
        (("enqueue", "basic.add", "--args", "[1, 2]", "--countdown", "inf"), "countdown must be a finite number"),
        (("enqueue", "basic.add", "--args", "[1, 2]", "--countdown", "1e308"), "is past the year 9999"),
        (("enqueue", "basic.add", "--args", "[" + "[" * 5000 + "]" * 5000 + ", 1]"), "nested too deeply"),
    ],
)
def test_bad_enqueue_input_exits_non_zero_and_writes_nothing(
    app: JobQueue, args: tuple[str, ...], fragment: str
) -> None:
    result = jobqueue(*args, check=False)
    assert result.returncode != 0
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert count(app, "message") == 0


def test_enqueue_without_an_app_says_how_to_give_one(db_url: str) -> None:
    result = jobqueue("enqueue", "no.such.task", app=None, check=False)
    assert result.returncode != 0 and "no.such.task" in result.stderr and "--app" in result.stderr


def test_non_serializable_arguments_write_nothing(app: JobQueue) -> None:
    with pytest.raises(SerializationError):
        basic.add.delay(1, object())
    with pytest.raises(SerializationError):
        basic.add.bulk([(1, 2), (3, {4, 5})])
    assert count(app, "message") == 0


def test_status_and_workers(app: JobQueue) -> None:
    basic.add.bulk([(1, 1)] * 3, queue="emails")
    text = jobqueue("status").stdout
    assert "emails" in text and "3" in text
    data = json.loads(jobqueue("status", "--json").stdout)
    assert data["queues"][0]["queue"] == "emails" and data["queues"][0]["ready"] == 3
    assert data["archive"] == {"cancelled": 0, "completed": 0, "failed": 0}  # a script reads each without a default
    assert "archive: empty" in text
    assert json.loads(jobqueue("workers", "--json").stdout) == []


def test_a_queue_named_like_a_declared_one_is_named_at_start_and_still_served(app: JobQueue) -> None:
    sent = basic.add.apply_async((1, 2), queue="emails")  # a queue given per call is served all the same
    result = jobqueue("worker", "--burst", "-Q", "emails,defualt")
    assert "no task of this app declares the queue 'defualt': did you mean 'default'?" in result.stderr
    assert "'emails'" not in result.stderr  # not like any declared queue: routed per call, not a typo
    assert sent.get(timeout=5) == 3
    assert "declares the queue" not in jobqueue("worker", "--burst", "-Q", "default").stderr


def test_a_worker_leaves_the_jobs_of_a_queue_spelled_in_another_case(app: JobQueue) -> None:
    """On MariaDB too, whose default collation holds 'Emails' equal to 'emails': there the worker
    of 'emails' ran them all."""
    ours = basic.add.apply_async((1, 2), queue="emails")
    others = [basic.add.apply_async((1, 2), queue=queue) for queue in ("Emails", "EMAILS")]
    jobqueue("worker", "--burst", "-Q", "emails")
    assert ours.get(timeout=5) == 3
    assert [handle.status() for handle in others] == ["pending", "pending"]


def test_worker_refuses_a_database_without_tables(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/empty.sqlite3"
    result = jobqueue("--database-url", url, "worker", "--burst", check=False)
    assert result.returncode == 1
    assert "jobqueue db init" in result.stderr


@pytest.mark.parametrize(
    "command",
    [("status",), ("jobs", "list"), ("workers",), ("db", "check"), ("db", "upgrade"), ("worker", "--burst")],
)
def test_a_sqlite_path_where_no_database_is_is_named_and_nothing_is_made_there(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """A mistyped path said the tables were missing, and left an empty database file there, which
    a later `db init` in the right place did not explain."""
    path = tmp_path / "mistyped.sqlite3"
    result = jobqueue("--database-url", f"sqlite:///{path}", *command, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"there is no SQLite database at {path}: correct the path" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
    app = JobQueue()
    app.configure(database_url=f"sqlite:///{path}")  # outranks JOBQUEUE_DATABASE_URL, as JobQueue(url) does not
    with pytest.raises(SchemaError, match="there is no SQLite database at"):
        app.check_schema()
    assert list(tmp_path.iterdir()) == []
    assert "created jobqueue schema" in jobqueue("--database-url", f"sqlite:///{path}", "db", "init").stdout
    app.check_schema()


def test_worker_without_an_app_refuses_to_start(db_url: str) -> None:
    result = jobqueue("worker", "--burst", app=None, check=False)
    assert result.returncode == 1 and "--app" in result.stderr


@pytest.mark.parametrize("concurrency, said", [("1", " 1 process on "), ("2", " 2 processes on ")])
def test_the_start_line_says_how_many_processes_serve_which_queues(db_url: str, concurrency: str, said: str) -> None:
    result = jobqueue("worker", "--burst", "-c", concurrency, check=False)
    assert result.returncode == 0 and said in result.stderr and " serving all queues; " in result.stderr, result.stderr


@pytest.mark.parametrize("queues", ["", " , ,"])
def test_a_queues_option_that_names_no_queue_is_refused_not_read_as_every_queue(db_url: str, queues: str) -> None:
    """As `-Q "$QUEUES"` with the variable unset: serving every queue instead would be a surprise."""
    result = jobqueue("worker", "--burst", "-Q", queues, check=False)
    assert result.returncode == 2
    assert "--queues names no queue" in result.stderr and "leave it out for every queue" in result.stderr, result.stderr
    assert " serving " not in result.stderr  # refused before starting


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("-c", "10000"), "Error: --concurrency must be at most 1024 worker processes per supervisor, got 10000"),
        (("--concurrency", "1025"), "run more supervisors"),
        (("--fetch-batch-size", "20000"), "Error: --fetch-batch-size must be at most 10000"),
        # Named as typed, and without Python's None: leaving the option out is how to say none.
        (("--metrics-port", "70000"), "Error: --metrics-port must be a TCP port (1-65535), got 70000\n"),
        (("-c", "0"), "Error: --concurrency must be an integer >= 1, got 0\n"),
        (
            ("--min-fetch-interval", "5", "--max-fetch-interval", "1"),
            "Error: --min-fetch-interval must not exceed --max-fetch-interval, got 5.0 and 1.0\n",
        ),
    ],
)
def test_a_worker_option_out_of_range_is_a_usage_error_before_anything_starts(
    db_url: str, args: tuple[str, ...], fragment: str
) -> None:
    """A typo such as -c 10000 forked ten thousand worker processes."""
    result = jobqueue("worker", "--burst", *args, check=False)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert " serving " not in result.stderr and "started worker process" not in result.stderr


def test_worker_refuses_a_listen_url_it_cannot_use(db_url: str, backend: str) -> None:
    """Before it touches the database: the option is checked against the database it serves."""
    given: tuple[str, ...] = ()
    env: dict[str, str] = {}
    if backend == "postgresql":
        given = ("--listen-database-url", "mysql://someone:hunter2secret@127.0.0.1/test")
        expected = "not a PostgreSQL URL"
    else:
        env = {"JOBQUEUE_LISTEN_DATABASE_URL": "postgresql://someone:hunter2secret@127.0.0.1/test"}
        expected = "listen_database_url is for PostgreSQL"
    result = jobqueue("worker", "--burst", *given, check=False, env=env)
    assert result.returncode == 1 and expected in result.stderr, result.stderr
    assert "hunter2secret" not in result.stderr
    assert "consumer groups added" not in result.stderr and "schedules" not in result.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("--database-url", "postgresql+psycopg2://u:hunter2secret@127.0.0.1:abc/db"), "cannot parse database URL"),
        (("--database-url", "postgresql+psycopg2://u:hunter2secret@127.0.0.1:5432/test?bogus=1"), '"bogus"'),
        (("--database-url", "mysql+mysqldb://u:hunter2secret@127.0.0.1:3306/test?bogus=1"), "does not take"),
    ],
)
def test_a_database_url_the_driver_cannot_use_is_one_line_naming_it(args: tuple[str, ...], fragment: str) -> None:
    result = jobqueue(*args, "status", check=False)
    assert result.returncode == 1 and fragment in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "hunter2secret" not in result.stderr


def test_a_blank_database_url_is_refused_not_taken_for_the_default(tmp_path: Path) -> None:
    """`--database-url "$DB_URL"` with DB_URL unset, or JobQueue(os.environ.get("DATABASE_URL", "")),
    fell back to sqlite:///jobqueue.sqlite3 in the working directory, without a word."""
    result = jobqueue("--database-url", "", "status", check=False)
    assert result.returncode == 1 and "the database URL given is blank" in result.stderr, result.stderr
    for given in ("", "  "):
        with pytest.raises(ConfigurationError, match="blank"):
            JobQueue(given)
    with pytest.raises(ConfigurationError, match="is blank"):
        JobQueue(f"sqlite:///{tmp_path}/a.sqlite3").configure(database_url="")


@pytest.mark.parametrize(
    "url, expected",
    [
        # A password that is also a word of the message, as the usual development credentials are.
        ("postgresql://postgres:postgres@127.0.0.1:1/nowhere", "Error: cannot use postgresql://***:***@127.0.0.1:1/"),
        ("postgresql://app:a@127.0.0.1:1/nowhere", "Error: cannot use postgresql://app:***@127.0.0.1:1/nowhere: "),
        ("mysql://root:root@127.0.0.1:1/nowhere", "Error: cannot use mysql://***:***@127.0.0.1:1/nowhere: "),
        # A URL that does not parse, and is a word of the message.
        ("pw:e", "Error: cannot parse database URL '<unparseable database URL>' (Could not parse SQLAlchemy URL"),
        # Text that may be the password itself, or a libpq connection string holding one: never shown.
        ("e", "Error: cannot parse database URL '<unparseable database URL>' (Could not parse SQLAlchemy URL"),
        ("host=db password=e", "Error: cannot parse database URL '<unparseable database URL>' (Could not parse"),
        # A SQLite file's name for a URL: shown, with the URL to write.
        (
            "jobqueue.sqlite3",
            "Error: 'jobqueue.sqlite3' is not a database URL: for that SQLite file write sqlite:///jo",
        ),
        # Two slashes: the file's name taken for a host (a traceback from SQLAlchemy before).
        ("sqlite://jobs.sqlite3", "Error: the SQLite URL 'sqlite://jobs.sqlite3' names a host, which a file has none"),
        (" ", "Error: the database URL given is blank (a variable that is not set?): give one, for example "),
    ],
)
def test_masking_leaves_the_rest_of_the_message_readable(url: str, expected: str) -> None:
    result = jobqueue("--database-url", url, "status", check=False)
    assert result.returncode == 1 and result.stderr.startswith(expected), result.stderr
    assert "password=e" not in result.stderr
    words = ["failed", "connect to server", "example sqlite:///", "then sqlite:///", "write three slashes"]
    words += ["write sqlite:///jobqueue.sqlite3 ("]
    assert any(word in result.stderr for word in words)


def test_an_app_without_a_module_is_one_line_naming_the_fix() -> None:
    result = jobqueue("status", app=":app", check=False)
    assert result.returncode == 1 and "names no module: give module:attribute" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_progress_counts_runs_and_the_jobs_left(app: JobQueue) -> None:
    """A retried job runs twice: the line says runs, so that 4 runs of 3 jobs add up."""
    basic.add.bulk([(1, 1), (2, 2)])
    basic.flaky.delay(1)  # fails once, then succeeds
    result = jobqueue("worker", "--burst", "--progress", "-c", "1")
    last = [line for line in result.stderr.splitlines() if line.startswith("[")][-1]
    assert re.match(r"\[#+\] 4 runs done, 0 jobs left, [\d,]+ runs/s, [\d.]+ s$", last), result.stderr


def test_a_burst_worker_whose_processes_die_as_they_start_gives_up(tmp_path) -> None:
    """A worker_process_init receiver that ends the process: a --burst worker restarted its
    processes for ever and never returned."""
    path = tmp_path / "dying.py"
    path.write_text(
        "import os\nfrom jobqueue import JobQueue, signals\n\n"
        f"app = JobQueue('sqlite:///{tmp_path / 'jobs.sqlite3'}')\n\n\n"
        "@app.task\ndef add(a, b):\n    return a + b\n\n\n"
        "@signals.worker_process_init.connect\ndef broken(**kwargs):\n    os._exit(3)\n"
    )
    jobqueue("db", "init", app=str(path))
    jobqueue("enqueue", "dying.add", "--args", "[1, 2]", app=str(path))
    result = jobqueue("worker", "--burst", "-c", "2", app=str(path), check=False, timeout=60)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "--burst gives up: every worker process died as it started, before running a job, 5 times" in result.stderr
    assert "exited with code 3" in result.stderr
    listed = json.loads(jobqueue("jobs", "list", "--json", app=str(path)).stdout)
    assert [job["state"] for job in listed] == ["pending"]  # nothing lost: it waits for a worker that starts


def test_an_app_file_in_a_package_is_imported_by_its_package_name(tmp_path) -> None:
    """Its tasks get the names the application's own imports give them (it registered ``jobs.add``
    where the application enqueued ``shop.jobs.add``, and every job failed as unknown), and its
    relative imports work."""
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(f"URL = 'sqlite:///{tmp_path / 'jobs.sqlite3'}'\n")
    (package / "helpers.py").write_text("FACTOR = 1\n")
    (package / "jobs.py").write_text(  # a sibling imported as a script would, as before
        "from jobqueue import JobQueue\nfrom .config import URL\nfrom helpers import FACTOR\n\n"
        "app = JobQueue(URL)\n\n\n@app.task\ndef add(a, b):\n    return (a + b) * FACTOR\n"
    )
    app = str(package / "jobs.py")
    jobqueue("db", "init", app=app)
    sent = json.loads(jobqueue("enqueue", "shop.jobs.add", "--args", "[2, 3]", "--json", app=app).stdout)
    jobqueue("worker", "--burst", app=app)
    shown = json.loads(jobqueue("jobs", "show", str(sent["id"]), "--json", app=app).stdout)
    assert (shown["task_name"], shown["state"]) == ("shop.jobs.add", "completed")


def test_an_app_file_whose_name_is_no_module_name_is_loaded_as_it_stands(tmp_path) -> None:
    path = tmp_path / "tasks.v2.py"
    path.write_text(f"from jobqueue import JobQueue\napp = JobQueue('sqlite:///{tmp_path / 'v2.sqlite3'}')\n")
    assert "created jobqueue schema" in jobqueue("db", "init", app=str(path)).stdout


def test_an_app_file_named_like_a_module_already_imported_is_refused_naming_the_fix(tmp_path) -> None:
    """It was handed the other module (Python's own ``email``), then said it had no 'app'."""
    path = tmp_path / "email.py"
    path.write_text("from jobqueue import JobQueue\napp = JobQueue()\n")
    result = jobqueue("status", app=str(path), check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{path} is imported as the module 'email', but that name is already the module of " in result.stderr
    assert "email/__init__.py: rename the file (its tasks are named after it)" in result.stderr


def test_an_app_attribute_that_is_missing_or_no_jobqueue_is_named_as_such(tmp_path) -> None:
    path = tmp_path / "two_apps.py"
    path.write_text("from jobqueue import JobQueue\nqueue = JobQueue()\nsettings = {}\n")
    missing = jobqueue("status", app=f"{path}:nothere", check=False)
    assert missing.returncode == 1 and f"{path} has no 'nothere'; JobQueue objects there: queue" in missing.stderr
    wrong = jobqueue("status", app=f"{path}:settings", check=False)
    assert wrong.returncode == 1 and "settings is a dict, not a JobQueue; JobQueue objects there: queue" in wrong.stderr


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("import os\nraise RuntimeError('settings missing')\n", "RuntimeError: settings missing, at {path} line 2"),
        ("def broken(:\n    pass\n", "SyntaxError: "),
    ],
)
def test_an_app_module_that_fails_at_import_is_one_line_naming_where(tmp_path, source: str, fragment: str) -> None:
    path = tmp_path / "failing_app.py"
    path.write_text(source)
    result = jobqueue("status", app=f"{path}:app", check=False)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"Error: cannot import '{path}' named by --app/JOBQUEUE_APP: ")
    assert fragment.format(path=path) in result.stderr and "failing_app.py" in result.stderr


def test_password_never_reaches_logs(tmp_path) -> None:
    """Passwords in the user part and in query parameters stay out of CLI errors and worker logs;
    a worker whose database is down waits for it, logging, instead of exiting."""
    for url in (
        "postgresql+psycopg2://someone:hunter2secret@127.0.0.1:1/nowhere?password=hunter2secret",
        "mysql+mysqldb://someone@127.0.0.1:1/nowhere?passwd=hunter2secret",
    ):
        result = jobqueue("--database-url", url, "db", "init", check=False, timeout=60)
        assert result.returncode == 1 and "hunter2secret" not in result.stdout + result.stderr
        assert "127.0.0.1:1/nowhere" in result.stderr  # the URL itself is shown, masked
        log = tmp_path / "worker.log"
        with open(log, "w") as out:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "jobqueue",
                    "--app",
                    "tests.apps.basic:app",
                    "--database-url",
                    url,
                    "worker",
                    "--burst",
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            try:
                wait_for(lambda: "unavailable" in log.read_text(), 30, "the worker to report the outage")  # noqa: B023
                assert worker.poll() is None, log.read_text()  # still waiting for the database
                worker.send_signal(signal.SIGTERM)
                assert worker.wait(30) == 0, log.read_text()
            finally:
                if worker.poll() is None:
                    worker.kill()
        text = log.read_text()
        assert "hunter2secret" not in text and "***" in text, text


@only("postgresql")
@pytest.mark.parametrize(
    "command",
    [("status",), ("worker", "--burst"), ("jobs", "cancel", "1"), ("enqueue", "basic.add", "--args", "[1, 2]")],
)
def test_a_database_user_without_privileges_is_one_line_naming_what_it_lacks(
    app: JobQueue, command: tuple[str, ...]
) -> None:
    tables = ", ".join(table.name for table in app.tables.metadata.sorted_tables)
    with app.engine.begin() as conn:  # the owner takes its own privileges away (and gives them back after)
        conn.execute(sa.text(f"REVOKE ALL ON {tables} FROM CURRENT_USER"))
    try:
        result = jobqueue(*command, check=False)
    finally:
        with app.engine.begin() as conn:
            conn.execute(sa.text(f"GRANT ALL ON {tables} TO CURRENT_USER"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "permission denied for table jobqueue_" in errors[0] and "GRANT" in errors[0], result.stderr


def _scratch(backend: str, tmp_path: Path) -> tuple[str, JobQueue]:
    url = servers.create_database(backend, str(tmp_path))
    app = JobQueue()
    app.configure(database_url=url)  # JOBQUEUE_DATABASE_URL (the session's) outranks JobQueue(url)
    app.init_schema()
    return url, app


def test_a_column_dropped_by_hand_is_one_line_naming_it_in_every_command(backend: str, tmp_path: Path) -> None:
    """status and workers printed a traceback (PostgreSQL) or the driver's line without a fix."""
    url, app = _scratch(backend, tmp_path)
    try:
        with app.engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE jobqueue_worker DROP COLUMN jobs_done"))
        for command in (("status",), ("workers",)):
            result = jobqueue("--database-url", url, *command, app=None, check=False)
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
            assert "lack column jobqueue_worker.jobs_done" in result.stderr and "back by hand" in result.stderr
    finally:
        app.close()
        servers.drop_database(backend, url)


@only("postgresql")
def test_a_database_that_accepts_no_writes_is_one_line_saying_so(tmp_path: Path) -> None:
    """A standby, or default_transaction_read_only: jobs cancel, workers --prune and enqueue printed
    a traceback ending in "cannot execute ... in a read-only transaction"."""
    url, app = _scratch("postgresql", tmp_path)
    try:
        with app.engine.connect() as conn:
            conn.execute(sa.text(f"ALTER DATABASE {sa.make_url(url).database} SET default_transaction_read_only = on"))
            conn.commit()
        app.engine.dispose()
        for command in (("jobs", "cancel", "1"), ("workers", "--prune"), ("enqueue", "basic.add", "--args", "[1, 2]")):
            result = jobqueue("--database-url", url, *command, check=False)
            errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
            assert len(errors) == 1 and "the database accepts no writes" in errors[0], result.stderr
    finally:
        app.close()
        servers.drop_database("postgresql", url)


@pytest.mark.parametrize("value", ["nan", "inf", "1e30"])
@pytest.mark.parametrize("command", [("status", "--watch", "--interval"), ("health", "--max-heartbeat-age")])
def test_seconds_that_are_no_finite_number_are_a_usage_error(command: tuple[str, ...], value: str) -> None:
    """status --watch --interval nan raised ValueError (inf and 1e30, OverflowError), with a
    traceback; health took --max-heartbeat-age nan and counted no worker live, inf every one."""
    result = jobqueue(*command, value, check=False, timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"Invalid value for '{command[-1]}'" in result.stderr


@only("postgresql")
def test_a_search_path_naming_no_schema_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    """db init printed a traceback ending in "no schema has been selected to create in"."""
    url = servers.create_database("postgresql", str(tmp_path))
    try:
        nowhere = sa.make_url(url).update_query_dict({"options": "-csearch_path=nosuch"})
        result = jobqueue("--database-url", nowhere.render_as_string(hide_password=False), "db", "init", check=False)
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert len(errors) == 1 and "search_path names no schema that exists" in errors[0], result.stderr
    finally:
        servers.drop_database("postgresql", url)


@only("postgresql")
def test_delay_by_a_user_without_privileges_raises_configuration_error_naming_the_grant(app: JobQueue) -> None:
    """delay() raised the driver's ProgrammingError, where the CLI named the grant."""
    tables = ", ".join(table.name for table in app.tables.metadata.sorted_tables)
    with app.engine.begin() as conn:  # the owner takes its own privileges away (and gives them back after)
        conn.execute(sa.text(f"REVOKE ALL ON {tables} FROM CURRENT_USER"))
    try:
        with pytest.raises(ConfigurationError, match=r"permission denied for table .*; nothing was enqueued: GRANT"):
            basic.add.delay(1, 2)
    finally:
        with app.engine.begin() as conn:
            conn.execute(sa.text(f"GRANT ALL ON {tables} TO CURRENT_USER"))


def test_a_command_behind_sqlite_write_lock_names_how_to_find_its_holder(tmp_path, monkeypatch) -> None:
    """It named PostgreSQL's and MariaDB's views of sessions, which a SQLite user has neither of."""
    from click.testing import CliRunner

    from jobqueue.cli import bound_cli
    from jobqueue.storage.dialects import sqlite_connection

    monkeypatch.setattr(sqlite_connection, "BUSY_TIMEOUT_SECONDS", 0.5)
    path = tmp_path / "locked.sqlite3"
    app = JobQueue(f"sqlite:///{path}")
    app.init_schema()
    app.task(name="t.waiting")(lambda: None).delay()  # a job to cancel: a write
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another program's long transaction
        result = CliRunner().invoke(bound_cli(app), ["jobs", "cancel", "--all", "--yes"])
    finally:
        holder.close()
        app.close()
    assert result.exit_code == 1, result.output
    assert "database is locked" in result.output and "`fuser FILE` or `lsof FILE`" in result.output, result.output
    assert "pg_stat_activity" not in result.output
