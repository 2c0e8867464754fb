"""Run the real ``jobqueue dashboard`` command in a subprocess and find the address it serves."""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path

from tests.acceptance.cli import ROOT

READY = re.compile(r" on (http://\S+/)")


class DashboardProcess:
    """``jobqueue --app APP dashboard --port 0 ARGS...``; ``url`` is where it listens, by 127.0.0.1."""

    def __init__(self, log_dir: Path, *args: str, app: str = "tests.apps.basic:app", timeout: float = 20) -> None:
        self.log_path = log_dir / "dashboard.log"
        self.log = open(self.log_path, "w")
        command = [sys.executable, "-m", "jobqueue", "--app", app, "dashboard", "--port", "0", *args]
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True, env=dict(os.environ)
        )
        self.ready_line = self._read_line(timeout)
        found = READY.search(self.ready_line)
        assert found, f"unexpected first line: {self.ready_line!r}"
        port = found.group(1).rstrip("/").rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{port}/"

    def _read_line(self, timeout: float) -> str:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if selector.select(0.1):
                    line = self.process.stdout.readline()
                    if line:
                        return line
                if self.process.poll() is not None:
                    break
        self.close()
        raise AssertionError(f"the dashboard did not start within {timeout} s; its log:\n{self.text()}")

    def text(self) -> str:
        """What it logged (its stderr, which it writes to the file itself) so far."""
        return self.log_path.read_text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()

    def __enter__(self) -> DashboardProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
