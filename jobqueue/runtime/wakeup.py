"""How idle worker processes learn that new work arrived, so that they start it at once.

- PostgreSQL notifies: a statement-level trigger on the message table calls pg_notify (delivered at
  COMMIT, so a rolled-back enqueue wakes nobody). With psycopg2 each worker process LISTENs on the
  connection it acquires on (:class:`ProcessListener`): the notification wakes it directly, and the
  acquire that follows reaches a server process that is awake already. With another driver
  (psycopg 3, untested) the supervisor polls as on MySQL.
- SQLite has no notifications, but ``PRAGMA data_version`` changes whenever another connection
  commits, and reading it touches no table: the supervisor checks it every ``idle_poll_interval``.
- MySQL/MariaDB: the supervisor asks one indexed question ("is anything ready?") every
  ``idle_poll_interval`` for the whole pool, instead of every idle process polling.

Where the supervisor learns of work, it wakes one idle process per piece of news; a process whose
fetch comes back full asks for a sibling, so a burst draws in the whole pool while a trickle wakes
one process per job.
Pollers run only while some process idles. The processes keep their own slow poll
(``max_fetch_interval``) as the fallback, and for delayed jobs coming due.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from jobqueue.clock import utcnow
from jobqueue.storage.store import Store
from jobqueue.storage.tables import notify_channel

logger = logging.getLogger("jobqueue.supervisor")


class Waker:
    """Base: nothing to wait on, never says there is news."""

    def fileno(self) -> int | None:
        """A descriptor that becomes readable on news, or None."""
        return None

    def due_in(self, now: float) -> float | None:
        """Seconds until the next poll, or None when this waker does not poll."""
        return None

    def check(self, now: float) -> int:
        """Consume what arrived; how many pieces of news (0: nothing new)."""
        return 0

    def close(self) -> None:
        pass


class PollingWaker(Waker):
    """Ask the database every ``interval`` while processes idle."""

    def __init__(self, store: Store, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.next_at = 0.0
        self.last_seen: Any = None

    def due_in(self, now: float) -> float | None:
        return max(0.0, self.next_at - now)

    def check(self, now: float) -> int:
        if now < self.next_at:
            return 0
        self.next_at = now + self.interval
        try:
            return int(self.poll())
        except Exception as exc:  # an outage: the supervisor's guard reports it elsewhere
            logger.debug("idle poll failed: %s", exc)
            return 0

    def poll(self) -> bool:
        raise NotImplementedError


class SQLiteWaker(PollingWaker):
    """``PRAGMA data_version`` changes when another connection commits; reading it reads no table."""

    def __init__(self, store: Store, interval: float) -> None:
        super().__init__(store, interval)
        self.connection = store.engine.raw_connection()

    def poll(self) -> bool:
        version = self.connection.cursor().execute("PRAGMA data_version").fetchone()[0]
        # The first reading counts as news: a commit made after a process's first (empty) fetch
        # but before this reading would otherwise wait for that process's fallback poll.
        changed = self.last_seen is None or version != self.last_seen
        self.last_seen = version
        return changed

    def close(self) -> None:
        self.connection.close()


class ReadyQueryWaker(PollingWaker):
    """One indexed query for the whole pool: is any message of our queues due?"""

    def __init__(self, store: Store, interval: float, queues: tuple[str, ...] | None) -> None:
        super().__init__(store, interval)
        self.queues = queues

    def poll(self) -> bool:
        return self.store.has_ready(self.queues, utcnow())


class ProcessListener:
    """A worker process's own PostgreSQL connection: it LISTENs, and acquire runs on it.

    Every idle process listening hears every notification, so a trickle of jobs costs one empty
    acquire per extra idle process; in exchange nothing relays the news (one wake-up fewer, and
    the supervisor's own work never delays it). The main thread holds ``lock`` while it acquires
    or waits; while it runs jobs the keeper thread drains what arrives (:meth:`drain`), so that a
    long job never leaves notifications piling up on the server.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.channel = notify_channel(store.tables.prefix)
        self.fairy: Any = None
        self.lock = threading.Lock()
        self.heard = False  # drained by the keeper while a job ran

    def connection(self) -> Any:
        """The connection, LISTENing (opened again after a failure); the caller holds ``lock``."""
        if self.fairy is not None and not self.fairy.is_valid:
            self.close()
        if self.fairy is None:
            fairy = self.store.driver_connection()
            try:
                self.store.run_on_driver(lambda cursor, info: cursor.execute(f"LISTEN {self.channel}"),
                                         f"LISTEN {self.channel}", fairy)
            except BaseException:
                if fairy.is_valid:
                    fairy.invalidate()
                raise
            self.fairy = fairy  # what committed before the LISTEN, the acquire about to run sees
        return self.fairy

    def fileno(self) -> int | None:
        return self.fairy.dbapi_connection.fileno() if self.fairy is not None and self.fairy.is_valid else None

    def take_news(self) -> bool:
        """Whether anything was heard since the last call; the caller holds ``lock``."""
        heard, self.heard = self.heard, False
        return self._read() or heard

    def drain(self) -> None:
        """From the keeper thread: read what arrived while the main thread is busy elsewhere."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            if self._read():
                self.heard = True
        finally:
            self.lock.release()

    def _read(self) -> bool:
        """Read what arrived: True for a notification, or for a lost connection (look at once:
        the next acquire reconnects, or meets the outage). The caller holds ``lock``."""
        if self.fairy is None or not self.fairy.is_valid:
            return False
        try:
            raw = self.fairy.dbapi_connection
            raw.poll()
            heard = bool(raw.notifies)
            raw.notifies.clear()
            return heard
        except Exception as exc:
            logger.debug("LISTEN connection lost (%s)", exc)
            self.close()
            return True

    def close(self) -> None:
        # Closed rather than pooled, as it is still LISTENing (an invalidated one was returned already).
        if self.fairy is not None and self.fairy.is_valid:
            try:
                self.fairy.invalidate()
            except Exception:
                pass
        self.fairy = None


def process_listener(store: Store) -> ProcessListener | None:
    """A listener for a worker process where acquire can run on it (PostgreSQL with psycopg2)."""
    return ProcessListener(store) if store.dialect.name == "postgresql" and store.acquires_on_driver else None


def make_waker(store: Store, queues: tuple[str, ...] | None, interval: float) -> Waker:
    name = store.engine.dialect.name
    if name == "postgresql" and process_listener(store) is not None:
        return Waker()  # the processes listen themselves: nothing to relay
    if name == "sqlite":
        return SQLiteWaker(store, interval)
    return ReadyQueryWaker(store, interval, queues)
