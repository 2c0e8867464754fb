"""A database server restarted under a running worker: nothing lost, nothing archived twice.

Each test starts its own private server (a temporary cluster on a free port) so that stopping it
disturbs nothing else.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.apps import runtime as rt
from tests.conftest import only
from tests.runtime.harness import REPORTS, Worker, repeated, runs, wait_for
from tests.servers import private_server


def archive_count(url: str) -> int:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM jobqueue_archive")).scalar_one())
    except sa.exc.OperationalError:
        return -1
    finally:
        engine.dispose()


@only("postgresql", "mysql")
def test_server_restart_during_a_run_of_2000_jobs(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with private_server(backend) as server:
        monkeypatch.setenv("JOBQUEUE_DATABASE_URL", server.url)
        monkeypatch.setenv("JOBQUEUE_TEST_RUNS", str(tmp_path / "runs.txt"))
        rt.app.configure(database_url=server.url)
        rt.app.init_schema()
        handles = rt.short.bulk([(0.003,)] * 2000)
        rt.app.close()
        worker = Worker(tmp_path, "--burst", "--concurrency", "2")
        try:
            wait_for(lambda: archive_count(server.url) >= 300, 60, "the first jobs to complete")
            down = time.monotonic()
            server.stop()
            time.sleep(2)  # the worker now sees a dead server for a while
            server.start()
            downtime = time.monotonic() - down
            assert worker.wait(180) == 0, worker.text()[-4000:]
        finally:
            worker.close()
        engine = sa.create_engine(server.url, poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            total, distinct = conn.execute(sa.text("SELECT count(*), count(DISTINCT id) FROM jobqueue_archive")).one()
            states: dict[str, int] = dict(
                conn.execute(sa.text("SELECT state, count(*) FROM jobqueue_archive GROUP BY state")).all()
            )
            left = conn.execute(sa.text("SELECT count(*) FROM jobqueue_message")).scalar_one()
        engine.dispose()
        assert (total, distinct, left) == (2000, 2000, 0)
        assert states == {"COMPLETED": 2000}
        assert {h.id for h in handles} == set(range(handles[0].id, handles[-1].id + 1))
        log = worker.text()
        warnings = log.count("unavailable (")
        assert 1 <= warnings <= 6, f"an outage should be logged once per process, not per attempt:\n{log[-3000:]}"
        assert "available again after" in log
        twice = repeated(runs(tmp_path / "runs.txt"), "run")
        REPORTS.append(
            f"restart[{backend}]: server down {downtime:.1f} s mid-run; 2000/2000 completed, "
            f"0 duplicate archive rows, {len(twice)} jobs ran twice, {warnings} outage warnings"
        )


@only("postgresql", "mysql")
def test_an_idle_worker_hears_new_work_again_after_a_server_restart(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle processes lose their connections (PostgreSQL: the one they LISTEN on) with the server;
    they must reconnect without crashing and be woken by new work, not by their 30 s fallback poll."""
    with private_server(backend) as server:
        monkeypatch.setenv("JOBQUEUE_DATABASE_URL", server.url)
        monkeypatch.setenv("JOBQUEUE_TEST_RUNS", str(tmp_path / "runs.txt"))
        rt.app.configure(database_url=server.url)
        rt.app.init_schema()
        worker = Worker(tmp_path, "--concurrency", "2", "--max-fetch-interval", "30")
        try:
            first = rt.short.delay(0)
            wait_for(lambda: first.status() == "completed", 30, "a job before the restart")
            server.stop()
            time.sleep(2)
            server.start()
            rt.app.close()  # the test's own pool died with the server too
            began = time.monotonic()
            after = rt.short.delay(0)
            wait_for(lambda: after.status() == "completed", 20, "a job enqueued after the restart")
            waited = time.monotonic() - began
            log = worker.text()
            assert "exited with" not in log and "crashed" not in log, log[-3000:]
            assert worker.process.poll() is None, "the worker stopped"
        finally:
            worker.close()
            rt.app.close()
        REPORTS.append(
            f"restart[{backend}], idle worker: a job enqueued after the restart completed in {waited:.1f} s "
            "(fallback poll: 30 s)"
        )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB file system of the test's own (a tmpfs: mounting needs root, as the test command
    runs), so that filling it disturbs nothing else."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32M", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if done.returncode != 0:
        reason = f"cannot mount a small file system to fill: {done.stderr.strip()}"
        if os.environ.get("JOBQUEUE_TEST_REQUIRE_ALL"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` with a file; return it (delete it to give the room back)."""
    ballast = disk / "ballast"
    with open(ballast, "wb", buffering=0) as f:  # unbuffered: nothing left to write at close
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return ballast


@only("sqlite")
def test_a_full_disk_keeps_the_outcomes_until_there_is_room(
    backend: str, small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk under a SQLite database fills up while a worker runs: every write fails, reads do
    not. The worker keeps its outcomes and writes them once there is room, says in the log what
    to do, and no job is failed, retried or run twice for it."""
    url = f"sqlite:///{small_disk}/queue.sqlite3"
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", url)
    monkeypatch.setenv("JOBQUEUE_TEST_RUNS", str(tmp_path / "runs.txt"))
    rt.app.configure(database_url=url)
    rt.app.init_schema()
    handles = rt.short.bulk([(0.005,)] * 1500)
    worker = Worker(tmp_path, "--concurrency", "2")
    try:
        wait_for(lambda: len(runs(tmp_path / "runs.txt")) >= 100, 60, "the first jobs to run")
        ballast = fill(small_disk)
        wait_for(lambda: "no room left to write" in worker.text(), 30, "the worker to say the disk is full")
        time.sleep(3.0)  # the disk stays full for a while: writes fail again and again
        stalled = len(runs(tmp_path / "runs.txt"))
        ballast.unlink()
        freed = time.monotonic()
        wait_for(lambda: all(h.status() == "completed" for h in handles), 120, "every job to complete", interval=0.2)
        recovered = time.monotonic() - freed
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        worker.close()
        rt.app.close()
    events = runs(tmp_path / "runs.txt")
    assert not repeated(events, "run"), "a job ran twice"
    assert len(events) == 1500
    log = worker.text()
    assert "refuses to store" not in log and "OutcomeRefused" not in log, log[-3000:]
    assert "available again" in log
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        states = conn.execute(sa.text("SELECT state, error_type, count(*) FROM jobqueue_archive GROUP BY 1, 2")).all()
    engine.dispose()
    assert states == [("COMPLETED", None, 1500)]
    REPORTS.append(
        f"full disk[sqlite]: {stalled} of 1500 jobs run when it filled; all completed once, "
        f"{recovered:.1f} s after room was made"
    )


@only("postgresql")
def test_a_worker_writes_again_once_the_database_accepts_writes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database read-only while the worker starts (default_transaction_read_only, a standby
    before its promotion): each session keeps the setting it was opened with, and the worker,
    retrying on the same sessions, never ran a job after the setting was turned off."""
    from tests import servers

    url = servers.create_database("postgresql", str(tmp_path))
    name = sa.make_url(url).database
    admin = sa.create_engine(servers.POSTGRES_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", url)
    monkeypatch.setenv("JOBQUEUE_TEST_RUNS", str(tmp_path / "runs.txt"))
    rt.app.configure(database_url=url)
    worker = None
    try:
        rt.app.init_schema()
        job = rt.short.delay(0)
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'))
        rt.app.close()
        worker = Worker(tmp_path, "--concurrency", "1")
        wait_for(lambda: "accepts no writes" in worker.text(), 30, "the worker to find the database read-only")
        assert "refuses this login" not in worker.text(), worker.text()[-3000:]  # it was said to, too
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = off'))
        wait_for(lambda: job.status() == "completed", 30, "the job to run once the database takes writes")
        assert worker.process.poll() is None, worker.text()[-3000:]
    finally:
        if worker is not None:
            worker.close()
        rt.app.close()
        admin.dispose()
        servers.drop_database("postgresql", url)
