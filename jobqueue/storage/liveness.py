"""Pooled connections that the server closed while they sat idle, found before they are used.

A database restart, a failover, a proxy or firewall that drops idle connections, or a server's own
idle timeout closes the connections an engine's pool keeps; the next statement on each of them
would fail (``server closed the connection unexpectedly``, ``Lost connection to server``), so the
first ``delay()`` of a web request or the first page of the dashboard after a restart would fail
though the database answers. A connection that has been idle in the pool for ``IDLE_SECONDS`` or
more is pinged as it is handed out (one round trip: ``SELECT 1`` on PostgreSQL, the protocol's ping
on MySQL and MariaDB); one that does not answer is replaced by a new connection, as SQLAlchemy's
``pool_pre_ping`` does, but only when the connection may have gone stale: a connection in use
every moment (an enqueue loop, a worker's batches) is never pinged.

Worker processes and their supervisor turn it off for their engine (:func:`trust_idle_connections`):
they recover from a lost connection by themselves, and an idle worker's polls would pay a ping each.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

IDLE_SECONDS = 1.0
_RETURNED = "jobqueue_returned_at"  # in a connection record's info: when it was last checked in


class _Liveness:
    """The checkin and checkout listeners of one engine's pool."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self.dialect = dialect
        self.idle_seconds: float | None = IDLE_SECONDS

    def checkin(self, _dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_RETURNED] = time.monotonic()

    def checkout(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get(_RETURNED)
        if self.idle_seconds is None or returned is None or time.monotonic() - returned < self.idle_seconds:
            return
        try:
            self.dialect.do_ping(dbapi_connection)
        except self.dialect.loaded_dbapi.Error as exc:
            if self.dialect.is_disconnect(exc, dbapi_connection, None):
                # The pool closes this connection and hands out a new one.
                raise sa.exc.DisconnectionError(f"an idle pooled connection was closed by the server: {exc}") from exc
            raise


_ENGINES: weakref.WeakKeyDictionary[sa.Engine, _Liveness] = weakref.WeakKeyDictionary()


def check_idle_connections(engine: sa.Engine) -> None:
    """Ping ``engine``'s pooled connections that were idle for IDLE_SECONDS before handing them out."""
    if engine in _ENGINES:
        return
    liveness = _ENGINES[engine] = _Liveness(engine.dialect)
    event.listen(engine, "checkin", liveness.checkin)
    event.listen(engine, "checkout", liveness.checkout)


def trust_idle_connections(engine: sa.Engine) -> None:
    """Stop pinging ``engine``'s idle connections (a worker's: it handles a lost connection itself)."""
    liveness = _ENGINES.get(engine)
    if liveness is not None:
        liveness.idle_seconds = None
