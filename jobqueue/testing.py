"""Run jobs in a test without starting a worker.

```python
handle = add.delay(2, 3)
drain(app)
assert handle.get(timeout=0) == 5
```

:func:`drain` takes the jobs that are due now, one at a time, through the executor a worker process
uses: the same ack policies, retry strategies, checkpoints, soft time limits, signals, flow control
and outcome writes, in the calling process. What it does not do: enforce a task's hard ``timeout``
(that kills a worker process, here the test itself), or fire periodic schedules. Called from a
thread other than the main one, sync jobs run without their ``soft_timeout`` (a signal, which only
the main thread receives). As in a worker process, the working directory, umask and signal
handlers a job changes are put back after it.

Ctrl-C stops a drain as it stops a worker: the running job finishes and its outcome is written,
then ``drain`` raises KeyboardInterrupt; a second Ctrl-C interrupts the job itself (it fails that
attempt, and is retried by its strategy).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from types import FrameType
from typing import TYPE_CHECKING

from jobqueue.errors import ConfigurationError
from jobqueue.handle import JobHandle
from jobqueue.job import Message, Outcome
from jobqueue.periodic import SCHEDULE_TASK
from jobqueue.runtime.executor import Executor, StoreDeliveryWriter
from jobqueue.runtime.outcome_log import log_outcome
from jobqueue.runtime.process import serves_rated
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.runtime.supervisor import queue_typos
from jobqueue.runtime.surroundings import Surroundings
from jobqueue.runtime.writer import OutcomeWriter, Unwritten
from jobqueue.settings import parse_queues
from jobqueue.signals import Interrupted

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store

__all__ = ["drain"]

logger = logging.getLogger("jobqueue.testing")

# Runs of one job within one call past which it is set aside: a strategy with no max_attempts and
# no delay would otherwise retry it for ever, and the call would never return.
RUNS_OF_ONE_JOB_MOST = 100


class _CtrlC:
    """Ctrl-C during a drain: the first lets the running job finish, the second interrupts it.
    Installed only in the main thread over Python's own handler (a program's own is left alone)."""

    def __init__(self) -> None:
        self.presses = 0
        self.previous: object = None
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self.previous = signal.signal(signal.SIGINT, self._pressed)

    def _pressed(self, signum: int, frame: FrameType | None) -> None:
        self.presses += 1
        if self.presses > 1:
            raise Interrupted("Ctrl-C during drain()")
        logger.warning("Ctrl-C: drain() stops once the running job ends (Ctrl-C again to interrupt it)")

    def uninstall(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)  # type: ignore[arg-type]


def drain(app: JobQueue, queues: str | Iterable[str] | None = None, max_jobs: int | None = None) -> list[JobHandle]:
    """Run the jobs that are due now in this process, one by one, and return their handles.

    Args:
        app: the JobQueue whose tasks run; its database is the one read.
        queues: only these queues (a list, or ``"a,b"``); None means every queue.
        max_jobs: stop after this many runs (a job retried within the call counts once per run);
            None runs until nothing is due.

    A job that fails and is retried by its strategy runs again within the call only if its retry
    falls due before the call ends (it ends when nothing is due); otherwise it stays retryable, and
    a later ``drain`` runs it once it is due (move the clock with freezegun, or give the task a
    strategy without delay in tests). Jobs held back by a rate limit wait for a later call too.

    Returns one handle per job that ran, in the order each first ran. A job's failure is recorded as
    a worker records it; read it with ``handle.status()`` or ``handle.get()``, which raises JobFailed.
    """
    if max_jobs is not None and (not isinstance(max_jobs, int) or isinstance(max_jobs, bool) or max_jobs < 0):
        raise ConfigurationError(f"max_jobs must be a non-negative integer or None, got {max_jobs!r}")
    wanted = parse_queues(queues if isinstance(queues, str) or queues is None else tuple(queues))
    for queue, close in queue_typos(app, wanted):
        logger.warning("drain(): no task of this app declares the queue %r: did you mean %r?", queue, close)
    framework = app.framework
    if framework is not None:
        framework.check_drain()
    store = app.store
    worker_id = f"drain-{uuid.uuid4().hex[:24]}"
    executor = Executor(app, writes=StoreDeliveryWriter(store), ack_first=lambda outcome: _write(store, outcome))
    lease = app.settings.release_stuck_timeout
    rated = serves_rated(app, wanted)
    handles: dict[int, JobHandle] = {}
    # Held until the end, so that the next acquire moves past them, then handed back: periodic
    # schedule messages met on the way, and jobs run too often within the call.
    held: list[Message] = []
    runs_of: Counter[int] = Counter()
    runs = 0
    ctrl_c = _CtrlC()
    # Signal handlers are put back only in the main thread, the one that can set them.
    surroundings = Surroundings("drain()", handlers=threading.current_thread() is threading.main_thread())
    try:
        while (max_jobs is None or runs < max_jobs) and not ctrl_c.presses:
            messages = store.acquire(worker_id, wanted, 1, lease, flow=True, rated=rated)
            if not messages:
                break
            message = messages[0]
            if message.task_name == SCHEDULE_TASK or ctrl_c.presses:  # Ctrl-C during the fetch: not started
                held.append(message)
                continue
            if runs_of[message.id] >= RUNS_OF_ONE_JOB_MOST:
                logger.warning(
                    "job %s %s ran %s times in this drain() and is due again: it is left for a later call (give "
                    "its retry strategy a max_attempts, or a delay, or pass drain(max_jobs=...))",
                    message.id,
                    message.task_name,
                    runs_of[message.id],
                )
                held.append(message)
                continue
            began = time.perf_counter()
            try:
                outcome = executor.execute(message)
            finally:
                surroundings.restore()
            runs += 1
            runs_of[message.id] += 1
            handles.setdefault(message.id, JobHandle(app, message.id))
            if outcome is not None:
                outcome.duration_seconds = time.perf_counter() - began
                _write(store, outcome)
    finally:
        try:
            if held:
                store.release_unstarted(worker_id, [m.lease_token for m in held], [])
        finally:
            ctrl_c.uninstall()
            surroundings.close()
            executor.close()
    if ctrl_c.presses:
        raise KeyboardInterrupt
    return list(handles.values())


def _write(store: Store, outcome: Outcome) -> bool:
    """Write one outcome now, as a worker writes its batch (fenced by the lease token).

    An outcome the database refuses (a value it cannot store, a result over MySQL's
    max_allowed_packet) fails its job with the reason, as in a worker; an error that retrying
    could fix (the database is down) is raised at once instead of waited out.
    """
    guard = DatabaseGuard(logging.getLogger("jobqueue.testing"), "database (drain)", store.classify, store.explain)
    try:
        result = OutcomeWriter(store, guard).write([outcome], give_up=lambda: True)
    except (GaveUp, Unwritten) as exc:
        raise exc.__cause__ or exc from None
    for applied in result.applied:
        log_outcome(applied)
    return bool(result.applied)
