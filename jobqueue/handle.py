"""JobHandle: follow one enqueued job by its id."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from jobqueue.context import running_job
from jobqueue.errors import JobCancelled, JobFailed, JobNotCommitted, JobNotFound, JobQueueError
from jobqueue.job import MessageState
from jobqueue.runtime.resilience import fresh_connection_retry
from jobqueue.storage import jobs
from jobqueue.storage.dialects.connector import CONTENTION, OUTAGE, first_line

if TYPE_CHECKING:
    from jobqueue.app import JobQueue
    from jobqueue.storage.store import Store

logger = logging.getLogger("jobqueue.handle")
# The tasks whose jobs were said to wait for another job's result (once each, per process).
WARNED_WAITING_TASKS: set[str] = set()

POLL_FIRST_SECONDS = 0.01
POLL_MAX_SECONDS = 0.25
OUTAGE_POLL_MAX_SECONDS = 5.0  # while the database does not answer


class JobHandle:
    """A job's id with ways to read its status, wait for its result and cancel it.

    ``existing`` is True on the handle an enqueue returned instead of adding a job: an active job
    of the task already held the call's ``unique_key``, and this is that job (as Oban marks a
    unique conflict). False for a job the enqueue added, and for a handle made from an id.
    """

    __slots__ = ("app", "id", "existing", "_uncommitted")

    def __init__(
        self, app: JobQueue, job_id: int, uncommitted: Callable[[], bool] | None = None, existing: bool = False
    ) -> None:
        self.app = app
        self.id = int(job_id)
        self.existing = existing
        # For a job enqueued in a transaction of the caller's: whether that transaction is still open.
        self._uncommitted = uncommitted

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def status(self) -> str:
        """Return "pending", "processing", "retryable", "completed", "failed" or "cancelled"."""
        state = jobs.job_state(self.app.store, self.id)
        if state is None:
            self._raise_uncommitted()
            raise JobNotFound(
                f"job {self.id} not found: it never existed, was purged, or its archive "
                "row was not retained (retain_in_archive_on_ack/on_reject)"
            )
        return state.public

    def _raise_uncommitted(self) -> None:
        if self._uncommitted is not None and self._uncommitted():
            framework = self.app.framework
            fix = framework.never_commits() if framework is not None else None
            raise JobNotCommitted(
                f"job {self.id} was enqueued in a transaction that has not committed yet: no worker "
                "(and no other connection) can see it until that transaction commits, and it is gone "
                f"if it rolls back; {fix or 'read its status after the commit'}"
            )

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the job to end and return its result.

        Raises JobFailed (with the remote error type, message and ``traceback``), JobCancelled, or
        TimeoutError when ``timeout`` seconds pass first. ``None`` waits without limit; 0 (or less)
        reads the job once. A database that stops answering while it waits (a restart, a failover,
        a lock held a while) is waited out until the deadline, or without limit for ``None``, with
        a warning as the outage begins and one as it ends; at the deadline its error is raised.
        One that does not answer the first read (down, or a wrong URL) raises at once. A statement
        sent to a server that is frozen, not down, waits for it, past the deadline.
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout)
        ):
            # NaN compares false with every deadline: the wait would poll the database for ever.
            raise ValueError(f"get(timeout=...) takes a number of seconds or None, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = POLL_FIRST_SECONDS
        store = self.app.store
        answered = False  # a read of this wait succeeded: the URL and login are right
        unanswered = False  # the database did not answer the last read
        waited = False  # the job was not done at the first read: this call waits
        while True:
            try:
                # A pooled connection the server had closed is replaced at once: only a second
                # failure is an outage.
                archived = fresh_connection_retry(lambda: self._archived_or_missing(store))
            except sa.exc.DBAPIError as exc:
                kind = store.classify(exc)
                late = deadline is not None and time.monotonic() >= deadline
                if not answered or kind not in (OUTAGE, CONTENTION) or late:
                    raise
                if kind == OUTAGE and not unanswered:
                    logger.warning(
                        "job %s: the database did not answer while waiting for its result (%s); still waiting",
                        self.id,
                        first_line(exc),
                    )
                    unanswered = True
                # Backing off, as a worker does: each try of a restarting server is a new connection.
                interval = min(interval * 2, OUTAGE_POLL_MAX_SECONDS)
            except JobQueueError:  # the database answered: the job is gone, or not committed
                self._answered_again(unanswered)
                raise
            else:
                self._answered_again(unanswered)
                if archived is not None:
                    return self._finish(archived)
                if unanswered:
                    unanswered, interval = False, POLL_MAX_SECONDS
                answered = True
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} did not finish within {timeout} seconds")
            if not waited:
                waited = True
                self._warn_if_inside_a_job()
            pause = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            if not unanswered:
                interval = min(interval * 1.5, POLL_MAX_SECONDS)

    def _warn_if_inside_a_job(self) -> None:
        """Say once per task, in a job that waits for another job's result: its process runs
        nothing while it waits, and once every process of a worker waits so (with one process, or
        in drain(), the first one), nobody runs the jobs waited for until the waits time out."""
        running = running_job()
        if running is None or running.task_name is None or running.task_name in WARNED_WAITING_TASKS:
            return
        WARNED_WAITING_TASKS.add(running.task_name)
        logger.warning(
            "job %s %s waits with handle.get() for job %s: its process runs nothing meanwhile, and once every "
            "process of a worker waits so (with --concurrency 1, or in drain(), the first one), nothing runs "
            "the jobs waited for until the waits time out. Enqueue the next step from the job that makes its "
            "input instead of waiting for it",
            running.id,
            running.task_name,
            self.id,
        )

    def _answered_again(self, unanswered: bool) -> None:
        if unanswered:
            logger.warning("job %s: the database answers again", self.id)

    def _archived_or_missing(self, store: Store) -> jobs.ArchivedJob | None:
        """The job's archive row, None while it is still in the queue; JobNotFound if neither holds it."""
        archived = jobs.archived_job(store, self.id)
        if archived is not None or jobs.job_state(store, self.id) is not None:
            return archived
        # Archived between our two reads, or gone for good.
        archived = jobs.archived_job(store, self.id)
        if archived is not None:
            return archived
        self._raise_uncommitted()  # waiting in the transaction that holds it would never end
        raise JobNotFound(
            f"job {self.id} not found: it never existed, was purged, or its archive "
            "row was not retained, so there is no result to read"
        )

    def _finish(self, archived: jobs.ArchivedJob) -> Any:
        if archived.state is MessageState.COMPLETED:
            return None if archived.result is None else self.app.serializer.loads(archived.result)
        if archived.state is MessageState.CANCELLED:
            raise JobCancelled(self.id)
        raise JobFailed(self.id, archived.error_type, archived.error_message, archived.error_traceback)

    def cancel(self) -> bool:
        """Cancel a pending or retryable job (archived as cancelled); False if it is running or ended."""
        return jobs.cancel(self.app.store, self.id)
