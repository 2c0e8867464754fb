"""The example shop, driven by Django's test client against a real database, with real workers.

Run from this folder: ``pytest`` (SQLite), or ``SHOP_DATABASE_URL=postgresql://... pytest``.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from datetime import timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from shop.models import Order
from shop.tasks import app, confirm_order

from jobqueue import JobNotCommitted, JobNotFound
from jobqueue.contrib.django.models import Message
from jobqueue.retry import NoRetryStrategy
from jobqueue.storage.jobs import cancel
from jobqueue.testing import drain

HERE = Path(__file__).resolve().parent
JOBS_PER_ORDER = 2 if settings.SHOP_RECEIPTS else 1  # confirm_order, and send_receipt where it exists
needs_task_api = pytest.mark.skipif(
    not settings.SHOP_RECEIPTS, reason="receipts need Django's task API (Django 6, or the django-tasks backport)"
)


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("JOBQUEUE_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=HERE, env=env, capture_output=True, text=True, timeout=120
    )


def jobs() -> tuple[int, int]:
    """(messages, archived jobs) in the jobqueue tables."""
    with app.store.reading() as conn:
        return (
            conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar_one(),
            conn.execute(sa.select(sa.func.count()).select_from(app.tables.archive)).scalar_one(),
        )


def place(client: Client, item: str, quantity: int):  # type: ignore[no-untyped-def]
    return client.post(
        "/orders/", data=json.dumps({"item": item, "quantity": quantity}), content_type="application/json"
    )


def test_a_declined_payment_leaves_no_order_and_no_job() -> None:
    response = place(Client(), "yacht", 500)
    assert response.status_code == 402
    assert Order.objects.count() == 0
    assert jobs() == (0, 0)


def test_orders_are_confirmed_by_the_worker() -> None:
    client = Client()
    placed = [place(client, f"book {i}", i + 1).json() for i in range(3)]
    assert jobs() == (3 * JOBS_PER_ORDER, 0)
    assert all((order["receipt"] is None) != settings.SHOP_RECEIPTS for order in placed)
    worker = manage("jobqueue", "worker", "--burst", "--concurrency", "2")
    assert worker.returncode == 0, worker.stderr
    assert jobs() == (0, 3 * JOBS_PER_ORDER)  # each job ran once
    for order in placed:
        shown = client.get(f"/orders/{order['id']}/").json()
        assert shown["status"] == "confirmed" and shown["confirmation"] == f"CONF-{order['id']:06d}"


def test_delay_inside_atomic_commits_or_rolls_back_with_it() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        confirm_order.delay(1)
        raise RuntimeError("roll back")
    assert jobs() == (0, 0)
    with transaction.atomic():
        handle = confirm_order.delay(2)
        with transaction.atomic():  # a savepoint, rolled back alone
            dropped = confirm_order.delay(3)
            transaction.set_rollback(True)
        with pytest.raises(JobNotCommitted):  # nobody else can see it before the commit
            handle.status()
        with pytest.raises(JobNotFound) as info:  # its savepoint rolled back: it never existed
            dropped.status()
        assert not isinstance(info.value, JobNotCommitted)
    assert jobs() == (1, 0)
    assert handle.status() == "pending"


def test_drain_runs_the_jobs_a_view_enqueued_in_this_process() -> None:
    client = Client()
    placed = [place(client, f"pen {i}", 1).json() for i in range(3)]
    handles = drain(app)  # no worker: the jobs run here, through the worker's executor
    assert len(handles) == 3 * JOBS_PER_ORDER
    for order in placed:
        assert client.get(f"/orders/{order['id']}/").json()["status"] == "confirmed"
        if settings.SHOP_RECEIPTS:
            assert client.get(f"/receipts/{order['receipt']}/").json()["status"] == "SUCCESSFUL"
    assert jobs() == (0, 3 * JOBS_PER_ORDER)


# Receipts: a task written for Django's task API, run by jobqueue through JobQueueBackend.


@needs_task_api
def test_receipts_are_sent_by_the_worker() -> None:
    client = Client()
    placed = [place(client, f"book {i}", i + 1).json() for i in range(2)]
    assert client.get(f"/receipts/{placed[0]['receipt']}/").json()["status"] == "READY"
    worker = manage("jobqueue", "worker", "--burst", "--concurrency", "2")
    assert worker.returncode == 0, worker.stderr
    for order in placed:
        receipt = client.get(f"/receipts/{order['receipt']}/").json()
        assert receipt["status"] == "SUCCESSFUL" and receipt["attempts"] == 1
        assert receipt["receipt"]["order"] == order["id"]


@needs_task_api
def test_a_django_task_enqueued_inside_atomic_commits_or_rolls_back_with_it() -> None:
    from shop.receipts import send_receipt

    with pytest.raises(RuntimeError), transaction.atomic():
        send_receipt.enqueue(1)
        raise RuntimeError("roll back")
    assert jobs() == (0, 0)
    with transaction.atomic():
        result = send_receipt.enqueue(2)
    assert jobs() == (1, 0)
    assert send_receipt.get_result(result.id).status == "READY"


@needs_task_api
def test_results_read_back_through_the_task_api() -> None:
    from shop.receipts import send_receipt

    order = Order.objects.create(item="lamp", quantity=1)
    result = send_receipt.enqueue(order.id)
    assert result.status == "READY" and not result.is_finished
    assert manage("jobqueue", "worker", "--burst", "--concurrency", "1").returncode == 0
    result.refresh()
    assert result.status == "SUCCESSFUL" and result.is_finished
    assert result.return_value == {"order": order.id, "text": "Thank you for buying 1 x lamp."}
    again = send_receipt.get_result(result.id)
    assert again.return_value == result.return_value and again.finished_at is not None
    assert again.enqueued_at.tzinfo is not None  # aware, as Django's API promises with USE_TZ
    from jobqueue.contrib.django.backend import TaskResultDoesNotExist  # Django's, or the backport's

    for unknown in ("99999999999999999999", "-1", "0", "lamp"):  # no job's, nor any id a database holds
        with pytest.raises(TaskResultDoesNotExist):
            send_receipt.get_result(unknown)


@needs_task_api
def test_a_failed_django_task_reports_its_error() -> None:
    from shop.receipts import send_receipt

    result = send_receipt.enqueue(999_999)  # no such order: Order.DoesNotExist, retried, then failed
    worker = manage("jobqueue", "worker", "--burst", "--concurrency", "1")
    assert worker.returncode == 0, worker.stderr
    result.refresh()
    assert result.status == "FAILED"
    assert result.errors and result.errors[-1].exception_class_path == "shop.models.Order.DoesNotExist"
    assert "does not exist" in result.errors[-1].traceback.lower()


def test_the_migration_made_what_db_init_makes() -> None:
    checked = manage("jobqueue", "db", "check")
    assert checked.returncode == 0, checked.stderr
    again = manage("jobqueue", "db", "init")
    assert "up to date" in again.stdout


def test_manage_py_jobqueue_refuses_another_database(tmp_path: Path) -> None:
    refused = manage("jobqueue", "--database-url", f"sqlite:///{tmp_path}/other.sqlite3", "status")
    assert refused.returncode == 1
    assert "Django's database" in refused.stderr and "other.sqlite3" in refused.stderr


# jobqueue's tables as Django models (jobqueue.contrib.django.models).


def test_the_job_models_change_nothing_in_the_database() -> None:
    checked = manage("makemigrations", "--check", "--dry-run")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    planned = manage("sqlmigrate", "jobqueue", "0006")
    assert planned.returncode == 0, planned.stderr
    statements = [line for line in planned.stdout.splitlines() if line and not line.startswith("--")]
    assert set(statements) <= {"BEGIN;", "COMMIT;"}  # unmanaged: jobqueue's migrations make the tables


def test_the_job_models_read_timestamps_as_stored_in_utc() -> None:
    handle = confirm_order.delay(1)
    m = app.tables.message
    with app.store.reading() as conn:
        stored = conn.execute(sa.select(m.c.created_at, m.c.next_attempt_at).where(m.c.id == handle.id)).one()
    job = Message.objects.get(pk=handle.id)
    assert job.created_at == stored.created_at.replace(tzinfo=timezone.utc)  # microseconds included
    assert job.next_attempt_at == stored.next_attempt_at.replace(tzinfo=timezone.utc)


# The admin: jobqueue's active and archived jobs at /admin/jobqueue/message/ and /admin/jobqueue/archive/.


@pytest.fixture
def admin_client() -> Client:
    """A superuser, logged in through the admin's login page."""
    User.objects.filter(username="admin").delete()
    User.objects.create_superuser("admin", "admin@example.com", "not-a-real-password")
    client = Client()
    login = client.post("/admin/login/", {"username": "admin", "password": "not-a-real-password", "next": "/admin/"})
    assert login.status_code == 302 and login["Location"] == "/admin/"
    return client


