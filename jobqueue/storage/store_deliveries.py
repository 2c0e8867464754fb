"""A delivery after its acquisition: its outcome written, its lease renewed, extended or released.

Every outcome is fenced: it is applied only to a message still PROCESSING under the lease token of
the delivery that produced it (``Dialect.lock_held``), so a worker that lost its lease can never
complete, retry or archive a message someone else now holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.job import Message, MessageState, Outcome
from jobqueue.storage.dialects.common import PROCESSING, WorkerState, readable_times
from jobqueue.storage.store_base import StoreBase


@dataclass
class FlushResult:
    applied: list[Outcome] = field(default_factory=list)
    lost: list[Outcome] = field(default_factory=list)


class DeliveryOperations(StoreBase):
    """The store's writes for deliveries under way: outcomes, checkpoints, leases."""

    def flush(self, outcomes: list[Outcome], now: datetime | None = None) -> FlushResult:
        """Apply outcomes in one transaction; those whose lease was lost are returned as ``lost``."""
        result = FlushResult()
        if not outcomes:
            return result
        applied = self.dialect.flush(outcomes, now or utcnow())
        for outcome in outcomes:
            key = (outcome.message.id, outcome.message.lease_token)
            (result.applied if key in applied else result.lost).append(outcome)
        return result

    def fire_schedule(self, message: Message, job: dict[str, Any], next_fire: datetime, state: bytes) -> bool:
        """Enqueue a schedule's ``job`` and defer its message to ``next_fire``, fenced (see the dialect)."""
        return self.dialect.fire_schedule(message, job, next_fire, state)

    def held_message(self, message_id: int, token: int) -> Message | None:
        """Load a message if it is still PROCESSING under ``token`` (for the supervisor's time limits)."""
        m = self.tables.message
        stmt = sa.select(*self.dialect.returned).where(
            m.c.id == message_id, m.c.lease_token == token, m.c.state == PROCESSING
        )
        with self.engine.begin() as conn:
            row = conn.execute(stmt).mappings().first()
        return readable_times(Message(**row)) if row is not None else None

    def archived_with(self, message_id: int, finished_at: datetime) -> bool:
        """True if the job is archived COMPLETED with exactly this ``finished_at`` (our own ack)."""
        a = self.tables.archive
        stmt = sa.select(a.c.id).where(
            a.c.id == message_id, a.c.state == MessageState.COMPLETED.value, a.c.finished_at == finished_at
        )
        with self.engine.begin() as conn:
            return conn.execute(stmt).first() is not None

    def extend_lease(self, message_id: int, token: int, seconds: float, now: datetime | None = None) -> bool:
        """Make one delivery's lease last at least ``seconds`` more (never shorter); False if it was lost."""
        m = self.tables.message
        until = self.dialect.clock_plus()
        later = sa.case((m.c.lease_expires_at < until, until), else_=m.c.lease_expires_at)
        stmt = (
            sa.update(m)
            .where(m.c.id == message_id, m.c.lease_token == token, m.c.state == PROCESSING)
            .values(lease_expires_at=later)
        )
        with self.engine.begin() as conn:
            return conn.execute(stmt, self._lease_clock(seconds, now).binds()).rowcount == 1

    def save_checkpoint(self, message_id: int, token: int, checkpoint: bytes | None) -> bool:
        """Store a running delivery's checkpoint durably now; False if the lease was lost.

        Raises SerializationError, writing nothing, for a checkpoint too large for one statement
        (over MySQL's max_allowed_packet)."""
        m = self.tables.message
        stmt = (
            sa.update(m)
            .where(m.c.id == message_id, m.c.lease_token == token, m.c.state == PROCESSING)
            .values(checkpoint=checkpoint)
        )
        with self.engine.begin() as conn:
            self.dialect.check_checkpoint(conn, checkpoint)
            return conn.execute(stmt).rowcount == 1

    def heartbeat(
        self, workers: list[str] | list[WorkerState], lease_seconds: float, now: datetime | None = None
    ) -> int:
        """Renew the worker rows (with what each process is doing) and the leases of every message
        they hold; return leases renewed.

        Renewal only moves a lease forward, so a longer ``extend()`` is kept. Times come from the
        lease clock (the database server's), or ``now``.
        """
        if not workers:
            return 0
        states = [w if isinstance(w, WorkerState) else WorkerState(w) for w in workers]
        return self.dialect.renew(states, self._lease_clock(lease_seconds, now))

    def release_expired(self, now: datetime | None = None) -> int:
        """Return messages whose lease expired by the lease clock to PENDING (their delivery stays counted)."""
        m = self.tables.message
        return self.dialect.release(
            [m.c.lease_expires_at < self.dialect.clock()], binds=self._lease_clock(0, now).binds()
        )

    def release_worker(
        self,
        worker_id: str,
        running: int | None = None,
        finished: list[int] | None = None,
        charge_running: bool = True,
    ) -> int:
        """Return every message a dead worker process held to PENDING at once.

        Only the message it was ``running`` keeps its attempt and its delivery: it may have killed
        the process, and a poison message must reach max_deliveries. Messages it ``finished``
        without writing their outcomes keep their attempt (they ran) but not the delivery; the rest,
        never started, go back as if never fetched. So jobs that merely shared a process with a
        process-killing job are never failed for it. ``finished=None`` means the process lost count:
        everything but the running one is then treated as unstarted. ``charge_running=False``: the
        process was killed by its supervisor as it stopped, not by its running job, which keeps
        its attempt but not the delivery.
        """
        m = self.tables.message
        charged = sa.case((m.c.id == running, 0), else_=1) if running and charge_running else sa.literal(1)
        ran = [running] if running else []
        ran += finished or []
        unstarted = sa.case((m.c.id.in_(ran), 0), else_=1) if ran else sa.literal(1)
        return self.dialect.release([m.c.worker_id == worker_id], attempts=unstarted, deliveries=charged)

    def release_unstarted(self, worker_id: str, tokens: list[int], started: list[int] | None) -> int:
        """Return a live process's unstarted messages of these batches (lease tokens), uncounted.

        ``started``: the ids it started, which stay; None when it lost count (nothing is released).
        """
        if not tokens or started is None:
            return 0
        m = self.tables.message
        conditions = [m.c.worker_id == worker_id, m.c.lease_token.in_(tokens)]
        if started:
            conditions.append(m.c.id.not_in(started))
        return self.dialect.release(conditions, attempts=sa.literal(1), deliveries=sa.literal(1))

    def release_token(self, token: int) -> int:
        """Undo an acquisition whose reply was lost (the connection dropped after COMMIT)."""
        m = self.tables.message
        return self.dialect.release([m.c.lease_token == token], attempts=sa.literal(1), deliveries=sa.literal(1))
