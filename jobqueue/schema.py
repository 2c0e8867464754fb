"""The jobqueue tables for an application's own Alembic migrations.

``metadata`` holds the tables with the default ``jobqueue_`` prefix. In ``env.py``::

    from jobqueue.schema import metadata as jobqueue_metadata
    target_metadata = [app_metadata, jobqueue_metadata]

With another prefix use ``build_tables(prefix).metadata``. Create and change these tables with
``jobqueue db init`` and ``jobqueue db upgrade`` rather than with Alembic: they also record the
schema version (``SCHEMA_VERSION``) in ``<prefix>schema_version``, which workers check, and on
PostgreSQL install the trigger that wakes idle workers at once (``postgresql_notify_ddl(prefix)``).
Compiled without a connection for a ``mysql://`` URL, which names MariaDB servers too, the name
and key columns carry both servers' collations, each in an executable comment only its server
runs (see docs/upgrading.md).
"""

from __future__ import annotations

from jobqueue.storage.tables import SCHEMA_VERSION, Tables, build_tables, postgresql_notify_ddl

tables = build_tables()
metadata = tables.metadata

__all__ = ["metadata", "tables", "build_tables", "postgresql_notify_ddl", "Tables", "SCHEMA_VERSION"]
