"""Acquiring: ready messages marked PROCESSING under a new lease token, plain and flow-keyed ones
taking turns, and the cheap checks that tell an idle worker whether anything is due.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from datetime import datetime

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.job import Message
from jobqueue.storage.dialects.common import AcquireParams
from jobqueue.storage.dialects.due import PRIORITY_LEVELS_PROBED
from jobqueue.storage.dialects.wakeup import Waker
from jobqueue.storage.engine import check_listen_url
from jobqueue.storage.store_base import StoreBase
from jobqueue.storage.tables import Tables


def new_lease_token() -> int:
    """A random positive 63-bit token; one per acquisition, so a stale delivery can never match."""
    return secrets.randbits(62) + 1


# A walk of the ready index that came back short and took longer than this read a backlog due
# later; acquires then go level by level for WALK_AGAIN_SECONDS (see AcquireOperations._acquire_plain).
LEVELS_AFTER_SECONDS = 0.005
WALK_AGAIN_SECONDS = 600.0


class AcquireOperations(StoreBase):
    """The store's acquisitions, and its checks for due work."""

    def __init__(self, engine: sa.Engine, tables: Tables, schema_command: str | None = None) -> None:
        super().__init__(engine, tables, schema_command)
        self._flow_first = False
        # Until when (time.monotonic()) plain acquires go level by level (see _acquire_plain).
        self._by_level_until = 0.0
        self.flow_due_in: float | None = None

    def acquire(
        self,
        worker_id: str,
        queues: tuple[str, ...] | None,
        limit: int,
        lease_seconds: float,
        now: datetime | None = None,
        token: int | None = None,
        flow: bool = False,
        rated: bool = False,
    ) -> list[Message]:
        """Mark up to ``limit`` ready messages PROCESSING under a new lease token and return them.

        With ``flow``, messages that have a flow key are acquired too, within their keys' limits;
        with ``rated`` as well, ``flow_due_in`` says in how many seconds a key held back by its rate
        may start its next one. Flow and plain messages take turns to go first, so that neither
        kind starves the other.
        """
        params = AcquireParams(
            worker_id=worker_id,
            token=token or new_lease_token(),
            queues=queues,
            limit=limit,
            now=now or utcnow(),
            lease=self._lease_clock(lease_seconds, now),
            rated=rated,
        )
        with self.schema_errors():
            if not flow:
                return self._acquire_plain(params)
            self.flow_due_in = None
            self._flow_first = not self._flow_first
            if not self._flow_first:
                messages = self._acquire_plain(params)
                if len(messages) >= limit:
                    return messages
                params = dataclasses.replace(params, limit=limit - len(messages), now=now or utcnow())
            flowed = self.dialect.acquire_flow(params)
            self.flow_due_in = flowed.due_in
            if not self._flow_first:
                return messages + flowed.messages
            rest = limit - len(flowed.messages)
            if rest <= 0:
                return flowed.messages
            # What is due is read again: a job enqueued while the first acquire ran is due now, and
            # its notification may have come before this process listened.
            return flowed.messages + self._acquire_plain(dataclasses.replace(params, limit=rest, now=now or utcnow()))

    def _acquire_plain(self, params: AcquireParams) -> list[Message]:
        """Acquire messages without a flow key.

        One statement walks the ready index in delivery order, skipping what is not due yet, and
        stops at ``limit``: one round trip, cheap while enough is due. A walk that comes back
        short has read every ready job, and behind the due ones there may be a backlog due later
        (reminders for tomorrow, retries waiting an hour): a hundred thousand such jobs cost a walk
        about 10 ms on PostgreSQL and SQLite and 100 ms on MariaDB. When a short walk took longer
        than LEVELS_AFTER_SECONDS, acquires go level by level for a while: per priority present,
        highest first, a walk of that priority alone, which ends at its first job not due; a few
        indexed statements, however large the backlog. A full batch, or WALK_AGAIN_SECONDS, brings
        the single walk back.
        """
        now = time.monotonic()
        if now < self._by_level_until:
            messages = self._acquire_by_level(params)
            if len(messages) >= params.limit:
                self._by_level_until = 0.0
            return messages
        began = time.perf_counter()
        messages = self.dialect.acquire(params)
        if len(messages) < params.limit and time.perf_counter() - began > LEVELS_AFTER_SECONDS:
            self._by_level_until = now + WALK_AGAIN_SECONDS
        return messages

    def _acquire_by_level(self, params: AcquireParams) -> list[Message]:
        taken: list[Message] = []
        level = None
        for _ in range(PRIORITY_LEVELS_PROBED):
            with self.dialect.probing() as conn:
                level = self.dialect.due_check.next_level(conn, params.queues, level)
            if level is None:
                return taken
            taken += self.dialect.acquire(dataclasses.replace(params, limit=params.limit - len(taken), level=level))
            if len(taken) >= params.limit:
                return taken
        # Jobs over more priorities than that: one walk of them all for the rest.
        return taken + self.dialect.acquire(dataclasses.replace(params, limit=params.limit - len(taken)))

    def warm_up(self, queues: tuple[str, ...] | None) -> None:
        """Build and compile the statements a worker serving ``queues`` fetches and writes with (see
        the dialect's warm_up): in a supervisor, before it forks its worker processes."""
        params = AcquireParams(
            worker_id="", token=0, queues=queues, limit=1, now=utcnow(), lease=self._lease_clock(1.0, None)
        )
        with self.schema_errors():
            self.dialect.warm_up(params)

    def has_work(self, queues: tuple[str, ...] | None, horizon: datetime) -> bool:
        """True while the queues hold a message PROCESSING or due before ``horizon`` (for --burst).

        A message its key holds back is not due: one behind the oldest job of its partition (which
        is not due either, or it would count), or one whose key's rate allows no start before
        ``horizon``. Counting them kept --burst running for as long as a partition's head waited to
        retry (an hour, say) or a "1/h" rate spaced the key's jobs.
        """
        with self.reading() as conn:  # four times a second: on indexes, like has_ready
            return self.dialect.due_check.work_until(conn, queues, horizon)

    def has_ready(self, queues: tuple[str, ...] | None, now: datetime) -> bool:
        """True if a message of these queues is due now, for idle polling: read on indexes, a few
        probes per priority level for jobs without a key and one per flow key for the others, so
        that a backlog of jobs due later is never walked (an idle supervisor asks every second)."""
        params = AcquireParams("", 0, queues, 1, now, self._lease_clock(0, None))
        with self.reading() as conn:  # the supervisor's own pool: no connection more for it
            return self.dialect.due_check.anything_due(conn, params)

    def notify(self) -> None:
        """Wake idle workers now (PostgreSQL: NOTIFY; elsewhere their supervisors poll anyway)."""
        self.dialect.notify()

    def waker(
        self, queues: tuple[str, ...] | None, interval: float, due_interval: float, listen_url: str | None = None
    ) -> Waker:
        """What tells a supervisor that work arrived for its idle processes (see storage.dialects.wakeup):
        news checked every ``interval``, due work every ``due_interval``; ``listen_url``, where
        PostgreSQL's LISTEN goes if not to the database URL."""
        check_listen_url(self.engine.url, listen_url)
        return self.dialect.waker(lambda: self.has_ready(queues, utcnow()), interval, due_interval, listen_url)
