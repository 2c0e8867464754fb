"""Signals: functions of yours that jobqueue calls when a job starts, ends or retries, and when a
worker process starts or stops, in the manner of Celery's signals.

Connect a receiver with ``.connect`` (also usable as a decorator) and remove it with
``.disconnect``. Receivers are called with keyword arguments only; accept ``**kwargs`` so that a
later release may add some::

    from jobqueue import signals

    @signals.job_failed.connect
    def report(job, exception, traceback, **kwargs):
        sentry_sdk.capture_exception(exception)

Every signal passes ``sender``: the task (a :class:`jobqueue.task.Task`, or None for a message
whose task this worker does not know) for job signals, the :class:`jobqueue.JobQueue` for process
signals. Job signals pass ``job``, the job's context (``job.id``, ``job.attempt``, ``job.headers``...).

- ``job_started(job)``: in the worker process, just before the task's function runs.
- ``job_succeeded(job, result)``: the function returned and the job is completed.
- ``job_retrying(job, exception, traceback, retry_at)``: the attempt failed and the job runs again
  at ``retry_at`` (a UTC datetime).
- ``job_failed(job, exception, traceback)``: the job failed for good (no retry left, rejected, an
  exception outside ``retry_on``, its task unknown to this worker, delivered too many times). For a
  job killed for passing its hard time limit, this and ``job_retrying`` are sent by the supervisor.
- ``worker_process_init(app, process_name)``: in each worker process, after it is forked and before
  its first job: the place to open per-process clients (HTTP sessions, SDKs that own threads).
- ``worker_process_shutdown(app, process_name)``: in each worker process as it stops for good
  (shutdown, recycling); not after SIGKILL, which no code survives.

``traceback`` is the formatted traceback text that the archive stores; the exception keeps its
traceback object in ``exception.__traceback__``. Outcomes are signalled when the worker decides them,
before they are written: if the job's lease was lost meanwhile the write is refused and logged, and
the job runs again elsewhere.

A receiver that raises is logged (logger ``jobqueue.signals``, with its traceback) and changes
nothing: the job's outcome stays what it was, and the other receivers are still called. That holds
for whatever it raises, ``SystemExit`` (``sys.exit()``), ``KeyboardInterrupt`` and
``asyncio.CancelledError`` included.
Receivers run in the worker process, on its only thread, so a slow one holds up the next job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("jobqueue.signals")

Receiver = Callable[..., Any]


class Interrupted(KeyboardInterrupt):
    """The user's Ctrl-C, as ``jobqueue.testing.drain`` raises it into the job it runs: passed on
    by :meth:`Signal.send` where a receiver's own exceptions are logged."""


class Signal:
    """A list of receivers called in the order they were connected."""

    def __init__(
        self, name: str, arguments: tuple[str, ...], unchanged: str = "the job's outcome is unchanged"
    ) -> None:
        self.name = name
        self.arguments = arguments
        self._receivers: tuple[Receiver, ...] = ()
        self._lock = threading.Lock()
        self._unchanged = unchanged  # what a receiver's exception leaves as it was, said in the log line

    def __repr__(self) -> str:
        return f"<Signal {self.name}({', '.join(self.arguments)}) receivers={len(self._receivers)}>"

    def connect(self, receiver: Receiver) -> Receiver:
        """Call ``receiver(**kwargs)`` on each send; returns it, so this works as a decorator.
        Connecting the same receiver twice connects it once."""
        if not callable(receiver):
            raise TypeError(f"{self.name}.connect() takes a callable, got {receiver!r}")
        with self._lock:
            if receiver not in self._receivers:
                self._receivers = (*self._receivers, receiver)
        return receiver

    def disconnect(self, receiver: Receiver) -> bool:
        """Stop calling ``receiver``; False if it was not connected."""
        with self._lock:
            kept = tuple(r for r in self._receivers if r != receiver)
            removed = len(kept) != len(self._receivers)
            self._receivers = kept
        return removed

    @property
    def receivers(self) -> tuple[Receiver, ...]:
        return self._receivers

    def send(self, sender: Any, **kwargs: Any) -> None:
        """Call every receiver; one that raises is logged and the rest still run."""
        for receiver in self._receivers:  # a tuple: a receiver may connect or disconnect while we loop
            try:
                receiver(sender=sender, **kwargs)
            except Interrupted:  # the user's Ctrl-C during drain(), landing in a receiver: not its error
                raise
            except BaseException:  # sys.exit() or asyncio.CancelledError in a receiver is its own fault too
                logger.exception("a receiver of %s raised (%r); %s", self.name, receiver, self._unchanged)


job_started = Signal("job_started", ("sender", "job"))
job_succeeded = Signal("job_succeeded", ("sender", "job", "result"))
job_retrying = Signal("job_retrying", ("sender", "job", "exception", "traceback", "retry_at"))
job_failed = Signal("job_failed", ("sender", "job", "exception", "traceback"))
worker_process_init = Signal("worker_process_init", ("sender", "app", "process_name"), "the worker process goes on")
worker_process_shutdown = Signal(
    "worker_process_shutdown", ("sender", "app", "process_name"), "the worker process goes on stopping"
)

__all__ = [
    "Signal",
    "job_failed",
    "job_retrying",
    "job_started",
    "job_succeeded",
    "worker_process_init",
    "worker_process_shutdown",
]
