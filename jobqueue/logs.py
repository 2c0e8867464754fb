"""How the ``jobqueue`` command writes its log: one line per record on stderr, as text or JSON,
with times in UTC and the name of the process (``jobqueue-supervisor``, ``jobqueue-worker-3``).

The command sets this up unless the app says not to (``JobQueue(configure_logging=False)``, the
default under Django, whose ``LOGGING`` setting is kept). The formatters work in any logging set-up:
``"()": "jobqueue.logs.JsonFormatter"`` in a ``dictConfig``.
"""

from __future__ import annotations

import builtins
import io
import json
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from jobqueue.bidi import block_escaped, line_escaped, needs_escape
from jobqueue.job import storable_text

# What jobqueue adds to the records of job outcomes (see runtime.outcome_log.outcome_fields).
JOB_FIELDS = ("job_id", "task", "queue", "attempt", "outcome", "duration_seconds")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"

# Every logger jobqueue logs on (tests/unit/test_logs.py checks the list against the code).
LOGGERS = (
    "jobqueue",
    "jobqueue.dashboard",
    "jobqueue.handle",
    "jobqueue.periodic",
    "jobqueue.signals",
    "jobqueue.storage",
    "jobqueue.supervisor",
    "jobqueue.testing",
    "jobqueue.worker",
)
# Record attributes that carry a job's text to formatters (the JSON one writes them as fields).
TEXT_FIELDS = ("task", "queue")
# How much of a message's end is looked for at the start of a traceback kept by its end, and in
# how many places at most.
_PROBE_CHARS = 64
_PROBE_TRIES = 8

# Set by the worker's progress line while it is on a terminal: a log line then first clears the
# terminal's last line, where the progress line is drawn again at its next refresh. Forked worker
# processes inherit the flag, so their lines clear it too.
progress_on_terminal = False


def utc_time(record: logging.LogRecord) -> str:
    """The record's time in ISO 8601, UTC, with its offset: ``2026-11-23T10:04:05.123+00:00``."""
    return datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    """The default text line, with the time in UTC (hosts in other time zones agree on it)."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_time(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC), level, logger, process, pid, message, and for a job's
    outcome its fields (job_id, task, queue, attempt, outcome, duration_seconds); a traceback, the
    job's or the exception logged, is under ``traceback``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": utc_time(record),
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["traceback"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False, default=str)


class OneLineFilter(logging.Filter):
    """Write the text of jobs and enqueuers in jobqueue's log records as escapes where it would
    mislead an operator: bidirectional controls (U+202E shows "\\u202egnp.exe" as "exe.png" on
    a terminal that honours it), line breaks that would start a forged line of the log, terminal
    escape sequences. Task names, queues, error messages and arguments reach the messages through
    their arguments; a job's traceback keeps its line breaks.

    A filter on jobqueue's loggers, not a formatter: it serves whatever handlers and formatters
    the application's own logging set-up has (Django's LOGGING). A message with nothing to escape
    costs one ``str.isprintable`` pass more.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self._escape(record)
        except Exception:
            # A call whose message cannot be formatted (too few arguments, an argument whose str()
            # raises) is left as it is: its handler reports it as a logging error, as for any
            # other logger, instead of raising into the code that logged.
            pass
        return True

    @staticmethod
    def _escape(record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.isprintable():
            record.msg, record.args = _escaped_call(record, message)
        if record.exc_info and not record.exc_text:
            # Formatted here, as a formatter would (it keeps the text it finds), so that it is
            # escaped too; but only kept where it needed it: otherwise the handler's formatter
            # writes it, its own way if it has a formatException of its own.
            formatted = _TRACEBACKS.formatException(record.exc_info)
            escaped = one_line_messages(formatted, chained_messages(record.exc_info[1]))
            if escaped != formatted:
                record.exc_text = escaped
        elif record.exc_text:
            record.exc_text = block_escaped(record.exc_text)
        fields = record.__dict__
        for name in TEXT_FIELDS:
            value = fields.get(name)
            if isinstance(value, str) and not value.isprintable():
                fields[name] = line_escaped(value)


def _escaped_call(record: logging.LogRecord, message: str) -> tuple[Any, Any]:
    """The record's message and arguments with what needs it escaped: its string arguments where
    that is enough, so that the message keeps its template (error trackers such as Sentry group
    records by it); else the whole formatted ``message``. (Not every character that
    ``str.isprintable`` refuses needs an escape: a no-break space or the joiner inside an emoji
    such as a family's stays as it is.)"""
    template, args = record.msg, record.args
    if isinstance(template, str) and not needs_escape(template) and isinstance(args, tuple):
        escaped = tuple(line_escaped(arg) if isinstance(arg, str) else arg for arg in args)
        try:
            formatted = template % escaped
        except (TypeError, ValueError):  # "%c" takes one character, and an escape is several
            formatted = None
        if formatted is not None and not needs_escape(formatted):
            return template, escaped
    return line_escaped(message), None


def one_line_messages(traceback: str, messages: list[str]) -> str:
    """``traceback`` with each of the exception ``messages`` in it written on one line (a line
    break in one would start a line of its own after the traceback's), and escaped as
    :class:`OneLineFilter` escapes messages; the traceback's own line breaks stay. A traceback kept
    by its end may begin inside a message: that part is escaped too."""
    for message in messages:
        if not needs_escape(message):
            continue
        if message in traceback:
            traceback = traceback.replace(message, line_escaped(message))
        elif (indented := _indented_escaped(traceback, message)) is not None:
            traceback = indented
        else:
            traceback = _escaped_start(traceback, message)
    return block_escaped(traceback)


def _indented_escaped(traceback: str, message: str) -> str | None:
    """``traceback`` with ``message`` escaped where it is written as a member of an exception group
    is: each of its lines after the first behind the group's margin (spaces and "|"), which goes
    with its line breaks. None if it is not found so."""
    if "\n" not in message or "|" not in traceback:
        return None
    first, *rest = message.split("\n")
    parts: list[str] = []
    done = 0  # traceback[:done] is in parts
    found = traceback.find(first)
    while found != -1:
        end = _margined_end(traceback, found + len(first), rest)
        if end is None:
            found = traceback.find(first, found + 1)
            continue
        parts += (traceback[done:found], line_escaped(message))
        done = end
        found = traceback.find(first, end)
    return "".join(parts) + traceback[done:] if parts else None


def _margined_end(traceback: str, at: int, lines: list[str]) -> int | None:
    """Where ``lines`` end in ``traceback`` from ``at``, each after a line break and a margin."""
    for line in lines:
        if not traceback.startswith("\n", at):
            return None
        at += 1
        while at < len(traceback) and traceback[at] in " |":
            at += 1
        if not traceback.startswith(line, at):
            return None
        at += len(line)
    return at


def _escaped_start(traceback: str, message: str) -> str:
    """``traceback`` with its start escaped where it is the end of ``message`` (the start of the
    message cut off with the traceback's), after "..." that says so: the job's text does not begin
    a line."""
    # The message's end is where its last characters are found in the traceback: the last such
    # place (or one of the few before it, if the text after the message repeats them).
    tail = message[-_PROBE_CHARS:]
    before = min(len(traceback), len(message) - 1)
    for _ in range(_PROBE_TRIES):
        found = traceback.rfind(tail, 0, before)
        if found == -1:
            break
        kept = found + len(tail)
        if message.endswith(traceback[:kept]):
            return "..." + line_escaped(traceback[:kept]) + traceback[kept:]
        before = kept - 1
    return traceback


def stored_messages(message: str, exc: BaseException | None) -> list[str]:
    """The exception messages in a job's stored traceback, for :func:`one_line_messages`: those of
    ``exc`` (the exception behind it, while this process holds it) and of the exceptions chained to
    it, and their notes, as stored (the stored ``message`` is cut at 10,000 characters, and is one
    of many); else the stored ``message``."""
    return [storable_text(text) for text in chained_messages(exc)] if exc is not None else [message]


def chained_messages(exc: BaseException | None) -> list[str]:
    """The messages of ``exc`` and of the exceptions chained to it, and their notes
    (``add_note``), as a traceback shows them: an exception group's sub-exceptions and theirs too."""
    messages: list[str] = []
    seen: set[int] = set()
    todo = [exc]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        # A str() that raises anything (SystemExit too: it is the job's code) is passed over, as
        # the traceback does ("<exception str() failed>").
        try:
            messages.append(str(exc))
        except BaseException:
            pass
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list | tuple):
            for note in notes:
                try:
                    messages.append(str(note))
                except BaseException:
                    pass
        todo.append(exc.__cause__ or exc.__context__)
        if _GROUP is not None and isinstance(exc, _GROUP):
            todo.extend(reversed(getattr(exc, "exceptions", ())))
    return messages


