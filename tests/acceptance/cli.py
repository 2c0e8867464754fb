"""Run the real ``jobqueue`` command in a subprocess, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.basic:app"


def jobqueue(
    *args: str, app: str | None = APP, timeout: float = 120, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "jobqueue"] + (["--app", app] if app else []) + list(args)
    environment = dict(os.environ, **(env or {}))
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result
