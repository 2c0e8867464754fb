"""The supervisor: forks worker processes and keeps the pool and its leases healthy.

Duties, each checked every tick: reap a dead child, record a hard-timeout kill as a nack, return the
child's other messages to PENDING at once and fork a replacement; renew the worker rows and the
leases of every message the children hold; release expired leases (other hosts' dead workers);
stop on signals (first: warm, second: cold); in ``--burst`` mode stop when the queues are drained.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import multiprocess
from multiprocess import connection as mp_connection

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError, TimeLimitExceeded
from jobqueue.job import ErrorInfo
from jobqueue.runtime.executor import Executor
from jobqueue.runtime.process import ChildSpec, WorkerProcess, _drain
from jobqueue.runtime.progress import Progress
from jobqueue.runtime.slot import Slot, SlotView
from jobqueue.storage.engine import mask_url

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.supervisor")

TICK_SECONDS = 0.1
BURST_HORIZON_SECONDS = 5.0
BURST_CHECK_SECONDS = 0.25
RESPAWN_BACKOFF_MAX_SECONDS = 10.0


@dataclass
class Child:
    spec: ChildSpec
    process: Any
    started: float
    timed_out: SlotView | None = None


@dataclass
class Supervisor:
    app: JobQueue
    burst: bool = False
    progress: bool = False
    supervisor_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        self.settings = self.app.settings
        self.context = multiprocess.get_context("fork")
        self.children: dict[int, Child] = {}
        self.slots = [Slot.create(self.context) for _ in range(self.settings.effective_concurrency)]
        self.signals = 0
        self.stopping = False
        self.stop_deadline = 0.0
        self.next_heartbeat = 0.0
        self.next_release = 0.0
        self.next_burst_check = 0.0
        self.respawn_at: dict[int, float] = {}
        self.quick_deaths: dict[int, int] = {}
        self.done_by_dead = 0

    # -- entry point -------------------------------------------------------------------------------
    def run(self) -> int:
        if not self.app.registry:
            raise ConfigurationError("no tasks are registered: point the worker at your app with --app "
                                     "module:attribute (or JOBQUEUE_APP)")
        self.app.check_schema()
        self.store = self.app.store
        self.executor = Executor(self.app)
        self.wake_r, self.wake_w = _pipe()
        self._install_signals()
        queues = ",".join(self.settings.queues) if self.settings.queues else "all queues"
        logger.info("jobqueue worker %s: %s processes on %s serving %s; tasks: %s", self.supervisor_id[:8],
                    len(self.slots), mask_url(self.app.database_url), queues, ", ".join(sorted(self.app.registry)))
        self.meter = Progress(self.store, self.settings.queues) if self.progress else None
        for index in range(len(self.slots)):
            self._spawn(index)
        try:
            return self._loop()
        finally:
            if self.meter is not None:
                self.meter.close(self._done())
            signal.set_wakeup_fd(-1)
            self.app.close()

    def _install_signals(self) -> None:
        def on_signal(signum: int, frame: Any) -> None:
            # Count and return: the loop reads the count at its next tick (the wakeup fd ends its wait).
            self.signals += 1

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

    def _loop(self) -> int:
        while True:
            self._wait()
            if self.signals >= 2:
                return self._cold_stop()
            if self.signals == 1 and not self.stopping:
                self._begin_stop("signal received")
            self._reap()
            if self.stopping and not self.children:
                logger.info("jobqueue worker %s stopped", self.supervisor_id[:8])
                return 0
            self._respawn_due()
            self._enforce_time_limits()
            self._maintenance()
            if self.stopping and time.monotonic() > self.stop_deadline:
                self._kill_all("graceful_timeout passed")
            if self.burst and not self.stopping:
                self._check_burst()
            if self.meter is not None:
                self.meter.update(self._done())

    def _wait(self) -> None:
        waitables: list[Any] = [self.wake_r] + [c.process.sentinel for c in self.children.values()]
        if mp_connection.wait(waitables, timeout=TICK_SECONDS):
            _drain(self.wake_r)

    # -- children ----------------------------------------------------------------------------------
    def _spawn(self, index: int) -> None:
        wake_r, wake_w = _pipe()
        spec = ChildSpec(index=index, worker_id=uuid.uuid4().hex, supervisor_id=self.supervisor_id,
                         slot=self.slots[index], wake_r=wake_r, wake_w=wake_w)
        spec.slot.reset()
        process = self.context.Process(target=_child_main, args=(self.app, spec), name=f"jobqueue-worker-{index}")
        process.start()
        os.close(wake_r)
        self.children[index] = Child(spec, process, time.monotonic())

    def _reap(self) -> None:
        for index, child in list(self.children.items()):
            code = child.process.exitcode
            if code is None:
                continue
            del self.children[index]
            view = child.spec.slot.read_raw()
            self.done_by_dead += view.done
            if code != 0 and child.timed_out is None:
                how = f"signal {-code}" if code < 0 else f"code {code}"
                running = f" while running job {view.running_id}" if view.running_id else ""
                logger.error("worker process %s exited with %s%s; its messages are returned now",
                             child.process.pid, how, running)
            self._release(child, view)
            os.close(child.spec.wake_w)
            if not self.stopping:
                self._schedule_respawn(index, child)

    def _release(self, child: Child, view: SlotView) -> None:
        worker_id = child.spec.worker_id
        try:
            if child.timed_out is not None:
                self._record_timeout(child.timed_out)
            released = self.store.release_worker(worker_id, running_id=view.running_id or None)
            if released:
                logger.info("returned %s message(s) held by worker process %s to PENDING", released,
                            child.process.pid)
            self.store.remove_workers([worker_id])
        except Exception:
            # Their leases still expire: release_expired returns them within release_stuck_timeout.
            logger.exception("could not release the messages of worker process %s now", child.process.pid)

    def _record_timeout(self, view: SlotView) -> None:
        message = self.store.held_message(view.running_id, view.token)
        if message is None:
            return
        task = self.app.registry.get(message.task_name)
        limit = task.options.timeout if task else None
        exc = TimeLimitExceeded(f"job ran past its timeout of {limit} s; its worker process was killed")
        outcome = self.executor.nack_for_timeout(message, ErrorInfo.from_exception(exc))
        self.store.flush([outcome])
        logger.warning("job %s %s killed after its timeout of %s s (%s)", message.id, message.task_name, limit,
                       "retry at %s" % outcome.next_attempt_at if outcome.next_attempt_at else "failed")

    def _schedule_respawn(self, index: int, child: Child) -> None:
        # A child that dies right after starting (broken import, database down) is respawned with
        # backoff instead of in a tight fork loop.
        quick = time.monotonic() - child.started < 1.0
        deaths = self.quick_deaths.get(index, 0) + 1 if quick else 0
        self.quick_deaths[index] = deaths
        delay = min(RESPAWN_BACKOFF_MAX_SECONDS, 0.5 * 2 ** (deaths - 1)) if deaths else 0.0
        self.respawn_at[index] = time.monotonic() + delay

    def _respawn_due(self) -> None:
        now = time.monotonic()
        for index, at in list(self.respawn_at.items()):
            if at <= now and not self.stopping:
                del self.respawn_at[index]
                self._spawn(index)

    def _enforce_time_limits(self) -> None:
        now = time.monotonic_ns()
        for child in self.children.values():
            view = child.spec.slot.read()
            if child.timed_out is None and view.running_id and view.deadline_ns and now > view.deadline_ns:
                child.timed_out = view
                _kill(child.process.pid)

    # -- maintenance -------------------------------------------------------------------------------
    def _maintenance(self) -> None:
        now = time.monotonic()
        try:
            if now >= self.next_heartbeat:
                ids = [c.spec.worker_id for c in self.children.values()]
                self.store.heartbeat(ids, self.settings.release_stuck_timeout)
                self.next_heartbeat = now + self.settings.heartbeat_interval
            if now >= self.next_release:
                released = self.store.release_expired()
                if released:
                    logger.warning("released %s message(s) whose lease expired (a worker died or stalled)",
                                   released)
                stale = max(10 * self.settings.release_stuck_timeout, 300.0)
                self.store.prune_workers(utcnow() - timedelta(seconds=stale))
                self.next_release = now + self.settings.release_stuck_interval
        except Exception:
            logger.exception("maintenance query failed; retrying next tick")

    def _check_burst(self) -> None:
        now = time.monotonic()
        if now < self.next_burst_check:
            return
        self.next_burst_check = now + BURST_CHECK_SECONDS
        if not self.children or not all(c.spec.slot.read().idle for c in self.children.values()):
            return
        horizon = utcnow() + timedelta(seconds=BURST_HORIZON_SECONDS)
        if not self.store.has_work(self.settings.queues, horizon):
            self._begin_stop("burst: no message processing or due within 5 s")

    # -- stopping ----------------------------------------------------------------------------------
    def _begin_stop(self, reason: str) -> None:
        self.stopping = True
        self.respawn_at.clear()
        self.stop_deadline = time.monotonic() + self.settings.graceful_timeout
        logger.info("stopping (%s): running jobs get up to %s s to finish", reason, self.settings.graceful_timeout)
        for child in self.children.values():
            _signal(child.process.pid, signal.SIGTERM)

    def _kill_all(self, reason: str) -> None:
        if self.children:
            logger.warning("%s: killing %s worker process(es); their messages are returned", reason,
                           len(self.children))
        for child in self.children.values():
            _kill(child.process.pid)
        for child in self.children.values():
            child.process.join(5)

    def _cold_stop(self) -> int:
        self.stopping = True
        self._kill_all("second signal")
        self._reap()
        logger.warning("cold shutdown")
        return 1

    def _done(self) -> int:
        return self.done_by_dead + sum(c.spec.slot.read().done for c in self.children.values())


def _child_main(app: JobQueue, spec: ChildSpec) -> None:
    code = 1
    try:
        code = WorkerProcess(app, spec).main()
    except Exception:
        logger.exception("worker process %s crashed", os.getpid())
    finally:
        logging.shutdown()
    sys.exit(code)


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    return read_fd, write_fd


def _signal(pid: int | None, signum: int) -> None:
    if pid:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _kill(pid: int | None) -> None:
    _signal(pid, signal.SIGKILL)


def run_supervisor(app: JobQueue, burst: bool = False, progress: bool = False) -> int:
    """Run a supervisor in this process until it stops; return its exit code."""
    return Supervisor(app, burst=burst, progress=progress).run()
