"""The dashboard's pages and actions through Flask's test client, on SQLite, PostgreSQL and MariaDB.

Jobs run through the real executor and store in this process (``run_due``), so what the pages show
is what a worker wrote.
"""

from __future__ import annotations

import re
from datetime import datetime
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.dashboard import create_app
from jobqueue.dashboard.views import render_overview
from jobqueue.errors import ConfigurationError
from jobqueue.storage import jobs
from jobqueue.storage.dialects.common import WorkerState
from jobqueue.storage.engine import mask_url, url_secrets
from jobqueue.storage.history import MinuteCount
from tests.conftest import only
from tests.dashboard.conftest import csrf_of
from tests.storage.test_lifecycle import run_due

TOKEN = "s3cret-token-for-the-tests"


def page(client: FlaskClient, path: str, status: int = 200) -> str:
    response = client.get(path)
    assert response.status_code == status, response.get_data(as_text=True)[:2000]
    return response.get_data(as_text=True)


def queue_cells(html: str, queue: str) -> dict[str, str]:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row, f"no row for queue {queue}"
    return {k: v.strip() for k, v in re.findall(r'data-key="(\w+)">(.*?)</td>', row.group(1), re.S)}


def failed_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job="(\d+)">', html)]


def test_overview_shows_queues_archive_throughput_and_workers(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    tasks.add.delay(1, 1)
    tasks.fail.delay("boom")
    run_due(app)
    tasks.add.delay(2, 2)
    tasks.add.apply_async((3, 3), queue="reports")
    tasks.add.apply_async((4, 4), queue="reports", countdown=3600)
    running = tasks.add.delay(5, 5)
    app.store.register_worker(
        {
            "id": "w" * 32,
            "supervisor_id": "s" * 32,
            "hostname": "box-7",
            "pid": 4242,
            "queues": "default,reports",
            "started_at": utcnow(),
            "heartbeat_at": utcnow(),
            "version": "test",
        }
    )
    app.store.heartbeat([WorkerState("w" * 32, running_job_id=running.id, running_since=utcnow(), jobs_done=17)], 30)

    html = page(client, "/")
    # Each state of each queue is shown as the storage layer counts it (a failed count links to the list).
    for row in jobs.queue_counts(app.store):
        cells = queue_cells(html, row["queue"])
        for key, value in row.items():
            if key in cells and isinstance(value, int):
                assert re.sub(r"<[^>]+>", "", cells[key]) == str(value), (row["queue"], key)
    reports = queue_cells(html, "reports")
    assert (reports["ready"], reports["scheduled"]) == ("1", "1")
    assert re.search(r"completed 1</span>,\s*<a class=\"state-failed\" href=\"/failed\">failed 1</a>", html)
    assert "1 completed</span>" in html and "1 failed</span>" in html  # the last hour's throughput
    assert html.count('<rect class="completed"') == 60
    workers = re.search(r'<table id="workers">(.*?)</table>', html, re.S).group(1)
    assert "box-7" in workers and "4242" in workers and "default,reports" in workers
    assert f'href="/jobs/{running.id}"' in workers and ">17<" in workers


def test_overview_of_an_empty_database(client) -> None:
    html = page(client, "/")
    assert "No active messages in any queue." in html and "No live worker processes." in html
    assert "0 completed</span>" in html


def test_overview_says_when_jobs_are_in_a_state_no_worker_takes(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    import sqlalchemy as sa

    tasks.add.delay(1, 1)
    edited = tasks.add.delay(2, 2)
    assert 'id="unknown-state"' not in page(client, "/")
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == edited.id).values(state="BOGUS"))
    html = page(client, "/")
    assert queue_cells(html, "default")["ready"] == "1"
    assert "1 job(s) in a state jobqueue does not know" in html


