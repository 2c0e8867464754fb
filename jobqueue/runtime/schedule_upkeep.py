"""A supervisor's part in periodic tasks: make the schedule messages match its code at start
(create, update, retire), apply later the changes that found their schedule busy being fired, and
create again the schedule messages deleted or cancelled by hand while it runs. What a schedule
means is ``jobqueue.schedule_times``'s and how a sync decides ``jobqueue.schedule_sync``'s; here is
when a supervisor does it and what it logs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobqueue import schedule_sync
from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.runtime.resilience import DatabaseGuard

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.supervisor")

# Syncs at start while a schedule is being fired (0.2 s apart) before its change is left for later.
SCHEDULE_SYNC_RETRIES = 10


@dataclass
class ScheduleUpkeep:
    app: JobQueue
    supervisor_id: str
    guard: DatabaseGuard
    busy: set[str] = field(default_factory=set)  # changed in code, held by a delivery when we started
    failing: bool = False  # whether the last look for deleted schedule messages failed

    def __post_init__(self) -> None:
        self.keeper = schedule_sync.Keeper(self.app.schedules, self.supervisor_id)

    def sync_at_start(self) -> None:
        """Create, update and retire schedule messages to match the code (before any child forks)."""
        report = self._sync()
        for _ in range(SCHEDULE_SYNC_RETRIES):
            if not report.busy:
                break
            time.sleep(0.2)  # a schedule being fired right now: its change waits a moment
            # The whole sync again (what matches the code is left alone): a removal waits too.
            again = self._sync()
            report.created += again.created
            report.updated += again.updated
            report.retired += again.retired
            report.busy = again.busy
            report.clashing = again.clashing
            report.contested = {**again.contested, **report.contested}  # as this start found them first
        _log_changes(report)
        if report.clashing:
            raise ConfigurationError(report.clash_message())
        if report.busy:
            # Held longer than a fire takes: most likely by a worker that died while firing it, whose
            # lease has yet to run out. The change is applied once it is free (see sync_busy).
            logger.warning(
                "schedules changed in code but busy being fired: %s; the change applies once they are free",
                ", ".join(sorted(report.busy)),
            )
        # Applied all the same (every start applies its code's definitions), said once, at this start:
        # while it runs, this worker looks again only at the busy ones, so two apps that share a
        # schedule name take it from each other at their starts, not over and over.
        for contest in sorted(report.contested.values(), key=lambda contest: contest.name):
            logger.warning("%s", contest.message())
        self.busy = set(report.busy)
        self.keeper.check(self.app.store, utcnow())  # the ids of the messages, to tell a retirement later

    def sync_busy(self) -> None:
        """Apply the changes (edits and removals) that found their schedule held at start, now that
        leases may have run out: the sync again, of those schedules only (the others are another
        worker's to change at its start), which leaves alone what matches the code."""
        report = self._sync(only=self.busy)
        self.busy = set(report.busy)
        _log_changes(report)
        if report.clashing:
            logger.error("%s", report.clash_message())

    def keep(self) -> None:
        """Create again the schedule messages deleted since the last look (see schedule_sync.Keeper); an
        error is logged once until a look succeeds again."""
        try:
            ok, found = self.guard.try_once(lambda: self.keeper.check(self.app.store, utcnow()))
        except Exception:
            if not self.failing:
                logger.exception(
                    "could not look for deleted schedule messages; trying again every %s s",
                    self.app.settings.release_stuck_interval,
                )
            self.failing = True
            return
        self.failing = False
        if not ok or found is None:
            return
        created, retired = found
        if created:
            logger.warning(
                "schedule messages were missing (deleted or cancelled by hand?), created again: %s; their next "
                "fires count from now. A schedule stops for good when it is removed from the code",
                ", ".join(created),
            )
        if retired:
            logger.info(
                "schedules retired by a worker whose code no longer defines them: %s; this worker leaves them "
                "retired (a release that defines them again creates them when its workers start)",
                ", ".join(retired),
            )

    def _sync(self, only: set[str] | None = None) -> schedule_sync.SyncReport:
        return schedule_sync.sync(
            self.app.store,
            self.app.schedules,
            set(self.app.registry),
            utcnow(),
            writer=self.supervisor_id,
            stale_seconds=self.app.settings.worker_stale_after,
            only=only,
        )


def _log_changes(report: schedule_sync.SyncReport) -> None:
    for kind in ("created", "updated", "retired"):
        names = getattr(report, kind)
        if names:
            logger.info("schedules %s: %s", kind, ", ".join(sorted(names)))
