"""Every ```python block in docs/ and README.md runs, and examples/quickstart.py works as documented."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from jobqueue.settings import Settings
from jobqueue.storage.tables import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[tuple[str, int, str]]:
    found = []
    for path in DOCS:
        for number, match in enumerate(BLOCK.finditer(path.read_text()), 1):
            found.append((path.name, number, match.group(1)))
    return found


@pytest.mark.parametrize("doc, number, code", python_blocks(), ids=lambda v: str(v)[:20] if isinstance(v, str) else v)
def test_python_block_runs(doc: str, number: int, code: str, tmp_path: Path) -> None:
    script = tmp_path / f"{Path(doc).stem}_{number}.py"
    script.write_text(code)
    # The working directory is a fresh folder: the default sqlite:///jobqueue.sqlite3 is made there.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("JOBQUEUE_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{doc} block {number} failed:\n{result.stdout}\n{result.stderr}"


def test_every_setting_is_documented() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [f.name for f in dataclasses.fields(Settings) if f"`{f.name}`" not in text]
    assert not missing


def test_every_schema_version_is_documented() -> None:
    text = (ROOT / "docs" / "upgrading.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ", text, re.M)
    assert [int(version) for version in rows] == list(range(1, SCHEMA_VERSION + 1))


def test_quickstart_example_runs_as_documented(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("JOBQUEUE_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--jobs", "300"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "jobqueue.sqlite3").exists()  # the embedded default, in the working directory
    assert "add(299, 1) = 300" in result.stdout
    assert "succeeded on attempt 2" in result.stdout
    assert "always_fails -> failed" in result.stdout
    assert "Decimal('29.97')" in result.stdout


def test_the_flask_page_runs_as_it_says(tmp_path: Path) -> None:
    """Its block saved as shop.py, run, then its worker command: the placed order gets confirmed
    (the block's own checks ran again at import, and failed there)."""
    block = next(code for doc, number, code in python_blocks() if doc == "flask.md" and number == 1)
    (tmp_path / "shop.py").write_text(block)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("JOBQUEUE_DATABASE_URL", None)

    def run(*args: str) -> str:
        result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    run(sys.executable, "shop.py")
    assert '"ready": 1' in run(sys.executable, "-m", "flask", "--app", "shop", "jobqueue", "status", "--json")
    run(sys.executable, "-m", "flask", "--app", "shop", "jobqueue", "worker", "--burst")
    database = next(tmp_path.rglob("shop.sqlite3"))  # in the app's instance/ folder
    with sqlite3.connect(database) as conn:
        assert conn.execute('SELECT item, status FROM "order"').fetchall() == [("book", "confirmed")]


def _jobqueue(app: str, cwd: Path, env: dict[str, str], *args: str) -> str:
    """``jobqueue --app APP ARGS...`` in ``cwd``; its output, once it succeeded."""
    result = subprocess.run(
        [sys.executable, "-m", "jobqueue", "--app", app, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_quickstart_tasks_run_through_the_cli(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JOBQUEUE_DATABASE_URL=f"sqlite:///{tmp_path}/q.sqlite3")
    app = str(ROOT / "examples" / "quickstart.py")

    def run(*args: str) -> str:
        return _jobqueue(app, tmp_path, env, *args)

    run("db", "init")
    out = run("enqueue", "quickstart.add", "--args", "[2, 3]")
    run("worker", "--burst", "--concurrency", "1")
    job_id = int(out.split()[2])
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        quickstart = importlib.import_module("quickstart")
        quickstart.app.configure(database_url=env["JOBQUEUE_DATABASE_URL"])
        assert quickstart.app.job(job_id).get(timeout=5) == 5
        quickstart.app.close()
    finally:
        sys.path.remove(str(ROOT / "examples"))


# The tables the docs show, with what makes each command print one.
SAMPLE_TABLES = [
    ("periodic.md", "NAME ", ["periodic", "list"], "@app.periodic(cron='0 7 * * *')\n@app.task\ndef digest(): ..."),
    ("topics.md", "TOPIC ", ["topics"], "app.init_schema()\napp.topic('orders').publish({'id': 7})"),
    ("operations.md", "QUEUE ", ["status"], "@app.task\ndef noop(): ...\n\n\napp.init_schema()\nnoop.delay()"),
]


@pytest.mark.parametrize("doc, first_column, command, setup", SAMPLE_TABLES, ids=[t[0] for t in SAMPLE_TABLES])
def test_a_table_shown_in_the_docs_has_the_columns_the_command_prints(
    doc: str, first_column: str, command: list[str], setup: str, tmp_path: Path
) -> None:
    run, _ = _docs_app(tmp_path, setup)
    printed, printed_next = _table_top(run(*command), first_column)
    shown, shown_next = _table_top((ROOT / "docs" / doc).read_text(), first_column)
    assert shown.split() == printed.split()
    assert set(shown_next) <= {"-", " "} if set(printed_next) <= {"-", " "} else not set(shown_next) <= {"-", " "}


# Jobs held back by their keys, as flow-control.md shows them: the partition's first job, one of
# three calls to a key with a limit of 1 and two of three notes (2/m) taken by a fetch, then a
# second job of the partition.
HELD_KEYS_APP = """
@app.task(name="add")
def add(x, y): ...


@app.task(name="partner_call", concurrency_key="partner", concurrency_limit=1)
def partner_call(n): ...


@app.task(name="notify", rate_limit="2/m")
def notify(n): ...
"""
HELD_KEYS_SETUP = """
from docs_app import add, app, notify, partner_call

add.apply_async((1, 2), partition_key="acct-7")
partner_call.bulk([(n,) for n in range(3)])
notify.bulk([(n,) for n in range(3)])
app.store.acquire("w" * 32, None, 10, 30.0, flow=True)  # the fetch a worker makes
add.apply_async((3, 4), partition_key="acct-7")
"""
RATE_TIME = re.compile(r"\d\d:\d\d:\d\d\.\d{3} UTC")


def test_the_keys_holding_jobs_back_in_flow_control_are_what_the_commands_print(tmp_path: Path) -> None:
    """The samples of `jobqueue status` and `jobs show` on keyed jobs, line for line (the time a
    rate allows the next start aside)."""
    run, env = _docs_app(tmp_path, HELD_KEYS_APP)
    (tmp_path / "setup_jobs.py").write_text(HELD_KEYS_SETUP)
    subprocess.run([sys.executable, "setup_jobs.py"], cwd=tmp_path, env=env, check=True, timeout=120)
    text = (ROOT / "docs" / "flow-control.md").read_text()

    status = run("status").splitlines()
    at = status.index("jobs held back by their keys (the most waiting first):")
    printed = [RATE_TIME.sub("HH:MM:SS.mmm UTC", line.rstrip()) for line in status[at : status.index("", at)]]
    shown = _block_from(text, "jobs held back by their keys")
    assert [RATE_TIME.sub("HH:MM:SS.mmm UTC", line) for line in shown] == printed

    listed = json.loads(run("jobs", "list", "--json"))
    waiting = next(row for row in listed if row["task_name"] == "partner_call" and row["waiting"])
    detail = run("jobs", "show", str(waiting["id"])).splitlines()
    shown = _block_from(text, "flow key     'partner'")
    assert [line for line in detail if line.startswith(("flow key ", "waiting "))] == shown
    assert "WAITING" in run("jobs", "list").splitlines()[0].split()  # the column the page names


def _block_from(text: str, first: str) -> list[str]:
    """The lines of the ``` block of ``text`` that starts with the line starting with ``first``."""
    lines = text.splitlines()
    at = next(number for number, line in enumerate(lines) if line.startswith(first))
    assert lines[at - 1] == "```", f"{first!r} does not start a block"
    return lines[at : lines.index("```", at)]


def _docs_app(tmp_path: Path, code: str) -> tuple[Callable[..., str], dict[str, str]]:
    """``docs_app``: a JobQueue on ``jobqueue.sqlite3`` in ``tmp_path``, then ``code``, its tables made;
    a function that runs ``jobqueue --app docs_app ARGS...`` there, and the environment it runs in."""
    (tmp_path / "docs_app.py").write_text(f"from jobqueue import JobQueue\n\napp = JobQueue()\n{code}\n")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}", NO_COLOR="1")
    env.pop("JOBQUEUE_DATABASE_URL", None)

    def run(*args: str) -> str:
        return _jobqueue("docs_app", tmp_path, env, *args)

    run("db", "init")
    return run, env


def _table_top(text: str, first_column: str) -> tuple[str, str]:
    """The header line of the table that starts with ``first_column``, and the line under it."""
    lines = text.splitlines()
    at = next(number for number, line in enumerate(lines) if line.startswith(first_column))
    return lines[at], lines[at + 1]


def test_the_unique_key_session_in_retries_runs_as_shown(tmp_path: Path) -> None:
    """The commands of the page, typed as they are, print what the page shows (job ids aside)."""
    text = (ROOT / "docs" / "retries.md").read_text()
    session = text[text.index("$ jobqueue -A billing enqueue") :].split("```")[0].splitlines()
    (tmp_path / "billing.py").write_text(
        "from jobqueue import JobQueue\n\napp = JobQueue()\n\n\n@app.task\ndef send_invoice(invoice_id): ...\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("JOBQUEUE_DATABASE_URL", None)
    subprocess.run([sys.executable, "-m", "jobqueue", "-A", "billing", "db", "init"], cwd=tmp_path, env=env, check=True)
    assert len(session) == 4, session
    for command, shown in zip(session[0::2], session[1::2], strict=True):
        args = shlex.split(command.removeprefix("$ jobqueue "))
        done = subprocess.run(
            [sys.executable, "-m", "jobqueue", *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert re.sub(r"job \d+", "job N", done.stdout.strip()) == re.sub(r"job \d+", "job N", shown)
