"""Flow rows that no rate could have written (a database clock set back, a row edited by hand),
on every database: they must not hold a key's jobs back for longer than its rate would."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.storage import waiting
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
