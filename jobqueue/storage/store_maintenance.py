"""The supervisors' upkeep of the database: the worker registry and its peers, flow rows swept
and restored, ids repaired, SQLite's journal written back, and a liveness check."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from jobqueue.flow import RATE_MEMORY_SECONDS, rate_horizon
from jobqueue.storage import flowkeys
from jobqueue.storage.dialects.common import READY_LITERALS
from jobqueue.storage.store_base import StoreBase
from jobqueue.storage.tables import Timestamp


class MaintenanceOperations(StoreBase):
    """The store's housekeeping, done by supervisors rather than for one job."""

    def forget_idle_flow_keys(self, idle_seconds: float, now: datetime | None = None, most: int = 1000) -> int:
        """Delete the flow rows of keys without jobs that were last served more than
        ``idle_seconds`` ago by the lease clock; a key's next job adds its row back. A key with a
        rate limit is kept until its last start is ``RATE_MEMORY_SECONDS`` old: forgetting it
        sooner would let its next jobs start at once. Rows an enqueue or an acquire holds are
        skipped."""
        f, m = self.tables.flow, self.tables.message
        idle = [
            f.c.served_at < sa.bindparam("quiet_before", type_=Timestamp),
            sa.or_(
                f.c.next_start_at.is_(None),
                f.c.next_start_at < sa.bindparam("rates_before", type_=Timestamp),
                f.c.next_start_at > sa.bindparam("rate_horizon", type_=Timestamp),  # no rate's: see rate_horizon
            ),
            ~sa.exists().where(m.c.flow_key == f.c.flow_key),
        ]
        found = sa.select(f.c.flow_key).where(*idle).order_by(f.c.served_at).limit(most)
        with self.writing() as conn:
            now = now or self.database_now(conn)
            binds = {
                "quiet_before": now - timedelta(seconds=idle_seconds),
                "rates_before": now - timedelta(seconds=max(idle_seconds, RATE_MEMORY_SECONDS)),
                "rate_horizon": rate_horizon(now),
            }
            keys = list(conn.execute(found.with_for_update(skip_locked=True), binds).scalars())
            if not keys:
                return 0
            # Checked again by a statement of its own: a job committed since the first one read
            # keeps its key (the rows are locked now, so no enqueue of them can be half done).
            gone = sa.delete(f).where(f.c.flow_key.in_(keys), *idle)
            return int(conn.execute(gone, binds).rowcount)

    def never_due_messages(self, after: int, span: int) -> tuple[list[tuple[int, str]], int]:
        """The ready messages among ids ``after`` + 1 to ``after`` + ``span`` whose due time holds
        what no worker finds due or can read (edited in by hand), with that value as text, and the
        id to go on after: a walk of the primary key one range at a time, from the start again
        once past the largest id, so that no look reads more than ``span`` rows."""
        m = self.tables.message
        never = self.dialect.never_due(m.c.next_attempt_at)
        if never is None:
            return [], after
        with self.reading() as conn:
            if after >= (conn.execute(sa.select(sa.func.max(m.c.id))).scalar() or 0):
                after = 0
            found = sa.select(m.c.id, self.dialect.as_stored(m.c.next_attempt_at)).where(
                m.c.id > after, m.c.id <= after + span, m.c.state.in_(READY_LITERALS), never
            )
            rows = [(int(row[0]), str(row[1])) for row in conn.execute(found)]
        return rows, after + span

    def restore_missing_flow_keys(self, after: str | None = None, most: int = flowkeys.WALK_MOST) -> flowkeys.Restored:
        """Add back the flow rows that keys with jobs lack (deleted by hand): without its row, no
        worker acquires a key's jobs. Walks ``most`` keys at most, one index probe each, from the
        one after ``after``; the result says where the next call goes on."""
        return flowkeys.restore_missing(self, after, most)

    def register_worker(self, row: dict[str, Any]) -> None:
        """Add a worker process's row; one there already is kept (a registration tried again after
        its commit's reply was lost, or made by its supervisor meanwhile)."""
        w = self.tables.worker
        with self.schema_errors(), self.engine.begin() as conn:
            conn.execute(self.dialect.insert_unless_present(w, [w.c.id]), row)

    def register_missing_workers(self, rows: list[dict[str, Any]]) -> int:
        """Register again the worker processes of ``rows`` (each registered itself before) whose
        rows are gone: deleted as stale while their supervisor renewed nothing (frozen, or cut off
        from the database), or by ``jobqueue workers --prune``. Return how many."""
        if not rows:
            return 0
        w = self.tables.worker
        with self.engine.begin() as conn:
            present = set(conn.execute(sa.select(w.c.id).where(w.c.id.in_([row["id"] for row in rows]))).scalars())
            gone = [row for row in rows if row["id"] not in present]
            if gone:
                conn.execute(self.dialect.insert_unless_present(w, [w.c.id]), gone)
        return len(gone)

    def remove_workers(self, worker_ids: list[str]) -> None:
        if worker_ids:
            w = self.tables.worker
            with self.engine.begin() as conn:
                conn.execute(sa.delete(w).where(w.c.id.in_(worker_ids)))

    def supervisor_peers(
        self, supervisor_id: str, queues: tuple[str, ...] | None, stale_seconds: float
    ) -> tuple[int, int]:
        """(rank, count) of this supervisor among the live ones serving the same queues, ordered
        by id; (0, 1) until its processes have registered."""
        w = self.tables.worker
        served = ",".join(queues or ()) or None
        stmt = (
            sa.select(w.c.supervisor_id)
            .distinct()
            .where(
                w.c.queues.is_(None) if served is None else w.c.queues == served,
                w.c.heartbeat_at >= self.dialect.clock_plus(),
            )
            .order_by(w.c.supervisor_id)
        )
        with self.reading() as conn:
            ids = list(conn.execute(stmt, self._lease_clock(-stale_seconds, None).binds()).scalars())
        return (ids.index(supervisor_id), len(ids)) if supervisor_id in ids else (0, 1)

    def prune_workers(self, stale_seconds: float, now: datetime | None = None) -> int:
        """Delete worker rows whose heartbeat is older than ``stale_seconds`` by the lease clock."""
        w = self.tables.worker
        with self.engine.begin() as conn:
            stmt = sa.delete(w).where(w.c.heartbeat_at < self.dialect.clock_plus())
            return int(conn.execute(stmt, self._lease_clock(-stale_seconds, now).binds()).rowcount)

    def repair_ids(self) -> int:
        """Give fresh ids to waiting messages whose ids an archived job has (see the MySQL dialect)."""
        with self.engine.begin() as conn:
            return self.dialect.repair_ids(conn)

    def take_over_checkpoints(self) -> bool:
        """Let this process write the journal back from now on (see :meth:`checkpoint`), for its
        connections and those of the processes it forks: SQLite's commits otherwise do it now and
        then, and wait for the disk while a job waits. False where there is nothing to take over."""
        return self.dialect.take_over_checkpoints()

    def checkpoint(self) -> None:
        """Write the journal back into the database file, where :meth:`take_over_checkpoints` took
        that over (SQLite); without blocking readers or writers."""
        self.dialect.checkpoint()

    def ping(self) -> None:
        """Raise unless the database answers a trivial query on a new connection."""
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
