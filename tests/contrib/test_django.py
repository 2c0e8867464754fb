"""The Django example site's own tests (examples/django_app), run on each database.

Django is configured once per process, so each database gets its own pytest process: it migrates a
fresh database (the jobqueue migration included), drives the site with Django's test client and
runs ``manage.py jobqueue worker`` on what the requests enqueued.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import servers
from tests.acceptance.cli import ROOT

HERE = Path(__file__).resolve().parent


def test_django_example_site(backend: str, tmp_path) -> None:
    url = servers.create_database(backend, str(tmp_path))
    try:
        env = dict(os.environ, SHOP_DATABASE_URL=url)
        env.pop("JOBQUEUE_DATABASE_URL", None)
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "examples" / "django_app")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
        assert " passed" in result.stdout and "failed" not in result.stdout
    finally:
        servers.drop_database(backend, url)


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
