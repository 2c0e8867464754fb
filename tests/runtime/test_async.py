"""``async def`` tasks under a real worker: results, retries, the soft time limit (the hard one is
tested with the sync one's, in test_runtime.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobqueue import JobFailed, JobQueue
from tests.apps import runtime as rt
from tests.runtime.harness import Worker, runs, start
from tests.runtime.test_runtime import table_rows


def test_async_tasks_run_with_their_context_on_each_process(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    handles = rt.async_ok.bulk([(i,) for i in range(40)])
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    results = [h.get(timeout=5) for h in handles]
    assert [r["value"] for r in results] == [2 * i for i in range(40)]
    assert all(r["attempt"] == 1 and r["same"] for r in results)  # bind=True and current_job() agree
    loops = {(r["pid"], r["loop"]) for r in results}
    assert len(loops) == len({r["pid"] for r in results})  # one loop per process, reused for its jobs


def test_an_async_task_that_raises_after_awaiting_is_retried_then_failed(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    job = rt.async_flaky.delay(0.05)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="async attempt 3 failed") as info:
        job.get(timeout=5)
    assert info.value.error_type == "RuntimeError"
    assert "async_flaky" in info.value.traceback and "raise RuntimeError" in info.value.traceback
    assert [event for event, _, _ in runs(tmp_path / "runs.txt")] == ["start"] * 3
    assert table_rows(app, "archive", "attempts_count", "state") == [(3, "FAILED")]
    log = worker.text()
    assert log.count("async attempt") >= 3 and "retry at" in log


def test_the_soft_timeout_cancels_an_async_task_at_its_await(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    job = rt.async_soft.apply_async(retry_strategy=rt.NO_RETRY)
    after = rt.async_ok.delay(21)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="soft time limit exceeded") as info:
        job.get(timeout=5)
    assert info.value.error_type == "jobqueue.errors.SoftTimeLimitExceeded"
    assert "CancelledError" in info.value.traceback  # where the job was waiting when it was cancelled
    assert [event for event, _, _ in runs(tmp_path / "runs.txt")][0] == "cancelled"
    assert after.get(timeout=5)["value"] == 42  # the loop is fine for the next job


def test_an_async_job_that_stops_the_loop_fails_and_never_resumes(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """It failed, and its coroutine, left pending, went on during the next async job: a failed job
    that kept running (and could run twice if retried)."""
    job = rt.stops_the_loop.delay()
    later = rt.async_ok.bulk([(i,) for i in range(3)])
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="Event loop stopped before Future completed"):
        job.get(timeout=5)
    assert [h.get(timeout=5)["value"] for h in later] == [0, 2, 4]
    events = [event for event, _, _ in runs(tmp_path / "runs.txt")]
    assert events.count("start") == 1 and "resumed" not in events, events
