"""One Dialect per database; :func:`dialect_for` picks it from a SQLAlchemy dialect name.

Each module is imported when its database is first used: a worker on SQLite never loads the
PostgreSQL and MySQL modules (nor SQLAlchemy's, which take a while to import).
"""

from __future__ import annotations

import importlib

from jobqueue.errors import ConfigurationError
from jobqueue.storage.dialects.base import AcquireParams, Dialect
from jobqueue.storage.tables import Tables

_DIALECTS = {
    "postgresql": ("postgresql", "PostgreSQLDialect"),
    "sqlite": ("sqlite", "SQLiteDialect"),
    "mysql": ("mysql", "MySQLDialect"),
    "mariadb": ("mysql", "MySQLDialect"),
}


def dialect_for(name: str, tables: Tables) -> Dialect:
    """Return the Dialect for SQLAlchemy dialect ``name`` over ``tables``."""
    if name not in _DIALECTS:
        raise ConfigurationError(
            f"unsupported database {name!r}: jobqueue runs on sqlite, postgresql and mysql/mariadb")
    module, cls = _DIALECTS[name]
    dialect: type[Dialect] = getattr(importlib.import_module(f"jobqueue.storage.dialects.{module}"), cls)
    return dialect(tables)


__all__ = ["AcquireParams", "Dialect", "dialect_for"]
