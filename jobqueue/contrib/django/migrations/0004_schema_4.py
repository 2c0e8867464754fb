"""jobqueue schema 4, as ``jobqueue db upgrade`` applies it: concurrency keys, concurrency limits
and rate limits (a flow key and its limits on each job, the flow table, and the indexes that
acquire each key's jobs). A database that 0001 created at schema 4 already has them: nothing to do
then."""

from __future__ import annotations

from django.db import migrations

from jobqueue.contrib.django.schema import keep_tables, upgrade_tables


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0003_schema_3")]
    operations = [migrations.RunPython(upgrade_tables, keep_tables, elidable=False)]