# Exception groups came with Python 3.11.
_GROUP: type[BaseException] | None = getattr(builtins, "BaseExceptionGroup", None)


ONE_LINE = OneLineFilter()
_TRACEBACKS = logging.Formatter()


def guard_loggers() -> None:
    """Put :class:`OneLineFilter` on every logger of jobqueue's (once)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if ONE_LINE not in logger.filters:
            logger.addFilter(ONE_LINE)


class StderrHandler(logging.StreamHandler):
    """A stream handler whose lines do not run into the worker's progress line on a terminal.

    It writes to a copy of stderr's file descriptor of its own: a job that closes ``sys.stderr``
    (as daemonizing code does) or file descriptor 2 neither silences the worker's log nor makes
    its next line raise inside the worker process.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        own = private_copy(sys.stderr) if stream is None else None
        super().__init__(stream or own or sys.stderr)
        self.own_stream = own  # closed with the handler; a stream given to it is the caller's

    def emit(self, record: logging.LogRecord) -> None:
        if progress_on_terminal:
            try:
                self.stream.write("\r\x1b[2K")
            except Exception:
                pass
        super().emit(record)

    def close(self) -> None:
        if self.own_stream is not None:
            try:
                self.own_stream.close()
            except Exception:
                pass
            # A line logged after this (logging shuts down at exit, before the finalizers of
            # libraries that log, such as PySpark's) goes to stderr as a plain handler's would.
            self.stream = sys.stderr
        super().close()


def private_copy(stream: TextIO) -> TextIO | None:
    """A line-buffered text stream on a duplicate of ``stream``'s file descriptor; None when it
    has none (a test's captured stderr)."""
    try:
        fd = os.dup(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return open(
        fd,
        "w",
        encoding=getattr(stream, "encoding", None) or "utf-8",
        errors=getattr(stream, "errors", None) or "backslashreplace",
        buffering=1,  # line by line
    )


def configure(level: str | int = "INFO", json_lines: bool = False) -> logging.Handler:
    """Send every log record at ``level`` or above to stderr, as text or JSON; replaces the root
    logger's handlers (the command owns its process's logging)."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, StderrHandler):
            old.close()  # its copy of stderr's descriptor with it
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
