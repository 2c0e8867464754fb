"""Create the jobqueue tables, exactly as ``jobqueue db init`` does (and drop them when unapplied)."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _target(schema_editor: Any) -> Any:
    """The tables of the configured app, if this migration runs on the configured database."""
    from jobqueue.contrib.django.integration import database_alias, jobqueue_setting

    if schema_editor.connection.alias != database_alias():
        return None
    from jobqueue.cli.state import load_app
    from jobqueue.storage.tables import build_tables

    spec = jobqueue_setting().get("APP")
    prefix = load_app(str(spec)).settings.table_prefix if spec else "jobqueue_"
    return build_tables(prefix)


def _borrowed(schema_editor: Any) -> Any:
    from jobqueue.contrib.django.integration import DjangoIntegration

    return DjangoIntegration(schema_editor.connection.alias).engine().connect()


def create_tables(apps: Any, schema_editor: Any) -> None:
    tables = _target(schema_editor)
    if tables is not None:
        from jobqueue.storage.schema_manager import init_schema_on

        with _borrowed(schema_editor) as connection:
            init_schema_on(connection, tables)


def drop_tables(apps: Any, schema_editor: Any) -> None:
    tables = _target(schema_editor)
    if tables is not None:
        from jobqueue.storage.schema_manager import drop_schema_on

        with _borrowed(schema_editor) as connection:
            drop_schema_on(connection, tables)


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(create_tables, drop_tables, elidable=False)]
