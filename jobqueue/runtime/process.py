"""A worker process: a blocking loop of fetch -> run -> buffer outcomes -> flush.

The process runs one job at a time. It fetches a batch sized to how long its jobs take (about
``PREFETCH_WINDOW_SECONDS`` of work, at most ``fetch_batch_size``), so no-op jobs come in large
batches while slow jobs are fetched one at a time. When a job turns out slow anyway, a keeper thread
hands the unstarted rest of the buffer back to the queue after ``HOARD_SECONDS``, so no message
waits behind it while another process idles. Outcomes are flushed when the buffer runs dry or
``flush_interval`` has passed. Leases are renewed by the supervisor for every message the process
holds, buffered ones included (seed 004).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from jobqueue.clock import utcnow
from jobqueue.job import Message, MessageState, Outcome, OutcomeKind
from jobqueue.runtime.executor import Executor, log_outcome
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.runtime.slot import Slot
from jobqueue.storage.store import new_lease_token

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.worker")

PREFETCH_WINDOW_SECONDS = 0.1
EWMA_WEIGHT = 0.2
# A job running this long (twice what a whole batch was sized for) hands back the unstarted
# messages behind it; checked this often.
HOARD_SECONDS = 2 * PREFETCH_WINDOW_SECONDS
KEEPER_TICK_SECONDS = 0.1


@dataclass
class ChildSpec:
    """What the supervisor hands a worker process at fork."""

    index: int
    worker_id: str
    supervisor_id: str
    slot: Slot
    wake_r: int
    wake_w: int


class WorkerProcess:
    def __init__(self, app: JobQueue, spec: ChildSpec) -> None:
        self.app = app
        self.settings = app.settings
        self.spec = spec
        self.stopping = False
        self.buffer: deque[Message] = deque()
        self.outcomes: list[Outcome] = []
        self.capacity = max(1, int(self.settings.fetch_batch_size * self.settings.overfetch_factor))
        self.next_fetch_at = 0.0
        self.last_flush = time.monotonic()
        self.avg_duration: float | None = None
        self.done = 0
        self.stop_requested_at: float | None = None
        self.pending_token: int | None = None
        # The keeper thread and the loop share the buffer and the running job's start time.
        self.buffer_lock = threading.Lock()
        self.running_since: float | None = None
        self.keeper_stop = threading.Event()
        self.guard = DatabaseGuard(logger, f"database (worker process {os.getpid()})")
        self.executor = Executor(app, keeper=self, ack_first=self._flush_now)

    # -- entry point -------------------------------------------------------------------------------
    def main(self) -> int:
        self._install_signals()
        self.app.after_fork()
        self.guard.what = f"database (worker process {os.getpid()})"
        self.store = self.app.store
        row = {"id": self.spec.worker_id, "supervisor_id": self.spec.supervisor_id, "hostname": os.uname().nodename,
               "pid": os.getpid(), "queues": ",".join(self.settings.queues or ()) or None,
               "started_at": utcnow(), "heartbeat_at": utcnow(), "version": _version()}
        keeper = threading.Thread(target=self._keep_buffer, name="jobqueue-buffer-keeper", daemon=True)
        try:
            self.guard.call(lambda: self.store.register_worker(row), give_up=lambda: self.stopping)
            keeper.start()
            self._loop()
        except GaveUp:
            pass  # stopping during an outage: what we hold is released by the supervisor
        finally:
            self.keeper_stop.set()
            if keeper.is_alive():
                keeper.join()
            self._shutdown()
        return 0

    def _install_signals(self) -> None:
        def on_term(signum: int, frame: Any) -> None:
            # Only set flags: the loop stops fetching at its next step and finishes the running job.
            self.stopping = True
            self.stop_requested_at = self.stop_requested_at or time.monotonic()

        signal.signal(signal.SIGTERM, on_term)
        # Ctrl-C reaches the whole process group; the supervisor decides, and tells us with SIGTERM.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.set_wakeup_fd(self.spec.wake_w, warn_on_full_buffer=False)

    # -- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self.stopping:
            if self._fetch_due():
                self._fetch()
            if self.buffer:
                self._run_next()
                if self._recycle_due():
                    return
            else:
                self._flush()
                self._idle_wait()

    def _fetch_due(self) -> bool:
        if time.monotonic() < self.next_fetch_at:
            return False
        # Top up only when a whole batch fits; an empty buffer always fetches.
        return not self.buffer or self.capacity - len(self.buffer) >= self.settings.fetch_batch_size

    def fetch_limit(self) -> int:
        """How many messages to ask for: what fits, and no more than PREFETCH_WINDOW_SECONDS of work."""
        limit = min(self.settings.fetch_batch_size, self.capacity - len(self.buffer))
        if self.avg_duration is None:
            return 1  # nothing known yet: one message tells us how long they take
        return max(1, min(limit, int(PREFETCH_WINDOW_SECONDS / max(self.avg_duration, 1e-6))))

    def _fetch(self) -> None:
        limit = self.fetch_limit()

        def acquire() -> list[Message]:
            # The token is ours before the statement runs, so an acquisition whose COMMIT reply was
            # lost (connection dropped) can be found and undone before we try again.
            self.pending_token = new_lease_token()
            messages = self.store.acquire(self.spec.worker_id, self.settings.queues, limit,
                                          self.settings.release_stuck_timeout, token=self.pending_token)
            self.pending_token = None
            return messages

        messages = self.guard.call(acquire, give_up=lambda: self.stopping, on_retry=self._undo_lost_acquire)
        with self.buffer_lock:
            self.buffer.extend(messages)
        interval = self.settings.min_fetch_interval if messages else self.settings.max_fetch_interval
        self.next_fetch_at = time.monotonic() + interval
        self.spec.slot.set_idle(not self.buffer)

    def _undo_lost_acquire(self) -> None:
        if self.pending_token is not None:
            self.store.release_token(self.pending_token)
            self.pending_token = None

    def _run_next(self) -> None:
        with self.buffer_lock:
            if not self.buffer:
                return  # the keeper handed the buffer back meanwhile
            message = self.buffer.popleft()
            self.running_since = time.monotonic()
        task = self.app.registry.get(message.task_name)
        self.spec.slot.start(message.id, message.lease_token, task.options.timeout if task else None)
        began = time.perf_counter()
        try:
            outcome = self.executor.execute(message)
        finally:
            with self.buffer_lock:
                self.running_since = None
        duration = time.perf_counter() - began
        self.spec.slot.finish()
        self.done += 1
        self.avg_duration = duration if self.avg_duration is None else (
            EWMA_WEIGHT * duration + (1 - EWMA_WEIGHT) * self.avg_duration)
        if outcome is not None:
            log_outcome(outcome, duration)
            self.outcomes.append(outcome)
        if self.outcomes and (not self.buffer or time.monotonic() - self.last_flush >= self.settings.flush_interval):
            self._flush()

    def _keep_buffer(self) -> None:
        """Keeper thread: hand back the unstarted buffer while the loop is stuck on a slow job."""
        while not self.keeper_stop.wait(KEEPER_TICK_SECONDS):
            with self.buffer_lock:
                started = self.running_since
                if started is None or time.monotonic() - started < HOARD_SECONDS or not self.buffer:
                    continue
                handed = list(self.buffer)
                self.buffer.clear()
            now = utcnow()
            returns = [Outcome(message=m, kind=OutcomeKind.RETURN, state=MessageState.PENDING, finished_at=now,
                               checkpoint=m.checkpoint) for m in handed]
            try:
                self.store.flush(returns)
            except Exception as exc:
                # Still ours (nothing was written): keep them, and try again next tick.
                logger.debug("could not hand back %s messages: %s", len(handed), exc)
                with self.buffer_lock:
                    self.buffer.extendleft(reversed(handed))
                continue
            logger.info("worker process %s: handed back %s unstarted message(s) waiting behind a slow job",
                        os.getpid(), len(handed))

    def _idle_wait(self) -> None:
        timeout = self.next_fetch_at - time.monotonic()
        if timeout <= 0 or self.stopping:
            return
        ready, _, _ = select.select([self.spec.wake_r], [], [], timeout)
        if ready:
            _drain(self.spec.wake_r)
            self.next_fetch_at = 0.0  # woken: work may have arrived

    def _recycle_due(self) -> bool:
        limit = self.settings.max_tasks_per_child
        if limit is not None and self.done >= limit:
            logger.info("worker process %s recycled after %s jobs (max_tasks_per_child)", os.getpid(), self.done)
            return True
        memory = self.settings.max_memory_per_child
        # Between two jobs: leaving hands the rest of the buffer back, uncounted.
        if memory is not None and rss_kib() > memory:
            logger.info("worker process %s recycled at %s KiB RSS (max_memory_per_child=%s)", os.getpid(),
                        rss_kib(), memory)
            return True
        return False

    # -- outcomes ----------------------------------------------------------------------------------
    def _flush(self, give_up: Any = lambda: False) -> None:
        if not self.outcomes:
            return
        outcomes = self.outcomes
        # Retrying is safe: outcomes are fenced, so any a lost COMMIT did apply come back as lost.
        result = self.guard.call(lambda: self.store.flush(outcomes), give_up=give_up)
        for outcome in result.lost:
            if self.guard.last_call_retried:
                logger.info("job %s %s: outcome not applied on retry (applied before the connection dropped, "
                            "or the lease was lost)", outcome.message.id, outcome.message.task_name)
            else:
                logger.warning("job %s %s: lease lost (it expired and the message was released or taken by "
                               "another worker); this delivery's %s outcome is dropped", outcome.message.id,
                               outcome.message.task_name, outcome.state.public)
        self.outcomes = []
        self.last_flush = time.monotonic()

    def _flush_now(self, outcome: Outcome) -> bool:
        """Record one outcome before anything else happens (ACK_FIRST); False if the lease was lost."""
        self._flush()
        applied = self.guard.call(lambda: self.store.flush([outcome]).applied)
        return bool(applied)

    def _shutdown(self) -> None:
        # Hand back what we hold but never started, uncounted, then write everything out, trying
        # through an outage for as long as the graceful timeout allows.
        now = utcnow()
        for message in self.buffer:
            self.outcomes.append(Outcome(message=message, kind=OutcomeKind.RETURN, state=MessageState.PENDING,
                                         finished_at=now, checkpoint=message.checkpoint))
        self.buffer.clear()
        deadline = (self.stop_requested_at or time.monotonic()) + self.settings.graceful_timeout
        try:
            if self.pending_token is not None:
                self.guard.call(self._undo_lost_acquire, give_up=lambda: time.monotonic() > deadline)
            self._flush(give_up=lambda: time.monotonic() > deadline)
        except GaveUp:
            logger.error("worker process %s: could not write %s outcome(s) before exiting; those jobs will run "
                         "again", os.getpid(), len(self.outcomes))

    # -- LeaseKeeper, for the running job's context --------------------------------------------------
    def save_checkpoint(self, message: Message, data: bytes | None) -> bool:
        return self.store.save_checkpoint(message.id, message.lease_token, data)

    def extend_lease(self, message: Message, seconds: float) -> bool:
        return self.store.extend_lease(message.id, message.lease_token, utcnow() + timedelta(seconds=seconds))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def rss_kib() -> int:
    """This process's resident set size in KiB (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _version() -> str:
    from jobqueue import __version__
    return __version__
