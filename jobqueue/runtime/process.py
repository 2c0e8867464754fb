"""A worker process: a blocking loop of fetch -> run -> buffer outcomes -> flush.

The process runs one job at a time. It fetches a batch sized to how long its jobs take (about
``PREFETCH_WINDOW_SECONDS`` of work, at most ``fetch_batch_size``), so no-op jobs come in large
batches while slow jobs are fetched one at a time. Outcomes are written when the buffer runs dry,
when ``flush_interval`` has passed, or when ``capacity`` of them wait. A fetch that comes back
short of its limit means the queues are empty for now: the process then idles, sending nothing,
until its supervisor wakes it with news of work (see storage.dialects.wakeup).

Once a job has run for ``HOARD_SECONDS``, the supervisor takes back the unstarted rest of the
buffer (it works from outside the process, so a job holding the GIL cannot stop it), and a keeper
thread writes outcomes that would otherwise wait longer than ``flush_interval``. Leases of
everything the process holds, buffered messages included, are renewed by the supervisor.

The process dies with its supervisor: on Linux the kernel sends it SIGKILL when the supervisor
exits (a parent-death signal), and elsewhere the keeper notices the new parent within a tick. A
process left running without a supervisor would run jobs whose leases nobody renews.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobqueue import clock, signals
from jobqueue.clock import utcnow
from jobqueue.job import Message
from jobqueue.runtime.executor import Executor, StoreDeliveryWriter
from jobqueue.runtime.holdings import BEHIND, Holdings
from jobqueue.runtime.oscalls import (
    DESCRIPTORS_LOST_STATUS,
    OUT_OF_MEMORY_STATUS,
    descriptor_identity,
    descriptors_floor,
    descriptors_used_up,
    forked_by_a_job,
    host_name,
    ignore_signal,
    lowest_free_descriptor,
    name_process,
    rss_kib,
    watch_supervisor,
)
from jobqueue.runtime.process_fetch import PREFETCH_WINDOW_SECONDS, Fetching
from jobqueue.runtime.process_flush import Flushing
from jobqueue.runtime.process_keeper import KEEPER_TICK_SECONDS, KeeperThread
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.runtime.slot import Slot
from jobqueue.runtime.surroundings import Surroundings
from jobqueue.runtime.writer import OutcomeWriter

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.worker")

EWMA_WEIGHT = 0.2
# A job running this long (twice what a whole batch was sized for) loses the unstarted messages
# behind it to the supervisor, which returns them to the queue.
HOARD_SECONDS = 2 * PREFETCH_WINDOW_SECONDS
KEEPER_JOIN_SECONDS = 30.0
MEMORY_RESERVE_BYTES = 64 * 1024
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@dataclass
class ChildSpec:
    """What the supervisor hands a worker process at fork."""

    index: int
    worker_id: str
    supervisor_id: str
    slot: Slot
    wake_r: int
    wake_w: int
    more_w: int = -1  # the supervisor's "wake another idle process" pipe
    idle_w: int = -1  # the supervisor's "look again" pipe: this process just turned idle
    supervisor_pid: int = 0


class WorkerProcess(Fetching, Flushing, KeeperThread):
    def __init__(self, app: JobQueue, spec: ChildSpec) -> None:
        self.app = app
        self.settings = app.settings
        self.spec = spec
        self.stopping = False
        self.capacity = capacity_of(self.settings.fetch_batch_size, self.settings.overfetch_factor)
        # A buffered message starts only while its lease has at least a heartbeat's worth left.
        self.lease_window = self.settings.release_stuck_timeout - self.settings.heartbeat_interval
        self.held = Holdings(spec.slot, self._timeout_of, start_window=self.lease_window)
        self.silent_since: float | None = None  # when the supervisor's silence was first noticed
        self.next_fetch_at = 0.0
        self.last_flush = time.monotonic()
        self.avg_duration: float | None = None
        self.done = 0
        self.last_run: Message | None = None  # the job that ran last (see _out_of_memory)
        # Freed when the process runs out of memory, so that it can still blame the job and say so.
        self.memory_reserve: bytearray | None = bytearray(MEMORY_RESERVE_BYTES)
        self.stop_requested_at: float | None = None
        self.pending_token: int | None = None
        self.keeper_stop = threading.Event()
        self.guard = DatabaseGuard(logger, f"database (worker process {os.getpid()})", self._classify, self._explain)
        # A job's own writes (checkpoint, extend) wait out an outage through a guard of their own.
        writes = StoreDeliveryWriter(
            app.store,
            DatabaseGuard(
                logger, f"database (worker process {os.getpid()}, a job's write)", self._classify, self._explain
            ),
            self.settings.release_stuck_timeout,
        )
        self.executor = Executor(app, writes=writes, ack_first=self._ack_first, writer=self.guard.call)
        self.writer = OutcomeWriter(app.store, self.guard)
        # The keeper thread writes through its own guard: a guard's bookkeeping belongs to one thread.
        self.keeper_writer = OutcomeWriter(
            app.store, DatabaseGuard(logger, "database (keeper)", self._classify, self._explain)
        )
        self.keeper_renewals = DatabaseGuard(logger, "database (keeper's lease renewal)", self._classify, self._explain)
        self.keeper_renew_after_ns = 0  # after a failed renewal, not before then
        self.keeper_lost: int | None = None  # the running job whose lease the keeper found lost
        self.keeper_renewed_id: int | None = None  # the job whose self-renewal was logged last
        self.wake_at: float | None = None  # monotonic time a deferred message of ours comes due
        self.acked_first: int | None = None  # the running job, once its ACK_FIRST outcome is written
        # File descriptors in use once connected (see descriptors_used_up); None: none were left.
        self.descriptors_at_start: int | None = None
        self.descriptors_floor = 0  # fewer in use than this: the check stops at its dup
        self.files_limit = 0  # RLIMIT_NOFILE's soft limit as the process started
        self.out_of_files = False  # the last job failed for want of a file descriptor (EMFILE)
        self.idle = False  # what the slot says: the supervisor wakes idle processes on news
        # Jobs with a flow key are acquired key by key, besides the others: any task's job may have
        # one, since a partition key is one. Whether a task this process serves has a rate limit
        # (then the process wakes when a key held back by its rate may start again).
        self.rated = serves_rated(app, self.settings.queues)

    # -- entry point -------------------------------------------------------------------------------
    def main(self) -> int:
        watch_supervisor(self.spec.supervisor_pid)
        self._install_signals()
        # Put back after each job, signal handlers included: a job's chdir is its own.
        self.surroundings = Surroundings()
        self.own_pipe = descriptor_identity(self.spec.wake_r)  # checked after every job
        # A log line that cannot be written is dropped, not raised: a job may close the stream a
        # handler writes to (sys.stderr, closed by daemonizing code), and the next line would then
        # raise inside this process's loop and end it. jobqueue's own handler has its own copy.
        logging.raiseExceptions = False
        name = name_process(f"jobqueue-worker-{self.spec.index}")
        self.app.after_fork()
        # How far this host's clock is off the server's is the supervisor's to measure: it tells.
        clock.kept_elsewhere()
        clock.follow(self.spec.slot.clock_base())
        with self.app.job_scope():  # the framework's, as for a job: Django closes what a receiver opened
            signals.worker_process_init.send(self.app, app=self.app, process_name=name)
        self.guard.what = f"database (worker process {os.getpid()})"
        self.store = self.app.store
        row = worker_row(self.spec.worker_id, self.spec.supervisor_id, os.getpid(), self.settings.queues)
        keeper = threading.Thread(target=self._keeper, name="jobqueue-keeper", daemon=True)
        try:
            self.guard.call(
                lambda: self.store.register_worker(row), give_up=lambda: self.stopping, doing="registering itself"
            )
            self.descriptors_at_start = lowest_free_descriptor(self.spec.wake_r)
            self.descriptors_floor = descriptors_floor()
            self.files_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            keeper.start()
            self._loop()
        except GaveUp:
            pass  # stopping during an outage: what we hold is released by the supervisor
        except MemoryError:
            self._out_of_memory()
        except SystemError:
            # What a driver's C code short of memory may raise ("error return without exception set")
            if memory_exhausted():
                self._out_of_memory()
            raise
        finally:
            self.keeper_stop.set()
            if keeper.is_alive():
                keeper.join(KEEPER_JOIN_SECONDS)
            self._shutdown()
            self.executor.close()
            with self.app.job_scope():
                signals.worker_process_shutdown.send(self.app, app=self.app, process_name=name)
        return 0

    def _classify(self, exc: BaseException) -> str | None:
        return self.app.store.classify(exc)

    def _explain(self, exc: BaseException) -> str | None:
        return self.app.store.explain(exc)

    def _install_signals(self) -> None:
        def on_term(signum: int, frame: Any) -> None:
            # Only set flags: the loop stops fetching at its next step and finishes the running job.
            self.stopping = True
            self.stop_requested_at = self.stop_requested_at or time.monotonic()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a job's own alarm() ends its process, as anywhere
        # Ctrl-C reaches the whole process group; the supervisor decides, and tells us with SIGTERM.
        # SIGUSR1 and SIGUSR2 reach it too when a process manager signals the group (systemctl kill
        # does, to reopen logs): the supervisor notes them, and they must not end a running job.
        # A handler that does nothing, not SIG_IGN: an ignored signal stays ignored across exec, so
        # every program a job starts would ignore it, while a handler is reset to the default
        # there. Calls it interrupts are restarted (Python retries its own, sleeps included).
        for signum in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, ignore_signal)
            signal.siginterrupt(signum, False)
        signal.set_wakeup_fd(self.spec.wake_w, warn_on_full_buffer=False)
        os.register_at_fork(after_in_child=forked_by_a_job)
        # The supervisor blocked these around fork so that none is lost before this point.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    # -- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self.stopping:
            if self._fetch_due() and self._supervisor_renewing():
                self._fetch()
            if len(self.held):
                self._run_next()
                if self._recycle_due():
                    return
            else:
                self._flush()
                if self.silent_since is None:
                    self._idle_wait()
                else:
                    self._wait_for_supervisor()

    def _timeout_of(self, message: Message) -> float | None:
        task = self.app.registry.get(message.task_name)
        return task.options.timeout if task else None

    def _run_next(self) -> None:
        waited = False
        while (message := self.held.start_next()) is BEHIND:
            # Written before the next job starts (the keeper may be writing them): its partition's
            # previous outcome, or all of them before a job that may have killed a process.
            if waited:
                time.sleep(KEEPER_TICK_SECONDS / 10)
            self._flush()
            waited = True
        if self.held.stale:
            self._report_stale()
        if message is None:
            return  # the supervisor took the buffer back meanwhile
        began = time.perf_counter()
        self.acked_first = None
        outcome = self.executor.execute(message)  # never raises for what the job did
        self.last_run = message
        if descriptor_identity(self.spec.wake_r) != self.own_pipe:
            self._descriptors_lost(message)
        self.surroundings.restore()
        self._cancel_timer_left(message)
        self.out_of_files = outcome is not None and outcome.error is not None and EMFILE_TEXT in outcome.error.message
        pending = self.held.finish(outcome, settled=self.acked_first == message.id)
        duration = time.perf_counter() - began
        if outcome is not None:
            outcome.duration_seconds = duration
        if self.executor.wake_at is not None:
            due_in = (self.executor.wake_at - utcnow()).total_seconds()
            self.executor.wake_at = None
            self.wake_at = min(self.wake_at or float("inf"), time.monotonic() + max(0.0, due_in))
        self.done += 1
        self.avg_duration = (
            duration if self.avg_duration is None else (EWMA_WEIGHT * duration + (1 - EWMA_WEIGHT) * self.avg_duration)
        )
        # A job that held a concurrency slot gives it back at once, not at the next flush. (A
        # partition's jobs are fetched in runs: its next one is likely in this buffer already.)
        limited = outcome is not None and outcome.message.concurrency_limit is not None
        if pending and (
            limited
            or not len(self.held)
            or pending >= self.capacity
            or time.monotonic() - self.last_flush >= self.settings.flush_interval
        ):
            self._flush()
        if limited or message.partition is not None:
            # This process may take the key's next job: a slot is free, or the partition's next
            # job is ready once this outcome is written (when the buffer runs dry, before the next
            # fetch). Nobody else would say so: the news of that job came when it was enqueued, and
            # whoever it woke found its partition busy.
            self.next_fetch_at = 0.0

    @staticmethod
    def _cancel_timer_left(message: Message) -> None:
        """A job's own signal.alarm() or setitimer() still pending as it ended would end this
        process, or raise in the job's handler, during a later job: cancelled, said once per job."""
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        if left <= 0:
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        logger.warning(
            "job %s %s left a timer (signal.alarm or setitimer) due in %.1f s; cancelled, so that it ends no later job",
            message.id,
            message.task_name,
            left,
        )

    def _descriptors_lost(self, message: Message) -> None:
        """The job closed descriptors it did not open: this process's pipes, log and database files
        went with them, and writing through a number reopened since could write into another file
        (on SQLite, a page of the database into a job's file). Exit at once, the job still marked
        running: like a job that kills its process, it is charged a delivery, and after
        max_deliveries it fails without running; what the process held goes back to the queue."""
        with contextlib.suppress(Exception):
            logger.error(
                "worker process %s: job %s %s closed the process's own file descriptors; the process exits",
                os.getpid(),
                message.id,
                message.task_name,
            )
        os._exit(DESCRIPTORS_LOST_STATUS)

    def _out_of_memory(self) -> None:
        """The process has no memory left to go on with (a job kept what it took: a global it filled
        until MemoryError). Exit at once, blaming the job that ran last, as if it were still running:
        like a job that kills its process, it is charged a delivery, and after max_deliveries it
        fails without running, rather than run and fill a fresh process again for ever. The other
        outcomes it held are lost, and those jobs run again; what it held goes back to the queue."""
        self.memory_reserve = None  # room to say so in, whatever the job left
        try:
            if self.last_run is not None:
                self.spec.slot.blame(self.last_run.id, self.last_run.lease_token)
            with contextlib.suppress(BaseException):
                os.write(
                    2,
                    f"worker process {os.getpid()} ran out of memory after job {getattr(self.last_run, 'id', '-')}; "
                    "it exits\n".encode(),
                )
        finally:
            os._exit(OUT_OF_MEMORY_STATUS)

    def _report_stale(self) -> None:
        stale = self.held.take_stale()
        if stale:
            logger.warning(
                "worker process %s: %s buffered message(s) returned to the queue unstarted (job ids %s): their "
                "lease was last renewed over %.1f s ago (the supervisor, pid %s, renewed nothing since: it is "
                "stopped or stuck, or the database was unavailable)",
                os.getpid(),
                len(stale),
                ", ".join(str(m.id) for m in stale[:10]) + (", ..." if len(stale) > 10 else ""),
                self.lease_window,
                self.spec.supervisor_pid,
            )

    def _recycle_due(self) -> bool:
        limit = self.settings.max_tasks_per_child
        if limit is not None and self.done >= limit:
            logger.info("worker process %s recycled after %s jobs (max_tasks_per_child)", os.getpid(), self.done)
            return True
        memory = self.settings.max_memory_per_child
        # Between two jobs: leaving hands the rest of the buffer back, uncounted.
        if memory is not None and rss_kib() > memory:
            logger.info(
                "worker process %s recycled at %s KiB RSS (max_memory_per_child=%s)", os.getpid(), rss_kib(), memory
            )
            return True
        used = (
            None
            if self.descriptors_at_start is None
            else descriptors_used_up(self.spec.wake_r, self.descriptors_at_start, self.descriptors_floor)
        )
        if used is None and self.out_of_files:
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if limit < self.files_limit:
                # A job lowered the limit under what the process needs: every later job failed.
                logger.warning(
                    "worker process %s recycled: a job lowered its limit of open files from %s to %s",
                    os.getpid(),
                    self.files_limit,
                    limit,
                )
                return True
        if used is not None:
            # A job leaked them: every job after it that opens a file or a connection would fail here.
            logger.warning(
                "worker process %s recycled: at least %s of the %s file descriptors it may open are in use "
                "(a job leaks them)",
                os.getpid(),
                *used,
            )
            return True
        return False

    def _shutdown(self) -> None:
        # Hand back what we hold but never started, uncounted, then write everything out, trying
        # through an outage for as long as the graceful timeout allows.
        self.held.hand_back_all()
        deadline = (self.stop_requested_at or time.monotonic()) + self.settings.graceful_timeout
        try:
            if self.pending_token is not None:
                self.guard.call(self._undo_lost_acquire, give_up=lambda: time.monotonic() > deadline)
            self._flush(give_up=lambda: time.monotonic() > deadline)
        except GaveUp:
            logger.error(
                "worker process %s: could not write its outcomes before exiting; those jobs will run again", os.getpid()
            )


