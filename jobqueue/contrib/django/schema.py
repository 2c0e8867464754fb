"""What the app's Django migrations run: jobqueue's own schema steps, on Django's connection."""

from __future__ import annotations

import functools
import sys
from typing import Any


def target_tables(schema_editor: Any) -> Any:
    """The tables of the configured app, if this migration runs on the configured database."""
    from jobqueue.contrib.django.integration import database_alias

    if schema_editor.connection.alias != database_alias():
        return None
    return configured_tables()


def configured_tables() -> Any:
    """The tables of the app settings.JOBQUEUE names (its table prefix)."""
    from jobqueue.cli.state import load_app
    from jobqueue.contrib.django.integration import jobqueue_setting
    from jobqueue.storage.tables import build_tables

    spec = jobqueue_setting().get("APP")
    prefix = load_app(str(spec), named_by="settings.JOBQUEUE['APP']").settings.table_prefix if spec else "jobqueue_"
    return _tables(prefix, build_tables)


@functools.lru_cache(maxsize=8)
def _tables(prefix: str, build: Any) -> Any:
    return build(prefix)


def tables_after_migrate(using: str = "default", verbosity: int = 1, **kwargs: Any) -> None:
    """After each ``migrate`` of jobqueue's database: create its tables when jobqueue's migrations
    are all recorded there as applied and its tables are missing. That happens when they ran while
    settings.JOBQUEUE named another database (they create nothing on any other) or another table
    prefix, and the setting changed since: Django would never run them again."""
    from django.db import connections, transaction
    from django.db.migrations.loader import MigrationLoader

    from jobqueue.contrib.django.integration import DjangoIntegration, database_alias
    from jobqueue.storage.migrations import installed_version
    from jobqueue.storage.schema_manager import init_schema_on

    if using != database_alias():
        return
    tables = configured_tables()
    # The usual case, asked first on Django's own connection: Django's flush after each
    # TransactionTestCase comes here too.
    if tables.schema_version.name in connections[using].introspection.table_names():
        return
    with transaction.atomic(using=using), DjangoIntegration(using).engine().connect() as connection:
        if installed_version(connection, tables) is not None:
            return
        loader = MigrationLoader(connections[using], ignore_no_migrations=True)
        leaves = loader.graph.leaf_nodes("jobqueue")
        if not leaves or any(leaf not in loader.applied_migrations for leaf in leaves):
            return  # migrated back on purpose, or not yet: the migrations do what is needed
        done = init_schema_on(connection, tables)
    if verbosity:
        out = kwargs.get("stdout") or sys.stdout
        out.write(
            f"  jobqueue: {done} on database {using!r} (its migrations were recorded there while "
            "settings.JOBQUEUE named another database or table prefix)\n"
        )


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
