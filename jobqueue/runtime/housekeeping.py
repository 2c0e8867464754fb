"""Housekeeping that a pool of supervisors needs done once, not once per host: forget long-dead
worker rows, trim the topic logs, forget idle flow keys and add back the lost rows of keys with
jobs. Supervisors serving the same queues leave it to the first of them by id; should that one
die, the next takes over once its rows go stale (``worker_stale_after``). Releasing expired
leases is not among it: every supervisor does that, so that a dead worker's jobs come back as
soon as possible.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobqueue.runtime.resilience import DatabaseGuard
from jobqueue.storage.jobs import fail_unreadable_due_time

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.supervisor")

# Flow keys without jobs are forgotten after a minute, swept once a minute: acquires walk the keys
# in the order they were served, and a key that went quiet would otherwise stay at the front. The
# same sweep adds back the rows that keys with jobs lack (deleted by hand).
FLOW_IDLE_SECONDS = 60.0
FLOW_SWEEP_SECONDS = 60.0
# How often a supervisor that runs consumer groups trims the topics' logs of finished messages.
TOPIC_COLLECT_SECONDS = 5.0
# Messages whose due time was edited into something no worker finds due (SQLite: "soon";
# PostgreSQL: 'infinity') are looked for this many ids at a time, on each tick: a range of the
# primary key, so that the look costs the same however large the backlog (a million ids in
# about a quarter of an hour at the default release_stuck_interval).
NEVER_DUE_SPAN = 5000


@dataclass
class Housekeeping:
    """The pool's housekeeping, as one supervisor does it: ``run`` on its ticks while it is the
    first of its peers. ``run`` returns how many keys' jobs became takeable (rows added back),
    news for idle processes that nothing else gives (no job was added)."""

    app: JobQueue
    guard: DatabaseGuard
    collects_topics: bool  # whether this supervisor runs consumer groups
    next_flow_sweep: float = 0.0
    next_topic_collect: float = 0.0
    flow_walk_after: str | None = None  # where the next look for keys without a flow row goes on
    never_due_after: int = 0  # where the next look for due times that are no times goes on
    looked: bool = False  # whether a look for due times that are no times went through once
    runs: int = 0  # turns begun, whatever became of them

    def run(self, now: float) -> int:
        self.runs += 1
        settings, store = self.app.settings, self.app.store
        stale = max(10 * settings.release_stuck_timeout, 300.0)
        self.guard.try_once(lambda: store.prune_workers(stale))
        self.looked = self._fail_never_due() or self.looked
        if self.collects_topics and now >= self.next_topic_collect:
            self.next_topic_collect = now + TOPIC_COLLECT_SECONDS
            self.guard.try_once(self.app.topic_store.collect)
        if now < self.next_flow_sweep:
            return 0
        self.next_flow_sweep = now + FLOW_SWEEP_SECONDS
        self.guard.try_once(lambda: store.forget_idle_flow_keys(FLOW_IDLE_SECONDS))
        return self._restore_flow_keys()

    def _fail_never_due(self) -> bool:
        """Fail the messages whose due time holds no time (edited by hand): no worker would ever
        take them, nor could it read them, and one of a partition would hold its key for ever.
        Whether the look went through."""
        store = self.app.store
        ok, found = self.guard.try_once(
            lambda: store.never_due_messages(self.never_due_after, NEVER_DUE_SPAN), reads=True
        )
        if not ok or found is None:
            return False
        rows, self.never_due_after = found
        for job_id, stored in rows:
            done, failed = self.guard.try_once(functools.partial(fail_unreadable_due_time, store, job_id, stored))
            if done and failed:
                logger.error(
                    "job %s: its due time (next_attempt_at) holds %r, which is no time (edited by hand?), so "
                    "no worker would ever take it; it is failed with CorruptMessage",
                    job_id,
                    stored[:200],
                )
        return True

    def _restore_flow_keys(self) -> int:
        """Add back the flow rows of keys with jobs that have none (deleted by hand): no worker
        acquires those jobs, and a --burst worker would wait for them forever."""
        ok, restored = self.guard.try_once(lambda: self.app.store.restore_missing_flow_keys(self.flow_walk_after))
        if not ok or restored is None:
            return 0
        self.flow_walk_after = restored.resume_after
        if restored.keys:
            shown = ", ".join(repr(key) for key in restored.keys[:10])
            more = f" and {len(restored.keys) - 10} more" if len(restored.keys) > 10 else ""
            logger.warning(
                "flow key(s) %s%s had jobs but no row in the flow table (deleted by hand?), so no worker took "
                "their jobs; the rows are added back",
                shown,
                more,
            )
        return len(restored.keys)
