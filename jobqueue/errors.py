"""Exceptions raised by jobqueue. Every one derives from :class:`JobQueueError`."""

from __future__ import annotations


class JobQueueError(Exception):
    """Base class of every error jobqueue raises on purpose."""


class ConfigurationError(JobQueueError):
    """A setting, task option or CLI argument is invalid; the message says which and how to fix it."""


class SerializationError(JobQueueError):
    """Arguments or a result cannot be serialized (or a stored payload cannot be read back)."""


class UnknownTaskError(JobQueueError):
    """A message or command names a task that is not registered in this application."""


class SchemaError(JobQueueError):
    """The jobqueue tables are missing or of another version; the message names the command to run."""


class JobNotFound(JobQueueError):
    """No message or archive row has this id (never existed, purged, or not retained)."""


class JobNotCommitted(JobNotFound):
    """The job was enqueued in a transaction that has not committed yet: nobody else can see it
    until that transaction commits, and it never exists if the transaction rolls back."""


class TimeLimitExceeded(JobQueueError):
    """A job ran past its hard ``timeout`` and its process was killed."""


class SoftTimeLimitExceeded(TimeLimitExceeded):
    """Raised inside a running job when it passes its ``soft_timeout``; the job may catch it."""


class MaxDeliveriesExceeded(JobQueueError):
    """Stored on a message failed without running because it was delivered too often (poison)."""


class OutcomeRefused(JobQueueError):
    """Stored on a job whose outcome the database refused to store (a value it cannot hold, a
    statement over its packet limit); the job is failed with the database's reason instead."""


class CorruptMessage(JobQueueError):
    """Stored on a message whose row could not be read back (hand-edited or damaged columns)."""


class Rejected(JobQueueError):
    """Stored on a message its handler rejected with ``reject()``."""


class LeaseLost(JobQueueError):
    """Internal: a worker found that its lease on a message was taken over (fencing).

    ``delivery``: the (job id, lease token) whose lease was lost, where known: raised into another
    job (a context kept from an earlier job), it is that job's error, not a lost lease of its own.
    """

    def __init__(self, message: str, delivery: tuple[int, int | None] | None = None) -> None:
        super().__init__(message)
        self.delivery = delivery


class JobFailed(JobQueueError):
    """Raised by ``JobHandle.get()`` when the job ended FAILED.

    ``str()`` holds the remote exception type and message; ``traceback`` the remote traceback.
    """

    def __init__(
        self, job_id: int, error_type: str | None, error_message: str | None, traceback: str | None = None
    ) -> None:
        self.job_id = job_id
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        super().__init__(f"job {job_id} failed: {error_type}: {error_message}")


class JobCancelled(JobQueueError):
    """Raised by ``JobHandle.get()`` when the job was cancelled before it ran."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} was cancelled")


class ExportError(JobQueueError):
    """An archive export could not be verified; nothing was purged."""
