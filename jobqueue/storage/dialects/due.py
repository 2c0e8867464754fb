"""Whether work is due, read on indexes however large the backlog due later.

Acquire's ordered walk filters ``next_attempt_at <= now`` entry by entry: on a backlog of jobs that
are not due yet (a million reminders for tomorrow, retries waiting an hour) it reads every entry to
find none. Within one priority the ready index is in due-time order, so the questions here go level
by level, each read the first entry of a range: the highest priority present, whether a job of
that priority is due (a range that ends at the first job not due), the next level below. Jobs with
a flow key are asked about once per key, on the flow table. An idle supervisor asks whether
anything is due every second; a ``--burst`` one asks four times a second whether anything runs or
comes due soon.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from jobqueue.flow import rate_horizon
from jobqueue.job import SCHEDULE_TASK
from jobqueue.storage.dialects.common import (
    PROCESSING,
    READY_LITERALS,
    AcquireParams,
    first_of_partition,
    queue_shape,
)
from jobqueue.storage.tables import Timestamp

if TYPE_CHECKING:
    from jobqueue.storage.dialects.base import Dialect

# Priority levels probed one by one; beyond them (a queue whose jobs spread over many priorities)
# one walk of the ready index answers instead.
PRIORITY_LEVELS_PROBED = 32


@dataclass(frozen=True)
class DueProbes:
    """Whether a job without a flow key is due: the highest priority present (``top``), whether
    a job of priority ``p`` is due (``due``), the next level below ``p`` (``below``), and the plain
    walk for many levels (``scan``). Bind ``now``, ``p`` and, for one queue, ``only_queue``."""

    top: Any
    due: Any
    below: Any
    scan: Any


class DueCheck:
    """The due questions of one dialect, their statements built once."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._levels: dict[tuple[bool, bool], DueProbes] = {}
        self._first: dict[str, Any] = {}
        self._running: dict[bool, Any] = {}

    def anything_due(self, connection: sa.Connection, params: AcquireParams) -> bool:
        """Whether a job of ``params.queues`` is due at ``params.now``, with or without a flow key:
        for jobs without a key a few probes per priority level present, for the others one probe
        per flow key. One statement when nothing waits."""
        queues = params.queues or (None,)
        binds = {**params.binds(), "only_queue": queues[0]}
        level, keyed = connection.execute(self._first_probe(params.shape), binds).one()
        if keyed:
            return True
        if self._due_from(connection, queues[0], params.now, level):
            return True
        return any(self._due_from(connection, queue, params.now) for queue in queues[1:])

    def work_until(self, connection: sa.Connection, queues: tuple[str, ...] | None, horizon: datetime) -> bool:
        """Whether a job of ``queues`` (None: any) runs, or comes due before ``horizon`` and may
        start then: not one behind an older job of its partition, nor one whose key's rate allows
        no start before ``horizon``. Schedule messages do not count: they never end."""
        running = connection.execute(self._running_probe(bool(queues)), {"queues": list(queues or ())})
        if running.first() is not None:
            return True
        if any(self._due_from(connection, queue, horizon, work_only=True) for queue in queues or (None,)):
            return True
        shape = queue_shape(queues)
        binds = {
            "now": horizon,
            "rate_horizon": rate_horizon(horizon),
            "only_queue": queues[0] if queues else None,
            "queues": list(queues or ()),
        }
        return connection.execute(self.dialect.flow_acquirer(shape).any_keys_until, binds).first() is not None

    def next_level(self, connection: sa.Connection, queues: tuple[str, ...] | None, below: int | None) -> int | None:
        """The highest priority of a ready job without a flow key in ``queues`` (None: any queue),
        below ``below`` if given (whether due or not); None if there is none."""
        probes = self.probes(one=bool(queues))
        statement = probes.top if below is None else probes.below
        levels = [connection.execute(statement, {"only_queue": q, "p": below}).scalar() for q in queues or (None,)]
        return max((level for level in levels if level is not None), default=None)

    def _first_probe(self, shape: str) -> Any:
        """The highest priority level of the first queue (as ``top``), and whether a flow key has
        work it may start, in one statement; the level is not looked for if a key has work (on
        MariaDB that walk may read the queue's keyed jobs)."""
        probe = self._first.get(shape)
        if probe is None:
            top = self.probes(one=shape != "all").top
            keyed = sa.exists(self.dialect.flow_acquirer(shape).any_keys)
            level = sa.case((keyed, sa.null()), else_=top.scalar_subquery())
            probe = self._first[shape] = sa.select(level, keyed)
        return probe

    def _due_from(
        self, connection: sa.Connection, queue: str | None, now: datetime, level: Any = ..., work_only: bool = False
    ) -> bool:
        """Whether a job without a flow key is due in ``queue`` (None: any), probing its priority
        levels from ``level`` down (from its highest if not given)."""
        probes = self.probes(one=queue is not None, work_only=work_only)
        binds: dict[str, Any] = {"now": now, "only_queue": queue}
        if level is ...:
            level = connection.execute(probes.top, binds).scalar()
        for _ in range(PRIORITY_LEVELS_PROBED):
            if level is None:
                return False
            if connection.execute(probes.due, {**binds, "p": level}).first() is not None:
                return True
            level = connection.execute(probes.below, {**binds, "p": level}).scalar()
        return level is not None and connection.execute(probes.scan, binds).first() is not None

    def probes(self, one: bool, work_only: bool = False) -> DueProbes:
        """The level probes for all queues or for ``one`` (``only_queue``); ``work_only`` leaves
        schedule messages out of what is due."""
        probes = self._levels.get((one, work_only))
        if probes is None:
            dialect, m = self.dialect, self.dialect.message
            ready: list[Any] = [m.c.state.in_(READY_LITERALS), m.c.flow_key.is_(None)]
            due = [m.c.next_attempt_at <= sa.bindparam("now", type_=Timestamp), first_of_partition(m)]
            if work_only:
                due.append(m.c.task_name != SCHEDULE_TASK)
            index = due_index = dialect.unkeyed_index
            if one:
                in_queue = m.c.queue == sa.bindparam("only_queue", type_=sa.String)
                if index == "ready":  # a partial index of the queue's jobs without a key
                    index = due_index = "ready_queue"
                    ready = [*ready, in_queue]
                else:
                    # The levels of every queue (the first entries of ranges). Whether a job of
                    # the level is due in this queue is read on the queue's own range of the index
                    # by queue, which ends at its first job due later: on the range of jobs
                    # without a key it would read through every other queue's due jobs first.
                    due.append(in_queue)
                    due_index = "ready_queue"
            prefix = dialect.tables.prefix
            on_index = self._forced(f"FORCE INDEX (ix_{prefix}message_{index})")
            on_due_index = self._forced(f"FORCE INDEX (ix_{prefix}message_{due_index})")
            level = sa.bindparam("p", type_=sa.Integer)
            levels = sa.select(m.c.priority).where(*ready).order_by(m.c.priority.desc()).limit(1)
            probes = self._levels[(one, work_only)] = DueProbes(
                top=on_index(levels),
                due=on_due_index(sa.select(m.c.id).where(*ready, m.c.priority == level, *due).limit(1)),
                below=on_index(levels.where(m.c.priority < level)),
                scan=on_due_index(sa.select(m.c.id).where(*ready, *due).limit(1)),
            )
        return probes

    def _running_probe(self, in_queues: bool) -> Any:
        """A job of the queues (bind ``queues``) running, other than a schedule message's turn: a
        range of the index of leases, which holds only running jobs where indexes are partial."""
        probe = self._running.get(in_queues)
        if probe is None:
            m = self.dialect.message
            probe = sa.select(m.c.id).where(m.c.state == PROCESSING, m.c.task_name != SCHEDULE_TASK).limit(1)
            if in_queues:
                probe = probe.where(m.c.queue.in_(sa.bindparam("queues", expanding=True)))
            hint = f"FORCE INDEX (ix_{self.dialect.tables.prefix}message_lease)"
            probe = self._running[in_queues] = self._forced(hint)(probe)
        return probe

    def _forced(self, hint: str) -> Any:
        """A function that gives a select ``hint`` on MariaDB, which chose other plans for some of
        these; the other databases find them themselves."""
        m = self.dialect.message

        def on_index(select: Any) -> Any:
            return select.with_hint(m, hint, dialect_name="mysql").with_hint(m, hint, dialect_name="mariadb")

        return on_index
