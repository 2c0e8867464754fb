"""Every ```python block in docs/ and README.md runs, and examples/quickstart.py works as documented."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobqueue.settings import Settings

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


def test_quickstart_tasks_run_through_the_cli(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JOBQUEUE_DATABASE_URL=f"sqlite:///{tmp_path}/q.sqlite3")
    app = str(ROOT / "examples" / "quickstart.py")

    def run(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "jobqueue", "--app", app, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

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
