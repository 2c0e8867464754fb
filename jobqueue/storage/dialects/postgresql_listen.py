"""PostgreSQL: a supervisor's LISTEN connection, which hears of new jobs as their commits happen."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from jobqueue.errors import ConfigurationError
from jobqueue.storage.dialects.base import Dialect
from jobqueue.storage.dialects.connector import first_line
from jobqueue.storage.dialects.wakeup import Waker
from jobqueue.storage.engine import create_engine, mask_url
from jobqueue.storage.tables import notify_channel

logger = logging.getLogger("jobqueue.storage")


class ListeningWaker(Waker):
    """A supervisor's LISTEN connection: every notification is news for one idle process.

    One connection per host, whatever its number of processes, and no statement at all while
    nothing happens. It is opened on ``listen_url`` if given: a pooler in transaction mode hands
    each transaction to any server connection, so LISTEN through it would hear nothing. Lost, it
    is opened again at most every ``RECONNECT_SECONDS``; the first reading after (re)connecting
    counts as news, since a commit may have happened while nothing listened.

    Every supervisor hears every notification. So that a job wakes one process in all, not one
    per host, each notification has one owner among the supervisors serving the same queues (the
    notifying server process's id modulo their number, see :meth:`set_peers`): the owner wakes a
    process at once; the others look ``DEFER_SECONDS`` later, with one cheap query, and wake one
    only if work is still waiting (the owner's processes were all busy, or it is gone).
    """

    RECONNECT_SECONDS = 1.0
    DEFER_SECONDS = 0.02

    def __init__(self, dialect: Dialect, listen_url: str | None, ready: Callable[[], bool]) -> None:
        self.dialect = dialect
        self.ready = ready
        self.rank, self.peers = 0, 1  # this supervisor's place among its peers, and their number
        self.deferred_at: float | None = None  # when to look at news another supervisor owned
        self.channel = notify_channel(dialect.tables.prefix)
        self.engine: sa.Engine | None = None
        if listen_url is not None:
            self.engine = create_engine(listen_url, pool_size=1, max_overflow=0)
        self.raw: Any = None  # the DB-API connection, LISTENing
        self.fresh = False  # (re)connected since the last check
        self.retry_at = 0.0
        # Since when it cannot listen (an outage): said once as it begins and once as it ends, not
        # at every try, which comes every RECONNECT_SECONDS.
        self.failing_since: float | None = None
        self.heard_on: tuple[Any, ...] | None = None  # the database the LISTEN connection first reached
        self.listen_url = listen_url
        self.wrong_target = False  # it reaches another database than the jobs': never LISTEN there
        self._connect(late=False)
        if self.heard_on is not None:  # checked here, so that a worker on a wrong one does not start
            wrong = self._wrong_target(self.heard_on)
            if wrong is not None:
                self.close()
                raise ConfigurationError(wrong)

    def _connect(self, late: bool = True) -> None:
        """Connect and LISTEN. ``late``: after the start, when the first connection's target is
        checked here (the server was down as the supervisor started)."""
        self.retry_at = time.monotonic() + self.RECONNECT_SECONDS
        pooled: Any = None
        try:
            engine = self.engine or self.dialect.engine
            pooled = engine.raw_connection()
            raw = pooled.dbapi_connection
            raw.autocommit = True
            with raw.cursor() as cursor:
                if self.engine is not None and self.heard_on is None:
                    cursor.execute(self.dialect.where_am_i)
                    heard_on = tuple(cursor.fetchone())
                    if late and self._reaches_another_database(heard_on):
                        pooled.invalidate()
                        return
                    self.heard_on = heard_on
                cursor.execute(f"LISTEN {self.channel}")
        except Exception as exc:
            if self.failing_since is None:
                self.failing_since = time.monotonic()
                logger.warning(
                    "cannot LISTEN for new jobs (%s); polling every max_fetch_interval meanwhile", first_line(exc)
                )
            if pooled is not None:
                with contextlib.suppress(Exception):
                    pooled.invalidate()
            return
        self.pooled, self.raw, self.fresh = pooled, raw, True
        if self.failing_since is not None:
            logger.warning("listening for new jobs again after %.1f s", time.monotonic() - self.failing_since)
            self.failing_since = None

    def _reaches_another_database(self, heard_on: tuple[Any, ...]) -> bool:
        """After the start: True, said once, when the LISTEN connection reaches another database
        than the jobs' (running by then, the supervisor never LISTENs, and polls)."""
        wrong = self._wrong_target(heard_on)
        if wrong is None:
            return False
        logger.error("%s; polling every max_fetch_interval instead", wrong)
        self.wrong_target = True
        return True

    def _wrong_target(self, heard_on: tuple[Any, ...]) -> str | None:
        """What is wrong unless the LISTEN connection reaches the jobs' own database: on another
        one (a typo, a replica, the pooler's alias of another database) it would hear none of
        their news, and every new job would wait for a poll."""
        with self.dialect.engine.connect() as conn:
            jobs_on = self.dialect.server_identity(conn)
        if heard_on == jobs_on:
            return None
        where = (
            f"database {heard_on[0]!r}, but the jobs are in {jobs_on[0]!r}"
            if heard_on[1] == jobs_on[1]
            else f"database {heard_on[0]!r} of another server (started at {heard_on[1]}; the jobs' one at "
            f"{jobs_on[1]}, database {jobs_on[0]!r})"
        )
        return (
            f"listen_database_url {mask_url(self.listen_url or '')!r} reaches {where}: it would hear of no new "
            "job. Give a direct connection to the jobs' database (on its primary server), or remove the option"
        )

    def fileno(self) -> int | None:
        if self.wrong_target:
            return None
        if self.raw is None and time.monotonic() >= self.retry_at:
            self._connect()
        return self.raw.fileno() if self.raw is not None else None

    def set_peers(self, rank: int, peers: int) -> None:
        self.rank, self.peers = rank, max(1, peers)

    def due_in(self, now: float) -> float | None:
        due = [self.deferred_at - now] if self.deferred_at is not None else []
        if self.raw is None and not self.wrong_target:
            due.append(self.retry_at - now)
        return max(0.0, min(due)) if due else None

    def check(self, now: float) -> int:
        heard = self._deferred(now)
        if self.raw is None:
            self.fileno()  # reconnect when due
            if self.raw is None:
                return heard
        heard, self.fresh = heard + int(self.fresh), False
        try:
            self.raw.poll()
        except Exception as exc:
            logger.warning("lost the LISTEN connection (%s); listening again", first_line(exc))
            self.failing_since = time.monotonic()  # said: a failed reconnect adds nothing until it ends
            self._drop()
            return heard + 1  # look at once: what committed meanwhile would wait for the next poll
        for notify in self.raw.notifies:
            if notify.pid % self.peers == self.rank:
                heard += 1
            elif self.deferred_at is None:
                self.deferred_at = now + self.DEFER_SECONDS
        self.raw.notifies.clear()
        return heard

    def _deferred(self, now: float) -> int:
        """News another supervisor owned, once it had its chance: 1 if work still waits."""
        if self.deferred_at is None or now < self.deferred_at:
            return 0
        self.deferred_at = None
        try:
            return int(self.ready())
        except Exception as exc:  # an outage: the supervisor's guard reports it elsewhere
            logger.debug("idle poll failed: %s", exc)
            return 1

    def _drop(self) -> None:
        # Never back into a pool: it is still LISTENing.
        with contextlib.suppress(Exception):
            self.pooled.invalidate()
        self.raw = None

    def close(self) -> None:
        if self.raw is not None:
            self._drop()
        if self.engine is not None:
            self.engine.dispose()
