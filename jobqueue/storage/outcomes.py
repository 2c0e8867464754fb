"""How outcomes become column values: an archive row, or the update of a requeued message."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobqueue.job import Outcome, OutcomeKind


# The columns a delivery's lease occupies, cleared whenever a message leaves PROCESSING.
RELEASED: dict[str, None] = {"worker_id": None, "lease_token": None, "acquired_at": None, "lease_expires_at": None}


def archive_row(outcome: Outcome, now: datetime) -> dict[str, Any]:
    """The archive row of a COMPLETED or FAILED outcome, built from what the worker holds."""
    m = outcome.message
    error = outcome.error
    return {
        "id": m.id, "task_name": m.task_name, "queue": m.queue, "priority": m.priority,
        "state": outcome.state.value, "payload": m.payload, "headers": m.headers,
        "unique_key": m.unique_key, "partition_key": m.partition_key, "checkpoint": outcome.checkpoint,
        "options": m.options, "history": m.history, "attempts_count": m.attempts_count,
        "deliveries_count": m.deliveries_count, "created_at": m.created_at,
        "first_attempt_at": m.first_attempt_at or outcome.started_at,
        "last_attempt_at": outcome.started_at or m.acquired_at, "finished_at": outcome.finished_at,
        "archived_at": now, "result": outcome.result,
        "error_type": error.type if error else None,
        "error_message": error.message if error else None,
        "error_traceback": error.traceback if error else None,
    }


def requeue_binds(outcome: Outcome) -> dict[str, Any]:
    """The new values of a message that goes back to the queue (retry, defer, hand-back)."""
    m = outcome.message
    error = outcome.error
    unstarted = outcome.kind is OutcomeKind.RETURN
    return {
        "b_id": m.id,
        "b_token": m.lease_token,
        "b_state": outcome.state.value,
        "b_next": outcome.next_attempt_at or m.next_attempt_at,
        # A recorded outcome resets deliveries (SPEC 3); handing back unstarted uncounts both.
        "b_attempts": m.attempts_count - 1 if unstarted else m.attempts_count,
        "b_deliveries": m.deliveries_count - 1 if unstarted else 0,
        "b_checkpoint": outcome.checkpoint,
        "b_error_type": error.type if error else None,
        "b_error_message": error.message if error else None,
        "b_error_traceback": error.traceback if error else None,
    }


# Archive columns copied from the message row, and those the outcome supplies (in this order).
COPIED = ("id", "task_name", "queue", "priority", "payload", "headers", "unique_key", "partition_key", "options",
          "history", "created_at")
SUPPLIED = ("state", "checkpoint", "attempts_count", "deliveries_count", "first_attempt_at", "last_attempt_at",
            "finished_at", "archived_at", "result", "error_type", "error_message", "error_traceback")


def supplied_values(outcome: Outcome, now: datetime) -> tuple[Any, ...]:
    """The SUPPLIED archive values of a COMPLETED or FAILED outcome, in SUPPLIED order."""
    row = archive_row(outcome, now)
    return tuple(row[column] for column in SUPPLIED)
