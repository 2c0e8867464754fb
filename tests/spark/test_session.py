"""get_session and the standalone cluster the Spark tests run on."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from jobqueue.errors import ConfigurationError
from tests.acceptance.cli import jobqueue
from tests.conftest import only
from tests.spark.cluster import StandaloneCluster


def test_get_session_gives_the_running_session_and_refuses_another_master(spark: Any, master: str) -> None:
    from jobqueue.spark import get_session

    assert get_session() is spark and get_session(master) is spark
    assert spark.sparkContext.master == master
    # Spark runs one session per process: a session on another master is not handed out in its place.
    refused = rf"a SparkSession on {re.escape(master)} is active .* one on local\[1\]"
    with pytest.raises(ConfigurationError, match=refused):
        get_session("local[1]")


@pytest.mark.parametrize("master", ["cluster"], indirect=True)
def test_the_cluster_runs_apart_and_listens_on_loopback_only(
    spark: Any, master: str, spark_cluster: StandaloneCluster
) -> None:
    # Tasks run in the cluster's processes (the executor's Python workers).
    pids = spark.sparkContext.parallelize(range(4), 2).map(lambda _: os.getpid()).collect()
    processes = set(spark_cluster.members())
    assert set(pids) <= processes
    driver = spark.sparkContext._gateway.proc.pid  # this process's JVM, which the executors call back
    addresses = listening({*processes, driver})
    assert len(addresses) >= 5, addresses  # master and worker, their web UIs, the executor, the driver
    assert {address for address, _ in addresses} == {"127.0.0.1"}, addresses


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """The (address, port) of every TCP socket these processes listen on; IPv4-mapped IPv6 addresses as IPv4."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                found.add((_address(local.split(":")[0]), int(local.split(":")[1], 16)))
    return found


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp or tcp6 (32-bit words in host byte order) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 16 and words[:12] == b"\0" * 10 + b"\xff\xff":
        words = words[12:]
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    return ":".join(words[i : i + 2].hex() for i in range(0, 16, 2))


@only("sqlite")
@pytest.mark.parametrize(
    "args, fragment",
    [
        (("report", "--out", "{tmp}/missing/report.html"), "directory {tmp}/missing does not exist"),
        (("report", "--out", "{tmp}/report.html", "--master", "bogus://x"), "cannot start Spark on bogus://x"),
        (("archive", "export", "--to", "{tmp}/out", "--master", "yarm"), "cannot start Spark on yarm"),
    ],
)
def test_a_bad_out_path_or_master_is_one_line_before_spark_starts(
    db_url: str, tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    result = jobqueue(*[arg.format(tmp=tmp_path) for arg in args], check=False, timeout=120)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and fragment.format(tmp=tmp_path) in errors[0], result.stderr
    assert "Traceback" not in result.stderr and "starting Spark" not in result.stderr, result.stderr


@only("sqlite")
@pytest.mark.parametrize(
    "command", [("report", "--out", "{tmp}/report.html"), ("archive", "export", "--to", "{tmp}/out")]
)
def test_a_database_without_the_tables_is_one_line_before_spark_starts(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Spark started (seconds, a JVM) before the database was read at all."""
    (tmp_path / "empty.sqlite3").touch()  # a database, empty
    url = f"sqlite:///{tmp_path}/empty.sqlite3"
    result = jobqueue("--database-url", url, *[arg.format(tmp=tmp_path) for arg in command], check=False)
    assert result.returncode == 1 and "tables (jobqueue_*) do not exist" in result.stderr, result.stderr
    assert "starting Spark" not in result.stderr and "Traceback" not in result.stderr, result.stderr


@only("sqlite")
def test_a_report_that_cannot_be_written_is_refused_before_spark_starts(db_url: str) -> None:
    """A directory that exists but takes no file (here /proc): a traceback, after Spark had
    computed the whole report."""
    result = jobqueue("report", "--since", "all", "--out", "/proc/report.html", check=False)
    assert result.returncode == 2 and "Invalid value for --out: cannot write /proc/report.html" in result.stderr
    assert "starting Spark" not in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    "url, said",
    [
        ("sqlite:////tmp/queue.sqlite3\n", "ends with '\\n'"),
        ("", "the database URL given is blank"),
        ("postgresql://u:pw@h:notaport/db", "cannot parse database URL"),
    ],
)
def test_the_pipelines_database_url_is_checked_as_everywhere_else(url: str, said: str) -> None:
    """The Spark entry points read the URL themselves: a line break at its end became %0A and
    "no SQLite database", a blank one SQLAlchemy's ArgumentError, a bad port a bare ValueError."""
    from jobqueue.spark.enqueue import executor_url

    with pytest.raises(ConfigurationError, match=re.escape(said)):
        executor_url(url)
