"""jobqueue schema 3, as ``jobqueue db upgrade`` applies it: the index that lets messages with a
partition key run one at a time, in order. A database that 0001 created at schema 3 already has
it: nothing to do then."""

from __future__ import annotations

from django.db import migrations

from jobqueue.contrib.django.schema import keep_tables, upgrade_tables


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0002_schema_2")]
    operations = [migrations.RunPython(upgrade_tables, keep_tables, elidable=False)]
