"""jobqueue: a job queue whose broker is the SQL database the application already has."""

from jobqueue.ack import AckPolicy
from jobqueue.app import JobQueue
from jobqueue.context import JobContext, current_job
from jobqueue.errors import (
    ConfigurationError,
    JobCancelled,
    JobFailed,
    JobNotCommitted,
    JobNotFound,
    JobQueueError,
    LeaseLost,
    SchemaError,
    SerializationError,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    UnknownTaskError,
)
from jobqueue.handle import JobHandle
from jobqueue.logs import guard_loggers
from jobqueue.task import Task
from jobqueue.version import __version__

guard_loggers()  # job-controlled text in log lines, escaped (see jobqueue.logs.OneLineFilter)

__all__ = [
    "AckPolicy",
    "JobQueue",
    "JobContext",
    "current_job",
    "JobHandle",
    "Task",
    "ConfigurationError",
    "JobCancelled",
    "JobFailed",
    "JobNotCommitted",
    "JobNotFound",
    "JobQueueError",
    "LeaseLost",
    "SchemaError",
    "SerializationError",
    "SoftTimeLimitExceeded",
    "TimeLimitExceeded",
    "UnknownTaskError",
    "__version__",
]
