"""Set Django up for the example's tests: SHOP_DATABASE_URL names the database (default: a
throwaway SQLite file), and ``migrate`` creates the shop's tables and jobqueue's."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if "SHOP_DATABASE_URL" not in os.environ:
    os.environ["SHOP_DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp()}/test_shop.sqlite3"
os.environ["DJANGO_SETTINGS_MODULE"] = "shopsite.settings"

import django  # noqa: E402

django.setup()


@pytest.fixture(scope="session", autouse=True)
def migrated() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@pytest.fixture(autouse=True)
def empty() -> None:
    import sqlalchemy as sa
    from shop.models import Order
    from shop.tasks import app

    Order.objects.all().delete()
    with app.engine.begin() as conn:
        for table in (app.tables.archive, app.tables.message):
            conn.execute(sa.delete(table))
