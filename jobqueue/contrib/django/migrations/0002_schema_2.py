"""jobqueue schema 2, as ``jobqueue db upgrade`` applies it: worker rows tell which job each
process runs, since when and how many it has done; schema versions record the release that
applied them. A database that 0001 created at schema 2 already has it: nothing to do then."""

from __future__ import annotations

from django.db import migrations

from jobqueue.contrib.django.schema import keep_tables, upgrade_tables


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0001_initial")]
    operations = [migrations.RunPython(upgrade_tables, keep_tables, elidable=False)]
