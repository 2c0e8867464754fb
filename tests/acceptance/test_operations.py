"""What an operator sees: log lines at every level, JSON logs, signals, stale workers after a
supervisor is killed, health probes, and a Prometheus scrape after a worker process was killed."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.storage import jobs as job_queries
from tests import servers
from tests.acceptance.cli import jobqueue
from tests.apps import ops
from tests.conftest import only
from tests.runtime.harness import Worker, wait_for

OPS = "tests.apps.ops:app"


@pytest.fixture
def app(db_url: str) -> Iterator[JobQueue]:
    ops.app.configure(database_url=db_url)
    yield ops.app
    ops.app.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()


def archived(app: JobQueue) -> int:
    a = app.tables.archive
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(a)).scalar_one())


FORGED = "2026-01-01T00:00:00.000+00:00 INFO jobqueue-worker-1 jobqueue.worker: job 1 ops.ok completed"


def test_a_jobs_text_cannot_reorder_or_forge_log_lines(app: JobQueue) -> None:
    # A right-to-left override shows "\u202egnp.exe" as "exe.png"; a line break starts a line the
    # worker did not write; an escape sequence recolours the terminal.
    text = f"see \u202egnp.exe\u2066\n{FORGED}\r\x1b[2J"
    final = ops.fail_saying.delay(text)
    retried = ops.retry_saying.delay(text)
    for json_lines in (False, True):
        result = jobqueue(*(["--log-json"] if json_lines else []), "worker", "--burst", "-c", "1", app=OPS)
        assert not any(ch in result.stderr for ch in "\u202e\u2066\r\x1b"), result.stderr
        lines = result.stderr.splitlines()
        assert not any(line.startswith("2026-01-01") for line in lines), result.stderr
        # The escapes that `jobs show` writes: the text can still be read, and copied back.
        shown = [json.loads(line)["message"] for line in lines] if json_lines else lines
        assert any("see \\u202egnp.exe\\u2066\\n2026-01-01" in line for line in shown), result.stderr
        ops.retry_saying.delay(text)
    assert final.status() == "failed" and retried.status() == "retryable"


def test_failures_are_logged_at_error_with_traceback_whatever_the_level(app: JobQueue, tmp_path: Path) -> None:
    failing = ops.fail.delay(1)
    flaky = ops.flaky.delay(2)
    fine = ops.ok.delay(3)
    log = tmp_path / "signals.jsonl"
    result = jobqueue("-l", "warning", "worker", "--burst", "-c", "2", app=OPS, env={"OPS_SIGNAL_LOG": str(log)})
    lines = result.stderr.splitlines()
    error = next(i for i, line in enumerate(lines) if f"job {failing.id} ops.fail failed" in line)
    assert " ERROR jobqueue-worker-" in lines[error]
    assert lines[error + 1] == "Traceback (most recent call last):"
    assert "ValueError: job 1 fails" in "\n".join(lines[error:])
    retry = next(line for line in lines if f"job {flaky.id} ops.flaky failed on attempt 1" in line)
    assert " WARNING jobqueue-worker-" in retry and "retry at" in retry
    assert not any(" INFO " in line for line in lines)  # successes stay at INFO, below the level
    assert lines[0][:4].isdigit() and "+00:00 " in lines[0]  # UTC times, with their offset
    assert (failing.status(), flaky.status(), fine.status()) == ("failed", "completed", "completed")

    # The signals, from the worker processes that ran the jobs.
    events = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [(e["signal"], e["job_id"]) for e in events]
    for job in (failing, flaky, fine):
        assert ("job_started", job.id) in kinds
    assert ("job_failed", failing.id) in kinds and ("job_retrying", flaky.id) in kinds
    assert ("job_succeeded", flaky.id) in kinds and ("job_succeeded", fine.id) in kinds
    failed = next(e for e in events if e["signal"] == "job_failed")
    assert (failed["exception"], failed["traceback"], failed["task"]) == ("ValueError", True, "ops.fail")
    succeeded = next(e for e in events if e["signal"] == "job_succeeded" and e["job_id"] == fine.id)
    assert succeeded["result"] == 3
    inits = {e["process_name"] for e in events if e["signal"] == "worker_process_init"}
    shutdowns = {e["process_name"] for e in events if e["signal"] == "worker_process_shutdown"}
    assert inits == shutdowns == {"jobqueue-worker-0", "jobqueue-worker-1"}


def test_a_receiver_that_raises_changes_nothing(app: JobQueue) -> None:
    job = ops.complain.delay()
    result = jobqueue("worker", "--burst", "-c", "1", app=OPS)
    assert job.get(timeout=5) == "done"
    assert "a receiver of job_succeeded raised" in result.stderr and "RuntimeError" in result.stderr


def test_log_json_lines_carry_the_job_fields(app: JobQueue) -> None:
    failing = ops.fail.delay(1)
    fine = ops.ok.delay(2)
    result = jobqueue("--log-json", "worker", "--burst", "-c", "2", app=OPS)
    entries = [json.loads(line) for line in result.stderr.splitlines()]  # every line is one JSON object
    assert all(e["time"].endswith("+00:00") for e in entries)
    by_job = {e.get("job_id"): e for e in entries if "job_id" in e}
    failure, success = by_job[failing.id], by_job[fine.id]
    assert (failure["level"], failure["task"], failure["outcome"], failure["attempt"]) == (
        "ERROR",
        "ops.fail",
        "failed",
        1,
    )
    assert failure["queue"] == "default" and "ValueError: job 1 fails" in failure["traceback"]
    assert (success["level"], success["outcome"]) == ("INFO", "completed")
    assert success["duration_seconds"] >= 0
    assert failure["process"].startswith("jobqueue-worker-") and success["process"].startswith("jobqueue-worker-")
    assert any(e["process"] == "jobqueue-supervisor" for e in entries)


def test_a_killed_supervisor_is_reported_stale(app: JobQueue, workers: list[Worker], tmp_path: Path) -> None:
    worker = Worker(tmp_path, "-c", "2", app=OPS)
    workers.append(worker)

    def live() -> list[dict]:
        return [w for w in json.loads(jobqueue("workers", "--json", app=OPS).stdout) if w["status"] != "stale"]

    wait_for(lambda: len(live()) == 2, 30, "two live worker processes")
    healthy = jobqueue("health", "--json", app=OPS)
    assert json.loads(healthy.stdout)["healthy"] is True
    assert jobqueue("health", "--this-host", app=OPS).returncode == 0
    rows = json.loads(jobqueue("workers", "--json", app=OPS).stdout)
    assert {r["status"] for r in rows} == {"idle"} and all(r["heartbeat_age_seconds"] < 3 for r in rows)

    os.kill(worker.pid, signal.SIGKILL)  # its worker processes die with it
    # The lease is 3 s: three heartbeats missed, and the rows are stale.
    wait_for(lambda: not live(), 10, "the killed supervisor's processes to be reported stale")
    rows = json.loads(jobqueue("workers", "--json", app=OPS).stdout)
    assert len(rows) == 2 and all(r["stale"] and r["heartbeat_age_seconds"] > 3 for r in rows)
    probe = jobqueue("health", app=OPS, check=False)
    assert probe.returncode == 1 and "FAIL workers: no worker process has a heartbeat under 3 s old" in probe.stdout
    assert jobqueue("health", "--no-workers", app=OPS).returncode == 0  # database and schema are fine
    status = json.loads(jobqueue("status", "--json", app=OPS).stdout)
    assert (status["workers"], status["stale_workers"]) == (0, 2)
    pruned = json.loads(jobqueue("workers", "--prune", "--json", app=OPS).stdout)
    assert pruned["pruned"] == 2
    assert json.loads(jobqueue("workers", "--json", app=OPS).stdout) == []


def test_status_splits_the_states(app: JobQueue) -> None:
    ops.ok.delay(1)
    ops.ok.apply_async((2,), countdown=3600)
    ops.fail.delay(3)
    ops.flaky.delay(4)
    jobqueue("worker", "--burst", "-c", "1", "-Q", "default", app=OPS)  # the retry is due at once
    ops.ok.delay(5)
    ops.ok.delay(6)
    later = ops.ok.delay(7)
    with app.engine.begin() as conn:  # as if its first attempt failed and the next is an hour away
        m = app.tables.message
        conn.execute(
            sa.update(m)
            .where(m.c.id == later.id)
            .values(state="RETRYABLE", next_attempt_at=utcnow() + timedelta(hours=1))
        )
    data = json.loads(jobqueue("status", "--json", app=OPS).stdout)
    (queue,) = data["queues"]
    assert (queue["ready"], queue["scheduled"], queue["retrying"], queue["failed"], queue["processing"]) == (
        2,
        1,
        1,
        1,
        0,
    )
    assert queue["oldest_ready_seconds"] >= 0
    assert data["archive"] == {"cancelled": 0, "completed": 2, "failed": 1}  # every final state, even at 0
    text = jobqueue("status", app=OPS).stdout
    assert "READY" in text and "SCHEDULED" in text and "RETRYING" in text


def test_prometheus_scrape_counts_a_run_with_a_killed_worker_process(
    app: JobQueue, workers: list[Worker], tmp_path: Path
) -> None:
    port = servers.free_port()
    blocker = ops.block.delay()
    worker = Worker(
        tmp_path,
        "-c",
        "2",
        "--fetch-batch-size",
        "5",
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        app=OPS,
    )
    workers.append(worker)

    def running_blocker():
        rows = job_queries.worker_rows(app.store, 3)
        return next((r["pid"] for r in rows if r["running_job_id"] == blocker.id), None)

    pid = wait_for(running_blocker, 30, "a worker process to run the blocking job")
    ops.ok.bulk([(i,) for i in range(79)])
    ops.fail.bulk([(i,) for i in range(10)])
    ops.flaky.bulk([(i,) for i in range(10)])
    wait_for(lambda: archived(app) == 99, 60, "the 99 other jobs to finish")
    os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]  # the supervisor returns the blocking job and forks a replacement
    wait_for(lambda: archived(app) == 100, 60, "the blocking job to run again and complete")
    assert blocker.get(timeout=5) == "unblocked"

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def outcomes(metrics: dict, task: str, outcome: str):
        labels = (("outcome", outcome), ("queue", "default"), ("task", task))
        return metrics.get(("jobqueue_jobs_total", labels), 0.0)

    metrics: dict = wait_for(  # type: ignore[assignment]
        lambda: (m := scrape()) and outcomes(m, "ops.block", "completed") == 1 and m, 10, "the scrape"
    )
    assert outcomes(metrics, "ops.ok", "completed") == 79
    assert outcomes(metrics, "ops.fail", "failed") == 10
    assert outcomes(metrics, "ops.flaky", "retrying") == 10
    assert outcomes(metrics, "ops.flaky", "completed") == 10
    assert metrics[("jobqueue_child_restarts_total", (("cause", "killed"),))] == 1
    assert metrics[("jobqueue_job_duration_seconds_count", (("task", "ops.ok"),))] == 79
    assert metrics[("jobqueue_queue_depth", (("queue", "default"), ("state", "failed")))] == 10
    assert metrics[("jobqueue_queue_depth", (("queue", "default"), ("state", "ready")))] == 0
    processes = [metrics[("jobqueue_worker_processes", (("state", state),))] for state in ("busy", "idle")]
    assert sum(processes) == 2  # the replacement included


@only("sqlite")  # the other databases refuse text that is no time
def test_a_worker_row_whose_heartbeat_cannot_be_read_is_listed_as_stale(app: JobQueue) -> None:
    """A worker row edited by hand must not take down `workers`, `status` or the dashboard: a
    heartbeat that cannot be read proves no process alive."""
    from jobqueue.dashboard import create_app

    w = app.tables.worker
    garbage: sa.ColumnElement[str] = sa.literal_column("'garbage'")
    with app.engine.begin() as conn:
        conn.execute(
            sa.insert(w).values(
                id="w1", supervisor_id="s1", hostname="h1", pid=1, started_at=garbage, heartbeat_at=garbage
            )
        )
    for command in (("workers",), ("status",), ("workers", "--json")):
        shown = jobqueue(*command, check=False)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, (command, shown.stderr[-2000:])
    (row,) = json.loads(jobqueue("workers", "--json").stdout)
    assert (row["status"], row["heartbeat_age_seconds"], row["started_at"]) == (
        "stale",
        None,
        "<unreadable: 'garbage'>",
    )
    assert "live worker processes: 0 (1 stale" in jobqueue("status").stdout
    assert create_app(app).test_client().get("/").status_code == 200
