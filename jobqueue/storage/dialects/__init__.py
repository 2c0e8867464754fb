"""One Dialect per database; :func:`dialect_for` picks the one for an engine.

Each module is imported when its database is first used: a worker on SQLite never loads the
PostgreSQL and MySQL modules (nor SQLAlchemy's, which take a while to import).
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa

from jobqueue.errors import ConfigurationError
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.dialects.common import AcquireParams, LeaseClock, WorkerState
from jobqueue.storage.tables import Tables

_DIALECTS = {
    "postgresql": ("postgresql", "PostgreSQLDialect"),
    "sqlite": ("sqlite", "SQLiteDialect"),
    "mysql": ("mysql", "MySQLDialect"),
    "mariadb": ("mysql", "MySQLDialect"),
}


def dialect_class(name: str) -> type[Dialect]:
    """The Dialect class for a SQLAlchemy dialect or backend name ("postgresql", "sqlite", "mysql", "mariadb")."""
    if name not in _DIALECTS:
        raise ConfigurationError(
            f"unsupported database {name!r}: jobqueue runs on sqlite, postgresql and mysql/mariadb"
        )
    module, cls = _DIALECTS[name]
    dialect: type[Dialect] = getattr(importlib.import_module(f"jobqueue.storage.dialects.{module}"), cls)
    return dialect


def dialect_for(engine: sa.Engine, tables: Tables) -> Dialect:
    """Return the Dialect that runs ``tables`` on ``engine``'s database."""
    return dialect_class(engine.dialect.name)(engine, tables)


__all__ = ["AcquireParams", "Dialect", "LeaseClock", "WorkerState", "dialect_class", "dialect_for"]
