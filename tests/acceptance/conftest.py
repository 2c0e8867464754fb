from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobqueue import JobQueue
from tests.apps import basic


@pytest.fixture
def app(db_url: str) -> Iterator[JobQueue]:
    """The acceptance app (tests/apps/basic.py), pointed at this test's database."""
    basic.app.configure(database_url=db_url)
    yield basic.app
    basic.app.close()
