"""Fixtures of the runtime tests: the runtime app on the test database, and workers stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobqueue import JobQueue
from tests.apps import runtime as rt
from tests.runtime.harness import Worker


@pytest.fixture
def app(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobQueue]:
    """The runtime tests' app on the test database; jobs record their runs in tmp_path/runs.txt."""
    rt.app.configure(database_url=db_url)
    monkeypatch.setenv("JOBQUEUE_TEST_RUNS", str(tmp_path / "runs.txt"))
    yield rt.app
    rt.app.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    """Workers a test starts (harness.start); any still running at the end are killed."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()
