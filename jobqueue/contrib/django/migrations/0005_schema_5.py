"""jobqueue schema 5, as ``jobqueue db upgrade`` applies it: topics with consumer groups (the log of
published messages, each topic's groups and their watermarks). A database that 0001 created at
schema 5 already has them: nothing to do then."""

from __future__ import annotations

from django.db import migrations

from jobqueue.contrib.django.schema import keep_tables, upgrade_tables


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0004_schema_4")]
    operations = [migrations.RunPython(upgrade_tables, keep_tables, elidable=False)]
