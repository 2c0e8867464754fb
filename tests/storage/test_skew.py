"""A worker host whose clock is off from the database server's.

Lease times are the server's (on SQLite, whose server is the host itself, there is one clock);
everything a host decides from them must count them on the same clock. The host's clock is
shifted as tests.apps.skewed shifts it: every time jobqueue reads from the host's clock comes from
``jobqueue.clock``'s epoch.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue, Task
from jobqueue.retry import ConstantRetryStrategy
from jobqueue.testing import drain
from tests.conftest import only


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


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process measures its clock's offset again before its next enqueue, from no correction."""
    import jobqueue.clock

    monkeypatch.setattr(jobqueue.clock, "_offset", 0.0)
    monkeypatch.setattr(jobqueue.clock, "_base", None)
    monkeypatch.setattr(jobqueue.clock, "_next_check", 0.0)


@pytest.fixture
def plain(app: JobQueue) -> Task:
    """A task that does nothing."""

    @app.task(name="t.plain")
    def plain() -> None: ...

    return plain


def due_at(app: JobQueue, job_id: int) -> datetime:
    m = app.tables.message
    with app.engine.connect() as conn:
        due: datetime = conn.execute(sa.select(m.c.next_attempt_at).where(m.c.id == job_id)).scalar_one()
    return due


def due_in(app: JobQueue, job_id: int) -> float:
    """Seconds from the database server's now to the job's due time."""
    with app.engine.connect() as conn:
        server = app.store.database_now(conn)
    return (due_at(app, job_id) - server).total_seconds()


@only("postgresql", "mysql")
@pytest.mark.parametrize("skew", [3600, -3600, -30])
def test_a_host_clock_off_by_an_hour_enqueues_jobs_due_by_the_servers_clock(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None, skew: float
) -> None:
    """A job enqueued now is due now and one with a countdown of a minute is due in a minute, by the
    server's clock, whatever the enqueuing host's clock says: ahead, it would wait an hour; behind,
    it would jump the queue by an hour and run its countdown early."""
    skew_host_clock(monkeypatch, skew)
    # The first enqueue measures the clock: its countdown counts from the corrected clock too.
    assert abs(due_in(app, plain.apply_async(countdown=60).id) - 60) < 5
    assert abs(due_in(app, plain.delay().id)) < 5
    assert abs(due_in(app, plain.bulk([(), ()])[1].id)) < 5


@only("postgresql", "mysql")
@pytest.mark.parametrize("step", [90.0, -90.0])
def test_a_host_clock_set_after_a_reading_moves_no_due_time(
    app: JobQueue,
    plain: Task,
    monkeypatch: pytest.MonkeyPatch,
    measured: None,
    caplog: pytest.LogCaptureFixture,
    step: float,
) -> None:
    """The host's clock set forward or back (NTP stepping it, `date -s`) after the server's was read:
    jobs enqueued before the next reading, a minute later, are still due by the server's clock. They
    were due 90 s late, or 90 s early (a countdown of a minute already past)."""
    import jobqueue.clock

    real, shift = time.time, [0.0]

    def host_clock() -> float:
        return real() + shift[0]

    monkeypatch.setattr(time, "time", host_clock)
    monkeypatch.setattr(jobqueue.clock, "_REAL_TIME", (host_clock,))  # taken for the interpreter's own
    for _ in range(3):  # the reading (one too slow to use, on a loaded machine, is taken again)
        monkeypatch.setattr(jobqueue.clock, "_next_check", 0.0)
        assert abs(due_in(app, plain.apply_async(countdown=60).id) - 60) < 5
        if jobqueue.clock.shared() is not None:
            break
    assert jobqueue.clock.shared() is not None, "no reading of the server's clock could be used"
    shift[0] = step
    assert abs(due_in(app, plain.apply_async(countdown=60).id) - 60) < 5
    assert abs(due_in(app, plain.delay().id)) < 5
    monkeypatch.setattr(jobqueue.clock, "_next_check", 0.0)  # the next reading says so, and corrects by it
    with caplog.at_level("WARNING", logger="jobqueue"):
        assert abs(due_in(app, plain.delay().id)) < 5
    assert f"this host's clock was set 90.0 s {'forward' if step > 0 else 'back'} since" in caplog.text
    assert abs(jobqueue.clock.correction() + step) < 1


