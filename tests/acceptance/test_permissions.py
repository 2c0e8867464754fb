"""A SQLite database the user may not write: a worker refuses to start with one line naming the file
and the fix; an enqueue says the same; nothing is lost.

As root the commands run without the capabilities that bypass file permissions (setpriv), so that
a file mode 444 or a directory mode 555 stops them as it stops any other user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobqueue.errors import ConfigurationError
from tests.acceptance.cli import APP, ROOT, jobqueue
from tests.apps import basic

AS_A_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []


def run_as_a_user(*args: str) -> subprocess.CompletedProcess[str]:
    command = [*AS_A_USER, sys.executable, *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


def cli_as_a_user(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_as_a_user("-m", "jobqueue", "--app", APP, "--database-url", url, *args)


@pytest.fixture(params=["file", "directory"])
def read_only(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    """A database with one job, its file (mode 444) or its directory (mode 555) read-only:
    the URL, the file, the job's id."""
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "queue.sqlite3"
    url = f"sqlite:///{path}"
    basic.app.configure(database_url=url)
    try:
        basic.app.init_schema()
        job_id = basic.add.delay(1, 2).id
    finally:
        basic.app.close()
    assert not list(folder.glob("*-wal")), "the journal outlived the last connection"
    locked = path if request.param == "file" else folder
    locked.chmod(0o444 if request.param == "file" else 0o555)
    try:
        yield url, path, job_id
    finally:
        locked.chmod(0o644 if request.param == "file" else 0o755)


def test_a_worker_on_a_database_it_may_not_write_refuses_to_start_naming_the_file_and_the_fix(
    read_only: tuple[str, Path, int],
) -> None:
    """Its worker processes crash-looped, a traceback a second."""
    url, path, job_id = read_only
    result = cli_as_a_user(url, "worker", "--burst", "-c", "1")
    said = result.stderr
    assert result.returncode == 1, said[-3000:]
    assert f"cannot write the SQLite database {path}" in said, said[-3000:]
    assert f"write permission on the file and on its directory {path.parent}" in said, said[-3000:]
    assert "Traceback" not in said and "started worker process" not in said, said[-3000:]
    assert len([line for line in said.splitlines() if "cannot write" in line]) == 1

    # Enqueueing says the same, as the CLI and as delay() (a ConfigurationError), and adds nothing.
    enqueued = cli_as_a_user(url, "enqueue", "basic.add", "--args", "[3, 4]")
    assert enqueued.returncode == 1, enqueued.stderr[-3000:]
    assert f"cannot write the SQLite database {path}" in enqueued.stderr and "Traceback" not in enqueued.stderr
    delay = f"from tests.apps import basic; basic.app.configure(database_url={url!r}); basic.add.delay(3, 4)"
    delayed = run_as_a_user("-c", delay)
    assert "jobqueue.errors.ConfigurationError: cannot write the SQLite database" in delayed.stderr, delayed.stderr


def test_nothing_is_lost_once_the_permissions_are_given(read_only: tuple[str, Path, int]) -> None:
    url, path, job_id = read_only
    refused = cli_as_a_user(url, "worker", "--burst", "-c", "1")
    assert refused.returncode == 1
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)
    ran = cli_as_a_user(url, "worker", "--burst", "-c", "1")
    assert ran.returncode == 0, ran.stderr[-3000:]
    basic.app.configure(database_url=url)
    try:
        assert basic.app.job(job_id).get(timeout=5) == 3
    finally:
        basic.app.close()
    assert jobqueue("--database-url", url, "status").returncode == 0


def _damaged(path: Path) -> None:
    """A database cut short, as a copy taken mid-write or a failing disk leaves it."""
    basic.app.configure(database_url=f"sqlite:///{path}")
    try:
        basic.app.init_schema()
        basic.add.bulk([(n, n) for n in range(2000)])
    finally:
        basic.app.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda path: path.mkdir(), "the SQLite database path {path} is a directory: fix the path in the URL"),
        (lambda path: path.write_bytes(os.urandom(8192)), "{path} is not a SQLite database"),
        (_damaged, "the SQLite database {path} is damaged (its disk image is malformed): restore it from a backup"),
    ],
    ids=["directory", "not-a-database", "damaged"],
)
def test_a_path_that_holds_no_usable_database_is_one_line_naming_the_fix_everywhere(
    tmp_path: Path, make: Any, said: str
) -> None:
    """A directory left the worker retrying "unable to open database file" for ever; a file of
    another kind or a damaged database printed the driver's words, naming no fix, and delay()
    raised the driver's error."""
    path = tmp_path / "queue.sqlite3"
    make(path)
    url = f"sqlite:///{path}"
    expected = said.format(path=path)
    for command in (("worker", "--burst", "-c", "1"), ("enqueue", "basic.add", "--args", "[1, 2]"), ("health",)):
        result = jobqueue("--database-url", url, *command, check=False, timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert expected in result.stdout + result.stderr, (command, result.stdout, result.stderr[-3000:])
    basic.app.configure(database_url=url)
    try:
        with pytest.raises(ConfigurationError) as raised:
            basic.add.delay(1, 2)
        assert expected in str(raised.value)
    finally:
        basic.app.close()


def test_a_database_on_a_file_system_mounted_read_only_names_the_mount(tmp_path: Path) -> None:
    """The user was told to give itself write permission on the file, or to run as its owner:
    neither helps on a read-only mount."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8M", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        if os.environ.get("JOBQUEUE_TEST_REQUIRE_ALL"):
            pytest.fail(f"cannot mount a file system: {mounted.stderr!r}")
        pytest.skip(f"cannot mount a file system: {mounted.stderr!r}")
    try:
        url = f"sqlite:///{disk}/queue.sqlite3"
        basic.app.configure(database_url=url)
        basic.app.init_schema()
        basic.app.close()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        for command in (("worker", "--burst", "-c", "1"), ("enqueue", "basic.add", "--args", "[1, 2]")):
            result = jobqueue("--database-url", url, *command, check=False, timeout=60)
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
            assert "its file system is mounted read-only. Remount it read-write" in result.stderr, result.stderr
    finally:
        basic.app.close()
        subprocess.run(["umount", "-l", str(disk)], check=False)
