"""What the app's Django migrations run: jobqueue's own schema steps, on Django's connection."""

from __future__ import annotations

from typing import Any


def target_tables(schema_editor: Any) -> Any:
    """The tables of the configured app, if this migration runs on the configured database."""
    from jobqueue.contrib.django.integration import database_alias, jobqueue_setting

    if schema_editor.connection.alias != database_alias():
        return None
    from jobqueue.cli.state import load_app
    from jobqueue.storage.tables import build_tables

    spec = jobqueue_setting().get("APP")
    prefix = load_app(str(spec)).settings.table_prefix if spec else "jobqueue_"
    return build_tables(prefix)


def borrowed_connection(schema_editor: Any) -> Any:
    """A SQLAlchemy connection over Django's, inside the migration's transaction."""
    from jobqueue.contrib.django.integration import DjangoIntegration

    return DjangoIntegration(schema_editor.connection.alias).engine().connect()


def create_tables(apps: Any, schema_editor: Any) -> None:
    tables = target_tables(schema_editor)
    if tables is not None:
        from jobqueue.storage.schema_manager import init_schema_on

        with borrowed_connection(schema_editor) as connection:
            init_schema_on(connection, tables)


def drop_tables(apps: Any, schema_editor: Any) -> None:
    tables = target_tables(schema_editor)
    if tables is not None:
        from jobqueue.storage.schema_manager import drop_schema_on

        with borrowed_connection(schema_editor) as connection:
            drop_schema_on(connection, tables)


def upgrade_tables(apps: Any, schema_editor: Any) -> None:
    """Apply jobqueue's numbered migrations the database still needs (none after a fresh 0001)."""
    tables = target_tables(schema_editor)
    if tables is not None:
        from jobqueue.storage.migrations import upgrade_on

        with borrowed_connection(schema_editor) as connection:
            upgrade_on(connection, tables)


def keep_tables(apps: Any, schema_editor: Any) -> None:
    """Unapplying an upgrade keeps its columns: an older release ignores them."""
