"""Acquiring messages that have a flow key: concurrency limits, rate limits, keys served in turn.

Messages without a flow key are acquired by the one-statement walk of the ready index. Those with
one are acquired here, key by key, in one short transaction:

1. Up to ``KEYS_PER_ACQUIRE`` keys with ready messages whose rate allows a start now, the keys
   served longest ago first (so every key gets its turn, however many jobs another one has).
2. Their flow rows are locked, skipping those another worker holds: while a worker holds a key,
   nobody else acquires its messages, so the running ones it counts next cannot change under it.
3. The running (PROCESSING) messages of each key are counted, and each key's ready messages are
   read in delivery order: as many as its fair share of the batch.
4. Each key takes what its limits allow: the concurrency limit minus those running, and the starts
   its rate allows since its last one (spaced ``1/rate`` apart, one interval of slack so that a
   late worker does not lose the rate). The key's row records when it was served and, with a
   rate, when its next start is allowed.

A slot is a PROCESSING row, so every outcome, expired lease and dead process frees it: there is
no counter that a crash could leave wrong. Times of the flow rows are read from the lease clock
(the database server's, where it has one), so that skewed hosts share one rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from jobqueue.job import Message
from jobqueue.storage.dialects.common import PROCESSING, READY_LITERALS, AcquireParams, first_of_partition

if TYPE_CHECKING:
    from jobqueue.storage.dialects.base import Dialect

KEYS_PER_ACQUIRE = 32


@dataclass
class FlowAcquired:
    messages: list[Message] = field(default_factory=list)
    # Seconds until a key with ready messages, held back by its rate, may start the next one (by
    # the database's clock: this host's may be skewed).
    due_in: float | None = None


class FlowAcquirer:
    """The statements of a flow acquisition, built once per dialect and queue shape."""

    def __init__(self, dialect: Dialect, shape: str) -> None:
        self.dialect = dialect
        m, f = dialect.message, dialect.tables.flow
        clock = dialect.clock()
        # A message of a key is ready: due, first of its partition, in the worker's queues.
        self.ready_of_key = [
            m.c.state.in_(READY_LITERALS),
            m.c.next_attempt_at <= sa.bindparam("now"),
            first_of_partition(m),
        ]
        if shape != "all":
            self.ready_of_key.append(dialect.queue_filter(shape == "one"))
        has_ready = sa.exists().where(m.c.flow_key == f.c.flow_key, *self.ready_of_key)
        self.keys = (
            sa.select(f.c.flow_key)
            .where(sa.or_(f.c.next_start_at.is_(None), f.c.next_start_at <= clock), has_ready)
            .order_by(f.c.served_at, f.c.flow_key)
            .limit(KEYS_PER_ACQUIRE)
        )
        self.lock = (
            sa.select(f.c.flow_key, f.c.next_start_at, clock.label("now"))
            .where(f.c.flow_key.in_(sa.bindparam("keys", expanding=True)))
            .order_by(f.c.flow_key)
            # FOR NO KEY UPDATE on PostgreSQL: enqueues holding the key (FOR KEY SHARE) do not
            # keep a worker from it.
            .with_for_update(skip_locked=True, key_share=True)
        )
        self.running = (
            sa.select(m.c.flow_key, sa.func.count())
            .where(m.c.flow_key.in_(sa.bindparam("keys", expanding=True)), m.c.state == PROCESSING)
            .group_by(m.c.flow_key)
        )
        self.due = sa.select(sa.func.min(f.c.next_start_at), clock).where(f.c.next_start_at > clock, has_ready)
        self.served = (
            sa.update(f)
            .where(f.c.flow_key == sa.bindparam("key"))
            .values(served_at=sa.bindparam("served"), next_start_at=sa.bindparam("next_start"))
        )

    def candidates(self, shares: dict[str, int]) -> Any:
        """Each key's first ``shares[key]`` ready messages in delivery order, in one statement."""
        m = self.dialect.message
        parts = []
        for number, (key, share) in enumerate(shares.items()):
            part = (
                sa.select(m.c.id, m.c.flow_key, m.c.concurrency_limit, m.c.rate_interval_us)
                .where(m.c.flow_key == sa.literal(key), *self.ready_of_key)
                .order_by(m.c.priority.desc(), m.c.next_attempt_at, m.c.id)
                .limit(share)
                .subquery(f"k{number}")
            )
            parts.append(sa.select(*part.c))
        return parts[0] if len(parts) == 1 else sa.union_all(*parts)

    def run(self, connection: sa.Connection, params: AcquireParams, take: Callable[..., list[Message]]) -> FlowAcquired:
        binds = params.binds()
        keys = list(connection.execute(self.keys, binds).scalars())
        result = FlowAcquired()
        if keys:
            locked = connection.execute(self.lock, {**binds, "keys": keys}).all()
            if locked:
                result.messages = self._take(connection, params, binds, locked, take)
        if params.rated:
            due, now = connection.execute(self.due, binds).one()
            if due is not None:
                result.due_in = (due - now).total_seconds()
        return result

    def _take(
        self,
        connection: sa.Connection,
        params: AcquireParams,
        binds: dict[str, Any],
        locked: Sequence[Any],
        take: Callable[..., list[Message]],
    ) -> list[Message]:
        now = locked[0].now
        keys = [row.flow_key for row in locked]
        running: dict[str, int] = dict(connection.execute(self.running, {**binds, "keys": keys}).all())
        share = max(1, math.ceil(params.limit / len(keys)))
        rows: dict[str, list[Any]] = {key: [] for key in keys}
        for row in connection.execute(self.candidates(dict.fromkeys(keys, share)), binds):
            rows[row.flow_key].append(row)
        chosen: list[int] = []
        served: list[dict[str, Any]] = []
        for lock in locked:
            candidates = rows[lock.flow_key]
            allowed = min(len(candidates), params.limit - len(chosen))
            next_start = lock.next_start_at
            if candidates:
                head = candidates[0]
                if head.concurrency_limit is not None:
                    allowed = min(allowed, head.concurrency_limit - running.get(lock.flow_key, 0))
                if head.rate_interval_us is not None:
                    interval = timedelta(microseconds=head.rate_interval_us)
                    start = now - interval if next_start is None else max(next_start, now - interval)
                    allowed = min(allowed, (now - start) // interval + 1)
                    if allowed > 0:
                        next_start = start + interval * allowed
            allowed = max(0, allowed)
            chosen.extend(row.id for row in candidates[:allowed])
            served.append({"key": lock.flow_key, "served": now, "next_start": next_start})
        connection.execute(self.served, served)
        return take(connection, chosen, params) if chosen else []
