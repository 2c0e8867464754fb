"""Numbered schema migrations: from the version a database holds to the one this release needs.

A new database gets the current layout at once (``init``); an older one is brought up step by step
(``upgrade``), each step in its own transaction where the database allows DDL in one (PostgreSQL,
SQLite; MySQL commits each ALTER by itself, so a step is written to be run again safely). Every
step only adds, or makes keys and names compare exactly: workers of the release before keep
running on an upgraded database until they are replaced (see docs/upgrading.md). Each applied
version is recorded with the release that applied it, so that an older release can say which one
to install.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import SchemaError
from jobqueue.storage.dialects import dialect_for
from jobqueue.storage.dialects.connector import CONTENTION, first_line
from jobqueue.storage.tables import SCHEMA_VERSION, Tables

logger = logging.getLogger("jobqueue.storage")
# A step of an upgrade that finds the tables locked by another session is tried again this many
# times (each waiting a moment for the lock: see Dialect.brief_lock_waits), a second apart.
STEP_TRIES = 30
STEP_RETRY_PAUSE_SECONDS = 1.0


@dataclass(frozen=True)
class Migration:
    """One step: the version it brings a database to, what it does, and its statements."""

    version: int
    description: str
    statements: Callable[[sa.Connection, Tables], list[str]]


def _add_columns(connection: sa.Connection, table: sa.Table, names: list[str]) -> list[str]:
    """``ALTER TABLE ... ADD COLUMN`` for the columns of ``table`` (as tables.py defines them) it lacks."""
    present = {column["name"] for column in sa.inspect(connection).get_columns(table.name)}
    statements = []
    for name in names:
        if name in present:
            continue
        column = table.c[name]
        kind = column.type.compile(dialect=connection.dialect)
        default = f" DEFAULT {column.server_default.arg}" if column.server_default is not None else ""  # type: ignore[attr-defined]
        null = "" if column.nullable else " NOT NULL"
        statements.append(f"ALTER TABLE {table.name} ADD COLUMN {name} {kind}{default}{null}")
    return statements


def _to_2(connection: sa.Connection, tables: Tables) -> list[str]:
    return _add_columns(connection, tables.worker, ["running_job_id", "running_since", "jobs_done"]) + _add_columns(
        connection, tables.schema_version, ["applied_by"]
    )


def _add_indexes(connection: sa.Connection, table: sa.Table, names: list[str]) -> list[str]:
    """``CREATE INDEX`` for the indexes of ``table`` (as tables.py defines them) the database lacks."""
    present = {index["name"] for index in sa.inspect(connection).get_indexes(table.name)}
    wanted = {str(index.name): index for index in table.indexes}
    return [
        str(sa.schema.CreateIndex(wanted[name]).compile(dialect=connection.dialect))
        for name in names
        if name not in present
    ]


def create_missing(connection: sa.Connection, table: sa.Table) -> list[str]:
    """``CREATE TABLE`` and ``CREATE INDEX`` for what of ``table`` the database lacks.

    MySQL and MariaDB commit each of them by itself: a run cut short after the table was created
    left it without some of its indexes, and the next run adds those.
    """
    dialect = connection.dialect
    if not sa.inspect(connection).has_table(table.name):
        created = [str(sa.schema.CreateTable(table).compile(dialect=dialect))]
        return created + [str(sa.schema.CreateIndex(index).compile(dialect=dialect)) for index in table.indexes]
    return _add_indexes(connection, table, sorted(str(index.name) for index in table.indexes))


def created_what(statement: str) -> str:
    """What a CREATE statement makes: "index ix_jobqueue_flow_served"."""
    found = re.search(r"\b(TABLE|INDEX)\s+(\S+)", statement)
    return f"{found.group(1).lower()} {found.group(2)}" if found else statement.strip()


def lacking(connection: sa.Connection, tables: Tables) -> tuple[list[str], list[str]]:
    """What of the current schema the database lacks (dropped by hand): the tables and indexes
    that `db init` creates again ("index ix_..."), and the columns it does not ("jobqueue_flow.x")."""
    inspector = sa.inspect(connection)
    created: list[str] = []
    columns: list[str] = []
    for table in tables.metadata.sorted_tables:
        created += [created_what(statement) for statement in create_missing(connection, table)]
        if inspector.has_table(table.name):
            present = {column["name"] for column in inspector.get_columns(table.name)}
            columns += [f"{table.name}.{name}" for name in table.c.keys() if name not in present]
    return created, columns


def _to_3(connection: sa.Connection, tables: Tables) -> list[str]:
    return _add_indexes(connection, tables.message, [f"ix_{tables.prefix}message_partition"])


def _to_4(connection: sa.Connection, tables: Tables) -> list[str]:
    flowed = ["flow_key", "concurrency_limit", "rate_interval_us"]
    statements = _add_columns(connection, tables.message, flowed) + _add_columns(connection, tables.archive, flowed)
    statements += create_missing(connection, tables.flow)
    dialect = connection.dialect
    p = tables.prefix
    for name in (f"ix_{p}message_ready", f"ix_{p}message_ready_queue"):
        index = next(i for i in tables.message.indexes if i.name == name)
        if index.dialect_kwargs.get(f"{dialect.name}_where") is not None:
            # Partial on this database: the ready indexes now leave out messages with a flow key.
            statements.append(f"DROP INDEX IF EXISTS {name}")
            statements.append(str(sa.schema.CreateIndex(index).compile(dialect=dialect)))
    flow_indexes = [f"ix_{p}message_flow_ready", f"ix_{p}message_flow_state"]
    return statements + _add_indexes(connection, tables.message, flow_indexes)


def _to_5(connection: sa.Connection, tables: Tables) -> list[str]:
    return [
        s
        for table in (tables.topic, tables.topic_group, tables.topic_message)
        for s in create_missing(connection, table)
    ]


def _exact(connection: sa.Connection, changed: list[tuple[sa.Table, list[str]]]) -> list[str]:
    """On MySQL and MariaDB, give the ``changed`` columns of each table the binary collation of
    tables.ExactText: one ALTER per table, which rebuilds it. Run again, it changes nothing.
    Elsewhere text already compares exactly: nothing to do."""
    if connection.dialect.name not in ("mysql", "mariadb"):
        return []
    statements = []
    for table, names in changed:
        changes = []
        for name in names:
            column = table.c[name]
            kind = column.type.compile(dialect=connection.dialect)
            changes.append(f"MODIFY COLUMN {name} {kind}{'' if column.nullable else ' NOT NULL'}")
        statements.append(f"ALTER TABLE {table.name} " + ", ".join(changes))
    return statements


def _to_6(connection: sa.Connection, tables: Tables) -> list[str]:
    keys = ["unique_key", "partition_key", "flow_key"]
    return _exact(connection, [(tables.message, keys), (tables.archive, keys), (tables.flow, ["flow_key"])])


def _to_7(connection: sa.Connection, tables: Tables) -> list[str]:
    named = ["task_name", "queue"]
    return _exact(
        connection,
        [
            (tables.message, named),
            (tables.archive, named),
            (tables.worker, ["queues"]),
            (tables.topic, ["name"]),
            (tables.topic_group, ["topic", "group_name"]),
            (tables.topic_message, ["topic"]),
        ],
    )


MIGRATIONS = (
    Migration(
        2,
        "worker rows tell which job each process runs, since when, and how many it has done; "
        "each schema version records the release that applied it",
        _to_2,
    ),
    Migration(3, "an index that lets messages with a partition key run one at a time, in order", _to_3),
    Migration(
        4,
        "concurrency keys, concurrency limits and rate limits: a flow key and its limits on each job, "
        "a table of flow keys, and indexes that acquire each key's jobs by themselves",
        _to_4,
    ),
    Migration(
        5,
        "topics with consumer groups: a log of published messages, each topic's groups and their watermarks",
        _to_5,
    ),
    Migration(
        6,
        "keys (unique, partition, concurrency, rate) compare exactly on MySQL and MariaDB, "
        "as on PostgreSQL and SQLite: case, accents, emoji and trailing spaces tell keys apart",
        _to_6,
    ),
    Migration(
        7,
        "names (of tasks, queues, topics and consumer groups) compare exactly on MySQL and MariaDB, "
        "as on PostgreSQL and SQLite: 'emails' and 'Emails' are two queues",
        _to_7,
    ),
)
assert MIGRATIONS[-1].version == SCHEMA_VERSION, "the newest migration must reach SCHEMA_VERSION"


def installed_version(connection: sa.Connection, tables: Tables) -> int | None:
    """The schema version recorded in the database, or None if there is none (no tables)."""
    if not sa.inspect(connection).has_table(tables.schema_version.name):
        return None
    value = connection.execute(sa.select(sa.func.max(tables.schema_version.c.version))).scalar()
    return int(value) if value is not None else None


def _applied_by(connection: sa.Connection, tables: Tables, version: int) -> str | None:
    """The release that applied ``version`` (recorded from schema 2 on)."""
    sv = tables.schema_version
    if "applied_by" not in {c["name"] for c in sa.inspect(connection).get_columns(sv.name)}:
        return None
    return connection.execute(
        sa.select(sa.literal_column("applied_by")).select_from(sv).where(sv.c.version == version)
    ).scalar()


def newer_error(connection: sa.Connection, tables: Tables, version: int) -> SchemaError:
    release = _applied_by(connection, tables, version)
    install = f"pip install 'jobqueue>={release}'" if release else "pip install -U jobqueue"
    return SchemaError(
        f"the jobqueue tables ({tables.prefix}*) are at schema version {version}, newer than this "
        f"release's {SCHEMA_VERSION} (jobqueue {_release()}); upgrade jobqueue: {install}"
    )


def missing_error(tables: Tables, schema_command: str | None = None) -> SchemaError:
    """The error for a database without the jobqueue tables, naming the command that creates them.

    ``schema_command``: the command that creates and upgrades the tables where the application
    manages them itself (``python manage.py migrate`` under Django); None names jobqueue's own.
    """
    command = f"`{schema_command}`" if schema_command else "`jobqueue db init` (or app.init_schema())"
    return SchemaError(
        f"the jobqueue tables ({tables.prefix}*) do not exist in this database; run {command} to create them"
    )


def unversioned(connection: sa.Connection, tables: Tables, version: int | None) -> bool:
    """Whether the tables exist though they record no schema version (its row deleted by hand)."""
    return version is None and sa.inspect(connection).has_table(tables.message.name)


def unversioned_error(tables: Tables, schema_command: str | None = None) -> SchemaError:
    """The error for jobqueue tables whose schema version row is gone (deleted by hand)."""
    command = f"`{schema_command}`" if schema_command else "`jobqueue db init`"
    return SchemaError(
        f"the jobqueue tables ({tables.prefix}*) exist but record no schema version (their "
        f"{tables.schema_version.name} row was deleted?): if they are this release's, {command} records it, "
        "after creating what they lack and naming any column to add by hand"
    )


def older_error(tables: Tables, version: int, schema_command: str | None = None) -> SchemaError:
    """The error for tables of an older schema version, naming the command that upgrades them."""
    command = f"`{schema_command}`" if schema_command else "`jobqueue db upgrade`"
    return SchemaError(
        f"the jobqueue tables ({tables.prefix}*) are at schema version {version}, this "
        f"release needs {SCHEMA_VERSION}; run {command} (see docs/upgrading.md)"
    )


def _release() -> str:
    from jobqueue.version import __version__

    return __version__


def pending(connection: sa.Connection, tables: Tables, schema_command: str | None = None) -> list[Migration]:
    """The migrations a database still needs, in order; SchemaError if it has no tables or is newer."""
    version = installed_version(connection, tables)
    if version is None:
        if unversioned(connection, tables, version):
            raise unversioned_error(tables, schema_command)
        raise missing_error(tables, schema_command)
    if version > SCHEMA_VERSION:
        raise newer_error(connection, tables, version)
    return [migration for migration in MIGRATIONS if migration.version > version]


def stamp(connection: sa.Connection, tables: Tables, version: int) -> None:
    """Record ``version`` as applied, by this release."""
    connection.execute(
        sa.insert(tables.schema_version), {"version": version, "applied_at": utcnow(), "applied_by": _release()}
    )


def stamp_sql(connection: sa.Connection, tables: Tables, version: int) -> str:
    """:func:`stamp` as SQL to run by hand (the time is the database's own when it runs)."""
    statement = sa.insert(tables.schema_version).values(
        version=version, applied_at=sa.func.current_timestamp(), applied_by=_release()
    )
    return str(statement.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True}))


