"""The Django example site's own tests (examples/django_app), run on each database.

Django is configured once per process, so each database gets its own pytest process: it migrates a
fresh database (the jobqueue migration included), drives the site with Django's test client and
runs ``manage.py jobqueue worker`` on what the requests enqueued.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests import servers
from tests.acceptance.cli import ROOT


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
