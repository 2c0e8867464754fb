"""A Django site whose jobqueue lives on the database alias "queue" with the table prefix "jq_".

Run by tests/contrib/test_django.py in an empty folder (it makes two SQLite files there): the admin,
whose own tables are on "default", must list, show and cancel the jobs of "queue". Prints "ok".
"""

from __future__ import annotations

import re

import django
from django.conf import settings
from django.urls import path

SQLITE = "django.db.backends.sqlite3"
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "jobqueue.contrib.django",
    ],
    DATABASES={
        "default": {"ENGINE": SQLITE, "NAME": "site.sqlite3"},
        "queue": {"ENGINE": SQLITE, "NAME": "queue.sqlite3"},
    },
    JOBQUEUE={"APP": "__main__:app", "DATABASE": "queue"},
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    TEMPLATES=[
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ],
    ROOT_URLCONF=__name__,
    SECRET_KEY="test-only",
    ALLOWED_HOSTS=["testserver"],
    USE_TZ=True,
)
django.setup()

from django.contrib import admin  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.test import Client  # noqa: E402

from jobqueue import JobQueue  # noqa: E402

urlpatterns = [path("admin/", admin.site.urls)]

app = JobQueue(table_prefix="jq_")


@app.task(name="site.noop")
def noop(n: int) -> int:
    return n


def main() -> None:
    call_command("migrate", verbosity=0)
    call_command("migrate", database="queue", verbosity=0)
    assert "jq_message" in connections["queue"].introspection.table_names()
    assert not [name for name in connections["default"].introspection.table_names() if name.startswith("jq_")]

    User.objects.create_superuser("admin", "admin@example.com", "not-a-real-password")
    client = Client()
    assert client.login(username="admin", password="not-a-real-password")
    job = noop.delay(1)  # through Django's connection for "queue"

    listed = client.get("/admin/jobqueue/message/")
    assert listed.status_code == 200 and f"/admin/jobqueue/message/{job.id}/change/" in listed.text, listed.text
    detail = client.get(f"/admin/jobqueue/message/{job.id}/change/")
    assert detail.status_code == 200 and "site.noop(1)" in detail.text
    cancelled = client.post(
        "/admin/jobqueue/message/",
        {"action": "cancel_jobs", "_selected_action": [job.id], "index": "0"},
        follow=True,
    )
    assert re.search(rf"Cancelled 1 job \({job.id}\)", cancelled.text), cancelled.text
    assert job.status() == "cancelled"
    archived = client.get("/admin/jobqueue/archive/?state__exact=CANCELLED")
    assert f"/admin/jobqueue/archive/{job.id}/change/" in archived.text
    print("ok")


if __name__ == "__main__":
    main()
