"""The jobqueue tables for an application's own Alembic migrations.

``metadata`` holds the tables with the default ``jobqueue_`` prefix. In ``env.py``::

    from jobqueue.schema import metadata as jobqueue_metadata
    target_metadata = [app_metadata, jobqueue_metadata]

With another prefix use ``build_tables(prefix).metadata``. ``jobqueue db init`` creates the same
tables and also records ``SCHEMA_VERSION`` in ``<prefix>schema_version``, which workers check:
an Alembic migration should insert that row too. On PostgreSQL, run the statements of
``postgresql_notify_ddl(prefix)`` as well: the trigger that wakes idle workers at once.
"""

from __future__ import annotations

from jobqueue.storage.tables import SCHEMA_VERSION, Tables, build_tables, postgresql_notify_ddl

tables = build_tables()
metadata = tables.metadata

__all__ = ["metadata", "tables", "build_tables", "postgresql_notify_ddl", "Tables", "SCHEMA_VERSION"]
