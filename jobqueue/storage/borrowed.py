"""Engines over someone else's DB-API connection: Django's, inside Django's transaction.

The dialects here are SQLAlchemy's own with one difference: they never begin, commit, roll back or
close the connection, and add nothing to it when they first see it (no type casters, no SQL
functions, no ``SET NAMES``). The owner (Django) does all of that, so a job written through such an
engine commits or rolls back with the owner's work, exactly like the owner's own rows.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.mysql.mysqldb import MySQLDialect_mysqldb
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

DRIVER = "jobqueue_borrowed"


class _Borrowing:
    """Leave the owner's connection as it is."""

    def on_connect(self) -> None:
        return None

    def do_begin(self, dbapi_connection: Any) -> None:
        pass

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_close(self, dbapi_connection: Any) -> None:
        pass


class BorrowedPsycopg2(_Borrowing, PGDialect_psycopg2):
    supports_statement_cache = True


class BorrowedPsycopg(_Borrowing, PGDialect_psycopg):
    supports_statement_cache = True


class BorrowedMySQLdb(_Borrowing, MySQLDialect_mysqldb):  # type: ignore[misc]
    supports_statement_cache = True


class BorrowedSQLite(_Borrowing, SQLiteDialect_pysqlite):  # type: ignore[misc]
    supports_statement_cache = True


# backend and DB-API module name -> dialect class
DIALECTS = {
    ("postgresql", "psycopg2"): "BorrowedPsycopg2",
    ("postgresql", "psycopg"): "BorrowedPsycopg",
    ("mysql", "MySQLdb"): "BorrowedMySQLdb",
    ("sqlite", "sqlite3"): "BorrowedSQLite",
}
for (_backend, _module), _name in DIALECTS.items():
    registry.register(f"{_backend}.{DRIVER}_{_module.lower()}", __name__, _name)


def borrowed_engine(backend: str, dbapi_module: str, get_connection: Callable[[], Any]) -> sa.Engine:
    """An engine whose every connection is ``get_connection()``, the owner's current DB-API connection.

    ``backend`` is "postgresql", "mysql" or "sqlite"; ``dbapi_module`` the owner's driver module name
    (psycopg2, psycopg, MySQLdb, sqlite3).
    """
    if (backend, dbapi_module) not in DIALECTS:
        from jobqueue.errors import ConfigurationError

        raise ConfigurationError(
            f"jobqueue cannot write through a {backend} connection of the {dbapi_module} driver; "
            "supported: psycopg2 and psycopg (PostgreSQL), mysqlclient (MySQL), sqlite3"
        )
    url = sa.URL.create(f"{backend}+{DRIVER}_{dbapi_module.lower()}")
    engine = sa.create_engine(url, creator=get_connection, poolclass=sa.pool.NullPool, pool_reset_on_return=None)
    BORROWED.add(engine)
    return engine


# The engines made here: their connections are a framework's own, on the queue's database by
# construction (its URL is made from the framework's settings), which an enqueue need not check.
BORROWED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
