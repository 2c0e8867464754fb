"""jobqueue schema 6, as ``jobqueue db upgrade`` applies it: on MySQL and MariaDB, the key columns
(unique, partition, concurrency and rate keys) compare exactly, as on PostgreSQL and SQLite. A
database that 0001 created at schema 6 already has them: nothing to do then."""

from __future__ import annotations

from django.db import migrations

from jobqueue.contrib.django.schema import keep_tables, upgrade_tables


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0006_admin_models")]
    operations = [migrations.RunPython(upgrade_tables, keep_tables, elidable=False)]
