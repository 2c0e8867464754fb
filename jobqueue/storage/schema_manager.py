"""Create the tables (``jobqueue db init``) and check their version before a worker starts."""

from __future__ import annotations

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import SchemaError
from jobqueue.storage.dialects import dialect_for
from jobqueue.storage.store import missing_table
from jobqueue.storage.tables import SCHEMA_VERSION, Tables


def installed_version(connection: sa.Connection, tables: Tables) -> int | None:
    """Return the schema version recorded in the database, or None if there is none."""
    try:
        with connection.begin_nested():
            value = connection.execute(sa.select(sa.func.max(tables.schema_version.c.version))).scalar()
    except sa.exc.DBAPIError as exc:
        if missing_table(exc):
            return None
        raise
    return int(value) if value is not None else None


def init_schema(engine: sa.Engine, tables: Tables) -> str:
    """Create missing tables and record the schema version; safe to run any number of times.

    Returns a sentence saying what was done.
    """
    with engine.begin() as conn:
        return init_schema_on(conn, tables)


def init_schema_on(conn: sa.Connection, tables: Tables) -> str:
    """:func:`init_schema` inside the caller's transaction (a Django migration's, say)."""
    dialect = dialect_for(conn.dialect.name, tables)
    dialect.check_server(conn)
    version = installed_version(conn, tables)
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaError(_newer(version, tables))
    tables.metadata.create_all(conn, checkfirst=True)
    dialect.after_create(conn)
    if version == SCHEMA_VERSION:
        return f"jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*) is up to date"
    conn.execute(sa.insert(tables.schema_version), {"version": SCHEMA_VERSION, "applied_at": utcnow()})
    return f"created jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*)"


def drop_schema_on(conn: sa.Connection, tables: Tables) -> None:
    """Drop the jobqueue tables, and everything in them (unapplying the Django migration)."""
    tables.metadata.drop_all(conn, checkfirst=True)
    dialect_for(conn.dialect.name, tables).after_drop(conn)


def check_schema(engine: sa.Engine, tables: Tables) -> None:
    """Raise SchemaError unless the tables exist at this release's schema version."""
    with engine.connect() as conn:
        dialect_for(conn.dialect.name, tables).check_server(conn)
        version = installed_version(conn, tables)
    if version is None:
        raise SchemaError(f"the jobqueue tables ({tables.prefix}*) do not exist in this database; "
                          "run `jobqueue db init` to create them")
    if version < SCHEMA_VERSION:
        raise SchemaError(f"the jobqueue tables ({tables.prefix}*) are at schema version {version}, this "
                          f"release needs {SCHEMA_VERSION}; run `jobqueue db init` to upgrade them")
    if version > SCHEMA_VERSION:
        raise SchemaError(_newer(version, tables))


def _newer(version: int, tables: Tables) -> str:
    return (f"the jobqueue tables ({tables.prefix}*) are at schema version {version}, newer than this "
            f"release's {SCHEMA_VERSION}; upgrade jobqueue (pip install -U jobqueue)")