def failed_job(order_id: int) -> int:
    """A confirm_order job that fails at once (there is no such order) and is archived as failed."""
    handle = confirm_order.apply_async(args=[order_id], retry_strategy=NoRetryStrategy())
    worker = manage("jobqueue", "worker", "--burst", "--concurrency", "1")
    assert worker.returncode == 0, worker.stderr
    assert handle.status() == "failed"
    return handle.id


def shown(response) -> list[str]:  # type: ignore[no-untyped-def]
    """The messages the admin shows on the page after an action."""
    listed = re.search(r'<ul class="messagelist">(.*?)</ul>', response.text, re.S)
    return [html.unescape(text) for text in re.findall(r"<li[^>]*>(.*?)</li>", listed.group(1) if listed else "")]


def row(page, job_id: int) -> str:  # type: ignore[no-untyped-def]
    """A job's row in a changelist, or "" if it is not listed."""
    rows = re.findall(r"<tr>.*?</tr>", page.text, re.S)
    return next((found for found in rows if re.search(rf'/{job_id}/change/["?]', found)), "")


def test_the_admin_lists_active_and_archived_jobs(admin_client: Client) -> None:
    failed = failed_job(900_001)
    pending = confirm_order.delay(1)
    active = admin_client.get("/admin/jobqueue/message/")
    assert active.status_code == 200
    listed = row(active, pending.id)
    assert "shop.confirm_order" in listed and '<td class="field-state">pending</td>' in listed
    assert row(active, failed) == ""
    archived = admin_client.get("/admin/jobqueue/archive/")
    listed = row(archived, failed)
    assert '<td class="field-state">failed</td>' in listed and "Order.DoesNotExist" in listed
    assert row(archived, pending.id) == ""
    # Filters by state, queue and task; search by task name or id.
    assert row(admin_client.get("/admin/jobqueue/archive/?state__exact=FAILED"), failed)
    assert not row(admin_client.get("/admin/jobqueue/archive/?state__exact=COMPLETED"), failed)
    assert row(admin_client.get("/admin/jobqueue/message/?queue=default"), pending.id)
    assert not row(admin_client.get("/admin/jobqueue/message/?queue=emails"), pending.id)
    assert row(admin_client.get("/admin/jobqueue/message/?task_name=shop.confirm_order"), pending.id)
    assert row(admin_client.get(f"/admin/jobqueue/archive/?q={failed}"), failed)
    assert row(admin_client.get("/admin/jobqueue/archive/?q=confirm"), failed)
    assert row(admin_client.get("/admin/jobqueue/archive/?q=Confirm_ORDER"), failed)  # regardless of case
    assert row(admin_client.get("/admin/jobqueue/archive/?q=shop+ORDER"), failed)  # each word
    assert not row(admin_client.get("/admin/jobqueue/archive/?q=receipt"), failed)


