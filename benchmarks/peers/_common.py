"""Helpers the peer adapters share: their databases, worker subprocesses, polling and percentiles.

Nothing here imports a peer library; psycopg2 is imported inside the functions that need it.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MAIN_DIR = Path(__file__).resolve().parents[2]  # /work/main: cwd and PYTHONPATH of the workers
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
LOG_DIR = Path("/tmp/peer-logs")
LATENCY_DIR = Path("/tmp/peer-latency")
POLL_INTERVAL = 0.01  # seconds between two looks at the peer's tables
TIMEOUT = 600.0


def database_url(url: str | None, database: str) -> str:
    """``url`` (the server; its database part is ignored) pointing at ``database``."""
    parts = urlsplit(url or os.environ.get("PEERS_POSTGRES_URL", DEFAULT_URL))
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))


def recreate_database(url: str) -> None:
    """Drop (closing any session on it) and create the database ``url`` names, from its server's ``postgres``."""
    import psycopg2

    database = urlsplit(url).path.lstrip("/")
    if not database.startswith("jobqueue_test_peer_"):
        raise ValueError(f"refusing to drop {database!r}: only jobqueue_test_peer_* databases are ours")
    conn = psycopg2.connect(database_url(url, "postgres"))
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{database}"')
    finally:
        conn.close()


def scalar(url: str, query: str) -> int:
    """One integer from ``query`` on a fresh connection (for set-up checks, not for polling)."""
    import psycopg2

    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            row = cur.fetchone()
            assert row is not None
            return int(row[0])
    finally:
        conn.close()


def pg_counter(url: str, query: str) -> tuple[Callable[[], int], Callable[[], None]]:
    """A function running ``query`` (one integer) on one autocommit connection, and one closing it."""
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = True
    cur = conn.cursor()

    def count() -> int:
        cur.execute(query)
        row = cur.fetchone()
        assert row is not None
        return int(row[0])

    return count, conn.close


class Workers:
    """Worker commands run as subprocesses of their own session (cwd /work/main, PYTHONPATH with it)."""

    def __init__(self, name: str, commands: list[list[str]], env: dict[str, str] | None = None) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        environ = dict(os.environ, **(env or {}))
        environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(MAIN_DIR), environ.get("PYTHONPATH")) if p)
        self.log_path = LOG_DIR / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.processes = [
            subprocess.Popen(
                command, cwd=MAIN_DIR, env=environ, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
            )
            for command in commands
        ]

    def check(self) -> None:
        """Raise if a worker has exited (with the end of its log)."""
        for process in self.processes:
            if process.poll() is not None:
                tail = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"worker {process.args!r} exited with {process.returncode}:\n{tail}")

    def stop(self, sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
        """``sig`` to each worker; SIGKILL to the process group of any still running ``grace`` s later."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(sig)
        deadline = time.monotonic() + grace
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the group we created (its leader is still alive)
                process.wait()
        self.log.close()

    def raise_on_errors(self) -> None:
        """Raise if a worker logged a traceback (a job failed, or the worker did)."""
        text = self.log_path.read_text()
        if "Traceback" in text:
            raise RuntimeError(f"a worker logged errors, see {self.log_path}:\n{text[-3000:]}")


def python_command(*args: str) -> list[str]:
    """``args`` run by this interpreter (the virtualenv's, so the peer libraries are there)."""
    return [sys.executable, *args]


def run_processing(jobs: int, workers: Callable[[], Workers], done: Callable[[], int]) -> dict[str, float]:
    """Start ``workers()``, poll ``done()`` every 10 ms until it reaches ``jobs``, stop them; wall and steady jobs/s."""
    t10 = t90 = None
    started = time.perf_counter()
    running = workers()
    try:
        while True:
            count = done()
            now = time.perf_counter()
            if t10 is None and count >= 0.1 * jobs:
                t10 = now
            if t90 is None and count >= 0.9 * jobs:
                t90 = now
            if count >= jobs:
                break
            if now - started > TIMEOUT:
                raise TimeoutError(f"{count}/{jobs} jobs done after {TIMEOUT} s")
            running.check()
            time.sleep(POLL_INTERVAL)
    finally:
        running.stop()
    running.raise_on_errors()
    assert t10 is not None and t90 is not None
    return {"wall": jobs / (now - started), "steady": 0.8 * jobs / max(t90 - t10, 1e-9)}


def run_latency(
    name: str, n: int, workers: Callable[[], Workers], enqueue: Callable[[int], Any]
) -> tuple[float, float]:
    """Start ``workers()``, wait 2 s, ``enqueue(key)`` n times 20 ms apart; p50 and p99 ms enqueue-to-start.

    The probe task appends "key time.time()" to ``latency_file(name)`` when it starts.
    """
    path = latency_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    enqueued: dict[int, float] = {}
    running = workers()
    try:
        time.sleep(2.0)
        running.check()
        for key in range(n):
            enqueued[key] = time.time()
            enqueue(key)
            time.sleep(0.02)
        deadline = time.monotonic() + 60
        while len(read_starts(path)) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(read_starts(path))}/{n} probes started")
            running.check()
            time.sleep(POLL_INTERVAL)
    finally:
        running.stop()
    running.raise_on_errors()
    starts = read_starts(path)
    samples = sorted((starts[k] - enqueued[k]) * 1000 for k in range(n))
    return statistics.median(samples), samples[min(n - 1, int(n * 0.99))]


def latency_file(name: str) -> Path:
    """Where the ``name`` peer's probe task records its start times."""
    return LATENCY_DIR / f"{name}.txt"


def record_start(name: str, key: int) -> None:
    """Called first thing by a probe task: append "key time.time()" to the peer's latency file."""
    started = time.time()
    fd = os.open(latency_file(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {started!r}\n".encode())
    finally:
        os.close(fd)


def read_starts(path: Path) -> dict[int, float]:
    """key -> start time, from a latency file (complete lines only)."""
    if not path.exists():
        return {}
    starts = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            starts[int(parts[0])] = float(parts[1])
    return starts


def distribution_name(distribution: str) -> str:
    """ "<distribution> <installed version>", or "<distribution> (not installed)"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{distribution} {version(distribution)}"
    except PackageNotFoundError:
        return f"{distribution} (not installed)"


def name_attribute(distribution: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` computing ``NAME`` on access, from the installed distribution."""

    def __getattr__(name: str) -> Any:
        if name == "NAME":
            return distribution_name(distribution)
        raise AttributeError(name)

    return __getattr__


def importable(*modules: str) -> bool:
    """Whether every one of ``modules`` imports."""
    import importlib

    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        return False
    return True
