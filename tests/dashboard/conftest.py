"""Fixtures of the dashboard tests: a few tasks on the test's app, and the dashboard of that app."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from flask.testing import FlaskClient

from jobqueue import JobQueue
from jobqueue.dashboard import create_app
from jobqueue.retry import NoRetryStrategy

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def tasks(app: JobQueue) -> SimpleNamespace:
    """``t.add``, ``t.fail`` (always raises ValueError) and ``t.flaky`` (fails on its first run only)."""
    runs: list[int] = []

    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="t.fail", retry_strategy=NoRetryStrategy())
    def fail(message: str) -> None:
        raise ValueError(message)

    @app.task(name="t.flaky", retry_strategy=NoRetryStrategy())
    def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("first run fails")
        return "second run works"

    return SimpleNamespace(add=add, fail=fail, flaky=flaky)


@pytest.fixture
def client(app: JobQueue) -> FlaskClient:
    """A test client of the dashboard without a token (so addressed to localhost), two failed jobs a page."""
    return create_app(app, page_size=2).test_client()


def csrf_of(html: str) -> str:
    """The CSRF token the page's forms carry."""
    found = CSRF.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)
