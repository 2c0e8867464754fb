"""One Dialect per database; :func:`dialect_for` picks it from a SQLAlchemy dialect name."""

from __future__ import annotations

from jobqueue.errors import ConfigurationError
from jobqueue.storage.dialects.base import AcquireParams, Dialect
from jobqueue.storage.dialects.mysql import MySQLDialect
from jobqueue.storage.dialects.postgresql import PostgreSQLDialect
from jobqueue.storage.dialects.sqlite import SQLiteDialect
from jobqueue.storage.tables import Tables

_DIALECTS: dict[str, type[Dialect]] = {
    "postgresql": PostgreSQLDialect,
    "sqlite": SQLiteDialect,
    "mysql": MySQLDialect,
    "mariadb": MySQLDialect,
}


def dialect_for(name: str, tables: Tables) -> Dialect:
    """Return the Dialect for SQLAlchemy dialect ``name`` over ``tables``."""
    try:
        return _DIALECTS[name](tables)
    except KeyError:
        raise ConfigurationError(
            f"unsupported database {name!r}: jobqueue runs on sqlite, postgresql and mysql/mariadb") from None


__all__ = ["AcquireParams", "Dialect", "dialect_for"]