@only("postgresql", "mysql")
def test_enqueues_on_the_engines_own_only_connection_are_due_by_the_servers_clock(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None
) -> None:
    """An application that enqueues in transactions of jobqueue's engine (its only open
    connection, given to each enqueue): the clock was never read, since no connection of the pool
    was free, and every job was due an hour late by the server's clock."""
    import jobqueue.clock

    skew_host_clock(monkeypatch, 3600)
    app.engine.dispose()  # no connection open yet
    for _ in range(2):
        due = []
        for _ in range(3):  # a reading too slow to use (a loaded machine) is taken again 5 s later: at once here
            monkeypatch.setattr(jobqueue.clock, "_next_check", 0.0)
            with app.engine.begin() as conn:
                handle = plain.apply_async(countdown=60, connection=conn)
            due.append(due_in(app, handle.id))
            if abs(due[-1] - 60) < 5:
                break
        assert abs(due[-1] - 60) < 5, due


@only("postgresql", "mysql")
def test_a_bulk_countdown_counts_from_the_corrected_clock(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None
) -> None:
    skew_host_clock(monkeypatch, 3600)
    assert abs(due_in(app, plain.bulk([(), ()], countdown=60)[1].id) - 60) < 5


@only("postgresql", "mysql")
def test_a_host_clock_within_a_second_of_the_servers_is_left_as_it_is(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None
) -> None:
    """Half a second off: not corrected (the reading's own noise is of that order on a busy network)."""
    import jobqueue.clock

    skew_host_clock(monkeypatch, 0.5)
    plain.delay()
    assert jobqueue.clock.correction() == 0.0
    skew_host_clock(monkeypatch, 5)
    monkeypatch.setattr(jobqueue.clock, "_next_check", 0.0)
    plain.delay()
    assert -6.0 < jobqueue.clock.correction() < -5.0


@only("postgresql", "mysql")
def test_a_frozen_clock_is_taken_as_it_is(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None
) -> None:
    """A test that freezes time (freezegun) decides what now is: no correction towards the server's."""
    from freezegun import freeze_time

    import jobqueue.clock

    with freeze_time("2030-01-02 03:04:05"):
        job = plain.delay()
    assert due_at(app, job.id) == datetime(2030, 1, 2, 3, 4, 5)
    assert jobqueue.clock.correction() == 0.0
    # The clock back (freezegun froze the monotonic clock too): measured again, at the next enqueue.
    skew_host_clock(monkeypatch, 3600)
    assert abs(due_in(app, plain.delay().id)) < 5


@only("postgresql", "mysql")
def test_a_frozen_clock_gets_no_correction_measured_before(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None
) -> None:
    from freezegun import freeze_time

    import jobqueue.clock

    skew_host_clock(monkeypatch, 3600)
    plain.delay()
    assert jobqueue.clock.correction() < -3500  # this host is an hour ahead
    monkeypatch.setattr(jobqueue.clock, "_EPOCH", datetime(1970, 1, 1))  # its clock now the frozen one
    with freeze_time("2030-01-02 03:04:05"):
        job = plain.delay()
    assert due_at(app, job.id) == datetime(2030, 1, 2, 3, 4, 5)


@only("postgresql", "mysql")
def test_an_enqueue_waits_for_no_connection_to_read_the_servers_clock(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None
) -> None:
    """Every connection of the pool held by the application (one given to the enqueue): the clock
    is read later, not after waiting for the pool's timeout."""
    pool = app.engine.pool
    assert isinstance(pool, sa.pool.QueuePool)
    held = [app.engine.connect() for _ in range(pool.size() + pool._max_overflow)]
    try:
        started = time.monotonic()
        plain.apply_async(connection=held[0])
        assert time.monotonic() - started < 5
        held[0].commit()
    finally:
        for conn in held:
            conn.close()
    assert plain.delay().status() == "pending"


@only("postgresql", "mysql")
def test_an_enqueue_goes_on_when_the_servers_clock_cannot_be_read(
    app: JobQueue, plain: Task, monkeypatch: pytest.MonkeyPatch, measured: None
) -> None:
    """Reading the server's clock is a side step: its failure leaves the host's clock as it was."""

    def fail() -> float | None:
        raise sa.exc.OperationalError("SELECT now()", {}, Exception("connection refused"))

    monkeypatch.setattr(app.store, "measure_clock", fail)
    skew_host_clock(monkeypatch, 3600)
    job = plain.delay()
    assert 3590 < due_in(app, job.id) < 3610  # the host's clock, as it says
