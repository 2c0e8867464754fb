"""Fixtures of the storage tests."""

from __future__ import annotations

import pytest

from jobqueue import JobQueue


@pytest.fixture
def add(app: JobQueue):
    """A task ``t.add(x, y)`` registered on ``app``."""

    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    return add
