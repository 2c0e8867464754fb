"""The jobqueue tables, built with SQLAlchemy Core for any table prefix.

``message`` holds PENDING, PROCESSING and RETRYABLE rows; ``archive`` COMPLETED, FAILED and CANCELLED
ones (history and dead-letter queue); ``worker`` one row per live worker process; ``flow`` one row
per concurrency key (or rate-limited task), where acquisitions of that key take turns;
``topic``, ``topic_group`` and ``topic_message`` a topic's name, its consumer groups (with each
group's watermark) and its log of published messages; and ``schema_version`` one row per version
installed (by ``jobqueue db init`` or ``db upgrade``).
Timestamps are naive UTC.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles

from jobqueue.job import READY_STATES

# The version of the layout below. Raising it takes a numbered migration in storage.migrations that
# brings a database of the version before up to it (and a Django migration that runs it).
SCHEMA_VERSION = 7

_MYSQL = ("mysql", "mariadb")
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # INTEGER PRIMARY KEY is SQLite's rowid
MAX_ID = 2**63 - 1  # the largest id every database can hold (a signed 64-bit integer); none is above
Blob = sa.LargeBinary().with_variant(mysql.LONGBLOB(), *_MYSQL)  # BLOB stops at 64 KiB on MySQL
LongText = sa.Text().with_variant(mysql.MEDIUMTEXT(), *_MYSQL)
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *_MYSQL)  # DATETIME drops microseconds
Json = sa.JSON(none_as_null=True)  # None is SQL NULL, not the JSON text 'null' (parsed back on every read)


class ExactText(sa.String):
    """Text compared exactly, as written, as PostgreSQL and SQLite compare it.

    MySQL's and MariaDB's default collations hold "Acme", "acme", "acmé" and "acme " equal, and
    every emoji equal to every other. There these columns get a binary collation that does not pad
    trailing spaces (see :func:`exact_collation`).
    """


class Key(ExactText):
    """A key (unique, partition, concurrency or rate key), compared exactly from schema 6: two jobs
    with keys the database held equal would be taken for one, two tenants would share one
    concurrency slot."""


class Name(ExactText):
    """The name of a task, queue, topic or consumer group, compared exactly from schema 7: a
    worker of the queue "emails" would take the jobs of "Emails", a unique key of the task
    "app.send" would hold back the jobs of "app.Send", and two topics would share their groups."""


def exact_collation(dialect: sa.Dialect) -> str | None:
    """The binary collation that does not pad, on the MySQL or MariaDB server of ``dialect``; None
    before it has connected through a ``mysql://`` URL, which names MariaDB servers too."""
    if getattr(dialect, "is_mariadb", False):
        return "utf8mb4_nopad_bin"
    if dialect.server_version_info is None:
        return None
    if dialect.server_version_info >= (8, 0, 17):
        return "utf8mb4_0900_bin"
    return "utf8mb4_bin"  # MySQL before 8.0.17 has no binary collation that does not pad: trailing spaces are ignored


# DDL printed without a connection (Alembic's --sql, a mock engine) may run on either server, and
# each takes its clause from its own kind of executable comment: MySQL 8.0.17 and later run
# /*!80017 ...*/, which MariaDB skips (it leaves versions 50700 to 99999 to MySQL); MariaDB runs
# /*M! ...*/, a plain comment to MySQL. MySQL before 8.0.17 runs neither: its tables are made by
# `jobqueue db init`, connected.
_EITHER_SERVER = "/*!80017 COLLATE utf8mb4_0900_bin */ /*M! COLLATE utf8mb4_nopad_bin */"


@compiles(ExactText, "mysql")
@compiles(ExactText, "mariadb")
def _exact_on_mysql(text: ExactText, compiler: sa.sql.compiler.TypeCompiler, **kw: object) -> str:
    kind = f"VARCHAR({text.length})" if text.length is not None else "TEXT"
    collation = exact_collation(compiler.dialect)
    return f"{kind} {_EITHER_SERVER if collation is None else f'COLLATE {collation}'}"


# Names joined by commas (the queues a worker serves): compared as names are, from schema 7.
Names = sa.Text().with_variant(Name(), *_MYSQL)


_READY_STATES = "state IN ({})".format(", ".join(f"'{state}'" for state in READY_STATES))
_READY = sa.text(_READY_STATES)
# Messages of a concurrency key (or a rate-limited task) are acquired their own way, key by key:
# the main ready indexes hold only the others.
_READY_FREE = sa.text(f"{_READY_STATES} AND flow_key IS NULL")
_FLOW_READY = sa.text(f"{_READY_STATES} AND flow_key IS NOT NULL")
_FLOWED = sa.text("flow_key IS NOT NULL")
_PROCESSING = sa.text("state = 'PROCESSING'")


