"""The dashboard against what it did not write: rows a DBA edited by hand and requests nobody's
form sends. Each page says what is wrong with a value and shows the rest; none fails whole."""

from __future__ import annotations

from types import SimpleNamespace

import sqlalchemy as sa

from jobqueue import JobQueue
from tests.conftest import only
from tests.dashboard.conftest import csrf_of
from tests.dashboard.test_app import failed_ids, page
from tests.storage.test_lifecycle import run_due


def test_a_job_whose_history_was_edited_into_no_list_is_shown_with_that_history_named(
    app: JobQueue, tasks: SimpleNamespace, client
) -> None:
    failed = tasks.fail.delay("x")
    waiting = tasks.add.apply_async((1, 1), countdown=3600)
    run_due(app)
    a, m = app.tables.archive, app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(a).where(a.c.id == failed.id).values(history=5))
        conn.execute(sa.update(m).where(m.c.id == waiting.id).values(history=["x", 3]))
    html = page(client, f"/jobs/{failed.id}")
    assert '<p class="unreadable" id="history">&lt;unreadable: 5&gt;</p>' in html
    assert 'id="state">failed<' in html and "ValueError" in html  # the rest of the job is there
    html = page(client, f"/jobs/{waiting.id}")
    assert "&lt;unreadable: [&#39;x&#39;, 3]&gt;" in html and 'id="cancel"' in html


@only("sqlite")  # the other databases refuse such a value
def test_times_that_are_no_times_are_shown_as_stored(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    """SQLite takes any text in a time column; the job page and the list show it as it is."""
    failed = tasks.fail.delay("x")
    run_due(app)
    a = app.tables.archive
    garbage: sa.ColumnElement[str] = sa.literal_column("'garbage'")
    with app.engine.begin() as conn:
        conn.execute(sa.update(a).where(a.c.id == failed.id).values(archived_at=garbage, created_at=garbage))
    assert "&lt;unreadable: &#39;garbage&#39;&gt;" in page(client, f"/jobs/{failed.id}")
    listed = page(client, "/failed")
    assert failed_ids(listed) == [failed.id] and "&lt;unreadable: &#39;garbage&#39;&gt;" in listed


def test_a_filter_no_name_can_hold_matches_nothing(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    """Task and queue names never hold a NUL, which PostgreSQL cannot even be sent."""
    tasks.fail.delay("x")
    run_due(app)
    for query in ("queue=%00", "task=t.fail%00", "queue=default%00&task=t.fail"):
        html = page(client, f"/failed?{query}", status=200)
        assert failed_ids(html) == [] and "No failed jobs" in html


def test_a_next_page_with_control_characters_stays_on_the_dashboard(
    app: JobQueue, tasks: SimpleNamespace, client
) -> None:
    """Browsers drop tabs and newlines from a Location: "/<tab>/evil.example" would lead to
    //evil.example, another site."""
    failed = tasks.fail.delay("x")
    run_due(app)
    token = csrf_of(page(client, f"/jobs/{failed.id}"))
    for target in ("/\t/evil.example/", "/\n/evil.example/", "/\r\n/evil.example/", "/\x00/evil.example/"):
        response = client.post(f"/jobs/{failed.id}/retry", data={"csrf_token": token, "next": target})
        assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{failed.id}", target
    response = client.post(f"/jobs/{failed.id}/retry", data={"csrf_token": token, "next": "/failed?task=t.fail"})
    assert response.headers["Location"] == "/failed?task=t.fail"


def test_a_job_in_a_state_jobqueue_does_not_know_says_so(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    edited = tasks.add.delay(1, 1)
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == edited.id).values(state="BOGUS"))
    html = page(client, f"/jobs/{edited.id}")
    assert 'id="state">&lt;unknown state: &#39;BOGUS&#39;&gt;<' in html
    assert "does not know (edited by hand?): no worker runs it; set it to PENDING" in html
    assert 'id="cancel"' not in html and 'id="retry"' not in html
