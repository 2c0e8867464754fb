"""The command's logging: UTC times, JSON fields, a host's own logging kept, short options."""

from __future__ import annotations

import builtins
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from jobqueue import ConfigurationError, JobQueue, logs
from jobqueue.cli import bound_cli, cli
from tests.acceptance.cli import ROOT

NOTES = pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes came with Python 3.11")


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = saved
    root.setLevel(level)
    logging.getLogger("jobqueue").setLevel(logging.NOTSET)


def record(**extra: object) -> logging.LogRecord:
    entry = logging.LogRecord("jobqueue.worker", logging.ERROR, __file__, 1, "job %s failed", (5,), None)
    entry.__dict__.update(extra)
    return entry


def test_json_lines_have_utc_times_and_the_job_fields() -> None:
    line = logs.JsonFormatter().format(record(job_id=5, task="t", outcome="failed", attempt=2))
    entry = json.loads(line)
    assert entry["time"].endswith("+00:00") and entry["message"] == "job 5 failed"
    assert (entry["job_id"], entry["task"], entry["outcome"], entry["attempt"]) == (5, "t", "failed", 2)
    assert "queue" not in entry  # fields a record does not have are left out


def test_a_job_traceback_is_appended_by_any_formatter() -> None:
    entry = record()
    entry.exc_text = "Traceback (most recent call last):\nValueError: x"
    text = logs.TextFormatter().format(entry)
    assert text.endswith("job 5 failed\nTraceback (most recent call last):\nValueError: x")
    assert "+00:00 ERROR" in text
    assert json.loads(logs.JsonFormatter().format(entry))["traceback"].endswith("ValueError: x")
    assert logging.Formatter("%(message)s").format(entry).endswith("ValueError: x")  # a host's own formatter too