def notify_channel(prefix: str) -> str:
    """The PostgreSQL channel the message table's insert trigger notifies."""
    return f"{prefix}new"


def postgresql_notify_ddl(prefix: str) -> list[str]:
    """The trigger that wakes idle workers on PostgreSQL; `db init` runs it (add it to Alembic too).

    Statement-level: one notification per INSERT statement however many rows, delivered at COMMIT.
    """
    return [
        f"CREATE OR REPLACE FUNCTION {prefix}notify() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN PERFORM pg_notify('{notify_channel(prefix)}', ''); RETURN NULL; END $$",
        f"DROP TRIGGER IF EXISTS {prefix}message_notify ON {prefix}message",
        f"CREATE TRIGGER {prefix}message_notify AFTER INSERT ON {prefix}message "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {prefix}notify()",
    ]


@dataclass(frozen=True)
class Tables:
    metadata: sa.MetaData
    message: sa.Table
    archive: sa.Table
    worker: sa.Table
    schema_version: sa.Table
    prefix: str
    flow: sa.Table
    topic: sa.Table
    topic_group: sa.Table
    topic_message: sa.Table


def _job_columns() -> list[sa.Column[object]]:
    """Columns that a message and its archive row share."""
    return [
        sa.Column("task_name", Name(255), nullable=False),
        sa.Column("queue", Name(100), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("payload", Blob, nullable=False),
        sa.Column("headers", Json),
        sa.Column("unique_key", Key(255)),
        sa.Column("partition_key", Key(255)),
        # The concurrency key, or "task:<name>", and its limits as the task declared them when the
        # job was enqueued (schema 4).
        sa.Column("flow_key", Key(255)),
        sa.Column("concurrency_limit", sa.Integer),
        sa.Column("rate_interval_us", sa.BigInteger),  # microseconds between two starts
        sa.Column("checkpoint", Blob),
        sa.Column("options", Json),
        sa.Column("history", Json),
        sa.Column("attempts_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("deliveries_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("first_attempt_at", Timestamp),
        sa.Column("last_attempt_at", Timestamp),
    ]


def build_tables(prefix: str = "jobqueue_", metadata: sa.MetaData | None = None) -> Tables:
    """Return the jobqueue tables named with ``prefix``, attached to ``metadata`` (a new one if None)."""
    md = metadata if metadata is not None else sa.MetaData()
    message = sa.Table(
        f"{prefix}message",
        md,
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        *_job_columns(),
        sa.Column("next_attempt_at", Timestamp, nullable=False),
        sa.Column("acquired_at", Timestamp),
        sa.Column("lease_expires_at", Timestamp),
        sa.Column("lease_token", sa.BigInteger),
        sa.Column("worker_id", sa.String(32)),
        sa.Column("last_error_type", sa.String(255)),
        sa.Column("last_error_message", LongText),
        sa.Column("last_error_traceback", LongText),
        # AUTOINCREMENT: never reuse the id of a deleted (archived) row, or the archive would collide.
        sqlite_autoincrement=True,
        mysql_charset="utf8mb4",
    )
    # Acquire walks one of these in order and stops after LIMIT rows: no sort of the backlog.
    # PostgreSQL and SQLite index only ready rows; MySQL has no partial indexes and skips the few
    # PROCESSING rows and rows with a flow key it meets. A flow key's ready messages have an index
    # of their own (its running ones are counted on the next one): one range of it per key.
    delivery_order = (message.c.priority.desc(), message.c.next_attempt_at, message.c.id)
    for name, leading, where in (
        ("ready_queue", [message.c.queue], _READY_FREE),
        ("ready", [], _READY_FREE),
        ("flow_ready", [message.c.flow_key], _FLOW_READY),
    ):
        sa.Index(f"ix_{prefix}message_{name}", *leading, *delivery_order, postgresql_where=where, sqlite_where=where)
    sa.Index(
        f"ix_{prefix}message_flow_state",
        message.c.flow_key,
        message.c.state,
        postgresql_where=_FLOWED,
        sqlite_where=_FLOWED,
    )
    sa.Index(
        f"ix_{prefix}message_lease",
        message.c.state,
        message.c.lease_expires_at,
        postgresql_where=_PROCESSING,
        sqlite_where=_PROCESSING,
    )
    # A message with a partition key runs only when no active message of its key is older: one
    # probe of this index per candidate of the ready walk.
    _partitioned = sa.text("partition_key IS NOT NULL")
    sa.Index(
        f"ix_{prefix}message_partition",
        message.c.partition_key,
        message.c.id,
        postgresql_where=_partitioned,
        sqlite_where=_partitioned,
    )
    # metadata.create_all (an application's own Alembic or tests) creates the trigger too.
    for statement in postgresql_notify_ddl(prefix):
        ddl = sa.DDL(statement)  # type: ignore[no-untyped-call]
        sa.event.listen(message, "after_create", ddl.execute_if(dialect="postgresql"))
    # One active message per (task, unique_key). Partial where the database allows it, so that the
    # many messages without a key add no entry to it on enqueue or on any update.
    _keyed = sa.text("unique_key IS NOT NULL")
    sa.Index(
        f"uq_{prefix}message_unique",
        message.c.task_name,
        message.c.unique_key,
        unique=True,
        postgresql_where=_keyed,
        sqlite_where=_keyed,
    )

    archive = sa.Table(
        f"{prefix}archive",
        md,
        # The message id: a job has at most one archive row, so it can never be archived twice.
        sa.Column("id", Id, primary_key=True, autoincrement=False),
        *_job_columns(),
        sa.Column("finished_at", Timestamp),
        sa.Column("archived_at", Timestamp, nullable=False),
        sa.Column("result", Blob),
        sa.Column("error_type", sa.String(255)),
        sa.Column("error_message", LongText),
        sa.Column("error_traceback", LongText),
        mysql_charset="utf8mb4",
    )
    sa.Index(f"ix_{prefix}archive_archived_at", archive.c.archived_at)
    sa.Index(f"ix_{prefix}archive_state", archive.c.state, archive.c.archived_at)
    sa.Index(
        f"ix_{prefix}archive_unique",
        archive.c.task_name,
        archive.c.unique_key,
        postgresql_where=_keyed,
        sqlite_where=_keyed,
    )

    worker = sa.Table(
        f"{prefix}worker",
        md,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("supervisor_id", sa.String(32), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("queues", Names),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("heartbeat_at", Timestamp, nullable=False),
        sa.Column("version", sa.String(32)),
        # What the process is doing, as of its last heartbeat (schema 2).
        sa.Column("running_job_id", sa.BigInteger),
        sa.Column("running_since", Timestamp),
        sa.Column("jobs_done", sa.Integer, nullable=False, server_default="0"),
        mysql_charset="utf8mb4",
    )
    schema_version = sa.Table(
        f"{prefix}schema_version",
        md,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("applied_at", Timestamp, nullable=False),
        sa.Column("applied_by", sa.String(32)),  # the jobqueue release that applied it (schema 2)
        mysql_charset="utf8mb4",
    )
    # One row per flow key: acquisitions of a key lock its row (so that they count its running
    # messages one at a time), keys are served in turn (served_at), and a rate limit keeps the time
    # the key's next start is allowed (next_start_at).
    flow = sa.Table(
        f"{prefix}flow",
        md,
        sa.Column("flow_key", Key(255), primary_key=True),
        sa.Column("served_at", Timestamp, nullable=False),
        sa.Column("next_start_at", Timestamp),
        mysql_charset="utf8mb4",
    )
    sa.Index(f"ix_{prefix}flow_served", flow.c.served_at)
    topic, topic_group, topic_message = _topic_tables(prefix, md)
    return Tables(md, message, archive, worker, schema_version, prefix, flow, topic, topic_group, topic_message)


def _topic_tables(prefix: str, md: sa.MetaData) -> tuple[sa.Table, sa.Table, sa.Table]:
    """Topics (schema 5). A published message is one row of ``topic_message`` (the log, never
    updated) plus, in the same transaction, one delivery per consumer group: a message row whose
    task is the group's and whose unique key is the log id, zero-padded so that keys sort as ids.

    Publishers share-lock their topic's row while they read its groups, and a group being added
    locks it exclusively: a group is added between two publishes, never in the middle of one.
    """
    topic = sa.Table(
        f"{prefix}topic",
        md,
        sa.Column("name", Name(100), primary_key=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("groups_changed_at", Timestamp, nullable=False),
        mysql_charset="utf8mb4",
    )
    topic_group = sa.Table(
        f"{prefix}topic_group",
        md,
        sa.Column("topic", Name(100), primary_key=True),
        sa.Column("group_name", Name(100), primary_key=True),
        sa.Column("start", sa.String(10), nullable=False),  # "latest" or "earliest", as first registered
        # The group's watermark: it has finished every message of the log up to this id. Messages at
        # or below every group's watermark are deleted from the log.
        sa.Column("finished_id", sa.BigInteger, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        mysql_charset="utf8mb4",
    )
    topic_message = sa.Table(
        f"{prefix}topic_message",
        md,
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("topic", Name(100), nullable=False),
        sa.Column("message_key", sa.String(255)),
        sa.Column("payload", Blob, nullable=False),
        sa.Column("headers", Json),
        sa.Column("published_at", Timestamp, nullable=False),
        sqlite_autoincrement=True,
        mysql_charset="utf8mb4",
    )
    sa.Index(f"ix_{prefix}topic_message_topic", topic_message.c.topic, topic_message.c.id)
    return topic, topic_group, topic_message
