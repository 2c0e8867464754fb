"""Settings of the example shop. The database comes from SHOP_DATABASE_URL (an SQLAlchemy-style URL:
sqlite:///shop.sqlite3, postgresql://user:password@host/name, mysql://user:password@host/name)."""

import os
from importlib.util import find_spec
from pathlib import Path

from sqlalchemy.engine import make_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "shopsite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",  # /admin/: jobqueue's active and archived jobs, with retry and cancel
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "jobqueue.contrib.django",  # jobqueue's tables (migrate), `manage.py jobqueue ...` and its admin
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
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
]

JOBQUEUE = {"APP": "shop.tasks:app", "DATABASE": "default"}

# Receipts are sent by a task written for Django's task API, which Django 6 has built in
# (django.tasks) and Django 5.2 gets from the django-tasks backport, an app of its own. Without
# either the shop runs all the same, and sends no receipts.
SHOP_RECEIPTS = find_spec("django.tasks") is not None or find_spec("django_tasks") is not None
if SHOP_RECEIPTS:
    if find_spec("django.tasks") is None:
        INSTALLED_APPS.insert(INSTALLED_APPS.index("jobqueue.contrib.django"), "django_tasks")
    TASKS = {"default": {"BACKEND": "jobqueue.contrib.django.backend.JobQueueBackend"}}


def database_from_url(url: str) -> dict:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        name = parsed.database or "shop.sqlite3"
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(BASE_DIR / name),
            "TEST": {"NAME": str(BASE_DIR / f"test_{Path(name).name}")},
        }
    engine = {
        "postgresql": "django.db.backends.postgresql",
        "mysql": "django.db.backends.mysql",
        "mariadb": "django.db.backends.mysql",
    }[backend]
    return {
        "ENGINE": engine,
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
    }


DATABASES = {"default": database_from_url(os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.sqlite3"))}