def test_the_command_configures_logging_unless_the_app_keeps_its_hosts(root_logging: logging.Logger, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/q.sqlite3"
    host = logging.NullHandler()
    root_logging.handlers[:] = [host]
    kept = JobQueue(url, configure_logging=False)
    result = CliRunner().invoke(bound_cli(kept), ["-l", "warning", "db", "init"], catch_exceptions=False)
    assert result.exit_code == 0
    assert root_logging.handlers == [host]  # the host's logging is kept...
    assert logging.getLogger("jobqueue").level == logging.WARNING  # ...and an explicit level still applies

    taken = JobQueue(url)
    CliRunner().invoke(bound_cli(taken), ["--log-json", "db", "check"], catch_exceptions=False)
    (handler,) = root_logging.handlers
    assert isinstance(handler.formatter, logs.JsonFormatter) and root_logging.level == logging.INFO


def test_a_missing_app_file_is_a_one_line_error(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["-A", f"{tmp_path}/nothere.py:app", "status"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: cannot import '{tmp_path}/nothere.py' named by --app/JOBQUEUE_APP: no such file: {tmp_path}/nothere.py"
    ]


def test_a_module_not_found_names_where_it_was_looked_for(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["-A", "shop_tasks_not_here:app", "status"])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line == (
        "Error: cannot import 'shop_tasks_not_here' named by --app/JOBQUEUE_APP: No module named "
        f"'shop_tasks_not_here' (looked for from {tmp_path} and PYTHONPATH): run jobqueue from the directory "
        "that holds it, set PYTHONPATH, or give the path of its file (path/to/tasks.py)"
    )


def test_a_module_whose_own_import_fails_is_named_with_the_line(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shop_tasks_importing.py").write_text("import os\nimport a_library_not_installed\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(cli, ["-A", "shop_tasks_importing", "status"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: cannot import 'shop_tasks_importing' named by --app/JOBQUEUE_APP: ModuleNotFoundError: No module "
        f"named 'a_library_not_installed', at {tmp_path}/shop_tasks_importing.py line 2"
    ]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["worker", "--app", "tasks:app"], "Error: --app goes before the command: jobqueue --app ... worker ..."),
        (["jobs", "list", "-l", "info"], "Error: -l goes before the command: jobqueue -l ... jobs list ..."),
        (["status", "--nope"], "Error: No such option '--nope'."),
    ],
)
def test_a_global_option_given_after_the_command_says_where_it_goes(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(cli, args, prog_name="jobqueue")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == expected


def test_a_misspelt_setting_is_named_with_the_one_meant() -> None:
    with pytest.raises(ConfigurationError, match=r"'concurency' \(did you mean 'concurrency'\?\); known: "):
        JobQueue(concurency=2)


def test_celery_short_options() -> None:
    from jobqueue.cli.worker import worker

    names = {opt for param in worker.params for opt in param.opts}
    assert {"-c", "-Q"} <= names
    assert {"-A", "-l"} <= {opt for param in cli.params for opt in param.opts}


def test_a_job_failing_with_a_huge_message_logs_a_line_of_bounded_size(caplog: pytest.LogCaptureFixture) -> None:
    """One log line carries the start of the error message, and the start and the end (where the
    error is raised) of the traceback, saying where to read the rest."""
    import dataclasses

    from jobqueue.clock import utcnow
    from jobqueue.job import ErrorInfo, Message, MessageState, Outcome, OutcomeKind
    from jobqueue.runtime.outcome_log import log_outcome

    now = utcnow()
    message = Message(7, "t", "default", 0, b"", None, 1, 1, 1, now, now, now)
    huge = "x" * 3_000_000
    error = ErrorInfo("ValueError", huge, f"Traceback (most recent call last):\n{huge}\nValueError: the end")
    failed = Outcome(message, OutcomeKind.ARCHIVE, MessageState.FAILED, finished_at=now, error=error)
    retried = Outcome(message, OutcomeKind.RETRY, MessageState.RETRYABLE, finished_at=now, error=error)
    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"):
        log_outcome(failed)
        log_outcome(retried)
        log_outcome(dataclasses.replace(failed, retain=False))  # not archived: nowhere to read the rest
    lines = [logging.Formatter().format(entry) for entry in caplog.records]
    assert len(lines) == 3
    for line in lines:
        assert len(line) < 30_000 and "ValueError: xxx" in line and "characters left out" in line
    assert lines[0].startswith("job 7 t failed") and lines[0].endswith("ValueError: the end")
    assert "`jobqueue jobs show 7` has more" in lines[0] and "`jobqueue jobs show 7` has more" in lines[1]
    assert "jobs show" not in lines[2]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"):
        log_outcome(dataclasses.replace(retried, error=None))  # the job called nack(): no error to name
    assert caplog.messages == [f"job 7 t failed on attempt 1 (nacked by the job); retry at {retried.next_attempt_at}"]


def test_a_line_logged_after_logging_shut_down_is_written_not_a_logging_error() -> None:
    """As at the command's exit, when a library's finalizer logs (PySpark's py4j does, after
    `jobqueue report` and `jobqueue archive export`): the line goes to stderr, no traceback."""
    script = (
        "import logging\n"
        "from jobqueue import logs\n"
        "logs.configure()\n"
        "logging.shutdown()\n"  # what the interpreter does at exit, before finalizers run
        "logging.getLogger('late').warning('said after shutdown')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "said after shutdown" in result.stderr
    assert "Logging error" not in result.stderr and "Traceback" not in result.stderr


def test_every_logger_of_jobqueues_escapes_the_text_of_jobs() -> None:
    import re
    from pathlib import Path

    source = Path(logs.__file__).parent
    named = {
        name
        for path in source.rglob("*.py")
        for name in re.findall(r'getLogger\("(jobqueue[\w.]*)"\)', path.read_text(encoding="utf-8"))
    }
    assert named == set(logs.LOGGERS)
    assert all(logs.ONE_LINE in logging.getLogger(name).filters for name in logs.LOGGERS)


def test_an_exception_logged_by_jobqueue_keeps_its_messages_on_their_lines(root_logging: logging.Logger) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter())
    root_logging.handlers[:] = [handler]
    try:
        try:
            raise KeyError("inner\nINFO forged")
        except KeyError as exc:
            raise ValueError("\u202egnp.exe\n2026-01-01 INFO forged") from exc
    except ValueError:
        logging.getLogger("jobqueue.worker").exception("job %s %s raised", 1, "t\u202e", extra={"task": "t\u202e"})
    text = stream.getvalue()
    assert "\u202e" not in text and "job 1 t\\u202e raised" in text
    assert "ValueError: \\u202egnp.exe\\n2026-01-01 INFO forged" in text
    assert "KeyError: 'inner\\nINFO forged'" in text
    assert not any(line.startswith(("2026-01-01", "INFO")) for line in text.splitlines())
    assert text.splitlines()[1] == "Traceback (most recent call last):"


def test_a_record_keeps_its_template_where_escaping_its_arguments_is_enough() -> None:
    """Error trackers group records by their message template: it is kept, with the arguments
    escaped, unless the text to escape comes from elsewhere (an object's str())."""
    from jobqueue.logs import OneLineFilter

    def filtered(msg: str, *args: object) -> logging.LogRecord:
        record = logging.LogRecord("jobqueue.worker", logging.ERROR, __file__, 1, msg, args, None)
        assert OneLineFilter().filter(record)
        return record

    plain = filtered("job %s %s failed", 7, "t.ok")
    assert (plain.msg, plain.args) == ("job %s %s failed", (7, "t.ok"))
    hostile = filtered("job %s %s failed: %s", 7, "t.x", "a\u202eb\nc")
    assert hostile.msg == "job %s %s failed: %s" and hostile.getMessage() == "job 7 t.x failed: a\\u202eb\\nc"
    error = filtered("job %s failed: %s", 7, ValueError("x\ny"))
    assert error.getMessage() == "job 7 failed: x\\ny" and error.args is None
    harmless = filtered(
        "key %s", "\U0001f468\u200d\U0001f469\u200d\U0001f467 and\u00a0more"
    )  # a family, a no-break space
    assert (harmless.msg, harmless.getMessage()) == (
        "key %s",
        "key \U0001f468\u200d\U0001f469\u200d\U0001f467 and\u00a0more",
    )
    spaced = filtered("montant\u00a0: %s", "a\nb")  # French writes a no-break space before a colon
    assert (spaced.msg, spaced.getMessage()) == ("montant\u00a0: %s", "montant\u00a0: a\\nb")


class Recording(logging.Handler):
    """The lines a handler writes, and how many records it could not format (a logging error)."""

    def __init__(self, formatter: logging.Formatter | None = None) -> None:
        super().__init__()
        self.setFormatter(formatter or logging.Formatter("%(message)s"))
        self.lines: list[str] = []
        self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.extend(self.format(record).splitlines())
        except Exception:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:
        self.errors += 1


def test_a_log_call_on_a_logger_of_jobqueues_never_raises(root_logging: logging.Logger) -> None:
    """A call whose message does not format raised from the filter into the code that logged (a
    job's, a library's, the worker's own loop), where logging reports it as a logging error and
    goes on. A "%c" of a control character, whose escape is no one character, is escaped whole."""

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    handler = Recording()
    root_logging.handlers[:] = [handler]
    log = logging.getLogger("jobqueue.worker")
    log.error("job %s of %s", 1)
    log.error("job %s", Unprintable())
    assert handler.errors == 2 and handler.lines == []
    log.error("mark %c", "\n")
    assert handler.lines == ["mark \\n"]


def test_a_hosts_formatter_writes_the_tracebacks_of_jobqueues_records_its_own_way(root_logging: logging.Logger) -> None:
    """The filter formatted every exception logged on jobqueue's loggers itself, so that a host's
    formatter (Django's LOGGING) with a formatException of its own never had it called; it now
    writes every traceback that has nothing to escape."""

    class OneLine(logging.Formatter):
        def formatException(self, ei: Any) -> str:
            return f"EXCEPTION {ei[0].__name__}: {ei[1]}"

    handler = Recording(OneLine("%(message)s"))
    root_logging.handlers[:] = [handler]
    try:
        raise ValueError("plain")
    except ValueError:
        logging.getLogger("jobqueue.worker").exception("job %s raised", 1)
    assert handler.lines == ["job 1 raised", "EXCEPTION ValueError: plain"]


@NOTES
def test_the_notes_of_an_exception_logged_by_jobqueue_are_on_their_lines(root_logging: logging.Logger) -> None:
    handler = Recording()
    root_logging.handlers[:] = [handler]
    try:
        error = ValueError("plain")
        if sys.version_info >= (3, 11):
            error.add_note("for order 7\nERROR forged")  # a note carries the job's text as its message does
        raise error
    except ValueError:
        logging.getLogger("jobqueue.worker").exception("job %s raised", 1)
    assert "for order 7\\nERROR forged" in handler.lines
    assert not any(line.startswith("ERROR") for line in handler.lines)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups came with Python 3.11")
def test_the_members_of_an_exception_group_logged_by_jobqueue_are_on_their_lines(root_logging: logging.Logger) -> None:
    """A traceback writes a group's members behind a margin ("    | "), line breaks and all: the
    messages of the members, and of their causes, are escaped too."""
    handler = Recording()
    root_logging.handlers[:] = [handler]
    try:
        raise grouped("for order 7\nERROR forged")
    except BaseException:
        logging.getLogger("jobqueue.worker").exception("job %s raised", 1)
    assert any(line.endswith("RuntimeError: for order 7\\nERROR forged") for line in handler.lines)
    assert not any(line.lstrip(" |").startswith("ERROR") for line in handler.lines)


def failed_outcome(exc: BaseException) -> Any:
    """The outcome of a job that raised ``exc`` and failed for good, as a worker process holds it."""
    import traceback

    from jobqueue.clock import utcnow
    from jobqueue.job import ErrorInfo, Message, MessageState, Outcome, OutcomeKind

    try:
        raise exc
    except BaseException as raised:
        error = ErrorInfo.from_exception(raised, traceback.format_exc())
    now = utcnow()
    message = Message(7, "t", "default", 0, b"", None, 1, 1, 1, now, now, now)
    return Outcome(message, OutcomeKind.ARCHIVE, MessageState.FAILED, finished_at=now, error=error, exception=exc)


def chained(message: str) -> BaseException:
    try:
        raise KeyError("inner") from RuntimeError(message)
    except KeyError as exc:
        return exc


def grouped(message: str) -> BaseException:
    """A group whose second sub-exception was caused by one with ``message``."""
    try:
        raise KeyError("inner") from RuntimeError(message)
    except KeyError as inner:
        group: type[BaseException] = builtins.ExceptionGroup  # type: ignore[attr-defined,unused-ignore]
        return group("several", [ValueError("first"), inner])


GROUPS = pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups came with Python 3.11")


def noted(message: str) -> BaseException:
    error = ValueError("plain")
    if sys.version_info >= (3, 11):
        error.add_note(message)
    return error


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda text: chained(text), id="a cause's message"),
        pytest.param(lambda text: noted(text), id="a note", marks=NOTES),
        pytest.param(lambda text: grouped(text), id="a cause of an exception group's member", marks=GROUPS),
        pytest.param(lambda text: ValueError("x" * 10_000 + text), id="past the 10,000 characters stored"),
        pytest.param(lambda text: ValueError(text * 6_000), id="cut off with the start of the traceback"),
        pytest.param(lambda text: ValueError(text * 200_000), id="megabytes, cut off"),  # in linear time
    ],
)
def test_a_failed_jobs_line_writes_every_message_of_its_traceback_on_one_line(
    root_logging: logging.Logger, make: Any
) -> None:
    """Only the message of the exception the job raised was escaped in its line's traceback, and
    only its first 10,000 characters (as stored): the messages of the exceptions chained to it,
    notes, the rest of a long message, and one the stored traceback (its last 60,000 characters)
    begins inside, kept their line breaks, so that the job's text started lines of its own."""
    from jobqueue.runtime.outcome_log import log_outcome

    handler = Recording(logs.TextFormatter())
    root_logging.handlers[:] = [handler]
    log_outcome(failed_outcome(make("\n2026-01-01 ERROR forged")))
    assert "\\n2026-01-01 ERROR forged" in "\n".join(handler.lines)
    assert not any(line.startswith("2026-01-01") for line in handler.lines)


class Unsayable(Exception):
    """An exception whose str() raises SystemExit: the job's code, which the worker survives."""

    def __str__(self) -> str:
        raise SystemExit(3)


def test_an_exception_whose_str_raises_system_exit_is_logged(root_logging: logging.Logger) -> None:
    from jobqueue.runtime.outcome_log import log_outcome

    handler = Recording(logs.TextFormatter())
    root_logging.handlers[:] = [handler]
    log_outcome(failed_outcome(Unsayable()))
    try:
        raise Unsayable()
    except Unsayable:
        logging.getLogger("jobqueue.worker").exception("a receiver raised")
    assert sum("<exception str() failed>" in line for line in handler.lines) == 2
