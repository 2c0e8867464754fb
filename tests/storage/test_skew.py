"""A worker host whose clock is off from the database server's.

Lease times are the server's (on SQLite, whose server is the host itself, there is one clock);
everything a host decides from them must count them on the same clock. The host's clock is
shifted as tests.apps.skewed shifts it: every time jobqueue reads from the host's clock comes from
``jobqueue.clock``'s epoch.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue, Task
from jobqueue.retry import ConstantRetryStrategy
from jobqueue.testing import drain


def skew_host_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make this host's clock run ``seconds`` ahead of the database server's (behind if negative)."""
    import jobqueue.clock

    monkeypatch.setattr("jobqueue.clock._EPOCH", jobqueue.clock._EPOCH + timedelta(seconds=seconds))


def archived(app: JobQueue, job_id: int) -> tuple[str, int]:
    a = app.tables.archive
    with app.engine.connect() as conn:
        state, attempts = conn.execute(sa.select(a.c.state, a.c.attempts_count).where(a.c.id == job_id)).one()
    return state, attempts


def flaky_task(app: JobQueue, max_attempts: int) -> Task:
    """A task that always fails, with ten minutes of retries allowed."""

    @app.task(
        name="t.flaky",
        retry_strategy=ConstantRetryStrategy(delay_seconds=0, max_attempts=max_attempts, max_total_delay_seconds=600),
    )
    def flaky() -> None:
        raise ConnectionError("down")

    return flaky


@pytest.mark.parametrize("skew", [3600, -3600, 0])
def test_a_host_clock_off_by_an_hour_spends_no_retry_budget(
    app: JobQueue, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """Ten minutes of retries allowed, none used: a job that fails at once gets all its attempts,
    whether the worker's clock runs an hour ahead of the server's or an hour behind."""

    flaky = flaky_task(app, max_attempts=4)
    skew_host_clock(monkeypatch, skew)
    job = flaky.delay()
    drain(app)
    assert archived(app, job.id) == ("FAILED", 4)


@pytest.mark.parametrize("skew", [-3600, 3600, 0])
def test_a_host_clock_off_by_an_hour_gets_no_retry_budget_more(
    app: JobQueue, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """A job whose first attempt was 20 minutes ago by the server's clock has spent its ten minutes
    of retries: its next failure is final, also on a worker whose clock runs an hour behind."""

    flaky = flaky_task(app, max_attempts=10)
    skew_host_clock(monkeypatch, skew)
    job = flaky.delay()
    drain(app, max_jobs=1)  # attempt 1: RETRYABLE, due at once
    m = app.tables.message
    with app.engine.begin() as conn:
        first = conn.execute(sa.select(m.c.first_attempt_at).where(m.c.id == job.id)).scalar_one()
        conn.execute(sa.update(m).where(m.c.id == job.id).values(first_attempt_at=first - timedelta(minutes=20)))
    drain(app, max_jobs=1)
    assert archived(app, job.id) == ("FAILED", 2)
