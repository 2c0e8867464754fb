"""The Django example site's own tests (examples/django_app), run on each database.

Django is configured once per process, so each database gets its own pytest process: it migrates a
fresh database (the jobqueue migration included), drives the site with Django's test client and
runs ``manage.py jobqueue worker`` on what the requests enqueued. They run twice: here, with the
django-tasks backport (Django's task API on Django 5.2), and in a virtualenv of ``jobqueue[django]``,
Django alone, where only the tests of the receipts (a task written for that API) are skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import servers
from tests.acceptance.cli import ROOT
from tests.conftest import only

HERE = Path(__file__).resolve().parent
EXAMPLE = ROOT / "examples" / "django_app"
NO_TASK_API = "receipts need Django's task API"  # the reason the example's receipt tests give for a skip


@pytest.fixture(scope="session")
def django_alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a virtualenv with jobqueue installed from this repository with its ``django``,
    ``postgresql`` and ``mysql`` extras, and pytest: Django without its task API."""
    root = tmp_path_factory.mktemp("django-alone")
    # A copy to install from: pip builds in the source folder, and the repository stays as it is.
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(ROOT / "jobqueue", source / "jobqueue", ignore=shutil.ignore_patterns("__pycache__"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # This virtualenv's pip installs into the new one; the packages come from pip's cache, filled
    # when this one was installed. Django as in the dev extra: 5.2, whose task API is the backport.
    installed = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"),
            f"{source}[django,postgresql,mysql]",
            "django>=5.2,<6",
            "pytest",
            "pytest-timeout",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return python


def run_example(python: Path | str, backend: str, tmp_path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The example's tests, by ``python``, on a fresh database of ``backend``."""
    url = servers.create_database(backend, str(tmp_path))
    try:
        env = dict(os.environ, SHOP_DATABASE_URL=url)
        for name in ("JOBQUEUE_DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTHONPATH"):
            env.pop(name, None)
        result = subprocess.run(
            # Not the repository's own options: its slowest-tests list names tests like "a_failed_...".
            [str(python), "-m", "pytest", "-q", "-rs", "-o", "addopts=", "-p", "no:cacheprovider", str(EXAMPLE)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        servers.drop_database(backend, url)
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    summary = result.stdout.strip().splitlines()[-1]  # "16 passed in 24.34s"
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    return result


def test_django_example_site(backend: str, tmp_path: Path) -> None:
    result = run_example(sys.executable, backend, tmp_path, cwd=ROOT)
    assert "skipped" not in result.stdout  # the backport is installed: the receipts are tested too


def test_django_example_site_with_django_alone(backend: str, tmp_path: Path, django_alone: Path) -> None:
    lacking = subprocess.run(
        [str(django_alone), "-c", "import django_tasks"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert "No module named 'django_tasks'" in lacking.stderr
    # From the example's folder, so that jobqueue is the one installed, not this repository's.
    result = run_example(django_alone, backend, tmp_path, cwd=EXAMPLE)
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    receipt_tests = (EXAMPLE / "test_shop.py").read_text().count("@needs_task_api\n")
    assert receipt_tests and len(skips) == receipt_tests
    assert all(NO_TASK_API in line for line in skips), skips
    assert re.search(rf"\b{receipt_tests} skipped\b", result.stdout)


def test_without_the_task_api_its_backend_names_what_to_install(tmp_path: Path, django_alone: Path) -> None:
    site = (
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(\n"
        "    INSTALLED_APPS=['jobqueue.contrib.django'],\n"
        "    DATABASES={'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': 'site.sqlite3'}},\n"
        "    TASKS={'default': {'BACKEND': 'jobqueue.contrib.django.backend.JobQueueBackend'}},\n"
        ")\n"
        "django.setup()\n"
    )
    started = subprocess.run([str(django_alone), "-c", site], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert started.returncode == 1
    last = started.stderr.strip().splitlines()[-1]
    assert last.startswith("jobqueue.errors.ConfigurationError: settings.TASKS['default']: "), started.stderr
    assert "pip install django-tasks" in last and 'pip install "jobqueue[django-tasks]"' in last

    imported = subprocess.run(
        [str(django_alone), "-c", "import jobqueue.contrib.django.backend"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = imported.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and "pip install django-tasks" in last, imported.stderr


def test_the_admin_uses_the_jobqueue_database_alias_and_table_prefix(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("JOBQUEUE_DATABASE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, str(HERE / "django_alias_site.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def manage(*args: str, database: Path) -> subprocess.CompletedProcess[str]:
    """``python manage.py ...`` in the example's folder, on an SQLite file."""
    env = dict(os.environ, SHOP_DATABASE_URL=f"sqlite:///{database}", PYTHONPATH=str(ROOT))
    env.pop("JOBQUEUE_DATABASE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=120
    )


def test_manage_py_jobqueue_takes_djangos_options_before_or_after_the_command(tmp_path: Path) -> None:
    # Settings that only --pythonpath makes importable, on their own database, logging jobqueue's INFO.
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "q.sqlite3")}
    logging = {
        "version": 1,
        "handlers": {"stderr": {"class": "logging.StreamHandler"}},
        "loggers": {"jobqueue": {"handlers": ["stderr"], "level": "INFO"}},
    }
    (tmp_path / "elsewhere.py").write_text(
        f"from shopsite.settings import *  # noqa: F403\nDATABASES = {{'default': {database!r}}}\n"
        f"LOGGING = {logging!r}\n"
    )
    elsewhere = ("--settings", "elsewhere", "--pythonpath", str(tmp_path))
    unused = tmp_path / "default.sqlite3"

    created = manage("jobqueue", *elsewhere, "db", "init", database=unused)
    assert created.returncode == 0, created.stderr
    assert (tmp_path / "q.sqlite3").exists() and not unused.exists()

    status = manage("jobqueue", "status", "--json", "--settings=elsewhere", f"--pythonpath={tmp_path}", database=unused)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["workers"] == 0

    started = "jobqueue worker"  # the worker's INFO line as it starts
    logged = manage("jobqueue", *elsewhere, "worker", "--burst", database=unused)
    assert logged.returncode == 0 and started in logged.stderr, logged.stderr
    quiet = manage("jobqueue", "worker", "--burst", *elsewhere, "-v", "0", database=unused)
    assert quiet.returncode == 0 and started not in quiet.stderr, quiet.stderr

    flags = manage("jobqueue", "--no-color", *elsewhere, "status", "--skip-checks", "--traceback", database=unused)
    assert flags.returncode == 0, flags.stderr
    both = manage("jobqueue", "--no-color", "--force-color", *elsewhere, "status", database=unused)
    assert both.returncode == 1 and "can't be used together" in both.stderr
    assert not unused.exists()


def test_manage_py_jobqueue_help_lists_what_it_takes(tmp_path: Path) -> None:
    database = tmp_path / "shop.sqlite3"
    helped = manage("jobqueue", "--help", database=database)
    assert helped.returncode == 0, helped.stderr
    assert manage("help", "jobqueue", database=database).stdout == helped.stdout
    for option in ("--settings", "--pythonpath", "-v, --verbosity", "--traceback", "--no-color", "--force-color"):
        assert option in helped.stdout
    assert "--skip-checks" in helped.stdout and "--log-level" in helped.stdout and "worker" in helped.stdout
    assert "--app" not in helped.stdout and "--database-url" not in helped.stdout

    refused = manage("jobqueue", "--app", "shop.tasks:app", "status", database=database)
    assert refused.returncode == 2
    assert "--app does not apply to manage.py jobqueue: it runs <JobQueue sqlite" in refused.stderr


def test_djangos_options_are_taken_wherever_they_stand() -> None:
    from jobqueue.contrib.django.management.commands.jobqueue import DJANGO_OPTIONS, Command, split_options

    parser = Command().create_parser("manage.py", "jobqueue")
    django_has = {name: action.nargs != 0 for action in parser._actions for name in action.option_strings}
    for name in ("-h", "--help", "--version"):  # jobqueue's own
        django_has.pop(name)
    assert DJANGO_OPTIONS == django_has

    line = ["-v", "0", "jobs", "--settings=x", "list", "-v2", "--task", "t", "--pythonpath", "p", "--", "--traceback"]
    assert split_options(line) == (
        ["-v", "0", "--settings=x", "-v2", "--pythonpath", "p"],
        ["jobs", "list", "--task", "t", "--", "--traceback"],
    )


SOCKET_SITE = """
import json, sys
import django
import sqlalchemy as sa
from django.conf import settings

settings.configure(DATABASES={"default": json.loads(sys.argv[1])}, INSTALLED_APPS=[])
django.setup()
from jobqueue.contrib.django.integration import database_url

url = sa.make_url(database_url("default").render_as_string(hide_password=False))  # as the app keeps it
engine = sa.create_engine(url)
print(json.dumps(engine.dialect.create_connect_args(url)[1], default=str))
if sys.argv[2] == "connect":
    with engine.connect() as conn:
        print(conn.exec_driver_sql("SELECT DATABASE()").scalar())
"""


@only("postgresql", "mysql")
def test_a_django_database_on_a_unix_socket_is_reached_on_that_socket(backend: str, db_url: str) -> None:
    """Django takes a HOST that begins with "/" as a Unix socket (its directory on PostgreSQL, its
    file on MySQL). jobqueue put the path in its URL's host, where it was read back as part of the
    database's name: workers and the CLI asked for a database "var/run/postgresql:5432/db", while
    the jobs went in through Django's own connection."""
    url = sa.make_url(db_url)
    socket = "/var/run/postgresql"  # Debian's (only the driver's arguments are read on PostgreSQL)
    if backend == "mysql":
        engine = sa.create_engine(db_url)
        with engine.connect() as conn:
            socket = conn.exec_driver_sql("SELECT @@socket").scalar()
        engine.dispose()
    engine_name = {"postgresql": "django.db.backends.postgresql", "mysql": "django.db.backends.mysql"}[backend]
    django_db = {"ENGINE": engine_name, "NAME": url.database, "USER": url.username, "PASSWORD": url.password}
    django_db.update(HOST=socket, PORT=str(url.port or ""))
    # PostgreSQL: the socket's arguments only (its local logins may be peer-authenticated here).
    how = "connect" if backend == "mysql" else "arguments"
    result = subprocess.run(
        [sys.executable, "-c", SOCKET_SITE, json.dumps(django_db), how], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    arguments, *answer = result.stdout.splitlines()
    given = json.loads(arguments)
    if backend == "postgresql":
        assert (given["host"], given["dbname"], str(given.get("port"))) == (socket, url.database, str(url.port)), given
    else:
        assert given["unix_socket"] == socket and given["db"] == url.database and "host" not in given, given
        assert answer == [url.database], result.stdout


SWITCHING_SITE = """
import os, sys
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "jobqueue.contrib.django"],
    DATABASES={
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "default.sqlite3"},
        "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": "other.sqlite3"},
    },
    JOBQUEUE={"APP": "__main__:app", "DATABASE": os.environ["QUEUE_ALIAS"]},
    USE_TZ=True,
)
from jobqueue import JobQueue

app = JobQueue()


@app.task(name="site.hello")
def hello() -> None:
    pass


django.setup()
from django.core.management import call_command

if sys.argv[1] == "migrate":
    call_command("migrate", *sys.argv[2:], verbosity=1)
else:
    print("job", hello.delay().id)
"""


def test_migrating_the_database_jobqueue_moved_to_creates_its_tables(tmp_path: Path) -> None:
    """settings.JOBQUEUE['DATABASE'] changed to a database migrated before, when jobqueue's
    migrations ran there and created nothing (they create on jobqueue's database only): Django
    had them as applied, `migrate --database other` did nothing, and delay() said to run it."""
    (tmp_path / "site.py").write_text(SWITCHING_SITE)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("JOBQUEUE_DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)

    def site(alias: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "site.py", *args],
            cwd=tmp_path,
            env=dict(env, QUEUE_ALIAS=alias),
            capture_output=True,
            text=True,
            timeout=120,
        )

    for args in (("migrate",), ("migrate", "--database", "other")):  # a deploy that migrates every database
        done = site("default", *args)
        assert done.returncode == 0, done.stderr
    assert "jobqueue: created" not in done.stdout
    moved = site("other", "migrate", "--database", "other")
    assert moved.returncode == 0, moved.stderr
    assert "jobqueue: created jobqueue schema" in moved.stdout and "'other'" in moved.stdout, moved.stdout
    enqueued = site("other", "enqueue")
    assert enqueued.returncode == 0 and enqueued.stdout.startswith("job 1"), enqueued.stderr[-2000:]
    again = site("other", "migrate", "--database", "other")
    assert again.returncode == 0 and "jobqueue:" not in again.stdout, again.stdout
    back = site("other", "migrate", "jobqueue", "zero", "--database", "other")  # on purpose: stays dropped
    assert back.returncode == 0, back.stderr
    assert "jobqueue: created" not in back.stdout
    with sa.create_engine(f"sqlite:///{tmp_path / 'other.sqlite3'}").connect() as conn:
        assert not [t for t in sa.inspect(conn).get_table_names() if t.startswith("jobqueue_")]


UNINSTALLED = """
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes"{installed}],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": "site.sqlite3"}}}},
    JOBQUEUE={{"APP": "nosuch.tasks:app"}},
)
django.setup()
from jobqueue import JobQueue

app = JobQueue()


@app.task
def add(x, y):
    return x + y


if {installed!r}:
    from jobqueue.contrib.django.integration import configured_app

    try:
        configured_app()
    except Exception as exc:
        print(exc)
else:
    app.init_schema()
    add.delay(1, 2)
    add.delay(3, 4)
"""


@pytest.mark.parametrize("installed", ["", ', "jobqueue.contrib.django"'])
def test_django_setup_mistakes_name_the_setting_to_fix(installed: str, tmp_path: Path) -> None:
    """Without jobqueue's app in INSTALLED_APPS, a JobQueue made without a URL put its jobs in
    ./jobqueue.sqlite3, outside Django's transactions, without a word; a bad JOBQUEUE['APP'] was
    blamed on the --app option, which manage.py jobqueue refuses."""
    script = tmp_path / "site.py"
    script.write_text(UNINSTALLED.format(installed=installed))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("JOBQUEUE_DATABASE_URL", "DJANGO_SETTINGS_MODULE", "JOBQUEUE_APP"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if installed:
        assert "cannot import 'nosuch.tasks' named by settings.JOBQUEUE['APP']" in result.stdout, result.stdout
    else:
        said = result.stderr.count("Add 'jobqueue.contrib.django' to INSTALLED_APPS")
        assert said == 1, result.stderr[-3000:]
