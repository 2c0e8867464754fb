"""archived_values builds an archive row's values in one pass: they must be what the ARCHIVED
fields (from which the PostgreSQL statement and the column order are built) say."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from jobqueue.job import ErrorInfo, Message, MessageState, Outcome, OutcomeKind
from jobqueue.storage.outcomes import ARCHIVED, archived_values

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456)


def message(first: datetime | None, acquired: datetime | None) -> Message:
    return Message(7, "t", "default", 0, b"[[],{}]", None, 2, 1, 99, T0, first, T0, acquired, checkpoint=b"c")


@pytest.mark.parametrize("first", [None, T0 + timedelta(seconds=1)])
@pytest.mark.parametrize("started", [None, T0 + timedelta(seconds=2)])
@pytest.mark.parametrize("acquired", [None, T0 + timedelta(seconds=3)])
@pytest.mark.parametrize("error", [None, ErrorInfo("ValueError", "bad", "Traceback ...")])
def test_archived_values_follow_the_fields(
    first: datetime | None, started: datetime | None, acquired: datetime | None, error: ErrorInfo | None
) -> None:
    outcome = Outcome(
        message(first, acquired),
        OutcomeKind.ARCHIVE,
        MessageState.FAILED if error else MessageState.COMPLETED,
        T0 + timedelta(seconds=4),
        started,
        result=None if error else b"42",
        error=error,
        checkpoint=b"state",
    )
    now = T0 + timedelta(seconds=5)
    assert archived_values(outcome, now) == tuple(field.value(outcome, now) for field in ARCHIVED)
    stamped = tuple(
        value.isoformat() if isinstance(value, datetime) and field.column != "archived_at" else value
        for field, value in zip(ARCHIVED, (field.value(outcome, now) for field in ARCHIVED), strict=True)
    )
    assert archived_values(outcome, now, datetime.isoformat) == stamped
