"""What a worker process puts back after each job: its working directory and its umask.

A job that calls ``os.chdir()`` or ``os.umask()`` changes them for the whole process, so every later
job in that process would open relative paths elsewhere, or create files with other permissions.
Both are put back after every job, on the hot path: an ``fchdir`` to a descriptor of the directory
(no path to resolve, whatever its depth) and one ``umask`` call, together well under a microsecond.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("jobqueue.worker")

# O_PATH: a directory the process may enter but not list still gives a descriptor to go back to.
_DIRECTORY_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY


class Surroundings:
    """The working directory and umask this process has now, to put back after each job."""

    def __init__(self) -> None:
        self.directory = _open_directory(".")
        try:
            self.path: str | None = os.getcwd()
        except OSError:  # started in a directory since deleted: only the descriptor leads back
            self.path = None
        self.umask = os.umask(0)
        os.umask(self.umask)
        self.warned = False

    def restore(self) -> None:
        """Put the working directory and umask back as they were when this object was made."""
        os.umask(self.umask)
        if self.directory is not None:
            try:
                os.fchdir(self.directory)
                return
            except OSError:  # the job closed descriptors it did not open: go back by the path
                self.directory = None
        if self.path is None:
            return
        try:
            if os.getcwd() == self.path:
                return
        except OSError:  # the job's directory was deleted
            pass
        try:
            os.chdir(self.path)
        except OSError as exc:
            if not self.warned:
                self.warned = True
                logger.warning(
                    "worker process %s: cannot go back to its working directory %s after a job changed it (%s); "
                    "later jobs run where the job left them",
                    os.getpid(),
                    self.path,
                    exc,
                )
            return
        self.directory = _open_directory(self.path)


def _open_directory(path: str) -> int | None:
    try:
        return os.open(path, _DIRECTORY_FLAGS)
    except OSError:
        return None
