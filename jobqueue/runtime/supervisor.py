"""The supervisor: forks worker processes and keeps the pool and its leases healthy.

Every tick (0.1 s, or sooner when a child exits or a signal arrives) it: reaps dead children,
records a hard-timeout kill as a failed attempt, returns the child's other messages to PENDING at
once and forks a replacement; kills children past their job's hard timeout; takes back the
unstarted buffer of a child whose job has run past ``HOARD_SECONDS``; renews the worker rows and
the leases of every message the children hold; releases expired leases (other hosts' dead
workers); stops on signals (first: warm, second: cold) or, with ``--burst``, once the queues are
drained. Database work goes through a guard: an outage is logged once and the work is retried on
later ticks, never blocking the loop. No error ends the loop: the children would run on without
anyone renewing their leases (they are killed by the kernel if the supervisor dies anyway).
"""

from __future__ import annotations

import difflib
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from multiprocess import connection as mp_connection

from jobqueue import clock, topics
from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.runtime import metrics
from jobqueue.runtime.executor import Executor
from jobqueue.runtime.housekeeping import Housekeeping
from jobqueue.runtime.oscalls import drain, name_process, poke
from jobqueue.runtime.pool import Pool, pipe
from jobqueue.runtime.progress import Progress
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.runtime.retry_later import RetryLater
from jobqueue.runtime.schedule_upkeep import ScheduleUpkeep
from jobqueue.runtime.supervisor_maintenance import Maintenance
from jobqueue.runtime.supervisor_reap import Reaping
from jobqueue.settings import resolve_listen_url
from jobqueue.storage.dialects.connector import CONTENTION
from jobqueue.storage.engine import check_listen_url, mask_url

if TYPE_CHECKING:
    from collections.abc import Iterable

    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.supervisor")

TICK_SECONDS = 0.1
BURST_HORIZON_SECONDS = 5.0
BURST_CHECK_SECONDS = 0.25
# Deaths in a row as they start, of every worker process, after which a --burst worker gives up.
BURST_QUICK_DEATHS = 5
# Turns of its housekeeping a --burst worker that tidies gives it to go through before it ends.
BURST_HOUSEKEEPING_TURNS = 3
LOOP_ERROR_PAUSE_SECONDS = 1.0
# Two stop signals this close together are one request (a warm stop), not a warm and a cold one.
SAME_REQUEST_SECONDS = 0.25
# Signals the supervisor notes in its log and otherwise ignores (worker processes keep the default).
IGNORED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


