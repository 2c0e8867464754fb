"""The supervisor's worker processes: forking them, finding the dead, replacing them, killing them.

What a dead process held goes back to the queue through the supervisor (it owns the database
work); here is only the processes' own lifecycle. A replacement starts at once, unless the slot's
processes keep dying right after they start, before running any job (a broken import, a database
that refuses connections): then the slot backs off, so that it is no fork loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import multiprocess

from jobqueue.runtime import metrics
from jobqueue.runtime.oscalls import descendants, reap_orphans
from jobqueue.runtime.process import STOP_SIGNALS, ChildSpec, WorkerProcess, capacity_of
from jobqueue.runtime.slot import Slot, SlotView

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

logger = logging.getLogger("jobqueue.supervisor")

RESPAWN_BACKOFF_MAX_SECONDS = 10.0
ORPHANS_EVERY_SECONDS = 1.0  # how often the first process of a container waits for ended orphans
QUICK_DEATHS_BEFORE_BACKOFF = 3


@dataclass
class Child:
    spec: ChildSpec
    process: Any
    started: float
    timed_out: SlotView | None = None
    poked_at: float = 0.0  # monotonic time the supervisor last woke it
    # Killed by the supervisor as it stopped (graceful_timeout passed, a second signal): its
    # running job did not kill it, and is not charged a delivery for it.
    killed_stopping: bool = False


@dataclass
class Death:
    """A worker process that exited: its slot (``index``), how (``code``) and its last view."""

    index: int
    child: Child
    code: int
    view: SlotView

    @property
    def cause(self) -> str:
        """Why it ended, for the metrics: a status of 0 mid-job is a death too."""
        if self.child.timed_out:
            return "timeout"
        if self.code < 0:
            return "killed"
        return "exited" if self.code or self.view.running_id else "recycled"


class Pool:
    """A supervisor's worker processes, by slot index."""

    def __init__(self, app: JobQueue, supervisor_id: str) -> None:
        self.app = app
        self.supervisor_id = supervisor_id
        self.context = multiprocess.get_context("fork")
        self.children: dict[int, Child] = {}
        self.respawn_at: dict[int, float] = {}
        self.quick_deaths: dict[int, int] = {}
        self.stop_sent_at = 0.0  # when SIGTERM last went to the processes (see remind)
        # The supervisor's pipes, set before the first fork: a process asks through ``more_w`` for
        # a sibling to join it, and says through ``idle_w`` that it idles.
        self.more_w = -1
        self.idle_w = -1
        self.orphans_at = 0.0  # when ended orphans were last waited for (see reap_orphans)

    def spawn(self, index: int) -> None:
        """Fork worker process ``index``; if anything fails (no processes, memory or descriptors
        left, a framework hook), try again later with the slot's backoff."""
        try:
            child = self._fork(index)
        except Exception as exc:
            logger.error("could not start worker process %s: %s", index, exc)
            self.quick_deaths[index] = self.quick_deaths.get(index, 0) + 1
            self.respawn_at[index] = time.monotonic() + self._respawn_delay(index)
            return
        self.children[index] = child
        logger.info("started worker process %s (pid %s)", index, child.process.pid)

    def _fork(self, index: int) -> Child:
        self.app.before_fork()
        wake_r, wake_w = pipe()
        try:
            settings = self.app.settings
            spec = ChildSpec(
                index=index,
                worker_id=uuid.uuid4().hex,
                supervisor_id=self.supervisor_id,
                slot=Slot.create(self.context, capacity_of(settings.fetch_batch_size, settings.overfetch_factor)),
                wake_r=wake_r,
                wake_w=wake_w,
                more_w=self.more_w,
                idle_w=self.idle_w,
                supervisor_pid=os.getpid(),
            )
            process = self.context.Process(target=_child_main, args=(self.app, spec), name=f"jobqueue-worker-{index}")
            # Block stop signals across fork: a SIGTERM sent before the child installs its own
            # handler then waits for it instead of hitting the supervisor's handler copied into it.
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                process.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        except BaseException:
            os.close(wake_r)
            os.close(wake_w)
            raise
        os.close(wake_r)
        return Child(spec, process, time.monotonic())

    def dead(self) -> list[Death]:
        """The processes that exited since the last look, taken out of the pool."""
        deaths = []
        for index, child in list(self.children.items()):
            code = child.process.exitcode
            if code is None:
                continue
            del self.children[index]
            deaths.append(Death(index, child, code, child.spec.slot.read_raw()))
        return deaths

    def reap_orphans(self) -> None:
        """As the first process of a container (PID 1), wait for the orphans that ended, once a
        second: the kernel hands it every process whose parent died, and no one else waits for them."""
        if os.getpid() != 1 or time.monotonic() - self.orphans_at < ORPHANS_EVERY_SECONDS:
            return
        self.orphans_at = time.monotonic()
        reaped = reap_orphans({child.process.pid for child in self.children.values()})
        if reaped:
            logger.debug("waited for %s ended orphan process(es)", reaped)

    def respawn_later(self, death: Death) -> None:
        # Replace a dead child at once. Only a slot whose children keep dying right after starting,
        # before running any job (a broken import, a database that refuses connections), backs off,
        # so it is not a fork loop. A child killed by a job is the job's fault, not the slot's: poison
        # protection ends that job, and the next child starts at once.
        index, view = death.index, death.view
        ran_a_job = bool(view.done or view.running_id)
        quick = time.monotonic() - death.child.started < 1.0 and not ran_a_job
        self.quick_deaths[index] = self.quick_deaths.get(index, 0) + 1 if quick else 0
        self.respawn_at[index] = time.monotonic() + self._respawn_delay(index)

    def _respawn_delay(self, index: int) -> float:
        deaths = self.quick_deaths.get(index, 0)
        if deaths < QUICK_DEATHS_BEFORE_BACKOFF:
            return 0.0
        delay = min(RESPAWN_BACKOFF_MAX_SECONDS, 0.5 * 2.0 ** (deaths - QUICK_DEATHS_BEFORE_BACKOFF))
        logger.warning(
            "worker process %s failed %s times in a row before running a job; next start in %.1f s",
            index,
            deaths,
            delay,
        )
        return delay

    def respawn_due(self) -> None:
        now = time.monotonic()
        for index, at in list(self.respawn_at.items()):
            if at <= now:
                del self.respawn_at[index]
                self.spawn(index)

    def enforce_time_limits(self) -> None:
        """Kill a child whose job passed its hard timeout; the reap records it and forks a replacement."""
        now = time.monotonic_ns()
        for child in self.children.values():
            view = child.spec.slot.read()
            if (
                view is not None
                and view.running_id
                and view.deadline_ns
                and now > view.deadline_ns
                and child.timed_out is None
            ):
                child.timed_out = view
                kill(child.process.pid)

    def idle(self) -> list[Child]:
        idle = []
        for child in self.children.values():
            view = child.spec.slot.read()
            if view is not None and view.idle:
                idle.append(child)
        return idle

    def stop(self) -> None:
        """Ask every process to stop (a warm shutdown of its own), and start no more."""
        self.respawn_at.clear()
        self.stop_sent_at = time.monotonic()
        for child in self.children.values():
            send_signal(child.process.pid, signal.SIGTERM)

    def remind(self) -> None:
        """While stopping: ask again, once a second, the processes that idle instead of stopping. A
        job that ran when the request came may have had a SIGTERM handler of its own, which took
        it (the process puts its own handler back once the job ends, but the request is gone); an
        idle process runs no job that a second SIGTERM could reach."""
        if time.monotonic() - self.stop_sent_at < STOP_REMINDER_SECONDS:
            return
        self.stop_sent_at = time.monotonic()
        for child in self.idle():
            send_signal(child.process.pid, signal.SIGTERM)

    def kill_all(self, reason: str) -> None:
        alive = [c for c in self.children.values() if c.process.exitcode is None]
        if alive:
            logger.warning("%s: killing %s worker process(es); their messages are returned", reason, len(alive))
        for child in alive:
            child.killed_stopping = True
        kill(*(child.process.pid for child in alive))
        for child in alive:
            child.process.join(5)


