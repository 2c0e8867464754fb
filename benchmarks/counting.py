"""Count the statements every process of a benchmark worker runs (JOBQUEUE_BENCH_COUNT=directory).

Each statement appends its first word to ``<directory>/<pid>`` (``ACQUIRE`` for an acquire of
messages, prepared or not): fine for an idle worker, which runs few; not
meant for throughput runs. sqlite3's trace callback sees every statement (the
supervisor's raw ``PRAGMA data_version`` polls included), and so does a cursor class on psycopg2
(acquire runs on the driver there); on MySQL SQLAlchemy's events do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event


def install(directory: str) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)

    full = bool(os.environ.get("JOBQUEUE_BENCH_COUNT_FULL"))
    prepared: dict[str, str] = {}  # the word a prepared statement is counted as, by its name

    def record(statement: str) -> None:
        words = statement.strip().split(None, 2)
        first = words[0].upper() if words else "?"
        upper = statement.upper()
        # An acquire takes messages with SKIP LOCKED; the flow step (which keys may start) and the
        # supervisor's lease renewal lock with it too, and are not acquires.
        acquire = "SKIP LOCKED" in upper and "FROM JOBQUEUE_FLOW" not in upper and "SET LEASE_EXPIRES_AT" not in upper
        if first == "PREPARE" and len(words) > 1:
            prepared[words[1]] = "ACQUIRE" if acquire else "EXECUTE"
            word = first
        elif first == "EXECUTE" and len(words) > 1:
            word = prepared.get(words[1].split("(")[0], first)
        else:
            word = "ACQUIRE" if acquire else first
        if full:  # JOBQUEUE_BENCH_COUNT_FULL=1: the statement's first 200 characters after the word
            word += " " + " ".join(statement.split())[:200]
        with open(os.path.join(directory, str(os.getpid())), "a") as out:
            out.write(word + "\n")

    @event.listens_for(sa.engine.Engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        if hasattr(dbapi_connection, "set_trace_callback"):
            dbapi_connection.set_trace_callback(record)
        elif type(dbapi_connection).__module__.startswith("psycopg2"):
            # Every cursor, SQLAlchemy's and the driver-level hot paths' (acquire, delay()) alike.
            import psycopg2.extensions

            class CountingCursor(psycopg2.extensions.cursor):
                def execute(self, query: Any, vars: Any = None) -> Any:
                    record(query if isinstance(query, str) else query.decode())
                    return super().execute(query, vars)

            dbapi_connection.cursor_factory = CountingCursor

    @event.listens_for(sa.engine.Engine, "before_cursor_execute")
    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if conn.dialect.name == "mysql":
            record(statement)


def counts(directory: str, word: str | None = None) -> dict[int, int]:
    """Statements so far per process id (only those counted as ``word``, if given)."""
    out = {}
    for path in Path(directory).glob("*"):
        out[int(path.name)] = sum(1 for line in open(path) if word is None or line.split(None, 1)[0] == word)
    return out
