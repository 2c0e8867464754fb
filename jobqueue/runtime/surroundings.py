"""What a worker process puts back after each job: its working directory, its umask, its
handlers of SIGTERM and SIGINT (and the other signals it relies on) and logging left disabled.

A job that calls ``os.chdir()`` or ``os.umask()`` changes them for the whole process, so every later
job in that process would open relative paths elsewhere, or create files with other permissions.
Both are put back after every job, on the hot path: an ``fchdir`` to a descriptor of the directory
(no path to resolve, whatever its depth) and one ``umask`` call, together well under a microsecond.
A job (or a library it calls) that installs its own SIGTERM handler would keep the process from
hearing a warm stop: the worker's handlers are put back too, with a warning, once looked up.
"""

from __future__ import annotations

import logging
import os
import signal

try:
    # The handler as stored, in a few nanoseconds: signal.getsignal() turns it into an enum first,
    # by way of an exception when it is a function (1.5 µs a call).
    from _signal import getsignal as _getsignal  # type: ignore[import-not-found]
except ImportError:  # an interpreter without CPython's module
    _getsignal = signal.getsignal

logger = logging.getLogger("jobqueue.worker")

# O_PATH: a directory the process may enter but not list still gives a descriptor to go back to.
_DIRECTORY_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY


# The signals whose handlers the worker process relies on: SIGTERM asks it to stop after the
# running job; SIGINT (Ctrl-C at a terminal reaches every process) is the supervisor's to decide.
# SIGCHLD too: left ignored by a job, the kernel reaps children at once and every later job's
# subprocess.run() reads exit status 0, whatever the program returned.
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)


class Surroundings:
    """The working directory, umask and signal handlers this process has now, to put back after
    each job (make it once the process's own handlers are installed)."""

    def __init__(self, who: str | None = None, handlers: bool = True) -> None:
        # Who puts them back, in warnings: this worker process, or a drain() in a test.
        self.who = who or f"worker process {os.getpid()}"
        self.directory = _open_directory(".")
        try:
            self.path: str | None = os.getcwd()
        except OSError:  # started in a directory since deleted: only the descriptor leads back
            self.path = None
        self.umask = os.umask(0)
        os.umask(self.umask)
        # Only the main thread may set signal handlers (and only its jobs can replace them).
        self.handlers = [(int(signum), _getsignal(signum)) for signum in HANDLED_SIGNALS] if handlers else []
        self.warned = False
        self.manager = logging.root.manager
        self.logging_disabled = self.manager.disable

    def restore(self) -> None:
        """Put the working directory, umask and signal handlers back as they were when this
        object was made."""
        os.umask(self.umask)
        for signum, handler in self.handlers:
            if _getsignal(signum) is not handler:
                self._restore_handler(signum, handler)
        if self.manager.disable != self.logging_disabled:
            self._restore_logging()
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
                    "%s: cannot go back to its working directory %s after a job changed it (%s); "
                    "later jobs run where the job left them",
                    self.who,
                    self.path,
                    exc,
                )
            return
        self.directory = _open_directory(self.path)

    def close(self) -> None:
        """Close the descriptor of the working directory (a worker process keeps it until it exits)."""
        if self.directory is not None:
            os.close(self.directory)
            self.directory = None

    def _restore_handler(self, signum: int, handler: object) -> None:
        logger.warning(
            "%s: a job replaced the process's %s handler and left it so; it is put back "
            "(restore the previous handler when the job ends, or set it in a process of the job's own)",
            self.who,
            signal.Signals(signum).name,
        )
        signal.signal(signum, handler)  # type: ignore[arg-type]

    def _restore_logging(self) -> None:
        # The job's logging.disable() would silence every later job's errors, and the worker's own.
        level = logging.getLevelName(self.manager.disable)
        logging.disable(self.logging_disabled)
        logger.warning(
            "%s: a job called logging.disable(%s) and left it so, which silenced every later job "
            "and the worker; logging is put back (a job that means to quieten a library sets that library's "
            "logger level)",
            self.who,
            level,
        )


def _open_directory(path: str) -> int | None:
    try:
        return os.open(path, _DIRECTORY_FLAGS)
    except OSError:
        return None
