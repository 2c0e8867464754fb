"""Create the tables (``jobqueue db init``), upgrade them, and check their version before a worker starts."""

from __future__ import annotations

import sqlalchemy as sa

from jobqueue.errors import ConfigurationError, SchemaError
from jobqueue.storage.dialects import dialect_for
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.dialects.connector import lacks_a_privilege
from jobqueue.storage.engine import CREATING_DATABASE, READONLY
from jobqueue.storage.migrations import (
    create_missing,
    created_what,
    installed_version,
    lacking,
    missing_error,
    newer_error,
    older_error,
    stamp,
    unversioned,
    unversioned_error,
    upgrade_on,
)
from jobqueue.storage.tables import SCHEMA_VERSION, Tables

# The fix for columns dropped by hand, which `db init` does not add (they may hold data elsewhere).
ADD_BACK_BY_HAND = (
    "add the column(s) back by hand (ALTER TABLE ... ADD COLUMN, of the type a new database gets), or restore the table"
)


def init_schema(engine: sa.Engine, tables: Tables) -> str:
    """Create missing tables, or upgrade older ones, and record the schema version; safe to run any
    number of times. Returns a sentence saying what was done."""
    creating = CREATING_DATABASE.set(True)
    try:
        with engine.begin() as conn:
            said = init_schema_on(conn, tables)
    finally:
        CREATING_DATABASE.reset(creating)
    # What was made again stays made (committed); columns dropped by hand are the user's to add.
    with engine.connect() as conn:
        _, columns = lacking(conn, tables)
    if columns:
        raise SchemaError(f"{said}; {_unlike_this_schema(tables, SCHEMA_VERSION, False, columns)}")
    return said


def init_schema_on(conn: sa.Connection, tables: Tables) -> str:
    """:func:`init_schema` inside the caller's transaction (a Django migration's, say)."""
    dialect = dialect_for(conn.engine, tables)
    dialect.check_server(conn)
    with dialect.schema_lock(conn):
        return _init_locked(conn, tables, dialect)


def _init_locked(conn: sa.Connection, tables: Tables, dialect: Dialect) -> str:
    version = installed_version(conn, tables)
    versionless = unversioned(conn, tables, version)
    if version is not None and version > SCHEMA_VERSION:
        raise newer_error(conn, tables, version)
    if version is None:
        # Checked before anything is created (MySQL and MariaDB commit each CREATE at once): a
        # table of the same name that is not of this schema is named, not added to, or stamped.
        _, columns = lacking(conn, tables)
        if columns:
            raise _unlike_this_schema(tables, version, versionless, columns)
    done = upgrade_on(conn, tables) if version is not None and version < SCHEMA_VERSION else []
    # Not create_all: it skips a table that exists, and a `db init` cut short on MySQL or MariaDB
    # (which commit each CREATE by itself) can have left one without some of its indexes.
    added = [statement for table in tables.metadata.sorted_tables for statement in create_missing(conn, table)]
    for statement in added:
        conn.exec_driver_sql(statement)
    beyond = dialect.after_create(conn)
    if versionless:
        # Tables whose version row was deleted: this release's (no column of it lacks, above).
        stamp(conn, tables, SCHEMA_VERSION)
        made = f"; created what they lacked: {', '.join(created_what(st) for st in added)}" if added else ""
        return (
            f"recorded jobqueue schema {SCHEMA_VERSION} for the existing tables ({tables.prefix}*), whose "
            f"version row was missing{made}"
        )
    if version is None:
        stamp(conn, tables, SCHEMA_VERSION)
        return f"created jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*)"
    if version < SCHEMA_VERSION:
        return f"upgraded jobqueue schema {version} to {SCHEMA_VERSION} ({tables.prefix}*, {len(done)} statements)"
    if added or beyond:
        return (
            f"jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*) is up to date; created what it lacked: "
            + ", ".join([*(created_what(statement) for statement in added), *beyond])
        )
    return f"jobqueue schema {SCHEMA_VERSION} ({tables.prefix}*) is up to date"


def _unlike_this_schema(tables: Tables, version: int | None, versionless: bool, columns: list[str]) -> SchemaError:
    """Why `db init` leaves tables that lack columns of this schema as they are."""
    named = ", ".join(columns[:4]) + (f" and {len(columns) - 4} more" if len(columns) > 4 else "")
    # Tables whose message table lacks the columns every release's has are another's, version row
    # or not (the topic log of a prefix that this one extends: jq_topic_message is jq_'s, and would
    # be jq_topic_'s); an older release's tables lack only columns added since.
    first = {f"{tables.message.name}.{name}" for name in ("task_name", "payload", "state")}
    foreign = version is None and bool(first & set(columns))
    if versionless and not foreign:
        return SchemaError(
            f"the jobqueue tables ({tables.prefix}*) record no schema version and lack column(s) {named}: "
            f"they are not this release's schema {SCHEMA_VERSION}; add the column(s) by hand, or restore the "
            "tables and their version row"
        )
    if version is None:
        names = ", ".join(dict.fromkeys(column.rpartition(".")[0] for column in columns))
        return SchemaError(
            f"table(s) {names} already exist in this database and are none of the jobqueue tables of prefix "
            f"{tables.prefix!r} (they lack column(s) {named}; another application's, or another prefix's): "
            "nothing was created; give this app another table_prefix, or move those tables away"
        )
    return SchemaError(
        f"the jobqueue tables ({tables.prefix}*) are at schema version {version} but lack column(s) {named} "
        f"(dropped by hand?): {ADD_BACK_BY_HAND}"
    )


