"""``jobqueue periodic list`` against schedule messages edited by hand, on every backend."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from jobqueue import schedule_sync
from jobqueue.clock import utcnow
from tests.acceptance.cli import jobqueue
from tests.apps import periodic as periodic_app

APP = "tests.apps.periodic:app"


@pytest.mark.parametrize("state", [b'{"last_fire": "garbage"}', b'{"last_fire": 5}', b"[1]", b"\xff"])
def test_a_last_fire_that_cannot_be_read_is_shown_as_stored(db_url: str, state: bytes) -> None:
    app = periodic_app.app
    app.configure(database_url=db_url)
    try:
        schedule_sync.sync(app.store, app.schedules, set(app.registry), utcnow())
        m = app.tables.message
        with app.engine.begin() as conn:
            conn.execute(sa.update(m).where(m.c.unique_key == "pd.tick").values(checkpoint=state))
    finally:
        app.close()
    shown = jobqueue("periodic", "list", app=APP, check=False)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-2000:]
    assert f"<unreadable: {state!r}>" in shown.stdout and "morning-report" in shown.stdout
    listed = {s["name"]: s for s in json.loads(jobqueue("periodic", "list", "--json", app=APP).stdout)}
    assert listed["pd.tick"]["last_fire"] == f"<unreadable: {state!r}>"
    assert listed["morning-report"]["last_fire"] is None
