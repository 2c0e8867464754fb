"""Pooled connections that the server closed while they sat idle, found before they are used.

A database restart, a failover, a proxy or firewall that drops idle connections, or a server's own
idle timeout closes the connections an engine's pool keeps; the next statement on each of them
would fail (``server closed the connection unexpectedly``, ``Lost connection to server``), so the
first ``delay()`` of a web request or the first page of the dashboard after a restart would fail
though the database answers. A connection that has been idle in the pool for ``IDLE_SECONDS`` or
more is pinged as it is handed out (one round trip: ``SELECT 1`` on PostgreSQL, the protocol's ping
on MySQL and MariaDB); one that does not answer is replaced by a new connection, as SQLAlchemy's
``pool_pre_ping`` does, but only when the connection may have gone stale: a connection in use
every moment (an enqueue loop, a worker's batches) is never pinged. Worker processes keep it too:
their own loop retries a lost connection, but a job's ``delay()`` or ``handle.get()`` does not; and
their loop uses its connections more often than once a second, idle or not.
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

    def checkin(self, _dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_RETURNED] = time.monotonic()

    def checkout(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get(_RETURNED)
        if returned is None or time.monotonic() - returned < IDLE_SECONDS:
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