STOP_REMINDER_SECONDS = 1.0


def _child_main(app: JobQueue, spec: ChildSpec) -> None:
    code = 1
    try:
        if metrics.active is not None:
            metrics.active.in_child()
        code = WorkerProcess(app, spec).main()
    except Exception:
        logger.exception("worker process %s crashed", os.getpid())
    finally:
        _say_threads_left()
        logging.shutdown()
    # Not sys.exit: on the way out the interpreter would wait for every thread a job left running
    # that is not a daemon (an executor never shut down, a library's background thread), and the
    # process, recycled or stopping, would never end. Its outcomes are written by now.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _say_threads_left() -> None:
    """Name the threads jobs left running (not daemons), which end with the process."""
    with contextlib.suppress(Exception):
        left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
        if left:
            logging.getLogger("jobqueue.worker").warning(
                "worker process %s exits with %s thread(s) a job started still running (%s); they end with it",
                os.getpid(),
                len(left),
                ", ".join(left[:10]) + (", ..." if len(left) > 10 else ""),
            )


def pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    return read_fd, write_fd


def send_signal(pid: int | None, signum: int) -> None:
    if pid:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):  # ended, or its number reused by another user's
            pass


# Looks for programs started while the ones found were being stopped, at most.
KILL_LOOKS = 20


def kill(*pids: int | None) -> None:
    """Kill worker processes and the programs their jobs started (they would run on, orphaned,
    with no job waiting for them).

    Each is stopped (SIGSTOP) as it is found, and the tree looked at again until a look finds no
    new one: a stopped process starts no more, where one only found could start another between
    the look and its kill. Then all are killed."""
    roots = {pid for pid in pids if pid}
    if not roots:
        return
    stopped = set(roots)
    try:
        for pid in stopped:
            send_signal(pid, signal.SIGSTOP)
        for _ in range(KILL_LOOKS):
            # From the worker processes each time (they are unreaped, their numbers cannot be
            # reused): a program that ended meanwhile is not looked below, its number may be another's.
            new = set(descendants(roots)) - stopped
            if not new:
                break
            for pid in new:
                send_signal(pid, signal.SIGSTOP)
            stopped |= new
    finally:  # whatever went wrong, nothing is left stopped
        for pid in stopped:
            send_signal(pid, signal.SIGKILL)
