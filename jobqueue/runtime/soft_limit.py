"""Where a sync job's soft time limit is raised: in the job's own code, never inside a library's.

The limit is a SIGALRM whose handler raises ``SoftTimeLimitExceeded`` wherever the main thread is.
Raised inside SQLAlchemy, a driver, logging or jobqueue itself (a checkpoint, an enqueue), it can be
swallowed (SQLAlchemy's pool logs an error while it returns a connection and goes on; logging drops
what a handler raises) or wrapped in another error (a ``StatementError``): the job would then run on
to its hard limit, or for ever, and ``retry_on=(SoftTimeLimitExceeded,)`` would not match. So when
the alarm lands inside such code, the exception waits for the job's next line of its own: a trace
function on the job's frames raises it there, and is removed at once.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any

from jobqueue.errors import SoftTimeLimitExceeded

# Top-level packages whose code the exception is not raised in.
LIBRARIES = frozenset({"jobqueue", "sqlalchemy", "logging", "psycopg2", "psycopg", "MySQLdb", "sqlite3", "pymysql"})


def _library(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] in LIBRARIES


class SoftLimit:
    """Raises the soft limit of jobs called from the frame running ``caller`` (the executor's)."""

    def __init__(self, caller: CodeType) -> None:
        self.caller = caller
        self.traced: list[FrameType] = []
        self.previous: Any = None

    def raise_here(self, frame: FrameType | None) -> bool:
        """Whether the alarm that interrupted ``frame`` may raise there; if not, the exception is
        arranged for the job's next line of its own."""
        stack: list[FrameType] = []
        while frame is not None and frame.f_code is not self.caller:
            stack.append(frame)
            frame = frame.f_back
        own: list[FrameType] = []  # the job's frames below any library's, from its function up
        for each in reversed(stack):
            if _library(each):
                break
            own.append(each)
        if frame is None or len(own) == len(stack) or not own:
            return True  # in the job's own code (or nothing of its own to wait for)
        self._trace(own)
        return False

    def _trace(self, frames: list[FrameType]) -> None:
        if self.traced:
            return
        self.previous = sys.gettrace()

        def on_line(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line" and self.traced:
                self.reset()
                raise SoftTimeLimitExceeded("soft time limit exceeded")
            return on_line

        self.traced = frames
        for frame in frames:
            frame.f_trace = on_line
            frame.f_trace_lines = True
        sys.settrace(_untraced)  # line events reach the frames' own trace functions only while tracing is on

    def reset(self) -> None:
        """Remove the trace function (the job ended, or the exception was raised)."""
        if not self.traced:
            return
        for frame in self.traced:
            frame.f_trace = None
        self.traced = []
        sys.settrace(self.previous)
        self.previous = None


def _untraced(frame: FrameType, event: str, arg: Any) -> None:
    """New frames are not traced: the job's line comes in one of the frames already on the stack."""
    return None
