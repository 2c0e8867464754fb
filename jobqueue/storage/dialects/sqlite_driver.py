"""SQLite: statements compiled once and run on the driver itself, inside the one write lock."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

# Archive copies go in statements of up to this many rows (13 values each), padded with rows of
# NULLs to a power of two, so that a handful of statements is prepared and cached.
COPY_ROWS_MOST = 256
# Ids go in IN lists of up to this many, padded with NULLs (which match nothing) to a power of two,
# so that a handful of statements is prepared and cached, not one per length.
ID_LIST_MOST = 512


class JsonList(sa.types.TypeDecorator[Any]):
    """A list bound as its JSON text, for json_each."""

    impl = sa.String
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return None if value is None else json.dumps(list(value))


class DriverStatement:
    """A statement compiled once for the driver itself: its SQL, the names of its columns, and
    its values from a statement's binds (converted as SQLAlchemy would). ``expanding`` says that
    it takes a list expanded per call, which SQL compiled once cannot."""

    def __init__(self, statement: Any, dialect: sa.Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.names = tuple(compiled.positiontup or ())
        self.expanding = any(compiled.binds[name].expanding for name in self.names)
        self.processors = tuple(compiled.binds[name].type._cached_bind_processor(dialect) for name in self.names)
        # Values the statement carries itself (a literal such as the 1 added to a count).
        self.carried = {key: value for key, value in compiled.params.items() if not compiled.binds[key].required}
        self.columns = tuple(column[0] for column in compiled._result_columns)

    def values(self, binds: dict[str, Any]) -> tuple[Any, ...]:
        binds = {**self.carried, **binds}
        return tuple(
            binds[name] if process is None else process(binds[name])
            for name, process in zip(self.names, self.processors, strict=True)
        )


def execute_on_driver(connection: sa.Connection, sql: str, values: tuple[Any, ...]) -> sqlite3.Cursor:
    """``sql`` executed on ``connection``'s driver connection, its cursor returned (rows read as the
    driver gives them); an error is raised as SQLAlchemy raises a statement's, so that it is
    classified and handled alike. Inside the write lock, which the other processes wait for,
    SQLAlchemy's own execution and result rows cost as much as some of SQLite's work."""
    driver: Any = connection.connection.driver_connection
    try:
        return driver.execute(sql, values)  # type: ignore[no-any-return]
    except sqlite3.Error as exc:
        raise sa.exc.DBAPIError.instance(sql, values, exc, sqlite3.Error) from exc


def id_lists(ids: list[int]) -> Iterator[tuple[str, tuple[int | None, ...]]]:
    """``ids`` in runs: each the "(?, ?, ...)" of its IN list, and its values."""
    for start in range(0, len(ids), ID_LIST_MOST):
        chunk: tuple[int | None, ...] = tuple(ids[start : start + ID_LIST_MOST])
        size = 1 << (len(chunk) - 1).bit_length()
        yield "(" + ", ".join("?" * size) + ")", chunk + (None,) * (size - len(chunk))