def test_the_admin_shows_a_failed_job_read_only_with_its_traceback(admin_client: Client) -> None:
    failed = failed_job(900_001)
    page = admin_client.get(f"/admin/jobqueue/archive/{failed}/change/")
    assert page.status_code == 200
    assert "Traceback (most recent call last)" in page.text and "Order.DoesNotExist" in page.text
    assert "shop.confirm_order(900001)" in page.text  # the call, its arguments decoded
    assert 'name="_save"' not in page.text  # read-only: jobs change through the actions only
    assert admin_client.post(f"/admin/jobqueue/archive/{failed}/change/", {}).status_code == 403
    assert admin_client.get(f"/admin/jobqueue/archive/{failed}/delete/").status_code == 403
    assert admin_client.get("/admin/jobqueue/message/add/").status_code == 403


def test_retry_in_the_admin_puts_a_failed_job_back_for_a_worker(admin_client: Client) -> None:
    failed = failed_job(900_002)
    order = Order.objects.create(item="lamp", quantity=1)
    completed = confirm_order.delay(order.id)
    assert manage("jobqueue", "worker", "--burst", "--concurrency", "1").returncode == 0
    Order.objects.create(id=900_002, item="desk", quantity=1)  # what the failed job was missing
    response = admin_client.post(
        "/admin/jobqueue/archive/",
        {"action": "retry_jobs", "_selected_action": [failed, completed.id], "index": "0"},
        follow=True,
    )
    assert shown(response) == [
        f"Retried 1 job ({failed}).",
        f"Not retried: job {completed.id}: completed; only failed or cancelled jobs are retried.",
    ]
    assert jobs() == (1, 1)
    worker = manage("jobqueue", "worker", "--burst", "--concurrency", "1")
    assert worker.returncode == 0, worker.stderr
    assert jobs() == (0, 2)
    assert Order.objects.get(pk=900_002).status == "confirmed"


def test_cancel_in_the_admin_cancels_pending_jobs(admin_client: Client) -> None:
    first, second = confirm_order.delay(1), confirm_order.delay(2)
    assert row(admin_client.get("/admin/jobqueue/message/"), second.id)
    assert cancel(app.store, second.id)  # cancelled elsewhere after the page was shown
    response = admin_client.post(
        "/admin/jobqueue/message/",
        {"action": "cancel_jobs", "_selected_action": [first.id, second.id], "index": "0"},
        follow=True,
    )
    assert shown(response) == [
        f"Cancelled 1 job ({first.id}).",
        f"Not cancelled: job {second.id}: it is cancelled (it changed after the page was shown).",
    ]
    assert first.status() == "cancelled" and jobs() == (0, 2)
    logged = LogEntry.objects.get(object_id=str(first.id), content_type__model="message")
    assert logged.user.username == "admin" and logged.get_change_message() == "Cancelled"