def test_failed_jobs_newest_first_a_page_at_a_time(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    ids = [tasks.fail.delay(f"n{i}").id for i in range(5)]
    tasks.add.delay(1, 2)
    run_due(app)
    first = page(client, "/failed")
    assert failed_ids(first) == [ids[4], ids[3]] and "5 in all" in first
    assert "<strong><bdi>ValueError</bdi></strong>: <bdi>n4</bdi>" in first
    older = re.search(r'rel="next" href="([^"]+)"', first).group(1).replace("&amp;", "&")
    second = page(client, older)
    assert failed_ids(second) == [ids[2], ids[1]]
    third = page(client, re.search(r'rel="next" href="([^"]+)"', second).group(1).replace("&amp;", "&"))
    assert failed_ids(third) == [ids[0]] and 'rel="next"' not in third
    assert failed_ids(page(client, "/failed?task=t.add")) == []
    assert failed_ids(page(client, "/failed?queue=default&task=t.fail")) == [ids[4], ids[3]]


def test_job_page_shows_arguments_error_traceback_and_history(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    handle = tasks.fail.delay("<b>not bold</b>")
    run_due(app)
    html = page(client, f"/jobs/{handle.id}")
    assert 'id="state">failed<' in html and 'id="retry"' in html and 'id="cancel"' not in html
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html and "<b>not bold</b>" not in html  # escaped, never markup
    traceback = re.search(r'<pre class="traceback" id="traceback">(.*?)</pre>', html, re.S).group(1)
    assert traceback.startswith("Traceback (most recent call last):")
    assert "raise ValueError(message)" in traceback
    client.post(f"/jobs/{handle.id}/retry", data={"csrf_token": csrf_of(html)})
    run_due(app)  # fails again: the first failure is now in its history
    again = page(client, f"/jobs/{handle.id}")
    assert re.search(r'<ol class="history">.*failed</span>\s*after <bdi>1</bdi> attempt\(s\)', again, re.S)
    assert page(client, "/jobs/987654321", status=404).count("not found") == 1


def test_job_page_shows_arguments_whose_dicts_have_keys_json_cannot_write(
    app: JobQueue, tasks: SimpleNamespace, client
) -> None:
    handle = tasks.fail.delay({(1, 2): "pair", datetime(2030, 1, 2): "day"})
    run_due(app)
    html = page(client, f"/jobs/{handle.id}")
    assert "&#34;(1, 2)&#34;: &#34;pair&#34;" in html and "2030-01-02 00:00:00" in html


def test_job_page_shows_a_lone_surrogate_pickle_kept(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    """A file name read with surrogateescape, say: the page was a 500 (UnicodeEncodeError)."""
    app.configure(serializer="pickle")
    handle = tasks.add.delay("report-\ud800", ".csv")
    run_due(app)
    assert handle.get(timeout=0) == "report-\ud800.csv"
    html = page(client, f"/jobs/{handle.id}")
    assert "report-\\ud800.csv" in html  # as its escape, in the result and the arguments


def test_ids_over_the_largest_a_database_holds_are_not_found(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    handle = tasks.fail.delay("x")
    run_due(app)
    html = page(client, f"/jobs/{handle.id}")
    too_big = 2**63  # one over a signed 64-bit integer: SQLite's driver cannot even send it
    page(client, f"/jobs/{too_big}", status=404)
    for action in ("retry", "cancel"):
        assert client.post(f"/jobs/{too_big}/{action}", data={"csrf_token": csrf_of(html)}).status_code == 404
    for before in (too_big, -too_big - 1):
        assert failed_ids(page(client, f"/failed?before={before}")) == [handle.id]  # the first page


def test_retry_and_cancel_through_post_with_the_csrf_token(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    flaky = tasks.flaky.delay()
    run_due(app)
    assert flaky.status() == "failed"
    html = page(client, f"/jobs/{flaky.id}")
    response = client.post(f"/jobs/{flaky.id}/retry", data={"csrf_token": csrf_of(html)})
    assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{flaky.id}"
    assert flaky.status() == "pending"
    shown = page(client, f"/jobs/{flaky.id}")
    assert "is back in its queue" in shown and 'id="state">pending<' in shown and 'id="cancel"' in shown
    run_due(app)
    assert flaky.get(timeout=1) == "second run works"
    assert 'id="state">completed<' in page(client, f"/jobs/{flaky.id}")

    waiting = tasks.add.apply_async((1, 1), countdown=3600)
    html = page(client, f"/jobs/{waiting.id}")
    response = client.post(f"/jobs/{waiting.id}/cancel", data={"csrf_token": csrf_of(html), "next": "/failed"})
    assert response.status_code == 303 and response.headers["Location"] == "/failed"
    assert waiting.status() == "cancelled"
    client.post(f"/jobs/{waiting.id}/cancel", data={"csrf_token": csrf_of(html)})
    assert "not cancelled: it is running, has ended" in page(client, f"/jobs/{waiting.id}")
    # a "next" that leaves the dashboard is ignored
    response = client.post(f"/jobs/{flaky.id}/retry", data={"csrf_token": csrf_of(html), "next": "//evil.example/"})
    assert response.headers["Location"] == f"/jobs/{flaky.id}"
    assert "only failed or cancelled jobs are retried" in page(client, f"/jobs/{flaky.id}")


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(
    app: JobQueue, tasks: SimpleNamespace, client
) -> None:
    failed = tasks.fail.delay("x")
    run_due(app)
    pending = tasks.add.delay(1, 1)
    assert client.post(f"/jobs/{failed.id}/retry").status_code == 403  # no session, no token
    response = client.get(f"/jobs/{failed.id}")
    html = response.get_data(as_text=True)
    session_cookie = response.headers["Set-Cookie"]  # the signed session that holds the CSRF token
    assert "HttpOnly" in session_cookie and "SameSite=Lax" in session_cookie
    assert client.post(f"/jobs/{failed.id}/retry", data={"csrf_token": "forged"}).status_code == 403
    assert client.post(f"/jobs/{pending.id}/cancel", data={}).status_code == 403
    other = create_app(app).test_client()  # another browser: its token is not this session's
    other_token = csrf_of(page(other, f"/jobs/{failed.id}"))
    assert client.post(f"/jobs/{failed.id}/retry", data={"csrf_token": other_token}).status_code == 403
    assert other_token != csrf_of(html)
    assert (failed.status(), pending.status()) == ("failed", "pending")


def test_a_token_is_required_when_configured(app: JobQueue, tasks: SimpleNamespace) -> None:
    failed = tasks.fail.delay("secret-looking detail")
    run_due(app)
    client = create_app(app, token=TOKEN).test_client()
    for path in ("/", "/failed", f"/jobs/{failed.id}", "/static/dashboard.css"):
        refused = client.get(path)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert "secret-looking" not in refused.get_data(as_text=True) and "<table" not in refused.get_data(as_text=True)
    assert client.get("/?token=wrong-token-of-some-length").status_code == 403
    assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert client.post(f"/jobs/{failed.id}/retry", data={"csrf_token": "x"}).status_code == 401
    assert failed.status() == "failed"

    assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    first = client.get(f"/failed?token={TOKEN}&task=t.fail")
    assert first.status_code == 303 and first.headers["Location"] == "/failed?task=t.fail"  # out of the address bar
    # a request line "GET //evil.example/?token=..." is redirected within the dashboard (werkzeug
    # collapses the leading slashes of the path), never to that site
    sneaky = client.get("/", query_string={"token": TOKEN}, environ_overrides={"PATH_INFO": "//evil.example/"})
    assert sneaky.headers["Location"] == "/evil.example/"
    cookie = first.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    html = page(client, f"/jobs/{failed.id}")  # the cookie carries it from now on
    assert "secret-looking detail" in html
    # a token does not stand in for the CSRF token
    assert client.post(f"/jobs/{failed.id}/retry").status_code == 403
    assert client.post(f"/jobs/{failed.id}/retry", data={"csrf_token": csrf_of(html)}).status_code == 303
    assert failed.status() == "pending"


def test_without_a_token_only_requests_to_localhost_are_answered(client) -> None:
    for host in ("localhost", "127.0.0.1:8080", "[::1]:8080", "localhost:80"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:8080", "10.0.0.5:8080"):  # a rebound DNS name, a LAN address
        response = client.get("/", headers={"Host": host})
        assert response.status_code == 403 and "<table" not in response.get_data(as_text=True), host


def test_pages_never_show_the_database_password(app: JobQueue, db_url: str, client) -> None:
    html = page(client, "/")
    assert mask_url(db_url) in html
    for secret in url_secrets(db_url):
        assert f":{secret}@" not in html


def test_every_response_forbids_framing_and_scripts(app: JobQueue, client) -> None:
    response = client.get("/")
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert "script-src" not in response.headers["Content-Security-Policy"]  # default-src 'none': no script runs
    assert response.headers["Cache-Control"] == "no-store"


def test_processes_serving_one_token_accept_each_others_sessions(app: JobQueue, tasks: SimpleNamespace) -> None:
    """As the workers of a WSGI server do: the form comes from one process, the POST goes to another."""
    failed = tasks.fail.delay("x")
    run_due(app)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    one, two = (create_app(app, token=TOKEN).test_client() for _ in range(2))
    html = one.get(f"/jobs/{failed.id}", headers=bearer).get_data(as_text=True)
    two.set_cookie("session", one.get_cookie("session").value)
    assert two.post(f"/jobs/{failed.id}/retry", data={"csrf_token": csrf_of(html)}, headers=bearer).status_code == 303
    assert failed.status() == "pending"
    other = create_app(app, token=TOKEN + "-other").test_client()  # another token signs otherwise
    other.set_cookie("session", one.get_cookie("session").value)
    other_bearer = {"Authorization": f"Bearer {TOKEN}-other"}
    assert (
        other.post(f"/jobs/{failed.id}/cancel", data={"csrf_token": csrf_of(html)}, headers=other_bearer).status_code
        == 403
    )


def test_the_overview_shows_the_states_and_marks_stale_workers(app: JobQueue) -> None:
    """Each queue state a column (a missing figure as "-"); a stale worker process marked."""
    minutes = [MinuteCount(datetime(2030, 3, 1, 9, i)) for i in range(60)]
    worker = {"hostname": "h", "pid": 7, "queues": None, "running_job_id": None, "jobs_done": 3}
    web = create_app(app)
    with web.test_request_context("/"):
        newer = render_overview(
            [{"queue": "q", "ready": 4, "scheduled": 2, "processing": 1, "retrying": 0, "failed": 9}],
            {"failed": 9},
            [
                dict(worker, heartbeat_age_seconds=2.5, stale=False),
                dict(worker, pid=8, heartbeat_age_seconds=95, stale=True),
            ],
            minutes,
        )
    assert queue_cells(newer, "q") == {
        "ready": "4",
        "scheduled": "2",
        "processing": "1",
        "retrying": "0",
        "failed": '<a href="/failed?queue=q">9</a>',
        "oldest_ready_seconds": "-",
    }
    assert "2.5 s" in newer and "1 min 35 s" in newer and newer.count('<tr class="stale">') == 1
    assert '<span class="badge stale">stale</span>' in newer


def test_a_database_that_does_not_answer_is_a_page_without_its_password(caplog) -> None:
    unreachable = JobQueue("postgresql+psycopg2://someone:hunter2-secret@127.0.0.1:1/nowhere")
    response = create_app(unreachable).test_client().get("/")
    html = response.get_data(as_text=True)
    assert response.status_code == 503 and "The database did not answer" in html
    assert "someone:***@127.0.0.1:1/nowhere" in html  # the header names the database
    assert "hunter2" not in html + caplog.text and "dashboard request failed" in caplog.text
    unreachable.close()


def test_a_periodic_schedules_message_shows_its_schedule_not_a_decoding_error(app: JobQueue, client) -> None:
    from datetime import timedelta

    import sqlalchemy as sa

    from jobqueue import schedule_sync
    from jobqueue.job import SCHEDULE_TASK

    @app.periodic(every=timedelta(minutes=5), kwargs={"kind": "daily"})
    @app.task(name="t.report")
    def report(kind: str) -> str:
        return kind

    schedule_sync.sync(app.store, app.schedules, set(app.registry), utcnow())
    m = app.tables.message
    with app.engine.connect() as conn:
        schedule_id = conn.execute(sa.select(m.c.id).where(m.c.task_name == SCHEDULE_TASK)).scalar_one()
    html = page(client, f"/jobs/{schedule_id}")
    assert "cannot decode" not in html
    schedule = '<p id="schedule"><bdi>t.report</bdi>: runs <bdi>t.report</bdi>, <bdi>every 300 s</bdi> (<bdi>UTC</bdi>)'
    assert schedule in html
    assert "&#34;kind&#34;: &#34;daily&#34;" in html


@only("postgresql")
def test_an_action_the_login_may_not_take_is_refused_naming_the_grant(
    app: JobQueue, tasks: SimpleNamespace, client
) -> None:
    """A login that may read the tables but not change them: a retry or cancel was answered "The
    database did not answer" (503), as if the server were down."""
    waiting = tasks.add.apply_async((1, 1), countdown=3600)
    html = page(client, f"/jobs/{waiting.id}")
    tables = ", ".join(table.name for table in app.tables.metadata.sorted_tables)
    with app.engine.begin() as conn:  # the owner takes its own rights to write away (and gives them back after)
        conn.execute(sa.text(f"REVOKE INSERT, UPDATE, DELETE ON {tables} FROM CURRENT_USER"))
    try:
        response = client.post(f"/jobs/{waiting.id}/cancel", data={"csrf_token": csrf_of(html)})
        assert page(client, f"/jobs/{waiting.id}")  # reading still works
    finally:
        with app.engine.begin() as conn:
            conn.execute(sa.text(f"GRANT ALL ON {tables} TO CURRENT_USER"))
    shown = response.get_data(as_text=True)
    assert response.status_code == 403 and "The database refused this" in shown, shown
    assert "permission denied for table" in shown and "SELECT, INSERT, UPDATE and DELETE" in shown, shown
    assert waiting.status() == "pending"


def test_a_token_too_short_to_be_secret_is_refused_by_create_app(app: JobQueue) -> None:
    """The command refused it; an application serving create_app(queue, token="x") took it."""
    for token in ("", "x", "a" * 15):
        with pytest.raises(ConfigurationError, match=f"the dashboard token is {len(token)} characters"):
            create_app(app, token=token)
    assert create_app(app, token="a" * 16) is not None
