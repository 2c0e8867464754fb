"""Reading rows that may hold values their column's type cannot read (a row edited by hand)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import to_naive_utc


class Unreadable(str):
    """A stored value that cannot be read as its column's type (a row edited by hand, say),
    shown as it is stored so that one bad cell never hides the rest of a listing."""

    def __new__(cls, raw: Any) -> Unreadable:
        return super().__new__(cls, f"<unreadable: {raw!r:.200}>")


def readable_rows(conn: sa.Connection, stmt: sa.Select[Any]) -> list[dict[str, Any]]:
    """The rows of ``stmt`` as dicts; a value its column's type cannot read becomes an
    :class:`Unreadable` (the statement is then read again, each value converted on its own)."""
    try:
        return [dict(row) for row in conn.execute(stmt).mappings()]
    except (ValueError, TypeError, LookupError):  # a bad time, JSON text, or enum value
        pass
    columns = list(stmt.selected_columns)
    names = [str(column.key) for column in columns]
    untyped = [sa.type_coerce(c, sa.types.NullType()).label(name) for c, name in zip(columns, names, strict=True)]
    raw = stmt.with_only_columns(*untyped)
    readers = [c.type.dialect_impl(conn.dialect).result_processor(conn.dialect, None) for c in columns]
    found = []
    for row in conn.execute(raw):
        values: dict[str, Any] = {}
        for name, read, value in zip(names, readers, row, strict=True):
            try:
                values[name] = read(value) if read is not None and value is not None else value
            except Exception:
                values[name] = Unreadable(value)
        found.append(values)
    return found


def as_stored(column: Any) -> Any:
    """``column`` read as the driver gives it, its type's conversion left to :func:`stored_time`."""
    return sa.type_coerce(column, sa.types.NullType()).label(column.key)


def stored_time(value: Any) -> datetime | None:
    """A timestamp read :func:`as_stored`, in naive UTC as every time jobqueue compares, or None if
    it holds none: SQLite stores any value in any column, so a row edited by hand may hold text (or
    a number) where a time belongs, or a time with a UTC offset ("...T10:00:00Z")."""
    try:
        value = datetime.fromisoformat(value) if isinstance(value, str) else value
        return to_naive_utc(value) if isinstance(value, datetime) else None
    except (ValueError, OverflowError):  # OverflowError: in UTC, before year 1 or after 9999
        return None
