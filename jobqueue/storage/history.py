"""Throughput read back from the archive: jobs completed and failed per minute.

Every ended job keeps the time it finished (``finished_at``), so the archive already is the history;
counting its rows per minute needs no table or counter of its own. Jobs the archive does not keep
(``retain_in_archive_on_ack=False`` or ``..._on_reject=False``) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from jobqueue.job import MessageState
from jobqueue.storage.store import Store

# finished_at is the worker's clock, archived_at the flush's: a flush comes after the finish, but
# the two clocks may disagree a little. The archived_at bound only lets the (state, archived_at)
# index narrow the scan; this slack keeps it from cutting jobs a skewed clock put just outside.
CLOCK_SLACK = timedelta(minutes=10)
_COUNTED = (MessageState.COMPLETED.value, MessageState.FAILED.value)


@dataclass(frozen=True)
class MinuteCount:
    """Jobs that finished within one minute, from ``minute`` (naive UTC) to a minute later."""

    minute: datetime
    completed: int = 0
    failed: int = 0


def throughput(store: Store, minutes: int = 60, now: datetime | None = None) -> list[MinuteCount]:
    """Jobs completed and failed in each of the last ``minutes`` whole minutes, oldest first.

    The last entry is the minute ``now`` is in (still filling up). Minutes with no job are there
    with zero counts, so the list always has ``minutes`` entries.
    """
    if minutes < 1:
        raise ValueError(f"minutes must be at least 1, not {minutes}")
    now = now or store.clock_now()
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=minutes)
    a = store.tables.archive
    # One pass over the range, bucketed with a CASE that every database runs the same way (each
    # dialect truncates timestamps differently, and SQLite stores them as text).
    edges = [start + timedelta(minutes=i + 1) for i in range(minutes)]
    bucket = sa.case(*[(a.c.finished_at < edge, i) for i, edge in enumerate(edges)])
    finished = (
        sa.select(bucket.label("minute"), a.c.state)
        .where(
            a.c.state.in_(_COUNTED),
            a.c.archived_at >= start - CLOCK_SLACK,
            a.c.finished_at >= start,
            a.c.finished_at < end,
        )
        .subquery()
    )
    # Grouping the subquery's column, not the CASE itself: PostgreSQL would see the CASE in the
    # GROUP BY as another expression, its bound edges being other parameters.
    stmt = sa.select(finished.c.minute, finished.c.state, sa.func.count()).group_by(finished.c.minute, finished.c.state)
    counts: dict[tuple[int, str], int] = {}
    with store.reading() as conn:
        for minute, state, count in conn.execute(stmt):
            counts[(int(minute), state)] = int(count)
    return [
        MinuteCount(
            start + timedelta(minutes=i),
            completed=counts.get((i, MessageState.COMPLETED.value), 0),
            failed=counts.get((i, MessageState.FAILED.value), 0),
        )
        for i in range(minutes)
    ]
