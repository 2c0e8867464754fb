"""Why active jobs wait: the partition they queue in, the limits and rate of their flow key.

Read by ``jobqueue jobs list`` and ``jobs show`` (per job) and ``jobqueue status`` (per key). Times
of rates are the lease clock's (the database server's, where it has one), as the acquire uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.flow import rate_horizon
from jobqueue.job import READY_STATES, MessageState
from jobqueue.storage.dialects.common import PROCESSING, READY_LITERALS
from jobqueue.storage.readable import as_stored, stored_time
from jobqueue.storage.store import Store

# How many keys `jobqueue status` lists, the most waiting jobs first.
STATUS_KEYS = 20
# Why the jobs of a key without a flow row wait: workers find keyed jobs through their key's row.
NO_ROW = (
    "no row in the flow table (deleted by hand?), so no worker takes its jobs; "
    "a running `jobqueue worker` adds the row back at its sweep of flow keys, once a minute"
)


@dataclass(frozen=True)
class Wait:
    """What holds an active job back; ``reason`` is None when nothing does but its turn."""

    reason: str | None
    holder: int | None = None  # partition: the job it waits for
    flow: dict[str, Any] | None = None  # flow key: key, running, limit, next_start_at


def explain(store: Store, rows: Iterable[dict[str, Any]]) -> dict[int, Wait]:
    """For each active job's row with a partition or flow key (its id, state, partition_key,
    flow_key and concurrency_limit): what it waits for."""
    rows = [row for row in rows if row.get("partition_key") is not None or row.get("flow_key") is not None]
    if not rows:
        return {}
    m, f = store.tables.message, store.tables.flow
    partition_keys = sorted({row["partition_key"] for row in rows if row.get("partition_key") is not None})
    flow_keys = sorted({row["flow_key"] for row in rows if row.get("flow_key") is not None})
    heads: dict[str, Any] = {}
    running: dict[str, int] = {}
    next_start: dict[str, datetime] = {}
    with_row: set[str] = set()
    with store.reading() as conn:
        now = store.database_now(conn)
        for chunk in _chunks(partition_keys):
            spelled = _spellings(chunk)
            on_key = m.c.partition_key == spelled.c.key
            # A running job holds its key even when an older one came back meanwhile (a retried
            # dead letter): the acquire waits for it, and so the older one waits behind it.
            holders = {
                **dict(conn.execute(_first(spelled, m, on_key)).all()),
                **dict(conn.execute(_first(spelled, m, on_key, m.c.state == PROCESSING)).all()),
            }
            columns = (m.c.id, m.c.state, m.c.next_attempt_at)
            read = conn.execute(sa.select(*columns).where(m.c.id.in_(holders.values())))
            by_id = {head.id: head for head in read}
            heads.update({chunk[n]: by_id[i] for n, i in holders.items() if i in by_id})
        for chunk in _chunks(flow_keys):
            spelled = _spellings(chunk)
            counted = (
                sa.select(spelled.c.n, sa.func.count())
                .join(m, m.c.flow_key == spelled.c.key)
                .where(m.c.state == PROCESSING)
                .group_by(spelled.c.n)
            )
            running.update({chunk[n]: count for n, count in conn.execute(counted).all()})
            rows_of_keys = sa.select(spelled.c.n, as_stored(f.c.next_start_at)).join(f, f.c.flow_key == spelled.c.key)
            for n, stored in conn.execute(rows_of_keys).all():
                with_row.add(chunk[n])
                at = stored_time(stored)
                if at is not None and _holds(at, now):
                    next_start[chunk[n]] = at
    found: dict[int, Wait] = {}
    for row in rows:
        head = heads.get(row.get("partition_key") or "")
        if head is not None and head.id != row["id"]:
            which = "the oldest unfinished job" if head.id < row["id"] else "the running job"
            found[row["id"]] = Wait(
                f"behind job {head.id} ({_state_of(head, now)}), {which} of partition key {row['partition_key']!r}",
                holder=head.id,
            )
            continue
        key = row.get("flow_key")
        if key is None:
            continue
        flow = {
            "key": key,
            "running": running.get(key, 0),
            "limit": row.get("concurrency_limit"),
            "next_start_at": next_start.get(key),
        }
        reason = None
        if row["state"].upper() in READY_STATES:
            if key not in with_row:
                reason = f"key {key!r} has {NO_ROW}"
            elif (held := _flow_reason(flow)) is not None:
                reason = f"key {key!r} is {held}"
        found[row["id"]] = Wait(reason, flow=flow)
    return found


# Keys looked up per statement: SQLite allows a compound SELECT of 500 parts (see _spellings).
SPELLED_KEYS_MOST = 400


def _chunks(keys: list[str]) -> list[list[str]]:
    return [keys[start : start + SPELLED_KEYS_MOST] for start in range(0, len(keys), SPELLED_KEYS_MOST)]


def _spellings(keys: list[str]) -> Any:
    """``keys`` as a table of (n, key): rows looked up through it are found as the database
    compares text and told apart by ``n``, as the caller spelled them. (Were a key column's
    collation changed by hand to one that holds 'Acct' equal to 'acct', grouped or mapped by the
    spelling a row has, a job of 'acct' behind one of 'Acct' would be missed.)"""
    parts = [sa.select(sa.literal(n).label("n"), sa.literal(key, sa.String).label("key")) for n, key in enumerate(keys)]
    return (parts[0] if len(parts) == 1 else sa.union_all(*parts)).subquery("spelled")


def _first(spelled: Any, m: Any, on_key: Any, *where: Any) -> Any:
    """Per spelled key (n), the smallest id of the matching messages."""
    return sa.select(spelled.c.n, sa.func.min(m.c.id)).join(m, on_key).where(*where).group_by(spelled.c.n)


def _state_of(head: Any, now: datetime) -> str:
    if head.state == MessageState.PROCESSING.value:
        return "running"
    if head.next_attempt_at > now:
        doing = "retrying" if head.state == MessageState.RETRYABLE.value else "scheduled"
        return f"{doing} at {head.next_attempt_at:%Y-%m-%d %H:%M:%S}"
    return "ready"


def _holds(next_start_at: datetime | None, now: datetime) -> bool:
    """Whether a key's next start holds its jobs back at ``now``: one past the rate horizon does
    not (no rate wrote it: see rate_horizon), as the acquire sees it."""
    return next_start_at is not None and now < next_start_at <= rate_horizon(now)


def _flow_reason(flow: dict[str, Any]) -> str | None:
    """Why a flow key starts none of its ready jobs now, or None if it may."""
    limit, running = flow["limit"], flow["running"]
    if limit is not None and running >= limit:
        return f"at its concurrency limit ({running} of {limit} running)"
    until = flow["next_start_at"]
    if until is not None:
        day = "" if until.date() == utcnow().date() else f"{until:%Y-%m-%d} "  # a rate of a start an hour, say
        return f"held by its rate until {day}{until:%H:%M:%S.%f}"[:-3] + " UTC"
    return None


def blocked_keys(store: Store, most: int = STATUS_KEYS) -> list[dict[str, Any]]:
    """Keys with jobs ready to run that a key holds back, the most waiting first: partitions
    behind their oldest job, flow keys at their concurrency limit, spaced by their rate or without
    their row in the flow table."""
    m, f = store.tables.message, store.tables.flow
    with store.reading() as conn:
        now = store.database_now(conn)
        due = sa.and_(m.c.state.in_(READY_LITERALS), m.c.next_attempt_at <= now)
        count_due = sa.func.sum(sa.case((due, 1), else_=0))
        partitions = conn.execute(
            sa.select(m.c.partition_key, sa.func.min(m.c.id), sa.func.count() - 1)
            .where(m.c.partition_key.isnot(None))
            .group_by(m.c.partition_key)
            .having(sa.func.count() > 1)
            .order_by((sa.func.count()).desc(), m.c.partition_key)
            .limit(most)
        ).all()
        flows = conn.execute(
            sa.select(
                m.c.flow_key,
                count_due,
                sa.func.sum(sa.case((m.c.state == PROCESSING, 1), else_=0)),
                sa.func.max(m.c.concurrency_limit),
                as_stored(f.c.next_start_at),
                f.c.flow_key.label("row_key"),
            )
            .join(f, f.c.flow_key == m.c.flow_key, isouter=True)
            .where(m.c.flow_key.isnot(None))
            .group_by(m.c.flow_key, f.c.next_start_at, f.c.flow_key)
            .having(count_due > 0)
            .order_by(count_due.desc(), m.c.flow_key)
        ).all()
        heads: dict[int, Any] = {}
        held: list[tuple[str, int, int]] = []
        if partitions:
            # A partition is held by its running job, which is its oldest unless an older one came
            # back meanwhile (a retried dead letter).
            runners = dict(
                conn.execute(
                    sa.select(m.c.partition_key, sa.func.min(m.c.id))
                    .where(m.c.partition_key.in_([key for key, _, _ in partitions]), m.c.state == PROCESSING)
                    .group_by(m.c.partition_key)
                ).all()
            )
            held = [(key, runners.get(key, oldest), waiting) for key, oldest, waiting in partitions]
            ids = [holder for _, holder, _ in held]
            heads = {
                head.id: head
                for head in conn.execute(sa.select(m.c.id, m.c.state, m.c.next_attempt_at).where(m.c.id.in_(ids)))
            }
    found: list[dict[str, Any]] = [
        {
            "kind": "partition",
            "key": key,
            "waiting": int(waiting),
            "reason": f"behind job {oldest} ({_state_of(heads[oldest], now)})",
        }
        for key, oldest, waiting in held
        if oldest in heads
    ]
    for key, ready, running, limit, stored, row_key in flows:
        next_start_at = stored_time(stored)
        flow = {
            "key": key,
            "running": int(running),
            "limit": limit,
            "next_start_at": next_start_at if _holds(next_start_at, now) else None,
        }
        reason = NO_ROW if row_key is None else _flow_reason(flow)
        if reason is not None:
            found.append({"kind": "flow", "key": key, "waiting": int(ready), "reason": reason})
    found.sort(key=lambda entry: -entry["waiting"])
    return found[:most]
