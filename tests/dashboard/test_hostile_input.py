"""The dashboard against what it did not write: rows a DBA edited by hand and requests nobody's
form sends. Each page says what is wrong with a value and shows the rest; none fails whole."""

from __future__ import annotations

from html.parser import HTMLParser
from types import SimpleNamespace
from urllib.parse import quote

import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.testing import drain
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
    assert '<p class="unreadable" id="history"><bdi>&lt;unreadable: 5&gt;</bdi></p>' in html
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


RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: what follows it, up to the end of its paragraph, reads backwards
ARABIC = "مرحبا"
BIDI_CONTROLS = {"\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))}


class _TextNodes(HTMLParser):
    """Each piece of text on a page with the elements it is in."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.found: list[tuple[str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.open:
            del self.open[len(self.open) - 1 - self.open[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        self.found.append((data, list(self.open)))


VOID = {"meta", "link", "input", "br", "img", "hr", "rect"}


def not_isolated(html: str) -> list[tuple[str, list[str]]]:
    """The text on the page holding right-to-left text or a bidirectional control that could reorder
    the text around it: outside a <bdi>, or (in a <pre>, where an isolate would not end a control's
    reach over the rest of its line) a control left as the character instead of written as an escape."""
    parser = _TextNodes()
    parser.feed(html)
    bad = []
    for text, inside in parser.found:
        controls = any(c in BIDI_CONTROLS for c in text)
        if not (controls or ARABIC in text):
            continue
        if "pre" in inside and not controls:
            continue
        if "pre" not in inside and "bdi" in inside:
            continue
        bad.append((text, inside))
    return bad


def test_right_to_left_text_in_a_job_is_isolated_and_cannot_reorder_the_text_around_it(
    app: JobQueue, tasks: SimpleNamespace, client
) -> None:
    """A value with a right-to-left override (or just Arabic) reorders the rest of its line: an error
    "\\u202egnp.exe" reads as "exe.png", and it drags the text after it (a queue name, the next field)
    along. Every value from a job is shown in its own <bdi>, which the browser lays out on its own."""
    hostile = f"{RLO}{ARABIC} 1 txt.exe"
    failed = tasks.fail.apply_async((hostile,), partition_key=hostile, unique_key=hostile)

    @app.task(name="t.keyed", concurrency_key=lambda key: key, concurrency_limit=1)
    def keyed(key: str) -> None: ...

    waiting = keyed.apply_async((hostile,), queue="reports", countdown=3600)
    drain(app)  # as a worker runs keyed jobs
    token = csrf_of(page(client, f"/jobs/{failed.id}"))
    client.post(f"/jobs/{failed.id}/retry", data={"csrf_token": token})
    drain(app)  # fails again: the first failure is now in its history
    assert failed.status() == "failed"
    a, m = app.tables.archive, app.tables.message
    with app.engine.begin() as conn:  # names jobqueue would refuse, edited in by hand
        conn.execute(sa.update(a).where(a.c.id == failed.id).values(task_name=f"t.{hostile}", queue=hostile))
        conn.execute(sa.update(m).where(m.c.id == waiting.id).values(queue=hostile, task_name=f"t.{hostile}"))
    app.store.register_worker(
        {
            "id": "w" * 32,
            "supervisor_id": "s" * 32,
            "hostname": hostile,
            "pid": 4242,
            "queues": hostile,
            "started_at": utcnow(),
            "heartbeat_at": utcnow(),
            "version": "test",
        }
    )
    pages = {
        path: page(client, path)
        for path in ("/", "/failed", f"/failed?queue={quote(hostile)}", f"/jobs/{failed.id}", f"/jobs/{waiting.id}")
    }
    # A refused retry quotes the state stored (edited by hand) in the message the next page shows.
    edited = tasks.fail.delay("y")
    run_due(app)
    with app.engine.begin() as conn:
        conn.execute(sa.update(a).where(a.c.id == edited.id).values(state=f"{RLO}{ARABIC}"))
    refused = client.post(f"/jobs/{edited.id}/retry", data={"csrf_token": token, "next": "/failed"})
    assert refused.status_code == 303
    pages["flash"] = page(client, "/failed")
    assert "not retried" in pages["flash"]
    for path, html in pages.items():
        assert ARABIC in html, path  # shown, not dropped
        assert not_isolated(html) == [], path
    # In the arguments (JSON) the override is written as its escape, the same string.
    assert f"&#34;\\u202e{ARABIC} 1 txt.exe&#34;" in pages[f"/jobs/{failed.id}"]
    assert f"<bdi>{hostile}</bdi>" in pages["/failed"] and "&lt;b&gt;" not in pages["/failed"]


def test_a_value_in_its_bdi_is_still_escaped(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    failed = tasks.fail.delay(f"{RLO}<b>not bold</b>")
    run_due(app)
    for path in ("/failed", f"/jobs/{failed.id}"):
        html = page(client, path)
        assert f"<bdi>{RLO}&lt;b&gt;not bold&lt;/b&gt;</bdi>" in html and "<b>not bold" not in html, path


def test_a_huge_error_edited_in_by_hand_is_listed_cut(app: JobQueue, tasks: SimpleNamespace, client) -> None:
    """The failed jobs show an error of over 200 characters as its first 199 and "~" (the database
    cuts it: see the test of ``jobs list``); the job's page shows it whole."""
    failed = tasks.fail.delay("x")
    run_due(app)
    start = "ü€😀" * 70
    a = app.tables.archive
    with app.engine.begin() as conn:
        conn.execute(sa.update(a).where(a.c.id == failed.id).values(error_message=start + "x" * 5_000_000))
    html = page(client, "/failed")
    assert f"<bdi>{start[:199]}~</bdi>" in html and len(html) < 20_000
