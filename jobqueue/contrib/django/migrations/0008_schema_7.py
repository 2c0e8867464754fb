"""jobqueue schema 7, as ``jobqueue db upgrade`` applies it: on MySQL and MariaDB, the names of
tasks, queues, topics and consumer groups compare exactly, as on PostgreSQL and SQLite. A database
that 0001 created at schema 7 already has them: nothing to do then."""

from __future__ import annotations

from django.db import migrations

from jobqueue.contrib.django.schema import keep_tables, upgrade_tables


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0007_schema_6")]
    operations = [migrations.RunPython(upgrade_tables, keep_tables, elidable=False)]
