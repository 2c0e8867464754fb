"""Create the jobqueue tables, exactly as ``jobqueue db init`` does (and drop them when unapplied)."""

from __future__ import annotations

from django.db import migrations

from jobqueue.contrib.django.schema import create_tables, drop_tables


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(create_tables, drop_tables, elidable=False)]
