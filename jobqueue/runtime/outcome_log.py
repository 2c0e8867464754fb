"""What a worker says about job outcomes once they are written: one log line each, with the job's
fields for structured logs, and a failed job's error clipped to what a log pipeline should carry."""

from __future__ import annotations

import logging
from typing import Any

from jobqueue import logs
from jobqueue.job import MessageState, Outcome, OutcomeKind

logger = logging.getLogger("jobqueue.worker")


def outcome_fields(outcome: Outcome) -> dict[str, Any]:
    """The structured fields of an outcome's log line (``--log-json`` writes them as keys)."""
    m = outcome.message
    return {
        "job_id": m.id,
        "task": m.task_name,
        "queue": m.queue,
        "attempt": m.attempts_count,
        "outcome": outcome.name,
        "duration_seconds": round(outcome.duration_seconds or 0.0, 6),
    }


# How much of a job's error message and traceback one log line carries: a job may fail with a
# message of megabytes, which a log pipeline should not have to carry (the archive keeps more:
# ``jobqueue jobs show``). A traceback keeps its start and its end, where the error is raised.
LOGGED_ERROR_CHARS = 2_000
LOGGED_TRACEBACK_HEAD_CHARS = 5_000
LOGGED_TRACEBACK_TAIL_CHARS = 15_000


def _clipped(text: str, outcome: Outcome, head: int, tail: int = 0) -> str:
    left_out = len(text) - head - tail
    if left_out <= 0:
        return text
    where = f": `jobqueue jobs show {outcome.message.id}` has more" if outcome.retain else ""
    end = text[-tail:] if tail else ""
    return f"{text[:head]}... ({left_out:,} characters left out{where}) ...{end}"


def log_outcome(outcome: Outcome) -> None:
    """One line per job outcome, once it is written: a success at INFO, a retry at WARNING and a
    final failure at ERROR with the job's traceback (whatever the level of the other lines)."""
    m = outcome.message
    error = outcome.error
    if outcome.kind is OutcomeKind.ARCHIVE and outcome.state is MessageState.FAILED:
        if logger.isEnabledFor(logging.ERROR):
            record = logger.makeRecord(
                logger.name,
                logging.ERROR,
                __file__,
                0,
                "job %s %s failed %s: %s: %s",
                (
                    m.id,
                    m.task_name,
                    # a job failed before its call (an unknown task, an unreadable row) never had an attempt
                    f"on attempt {m.attempts_count} after {(outcome.duration_seconds or 0.0) * 1000:.1f} ms"
                    if outcome.ran
                    else "without running",
                    error.type if error else "?",
                    _clipped(error.message, outcome, LOGGED_ERROR_CHARS) if error else "",
                ),
                None,
                extra=outcome_fields(outcome),
            )
            # Formatters append exc_text as they would a traceback of exc_info: the job's own, as the
            # archive keeps it, though no exception is being handled by the time the outcome is written.
            traceback = error.traceback.rstrip() if error and error.traceback else ""
            if error:  # the job's messages written on one line in it (job text: see logs.OneLineFilter)
                traceback = logs.one_line_messages(traceback, logs.stored_messages(error.message, outcome.exception))
            record.exc_text = (
                _clipped(traceback, outcome, LOGGED_TRACEBACK_HEAD_CHARS, LOGGED_TRACEBACK_TAIL_CHARS) or None
            )
            logger.handle(record)
    elif outcome.kind is OutcomeKind.RETRY:
        logger.warning(
            "job %s %s failed on attempt %s (%s); retry at %s",
            m.id,
            m.task_name,
            m.attempts_count,
            f"{error.type}: {_clipped(error.message, outcome, LOGGED_ERROR_CHARS)}" if error else "nacked by the job",
            outcome.next_attempt_at,
            extra=outcome_fields(outcome),
        )
    elif not logger.isEnabledFor(logging.INFO):
        return  # the common case of a busy worker: build nothing for a line nobody reads
    elif outcome.kind is OutcomeKind.DEFER:
        logger.info(
            "job %s %s deferred to %s", m.id, m.task_name, outcome.next_attempt_at, extra=outcome_fields(outcome)
        )
    elif outcome.kind is OutcomeKind.ARCHIVE:
        logger.info(
            "job %s %s %s in %.1f ms",
            m.id,
            m.task_name,
            outcome.state.public,
            (outcome.duration_seconds or 0.0) * 1000,
            extra=outcome_fields(outcome),
        )