def upgrade(engine: sa.Engine, tables: Tables, dry_run: bool = False, schema_command: str | None = None) -> list[str]:
    """Bring the database to SCHEMA_VERSION; return what was run (or, with ``dry_run``, would be).

    Each step runs in a transaction of its own and is recorded as it ends, so an interrupted
    upgrade resumes where it stopped.
    """
    done: list[str] = []
    dialect = dialect_for(engine, tables)
    with engine.connect() as connection:
        dialect.check_server(connection)
        steps = pending(connection, tables, schema_command)
        connection.rollback()
        for migration in steps:
            for attempt in range(1, STEP_TRIES + 1):
                try:
                    done += _step(connection, dialect, tables, migration, dry_run)
                    break
                except sa.exc.DBAPIError as exc:
                    if dialect.classify(exc) != CONTENTION:
                        raise
                    if attempt == STEP_TRIES:
                        raise SchemaError(
                            f"the upgrade to schema {migration.version} found the jobqueue tables locked by another "
                            f"session {STEP_TRIES} times ({first_line(exc)}): a long "
                            "transaction that touched them (an application's that enqueued, or a session left "
                            "open), which holds their lock until it ends; end it, then run the upgrade again "
                            "(it goes on from this step)"
                        ) from exc
                    # Each try waits for the lock a moment only: enqueues queue behind a waiting
                    # ALTER, and must not wait out another session's transaction with it.
                    logger.warning(
                        "upgrade to schema %s: the tables are locked by another session (%s); trying again",
                        migration.version,
                        first_line(exc),
                    )
                    time.sleep(STEP_RETRY_PAUSE_SECONDS)
    return done