def drop_schema_on(conn: sa.Connection, tables: Tables) -> None:
    """Drop the jobqueue tables, and everything in them (unapplying the Django migration)."""
    tables.metadata.drop_all(conn, checkfirst=True)
    dialect_for(conn.engine, tables).after_drop(conn)


def check_schema(
    engine: sa.Engine, tables: Tables, schema_command: str | None = None, beyond_tables: bool = True
) -> None:
    """Raise SchemaError unless the tables exist at this release's schema version, naming the fix
    (``schema_command``, where the application creates the tables itself: see ``missing_error``).
    ``beyond_tables``: what `db init` makes beyond the tables (PostgreSQL's wake-up trigger) counts."""
    with engine.connect() as conn:
        # Only reads: on SQLite it takes no write lock, so it never waits for a writer.
        conn.execution_options(**{READONLY: True})
        dialect = dialect_for(engine, tables)
        dialect.check_server(conn)
        version = installed_version(conn, tables)
        if version is not None and version > SCHEMA_VERSION:
            raise newer_error(conn, tables, version)
        created, columns = lacking(conn, tables) if version == SCHEMA_VERSION else ([], [])
        beyond = dialect.lacks_beyond_tables(conn) if version == SCHEMA_VERSION and beyond_tables else []
        versionless = unversioned(conn, tables, version)
    if version is None:
        raise unversioned_error(tables, schema_command) if versionless else missing_error(tables, schema_command)
    if version < SCHEMA_VERSION:
        raise older_error(tables, version, schema_command)
    if created or columns or beyond:
        command = f"`{schema_command}`" if schema_command else "`jobqueue db init`"
        fixes = [f"run {command}, which creates {', '.join(created)} again"] if created else []
        if beyond:  # made by jobqueue's own command, whoever made the tables (an applied migration does nothing)
            fixes.append(f"run `jobqueue db init`, which makes {', '.join(beyond)} again")
        created = created + beyond
        if columns:
            fixes.append(ADD_BACK_BY_HAND.replace("the column(s)", f"the column(s) {', '.join(columns)}"))
        raise SchemaError(
            f"the jobqueue tables ({tables.prefix}*) are at schema version {version} but lack "
            f"{', '.join(created + ['column ' + c for c in columns])} (dropped by hand?): {'; '.join(fixes)}"
        )


WORKER_RIGHTS = ("SELECT", "INSERT", "UPDATE", "DELETE")


def check_rights(engine: sa.Engine, tables: Tables) -> None:
    """Before a worker starts: raise ConfigurationError, naming each table and the grant, if the
    login may not read and write every jobqueue table. Such a worker would run each job and then
    fail to store its outcome (a login without DELETE cannot archive one), so that every job ran
    again and again. Each right is tried with a statement that touches no row, rolled back."""
    if engine.dialect.name == "sqlite":  # no logins: a file this process may not write is checked apart
        return
    refused: dict[str, list[str]] = {}
    with engine.connect() as conn:
        transaction = conn.begin()
        for table in tables.metadata.sorted_tables:
            if table is tables.schema_version:  # only read
                continue
            key = next(iter(table.primary_key.columns))
            nothing = sa.select(*table.columns).where(sa.false())  # every column: MariaDB checks NOT NULLs
            probes: dict[str, sa.Executable] = {
                "SELECT": nothing,
                "INSERT": table.insert().from_select(list(table.columns.keys()), nothing),
                "UPDATE": table.update().where(sa.false()).values({key.name: key}),
                "DELETE": table.delete().where(sa.false()),
            }
            for right in WORKER_RIGHTS:
                try:
                    with conn.begin_nested():  # a refusal aborts PostgreSQL's transaction: only this
                        conn.execute(probes[right])
                except sa.exc.DBAPIError as exc:
                    if not lacks_a_privilege(exc):
                        raise
                    refused.setdefault(right, []).append(table.name)
        sequences = _unusable_sequences(conn, tables) if engine.dialect.name == "postgresql" else []
        transaction.rollback()
    login = engine.url.username or "this login"
    if refused:
        missing = "; ".join(f"{right} on {', '.join(refused[right])}" for right in WORKER_RIGHTS if right in refused)
        raise ConfigurationError(
            f"the database login {login!r} may not {missing}: a worker reads and writes every jobqueue "
            f"table ({tables.prefix}*), and without these it would run each job and fail to store its "
            f"outcome. Grant it {', '.join(WORKER_RIGHTS)} on them (GRANT SELECT, INSERT, UPDATE, DELETE "
            f"ON ... TO {login}) and start the worker again"
        )
    if sequences:
        raise ConfigurationError(
            f"the database login {login!r} may not use the sequence(s) {', '.join(sequences)}, which number new "
            f"jobs: a worker adds some (a periodic task's next run, a topic's deliveries). Grant it USAGE on them "
            f"(GRANT USAGE ON SEQUENCE {', '.join(sequences)} TO {login}) and start the worker again"
        )


def _unusable_sequences(conn: sa.Connection, tables: Tables) -> list[str]:
    """PostgreSQL: the sequences of the jobqueue tables' ids that the login may not draw from."""
    found: list[str] = []
    for table in tables.metadata.sorted_tables:
        key = next(iter(table.primary_key.columns))
        sequence: str | None = conn.execute(
            sa.text("SELECT pg_get_serial_sequence(:table, :column)"), {"table": table.name, "column": key.name}
        ).scalar()
        usable = sa.text("SELECT has_sequence_privilege(:sequence, 'USAGE, UPDATE')")
        if sequence is not None and not conn.execute(usable, {"sequence": sequence}).scalar():
            found.append(sequence)
    return found
