"""Run a real ``jobqueue worker`` in a subprocess and watch it from the test."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from tests.acceptance.cli import ROOT

REPORTS: list[str] = []  # printed at the end of the session (conftest's terminal summary)


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Worker:
    """``jobqueue --app tests.apps.runtime:app worker ...`` with its log in a file."""

    def __init__(
        self,
        tmp: Path,
        *args: str,
        app: str = "tests.apps.runtime:app",
        name: str = "worker",
        env: dict[str, str] | None = None,
        group: bool = False,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        self.log_path = tmp / f"{name}.log"
        self.log = open(self.log_path, "w")
        command = [*wrapper, sys.executable, "-m", "jobqueue", "--app", app, "worker", *args]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, **(env or {})),
            preexec_fn=default_signals,
            start_new_session=group,  # a process group of its own, as a terminal's foreground job
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker did not exit within {timeout} s; log:\n{self.text()[-4000:]}") from None

    def kill(self) -> None:
        for pid in self.children() + [self.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(10)

    def text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self.log.close()


def start(
    workers: list[Worker],
    tmp_path: Path,
    *args: str,
    name: str = "worker",
    app: str = "tests.apps.runtime:app",
    env: dict[str, str] | None = None,
    group: bool = False,
    wrapper: tuple[str, ...] = (),
) -> Worker:
    """Start a worker that the ``workers`` fixture stops after the test (in a process group of its
    own with ``group``: then ``os.killpg(worker.pid, ...)`` is Ctrl-C at its terminal; run by the
    command ``wrapper`` if given)."""
    worker = Worker(tmp_path, *args, name=name, app=app, env=env, group=group, wrapper=wrapper)
    workers.append(worker)
    return worker


def default_signals() -> None:
    """A worker as a terminal would start it: under nohup or in a background job of a script (as
    CI runs us) SIGHUP, SIGINT and SIGQUIT are ignored, and a child would inherit that."""
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


def recorded(path: Path) -> list[list[str]]:
    """The fields of each line a task appended to ``path`` (none if it does not exist yet).
    Read while tasks append: a line still being written (no newline yet) is left for next time."""
    if not path.exists():
        return []
    text = path.read_text()
    return [line.split() for line in text[: text.rfind("\n") + 1].splitlines()]


def runs(path: Path) -> list[tuple[str, int, int]]:
    """The events the runtime tasks recorded: (event, job id, pid)."""
    out = []
    for line in recorded(path):
        event, job_id, pid = line
        out.append((event, int(job_id), int(pid)))
    return out


def repeated(events: list[tuple[str, int, int]], event: str) -> dict[int, int]:
    counts = collections.Counter(job_id for name, job_id, _ in events if name == event)
    return {job_id: n for job_id, n in counts.items() if n > 1}


def others_in_transaction(engine: sa.Engine) -> bool:
    """True if another connection to the test database holds an open transaction right now."""
    import sqlite3

    if engine.dialect.name == "sqlite":
        probe = sqlite3.connect(engine.url.database or "", timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            probe.close()
    if engine.dialect.name == "postgresql":
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        )
        with engine.connect() as conn:
            return bool(conn.execute(sa.text(query)).scalar())
    # MySQL: innodb_trx needs the PROCESS privilege; try to lock every row instead.
    try:
        with engine.begin() as conn:
            for table in ("message", "worker"):
                conn.execute(sa.text(f"SELECT id FROM jobqueue_{table} FOR UPDATE NOWAIT")).all()
        return False
    except sa.exc.OperationalError:
        return True


def freeze(worker: Worker, engine: sa.Engine, tries: int = 200) -> None:
    """SIGSTOP ``worker`` at a moment it holds no transaction open.

    A process frozen inside a transaction keeps its locks (and SQLite's write lock) until it runs
    again, so the other worker in the test could not release its lease until then.
    """
    for _ in range(tries):
        worker.signal(signal.SIGSTOP)
        time.sleep(0.05)
        if not others_in_transaction(engine):
            return
        worker.signal(signal.SIGCONT)
        time.sleep(0.013)
    raise AssertionError("could not stop the worker outside a transaction")


def freeze_host(worker: Worker, engine: sa.Engine, tries: int = 400) -> list[int]:
    """SIGSTOP ``worker`` and its processes, as a host that freezes whole, at a moment none of them
    holds a transaction open (see freeze); return their pids, for SIGCONT."""
    for _ in range(tries):
        pids = worker.children() + [worker.pid]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(0.01)
        if not others_in_transaction(engine):
            return pids
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.013)
    raise AssertionError("could not stop the worker outside a transaction")
