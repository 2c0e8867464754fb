"""Create the tables (``jobqueue db init``), upgrade them, and check their version before a worker starts."""

from __future__ import annotations

import sqlalchemy as sa

from jobqueue.errors import SchemaError
from jobqueue.storage.dialects import dialect_for
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.migrations import (
    create_missing,
    created_what,
    installed_version,
    lacking,
    missing_error,
    newer_error,
    older_error,
    stamp,
    upgrade_on,
)
from jobqueue.storage.tables import SCHEMA_VERSION, Tables


def init_schema(engine: sa.Engine, tables: Tables) -> str:
    """Create missing tables, or upgrade older ones, and record the schema version; safe to run any
    number of times. Returns a sentence saying what was done."""
    with engine.begin() as conn:
        return init_schema_on(conn, tables)


def init_schema_on(conn: sa.Connection, tables: Tables) -> str:
    """:func:`init_schema` inside the caller's transaction (a Django migration's, say)."""
    dialect = dialect_for(conn.engine, tables)
    dialect.check_server(conn)
    with dialect.schema_lock(conn):
        return _init_locked(conn, tables, dialect)


def _init_locked(conn: sa.Connection, tables: Tables, dialect: Dialect) -> str:
    version = installed_version(conn, tables)
    if version is not None and version > SCHEMA_VERSION:
        raise newer_error(conn, tables, version)
    done = upgrade_on(conn, tables) if version is not None and version < SCHEMA_VERSION else []
    # Not create_all: it skips a table that exists, and a `db init` cut short on MySQL or MariaDB
    # (which commit each CREATE by itself) can have left one without some of its indexes.
    added = [statement for table in tables.metadata.sorted_tables for statement in create_missing(conn, table)]
    for statement in added:
        conn.exec_driver_sql(statement)
    dialect.after_create(conn)
    if version is None:
        stamp(conn, tables, SCHEMA_VERSION)
        return f"created jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*)"
    if version < SCHEMA_VERSION:
        return f"upgraded jobqueue schema {version} to {SCHEMA_VERSION} ({tables.prefix}*, {len(done)} statements)"
    if added:
        return (
            f"jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*) is up to date; created what it lacked: "
            + ", ".join(created_what(statement) for statement in added)
        )
    return f"jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*) is up to date"


def drop_schema_on(conn: sa.Connection, tables: Tables) -> None:
    """Drop the jobqueue tables, and everything in them (unapplying the Django migration)."""
    tables.metadata.drop_all(conn, checkfirst=True)
    dialect_for(conn.engine, tables).after_drop(conn)


def check_schema(engine: sa.Engine, tables: Tables, schema_command: str | None = None) -> None:
    """Raise SchemaError unless the tables exist at this release's schema version, naming the fix
    (``schema_command``, where the application creates the tables itself: see ``missing_error``)."""
    with engine.connect() as conn:
        dialect_for(engine, tables).check_server(conn)
        version = installed_version(conn, tables)
        if version is not None and version > SCHEMA_VERSION:
            raise newer_error(conn, tables, version)
        created, columns = lacking(conn, tables) if version == SCHEMA_VERSION else ([], [])
    if version is None:
        raise missing_error(tables, schema_command)
    if version < SCHEMA_VERSION:
        raise older_error(tables, version, schema_command)
    if created or columns:
        command = f"`{schema_command}`" if schema_command else "`jobqueue db init`"
        fixes = [f"run {command}, which creates {', '.join(created)} again"] if created else []
        if columns:
            fixes.append(
                f"add the column(s) {', '.join(columns)} back by hand (ALTER TABLE ... ADD COLUMN, of the type "
                "a new database gets), or restore the table"
            )
        raise SchemaError(
            f"the jobqueue tables ({tables.prefix}*) are at schema version {version} but lack "
            f"{', '.join(created + ['column ' + c for c in columns])} (dropped by hand?): {'; '.join(fixes)}"
        )