def serves_rated(app: JobQueue, queues: tuple[str, ...] | None) -> bool:
    """Whether a task of these queues has a rate limit (then acquire says when a held-back key may
    start again)."""
    return any(
        task.flow.interval_us is not None for task in app.registry.values() if queues is None or task.queue in queues
    )


def capacity_of(fetch_batch_size: int, overfetch_factor: float) -> int:
    """How many messages a process may hold unstarted (and how many outcomes make it flush)."""
    return max(1, int(fetch_batch_size * overfetch_factor))


def memory_exhausted() -> bool:
    """Whether this process could not take a little more memory (a MEMORY_RESERVE_BYTES piece)."""
    try:
        bytearray(MEMORY_RESERVE_BYTES)
    except MemoryError:
        return True
    return False


EMFILE_TEXT = f"[Errno {errno.EMFILE}]"  # in the message of an OSError for want of a file descriptor


def worker_row(worker_id: str, supervisor_id: str, pid: int, queues: tuple[str, ...] | None) -> dict[str, Any]:
    """A worker process's row in the worker registry, as it registers itself (or as its supervisor
    registers it again, if the row was deleted meanwhile)."""
    from jobqueue.version import __version__

    now = utcnow()
    return {
        "id": worker_id,
        "supervisor_id": supervisor_id,
        "hostname": host_name(),
        "pid": pid,
        "queues": ",".join(queues or ()) or None,
        "started_at": now,
        "heartbeat_at": now,
        "version": __version__,
    }