@dataclass
class Supervisor(Reaping, Maintenance):
    app: JobQueue
    burst: bool = False
    progress: bool = False
    supervisor_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        self.settings = self.app.settings
        self.size = self.settings.effective_concurrency
        self.pool = Pool(self.app, self.supervisor_id)
        self.children = self.pool.children  # by slot index
        self.signals = 0
        self.stopping = False
        self.stop_deadline = 0.0
        self.next_heartbeat = 0.0
        self.renewed_ns: int | None = None  # when the last successful renewal was sent (monotonic)
        self.next_release = 0.0
        self.release_after = 0.0  # no expired lease is released before this (after the clock jumped)
        self.clock_mark: tuple[float, datetime] | None = None  # (monotonic, lease clock) at the last look
        self.tidies = True  # the first of its peers (alone until the worker registry says otherwise)
        self.next_checkpoint = 0.0
        self.checkpoints = False  # whether this supervisor writes the database's journal back
        self.next_burst_check = 0.0
        self.exit_code = 0  # of a warm stop
        self.done_by_dead = 0
        self.unspent = 0  # news of work that found no idle process to wake
        self.meter: Progress | None = None
        self.metrics: metrics.Metrics | None = None
        self.last_loop_error: tuple[str, float] | None = None
        self.ignored_signals: list[int] = []
        self.guard = DatabaseGuard(
            logger,
            "database (supervisor)",
            lambda exc: self.app.store.classify(exc),
            lambda exc: self.app.store.explain(exc),
        )
        self.schedule_upkeep = ScheduleUpkeep(self.app, self.supervisor_id, self.guard)
        # Database work that failed during an outage, retried every tick until it succeeds.
        self.later = RetryLater(self.guard)
        self.groups_waiting: set[tuple[str, str]] = set()  # groups said to wait for a publisher's lock

    # -- entry point -------------------------------------------------------------------------------
    def run(self) -> int:
        if not self.app.registry:
            raise ConfigurationError(
                "no tasks are registered: point the worker at your app with --app module:attribute (or "
                "JOBQUEUE_APP); if that module makes the app but defines its tasks in other modules, import "
                "those at its end (from myproject import tasks), or point --app at one of them"
            )
        if self.app.framework is not None:
            self.app.framework.check_worker()
        check_listen_url(self.app.database_url, resolve_listen_url(self.settings))  # before any work
        name_process("jobqueue-supervisor")
        self.consumers = topics.served_consumers(self.app.consumers.values(), self.settings.groups)
        self.housekeeping = Housekeeping(self.app, self.guard, collects_topics=bool(self.consumers))
        if self.settings.queues is not None or self.settings.groups is not None:
            # Served: the queues asked for (or those of the app's tasks) and the groups' own queues.
            consumed = {c.queue for c in self.app.consumers.values()}
            tasks = self.settings.queues or tuple(
                sorted({task.queue for task in self.app.registry.values() if task.queue not in consumed})
            )
            self.app.configure(queues=tuple(dict.fromkeys([*tasks, *(c.queue for c in self.consumers)])))
            self.settings = self.app.settings
        self.wake_r, self.wake_w = pipe()
        self.more_r, self.more_w = pipe()
        self.pool.more_w, self.pool.idle_w = self.more_w, self.wake_w
        self._install_signals()
        if self.settings.metrics_port:
            self.metrics = metrics.start(
                self.settings.metrics_host, self.settings.metrics_port, self.app.store, self._process_counts
            )
        # This process measures how far this host's clock is off the server's, every
        # release_stuck_interval, for itself and its worker processes (see jobqueue.clock).
        clock.kept_elsewhere()
        try:
            if not self._start():
                return 0  # stopped by a signal while waiting for the database
            return self._loop()
        finally:
            clock.kept_elsewhere(False)
            # Whatever ended the loop, no child outlives it (they would run on unsupervised).
            if any(c.process.exitcode is None for c in self.children.values()):
                self.pool.kill_all("supervisor exiting")
                self._release_killed()
            if hasattr(self, "waker"):
                self.waker.close()
            if self.meter is not None:
                self.meter.close(self._done())
            if self.metrics is not None:
                self.metrics.close()
                metrics.active = None
            signal.set_wakeup_fd(-1)
            for fd in (self.wake_r, self.wake_w, self.more_r, self.more_w):
                os.close(fd)
            self.app.close()

    def _start(self) -> bool:
        """Check the schema, create the schedules and fork the pool; wait out a database that is down."""
        queues = ",".join(self.settings.queues) if self.settings.queues else "all queues"
        logger.info(
            "jobqueue worker %s: %s on %s serving %s; tasks: %s",
            self.supervisor_id[:8],
            "1 process" if self.size == 1 else f"{self.size} processes",
            mask_url(self.app.database_url),
            queues,
            ", ".join(sorted(self.app.registry)),
        )
        self._warn_of_strange_queues()
        # Before any waiting: a cause that no retry can fix (a database this process may not write,
        # a statement time limit too short for any statement) ends the start with the fix.
        self.app.store.check_workable()
        try:
            self.guard.call(self._check_schema, give_up=lambda: self.signals > 0, doing="checking the schema")
            self.guard.call(self.app.store.check_rights, give_up=lambda: self.signals > 0, doing="checking its rights")
            self.guard.call(self._check_connection_limit, give_up=lambda: self.signals > 0)
            self.store = self.app.store
            # Before anything is stamped (the schedules' next fires) and any fork: on the server's
            # clock. This also takes the lease clock's first mark.
            self._lease_clock_jumped()
            # Before any fork: the worker processes' commits never stop to write the journal back.
            self.checkpoints = self.store.take_over_checkpoints()
            self.guard.call(self.store.repair_ids, give_up=lambda: self.signals > 0)
            self.executor = Executor(self.app)
            self.guard.call(self.schedule_upkeep.sync_at_start, give_up=lambda: self.signals > 0)
            self.guard.call(self._register_groups, give_up=lambda: self.signals > 0)
            # Before any fork: the worker processes share the statements built here.
            self.guard.call(lambda: self.store.warm_up(self.settings.queues), give_up=lambda: self.signals > 0)
            self.waker = self.guard.call(
                lambda: self.store.waker(
                    self.settings.queues,
                    self.settings.idle_poll_interval,
                    self.settings.max_fetch_interval,
                    resolve_listen_url(self.settings),
                ),
                give_up=lambda: self.signals > 0,
            )
            # The supervisor's own connection, opened before any fork and kept in its pool (the
            # LISTEN holds another): under a login limited to fewer connections than the worker
            # needs, its processes took every one left, and the supervisor renewed no lease.
            self.guard.call(self.store.lease_clock_now, give_up=lambda: self.signals > 0)
        except GaveUp:
            logger.info("jobqueue worker %s stopped before it started", self.supervisor_id[:8])
            return False
        self.meter = Progress(self.store, self.settings.queues) if self.progress else None
        for index in range(self.size):
            if self.signals:  # stopped while forking (a large pool takes a while): the loop stops it
                break
            self.pool.spawn(index)
        return True

    def _check_schema(self) -> None:
        """The tables at this release's version (else SchemaError); what `db init` makes beyond them
        and is missing (PostgreSQL's wake-up trigger, left out of an application's own migrations)
        only slows new jobs down: said, and the worker runs."""
        store = self.app.store
        self.app.check_schema(beyond_tables=False)
        with store.engine.connect() as connection:
            missing = store.dialect.lacks_beyond_tables(connection)
            connection.rollback()
        if missing:
            logger.warning(
                "the jobqueue tables lack %s (dropped, or left out of the application's own migrations): idle "
                "worker processes hear of no new job, and find it only when they poll (every %s s); run "
                "`jobqueue db init` to make it again",
                ", ".join(missing),
                self.settings.max_fetch_interval,
            )

    def _check_connection_limit(self) -> None:
        """A login limited to fewer connections than this worker holds: the processes beyond the
        limit wait for a connection, running nothing; said at start, with the fix."""
        size = self.settings.effective_concurrency
        listens = self.app.store.dialect.name == "postgresql" and resolve_listen_url(self.settings) is None
        needed = 1 + 2 * size + (1 if listens else 0)
        parts = f"2 per process, 1 for the supervisor{', 1 to LISTEN' if listens else ''}"
        said = self.app.store.connection_limit_warning(needed, f"a worker of {size} process(es) ({parts})")
        if said:
            logger.warning("%s", said)

    def _warn_of_strange_queues(self) -> None:
        """A queue asked for that none of the app's tasks and consumers declares, but whose name is
        close to one they do, is most likely a typo, which would otherwise idle without a word. It
        is served all the same: jobs sent there with ``queue=`` or by name run."""
        for queue, close in queue_typos(self.app, self.settings.queues):
            logger.warning(
                "no task of this app declares the queue %r: did you mean %r? It is served all the same, "
                "for jobs sent there with queue= or by name",
                queue,
                close,
            )

    def _register_groups(self) -> None:
        """Add the consumer groups this worker runs to their topics, those that are new."""
        store = self.app.topic_store
        added = []
        for c in self.consumers:
            try:
                new = store.register(c.topic, c.group, c.start)
            except sa.exc.DBAPIError as exc:
                if self.app.store.classify(exc) == CONTENTION and (c.topic, c.group) not in self.groups_waiting:
                    self.groups_waiting.add((c.topic, c.group))
                    logger.warning(
                        "adding consumer group %s:%s waits for a transaction that published to topic %s and is "
                        "still open (the lock it holds until it ends); publishes go on meanwhile, and the group "
                        "is added once it ends",
                        c.topic,
                        c.group,
                        c.topic,
                    )
                raise
            if new:
                added.append(f"{c.topic}:{c.group} (from the {c.start})")
            elif (started := store.start_of(c.topic, c.group)) not in (None, c.start):
                # A start changed in the code of a group that exists: nothing would say it is not
                # replayed (to "earliest") nor skipped ahead (to "latest").
                logger.warning(
                    "consumer group %s:%s has start=%r, but it was added from the %s and goes on from "
                    "where it is: start applies only when a group is added (`jobqueue topics drop-group "
                    "%s %s` removes it with its waiting messages; the next worker adds it again)",
                    c.topic,
                    c.group,
                    c.start,
                    started,
                    c.topic,
                    c.group,
                )
        if added:
            logger.info("consumer groups added: %s", ", ".join(added))

    def _install_signals(self) -> None:
        first_at = [0.0]

        def on_signal(signum: int, frame: Any) -> None:
            # Count and return: the loop reads the count at its next tick (the wakeup fd ends its wait).
            # One request to stop may come as two signals at once: `timeout` and some process
            # managers signal the process and then its whole group, which holds it too. A second
            # signal counts only once a person could have sent it.
            now = time.monotonic()
            if self.signals == 1 and now - first_at[0] < SAME_REQUEST_SECONDS:
                return
            first_at[0] = now
            self.signals += 1

        def on_other(signum: int, frame: Any) -> None:
            self.ignored_signals.append(signum)  # said in the log by the loop

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # Signals whose default is to end the process without a word (logrotate's SIGUSR1, a stray
        # alarm): the supervisor's processes would die with it, and their jobs wait for their leases.
        for signum in IGNORED_SIGNALS:
            signal.signal(signum, on_other)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

    def _loop(self) -> int:
        while True:
            try:
                code = self._tick()
            except Exception as exc:
                self._loop_error(exc)
                continue
            if code is not None:
                return code

    def _tick(self) -> int | None:
        """One turn of the loop; an exit code once the supervisor is done."""
        self._wait()
        if self.signals >= 2:
            return self._cold_stop()
        if self.signals == 1 and not self.stopping:
            self._begin_stop("signal received")
        while self.ignored_signals:
            logger.warning(
                "ignored signal %s: jobqueue worker stops on SIGTERM or SIGINT (a second one stops it at once)",
                signal.Signals(self.ignored_signals.pop(0)).name,
            )
        self._reap()
        self.later.retry_due()
        if self.stopping and not self.children:
            self.later.finish(self.settings.graceful_timeout, stopped=lambda: self.signals >= 2)
            logger.info("jobqueue worker %s stopped", self.supervisor_id[:8])
            return self.exit_code
        if not self.stopping:
            self.pool.respawn_due()
        self.pool.enforce_time_limits()
        self._take_back_buffers()
        self._maintenance()  # never raises: the steps below run whatever the database refuses it
        if self.stopping:
            self.pool.remind()
        if self.stopping and time.monotonic() > self.stop_deadline:
            self.pool.kill_all("graceful_timeout passed")
        if self.burst and not self.stopping:
            self._give_up_on_dying_processes()
        if self.burst and not self.stopping:
            self._check_burst()
        if self.meter is not None:
            self.meter.update(self._done())
        return None

    def _loop_error(self, exc: Exception) -> None:
        """Log an error the loop met (once a minute for the same one) and pause a moment; go on."""
        self._log_error(exc)
        time.sleep(LOOP_ERROR_PAUSE_SECONDS if self.signals == 0 else 0)

    def _wait(self) -> None:
        """Sleep until a child exits, a signal arrives, news of work arrives or the tick ends."""
        waitables: list[Any] = [self.wake_r, self.more_r] + [c.process.sentinel for c in self.children.values()]
        news_fd = self.waker.fileno()
        if news_fd is not None:
            waitables.append(news_fd)
        idle = self.pool.idle()
        timeout = TICK_SECONDS
        poll_due = self.waker.due_in(time.monotonic()) if idle else None
        if poll_due is not None:
            timeout = min(timeout, poll_due)
        ready = mp_connection.wait(waitables, timeout=timeout)
        if self.wake_r in ready:
            drain(self.wake_r)
        # Idle processes are woken one per piece of news, not all at once: one new job wakes one
        # process, and a process whose fetch came back full asks (more_r) for a sibling to join it.
        wanted = 0
        if self.more_r in ready:
            drain(self.more_r)
            wanted += 1
        # A LISTEN connection is read whenever it has something, lest it stay readable; pollers only
        # ask while someone idles.
        if (news_fd is not None and news_fd in ready) or (poll_due is not None and idle):
            wanted += self.waker.check(time.monotonic())
        wanted += self.unspent
        if wanted:
            # Who idles now, not before the wait: a process woken for the last news may be running
            # that job already. Among the idle, the least recently woken first: one woken a moment
            # ago may not have fetched yet.
            woken = sorted(self.pool.idle(), key=lambda c: c.poked_at)[:wanted]
            for child in woken:
                child.poked_at = time.monotonic()
                poke(child.spec.wake_w)
            # News nobody idle could take (a process between its empty fetch and saying it idles)
            # waits for the next process that idles; SQLite's data_version says it only once.
            self.unspent = min(wanted - len(woken), self.size)

    def _give_up_on_dying_processes(self) -> None:
        """--burst: stop, exit status 1, once every worker process has died as it started, before
        running a job, this many times in a row. A worker waits for such a cause to go (a database
        that refuses connections comes back); a burst run would wait for ever."""
        fewest = min(self.pool.quick_deaths.get(index, 0) for index in range(self.size))
        if fewest < BURST_QUICK_DEATHS:
            return
        views = [child.spec.slot.read() for child in self.children.values()]
        if not any(view is not None and (view.done or view.running_id) for view in views):
            # (A process that came up after dying so runs the jobs: nothing to give up.)
            logger.error(
                "--burst gives up: every worker process died as it started, before running a job, %s times in a "
                "row (their exit status and the cause are in the log above: an import, a worker_process_init "
                "receiver, a database refusing connections)",
                fewest,
            )
            self.exit_code = 1
            self._begin_stop("worker processes die as they start")

    def _check_burst(self) -> None:
        now = time.monotonic()
        if now < self.next_burst_check:
            return
        self.next_burst_check = now + BURST_CHECK_SECONDS
        views = [c.spec.slot.read() for c in self.children.values()]
        if not views or self.later.pending or not all(v is not None and v.idle for v in views):
            return
        if self.tidies and not self.housekeeping.looked and self.housekeeping.runs < BURST_HOUSEKEEPING_TURNS:
            # Not before its housekeeping went through once (or had a few turns, should the
            # database refuse it): a job whose due time is no time (edited by hand) is failed by
            # it, and until then holds its partition's others back.
            return
        horizon = utcnow() + timedelta(seconds=BURST_HORIZON_SECONDS)
        ok, busy = self.guard.try_once(lambda: self.store.has_work(self.settings.queues, horizon), reads=True)
        if ok and not busy:
            self._begin_stop("burst: no message processing or due within 5 s")

    # -- stopping ----------------------------------------------------------------------------------
    def _begin_stop(self, reason: str) -> None:
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.settings.graceful_timeout
        logger.info("stopping (%s): running jobs get up to %s s to finish", reason, self.settings.graceful_timeout)
        self.pool.stop()

    def _cold_stop(self) -> int:
        self.stopping = True
        self.pool.kill_all("second signal")
        self._reap()
        self.later.retry_due(now_anyway=True)
        for what, _ in self.later.pending:
            logger.error("could not %s before exiting; those messages return when their leases expire", what)
        logger.warning("cold shutdown")
        return 1

    def _release_killed(self) -> None:
        """Return the messages of children killed on the way out, if the database answers now."""
        self.stopping = True
        try:
            self._reap()
            self.later.retry_due(now_anyway=True)
        except Exception:
            logger.exception(
                "could not return the messages of the killed worker processes; they return when their leases expire"
            )

    def _process_counts(self) -> dict[str, int]:
        """This supervisor's processes by what they do (read by the metrics thread: a copy of the dict)."""
        views = [child.spec.slot.read_raw() for child in list(self.children.values())]
        busy = sum(not view.idle for view in views)
        return {"busy": busy, "idle": len(views) - busy}

    def _done(self) -> int:
        views = [c.spec.slot.read_raw() for c in self.children.values()]
        return self.done_by_dead + sum(v.done for v in views)


def run_supervisor(app: JobQueue, burst: bool = False, progress: bool = False) -> int:
    """Run a supervisor in this process until it stops; return its exit code."""
    return Supervisor(app, burst=burst, progress=progress).run()


def queue_typos(app: JobQueue, queues: Iterable[str] | None) -> list[tuple[str, str]]:
    """The queues asked for that none of ``app``'s tasks and consumers declares but whose name is
    close to one they do (most likely typos), each with the declared name it is close to."""
    known = sorted({task.queue for task in app.registry.values()} | {c.queue for c in app.consumers.values()})
    found = []
    for queue in queues or ():
        close = [] if queue in known else difflib.get_close_matches(queue, known, n=1, cutoff=0.75)
        if close:
            found.append((queue, close[0]))
    return found
