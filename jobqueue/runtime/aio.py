"""Running ``async def`` tasks: one event loop per process, one job at a time on it.

The loop outlives each job, so clients a task opens on it (an HTTP session, a connection pool) can
be kept for the next job in the same process. A soft time limit cancels the job's coroutine at its
next ``await`` (the job sees ``asyncio.CancelledError`` there, and its ``finally`` blocks run) and
then raises ``SoftTimeLimitExceeded``; a coroutine that never awaits is stopped by the hard limit
only, as a sync task that never returns to Python would be.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any

from jobqueue.errors import SoftTimeLimitExceeded

logger = logging.getLogger("jobqueue.worker")
# How long what a job left on the loop gets to end once cancelled, as its process stops.
LEFTOVER_SECONDS = 5.0


class CoroutineRunner:
    """Runs coroutines to completion on this process's own loop (made at first use, after a fork)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def run(self, coroutine: Coroutine[Any, Any, Any], soft_timeout: float | None = None) -> Any:
        if _loop_running():
            # Called from async code (a test draining jobs inside its own loop): a loop cannot run
            # inside another in one thread, so the job gets a thread and a loop of its own.
            return _in_thread(lambda: _run(asyncio.new_event_loop(), coroutine, soft_timeout, close=True))
        return _run(self.loop(), coroutine, soft_timeout)

    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed() or self._pid != os.getpid():
            self._loop = asyncio.new_event_loop()  # a loop inherited through fork is never reused
            self._pid = os.getpid()
        return self._loop

    def close(self) -> None:
        """Finish the loop's async generators and close it (the process is done with jobs)."""
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed() or self._pid != os.getpid():
            return
        try:
            _cancel_leftovers(loop)
            # asyncio.wait, not wait_for: wait_for waits for what it cancels, which may never end.
            closing = loop.create_task(loop.shutdown_asyncgens())
            _, pending = loop.run_until_complete(asyncio.wait({closing}, timeout=LEFTOVER_SECONDS))
            if pending:
                logger.warning(
                    "worker process %s: async generators a job left open did not close within %s s; left as they are",
                    os.getpid(),
                    LEFTOVER_SECONDS,
                )
            # The loop's own threads (asyncio.to_thread, run_in_executor without one): ours to end,
            # not threads a job left running.
            ending = loop.create_task(loop.shutdown_default_executor())
            loop.run_until_complete(asyncio.wait({ending}, timeout=LEFTOVER_SECONDS))
        finally:
            loop.close()


def _run(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, Any],
    soft_timeout: float | None,
    close: bool = False,
) -> Any:
    future = asyncio.ensure_future(_limited(coroutine, soft_timeout), loop=loop)
    try:
        return loop.run_until_complete(future)
    except BaseException:
        if not future.done():  # the loop stopped under it (a job's loop.stop()): it must not resume later
            future.cancel()
            _cancel_leftovers(loop, [future])
        raise
    finally:
        if close:
            _cancel_leftovers(loop)
            loop.close()


async def _limited(coroutine: Coroutine[Any, Any, Any], soft_timeout: float | None) -> Any:
    if soft_timeout is None:
        return await coroutine
    if soft_timeout <= 0:
        coroutine.close()
        raise SoftTimeLimitExceeded("soft time limit exceeded")
    task = asyncio.ensure_future(coroutine)
    passed = False

    def expire() -> None:
        nonlocal passed
        passed = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(soft_timeout, expire)
    try:
        return await task
    except asyncio.CancelledError as exc:
        if passed:  # the chained CancelledError shows where the job was waiting
            raise SoftTimeLimitExceeded("soft time limit exceeded") from exc
        raise
    finally:
        timer.cancel()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Future[Any]] | None = None) -> None:
    """Cancel what jobs left running on the loop (or ``tasks``), and let it unwind, for at most
    LEFTOVER_SECONDS: a task that does not end when cancelled (a cleanup that waits for ever, a
    loop that catches CancelledError) must not keep its process from ending."""
    leftovers = [task for task in (asyncio.all_tasks(loop) if tasks is None else tasks) if not task.done()]
    if not leftovers:
        return
    for task in leftovers:
        task.cancel()
    _, pending = loop.run_until_complete(asyncio.wait(leftovers, timeout=LEFTOVER_SECONDS))
    for task in leftovers:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: not reported again when the task is collected
    if pending:
        logger.warning(
            "worker process %s: %s task(s) a job left on its event loop did not end within %s s of being "
            "cancelled (%s); left behind",
            os.getpid(),
            len(pending),
            LEFTOVER_SECONDS,
            ", ".join(sorted(_task_name(task) for task in pending)),
        )


def _task_name(task: asyncio.Future[Any]) -> str:
    coroutine = task.get_coro() if isinstance(task, asyncio.Task) else None
    return getattr(coroutine, "__qualname__", None) or repr(task)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_thread(run: Any) -> Any:
    box: dict[str, Any] = {}
    context = contextvars.copy_context()  # the running job's context (current_job()) goes along

    def target() -> None:
        try:
            box["result"] = context.run(run)
        except BaseException as exc:  # handed to the caller's thread as the job's own error
            box["error"] = exc

    thread = threading.Thread(target=target, name="jobqueue-async-job")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
