"""A worker process: a blocking loop of fetch -> run -> buffer outcomes -> flush.

The process runs one job at a time. It fetches a batch sized to how long its jobs take (about
``PREFETCH_WINDOW_SECONDS`` of work, at most ``fetch_batch_size``), so no-op jobs come in large
batches while slow jobs are fetched one at a time and never hoarded while another process idles.
Outcomes are flushed when the buffer runs dry or ``flush_interval`` has passed. Leases are renewed
by the supervisor for every message the process holds, buffered ones included (seed 004).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from jobqueue.clock import utcnow
from jobqueue.job import Message, MessageState, Outcome, OutcomeKind
from jobqueue.runtime.executor import Executor, log_outcome
from jobqueue.runtime.slot import Slot

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.worker")

PREFETCH_WINDOW_SECONDS = 0.1
EWMA_WEIGHT = 0.2


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
        self.executor = Executor(app, keeper=self, ack_first=self._flush_now)

    # -- entry point -------------------------------------------------------------------------------
    def main(self) -> int:
        self._install_signals()
        self.app.after_fork()
        self.store = self.app.store
        self.store.register_worker({
            "id": self.spec.worker_id, "supervisor_id": self.spec.supervisor_id, "hostname": os.uname().nodename,
            "pid": os.getpid(), "queues": ",".join(self.settings.queues or ()) or None,
            "started_at": utcnow(), "heartbeat_at": utcnow(), "version": _version(),
        })
        try:
            self._loop()
        finally:
            self._shutdown()
        return 0

    def _install_signals(self) -> None:
        def on_term(signum: int, frame: Any) -> None:
            # Only set a flag: the loop stops fetching at its next step and finishes the running job.
            self.stopping = True

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
        messages = self.store.acquire(self.spec.worker_id, self.settings.queues, self.fetch_limit(),
                                      self.settings.release_stuck_timeout)
        self.buffer.extend(messages)
        interval = self.settings.min_fetch_interval if messages else self.settings.max_fetch_interval
        self.next_fetch_at = time.monotonic() + interval
        self.spec.slot.set_idle(not self.buffer)

    def _run_next(self) -> None:
        message = self.buffer.popleft()
        task = self.app.registry.get(message.task_name)
        self.spec.slot.start(message.id, message.lease_token, task.options.timeout if task else None)
        began = time.perf_counter()
        outcome = self.executor.execute(message)
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
        if memory is not None and not self.buffer and rss_kib() > memory:
            logger.info("worker process %s recycled at %s KiB RSS (max_memory_per_child=%s)", os.getpid(),
                        rss_kib(), memory)
            return True
        return False

    # -- outcomes ----------------------------------------------------------------------------------
    def _flush(self) -> None:
        if not self.outcomes:
            return
        result = self.store.flush(self.outcomes)
        for outcome in result.lost:
            logger.warning("job %s %s: lease lost (its lease expired and the message was released or taken "
                           "by another worker); this delivery's %s outcome is dropped", outcome.message.id,
                           outcome.message.task_name, outcome.state.public)
        self.outcomes = []
        self.last_flush = time.monotonic()

    def _flush_now(self, outcome: Outcome) -> bool:
        """Record one outcome before anything else happens (ACK_FIRST); False if the lease was lost."""
        self._flush()
        applied = self.store.flush([outcome]).applied
        return bool(applied)

    def _shutdown(self) -> None:
        # Hand back what we hold but never started, uncounted, then write everything out.
        now = utcnow()
        for message in self.buffer:
            self.outcomes.append(Outcome(message=message, kind=OutcomeKind.RETURN, state=MessageState.PENDING,
                                         finished_at=now, checkpoint=message.checkpoint))
        self.buffer.clear()
        self._flush()

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