def _step(connection: sa.Connection, dialect: Any, tables: Tables, migration: Migration, dry_run: bool) -> list[str]:
    """One migration in a transaction of its own (as far as the database's DDL allows), recorded
    as it ends; the SQL it ran (or, with ``dry_run``, would run)."""
    # Several upgrades at once take turns; one that finds a step done by another skips it.
    lock = contextlib.nullcontext() if dry_run else dialect.schema_lock(connection)
    with connection.begin(), lock:
        if not dry_run and (installed_version(connection, tables) or 0) >= migration.version:
            return []
        statements = migration.statements(connection, tables)
        done = [f"-- {migration.version}: {migration.description}", *(f"{statement};" for statement in statements)]
        if dry_run:  # what records the step: without it, SQL applied by hand reads as undone
            return [*done, f"{stamp_sql(connection, tables, migration.version)};"]
        with dialect.brief_lock_waits(connection):
            for statement in statements:
                connection.exec_driver_sql(statement)
        stamp(connection, tables, migration.version)
    return done


def upgrade_on(connection: sa.Connection, tables: Tables) -> list[str]:
    """:func:`upgrade` inside the caller's transaction (a Django migration's)."""
    done: list[str] = []
    for migration in pending(connection, tables):
        for statement in migration.statements(connection, tables):
            connection.exec_driver_sql(statement)
            done.append(statement)
        stamp(connection, tables, migration.version)
    return done
