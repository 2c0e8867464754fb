"""Flow rows that no rate could have written (a database clock set back, a row edited by hand),
on every database: they must not hold a key's jobs back for longer than its rate would."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.storage import waiting
from tests.conftest import only
from tests.storage.test_flow import take


@pytest.mark.parametrize("ahead", [timedelta(days=30), datetime(9999, 12, 31) - utcnow()])
def test_a_next_start_further_ahead_than_any_rate_allows_holds_nothing_back(app: JobQueue, ahead: timedelta) -> None:
    """A rate's next start is at most its interval ahead (one day at the slowest). One a month
    ahead, left by a database clock that was set back or by a hand edit, held the key's jobs for
    that month (--burst left them; status said "held by its rate until 00:00:00.000 UTC"): it is
    ignored, as for a quiet key, and the next start written is the rate's again."""

    @app.task(name="t.mail", rate_limit="1/m")
    def mail(n: int) -> None: ...

    handles = [mail.delay(n) for n in range(3)]
    f = app.tables.flow
    with app.engine.begin() as conn:
        conn.execute(sa.update(f).values(next_start_at=utcnow() + ahead))
    assert waiting.blocked_keys(app.store) == []
    assert app.store.has_work(None, utcnow())
    taken = take(app)
    assert [m.id for m in taken] == [h.id for h in handles[:2]]  # two, as after a quiet spell
    with app.engine.connect() as conn:
        next_start = conn.execute(sa.select(f.c.next_start_at)).scalar_one()
    assert next_start <= utcnow() + timedelta(minutes=1)  # spaced by the rate again
    assert take(app) == []  # ...which now holds the third job for its interval


def test_a_quiet_key_whose_next_start_is_further_ahead_than_any_rate_allows_is_forgotten(app: JobQueue) -> None:
    @app.task(name="t.mail", rate_limit="10/s")
    def mail(n: int) -> None: ...

    mail.delay(1)
    f, m = app.tables.flow, app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.delete(m))
        quiet, ahead = utcnow() - timedelta(hours=2), utcnow() + timedelta(days=30)
        conn.execute(sa.update(f).values(served_at=quiet, next_start_at=ahead))
    assert app.store.forget_idle_flow_keys(60) == 1


@only("sqlite")
@pytest.mark.parametrize("junk", ["junk", "", "2026-99-99 99:99:99", "1", f"{utcnow():%Y-%m-%d} 23:99:99"])
def test_a_flow_row_whose_times_are_not_timestamps_is_repaired_not_fatal(app: JobQueue, junk: str) -> None:
    """SQLite stores any text in any column: a flow row edited by hand to hold text that is no
    timestamp made every fetch raise, so that each worker process exited before running a job (its
    supervisor backing off, jobs without a key waiting too), and `status` and `jobs list` failed.
    Such a time holds nothing back: the key's jobs are taken, and serving it writes its times again."""

    @app.task(name="t.mail", rate_limit="1/m")
    def mail(n: int) -> None: ...

    @app.task(name="t.api", concurrency_key="partner", concurrency_limit=1)
    def api(n: int) -> None: ...

    handles = [mail.delay(0), api.delay(0)]
    with app.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE jobqueue_flow SET served_at = ?, next_start_at = ?", (junk, junk))
    assert waiting.blocked_keys(app.store) == []
    rows = [
        {"id": h.id, "state": "PENDING", "flow_key": key, "partition_key": None}
        for h, key in zip(handles, ["task:t.mail", "partner"], strict=True)
    ]
    assert all(wait.reason is None for wait in waiting.explain(app.store, rows).values())
    assert app.store.has_work(None, utcnow())
    assert sorted(m.id for m in take(app)) == [h.id for h in handles]
    f = app.tables.flow
    with app.engine.connect() as conn:
        stored = dict(conn.execute(sa.select(f.c.flow_key, f.c.served_at)).all())  # readable again
    assert set(stored) == {"task:t.mail", "partner"}


@only("sqlite")
@pytest.mark.parametrize("text", ["2020-01-01T10:00:00Z", "2020-01-01 12:00:00+02:00", "0001-01-01T00:00:00+05:00"])
def test_a_flow_row_time_edited_by_hand_with_an_offset_is_read_as_utc(app: JobQueue, text: str) -> None:
    """A time with a UTC offset ('2026-11-28T10:00:00Z', as an API or `date -Iseconds` writes it),
    set by hand on SQLite, was read as an aware time and compared with the naive UTC times of the
    rest: every fetch raised (TypeError), as did `status`. It is that instant, in UTC (and no time
    where that instant is before year 1)."""

    @app.task(name="t.mail", rate_limit="1/m")
    def mail(n: int) -> None: ...

    handles = [mail.delay(n) for n in range(2)]
    with app.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE jobqueue_flow SET next_start_at = ?", (text,))
    assert waiting.blocked_keys(app.store) == []
    assert [m.id for m in take(app)] == [h.id for h in handles]  # a quiet key's two starts
    assert take(app) == []


def test_a_rate_hold_that_ends_another_day_says_which_day(app: JobQueue) -> None:
    """A key held until tomorrow by a rate of a start an hour was said to be held "until 01:01:57
    UTC", which reads as today."""

    @app.task(name="t.mail", rate_limit="1/h")
    def mail(n: int) -> None: ...

    mail.delay(1)
    f = app.tables.flow
    # The next midnight: another day, and always within the day a rate's next start may be ahead
    # (tomorrow's 01:01:57 was more than a day ahead when the test ran before 01:01:57 UTC).
    tomorrow = utcnow().replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    for until, said in ((tomorrow, f"{tomorrow:%Y-%m-%d} 00:00:00.000 UTC"), (utcnow(), "")):
        with app.engine.begin() as conn:
            conn.execute(sa.update(f).values(next_start_at=until))
        reasons = [key["reason"] for key in waiting.blocked_keys(app.store)]
        if said:
            assert reasons == [f"held by its rate until {said}"], reasons
        else:
            assert all(f"{until:%Y-%m-%d}" not in reason for reason in reasons), reasons
