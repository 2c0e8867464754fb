"""A Spark standalone cluster for the tests: a master and one worker started from the scripts
pyspark ships, bound to 127.0.0.1 on free ports, with their logs and work files in a folder of
their own. Its executors are JVMs (and Python workers) of their own, started by the worker in its
working folder: what they need must come through the job, not from the test process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.servers import free_port

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def spark_class() -> str:
    """The ``spark-class`` script of the installed pyspark."""
    import pyspark

    script = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not script.exists():
        raise RuntimeError(f"{script} not found: this pyspark does not ship the standalone cluster's scripts")
    return str(script)


class StandaloneCluster:
    """A master and one worker (2 cores, 1 GiB) on 127.0.0.1; ``start``, then ``url``, then ``stop``."""

    def __init__(self, directory: Path, env: dict[str, str] | None = None) -> None:
        self.dir = directory
        self._choose_ports()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        for name in ("conf", "local", "work"):
            (directory / name).mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            **(env or {}),
            "SPARK_LOCAL_IP": "127.0.0.1",  # every listening socket, the web UIs' too
            "SPARK_CONF_DIR": str(directory / "conf"),  # empty: no spark-env.sh or defaults of this machine
            "SPARK_LOCAL_DIRS": str(directory / "local"),
            # No REST submission server: it would listen on a fixed port (6066) that two test runs share.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,  # so that executors import this jobqueue
        }

    def _choose_ports(self) -> None:
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.web_port = free_port()

    def start(self, timeout: float = 180, attempts: int = 2) -> None:
        """Start the master and the worker; return once the worker has registered. A failed start
        stops what started and tries again on other ports (a port found free may be taken by the
        time the JVM binds it); after ``attempts`` failures raise RuntimeError with the end of
        every attempt's logs."""
        failures = []
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(timeout)
                return
            except Exception as exc:
                failures.append(f"attempt {attempt} (master {self.url}, web UI port {self.web_port}): {exc}")
                self._choose_ports()
        raise RuntimeError("\n".join(failures))

    def _start_once(self, timeout: float) -> None:
        script = spark_class()
        try:
            self._spawn("master", [script, MASTER, "--host", "127.0.0.1", "--port", str(self.port)], self.web_port)
            self._spawn(
                "worker",
                [script, WORKER, self.url, "--host", "127.0.0.1", "--cores", "2", "--memory", "1g"]
                + ["--work-dir", str(self.dir / "work")],
                free_port(),
            )
            self._wait_for_worker(timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, command: list[str], web_port: int) -> None:
        with open(self.dir / f"{name}.log", "wb") as log:  # the child has its own copy of the file
            # A session of its own: stop() finds and ends every process started from it.
            self.processes[name] = subprocess.Popen(
                [*command, "--webui-port", str(web_port)],
                env=self.env,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_for_worker(self, timeout: float) -> None:
        """Wait until the worker says it registered with our master, or the master's JSON page
        counts an alive worker. Whatever else answers on the web UI's port (nothing yet, a page
        that is not JSON) means not yet; the last answer goes in the error."""
        deadline = time.monotonic() + timeout
        answer = "nothing"
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited with code {process.returncode}\n{self.logs()}")
            if f"Successfully registered with master {self.url}" in self._log("worker"):
                return
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as response:
                    body = response.read()
                answer = repr(body[:200])
                if json.loads(body).get("aliveworkers", 0) >= 1:
                    return
            except OSError as exc:  # not listening yet
                answer = str(exc)
            except (ValueError, AttributeError):
                pass  # something answered, but not the master's JSON: ``answer`` holds what
            time.sleep(0.5)
        raise RuntimeError(
            f"no Spark worker registered with the master at {self.url} within {timeout:.0f} s "
            f"(its web UI on port {self.web_port} answered {answer})\n{self.logs()}"
        )

    def _log(self, name: str) -> str:
        try:
            return (self.dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def logs(self, lines: int = 30) -> str:
        """The last lines of each process's log, for an error message."""
        parts = []
        for name in self.processes:
            text = self._log(name).splitlines()
            parts.append(f"--- {name} log ({self.dir / name}.log), last lines:\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def members(self) -> dict[int, int]:
        """The running processes of the cluster (pid: process group): the master, the worker, its
        executors, and their Python daemons, which put themselves in process groups of their own
        but stay in the session each of ours leads. Zombies do not count: the container's first
        process may never reap the executors the worker started."""
        for process in self.processes.values():
            process.poll()  # reap our own children
        sessions = {process.pid for process in self.processes.values()}
        found = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[3]) in sessions and fields[0] != "Z":
                found[int(stat.parent.name)] = int(fields[2])
        return found

    def stop(self, timeout: float = 30) -> None:
        """End every process group of the cluster (SIGTERM, then SIGKILL for what is left) and wait
        until none of its processes runs."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in set(self.members().values()):
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + timeout
            while self.members() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.members():
                break
        self.processes.clear()
