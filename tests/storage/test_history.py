"""Throughput per minute from the archive, with the clock pinned, on every backend."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.storage.history import MinuteCount, throughput

NOW = datetime(2030, 3, 1, 9, 30, 20)


def archive(app: JobQueue, rows: list[tuple[str, datetime, datetime | None]], first_id: int = 1000) -> None:
    """Archive rows as (state, finished_at, archived_at or None for the same time), ids from ``first_id``."""
    values = [
        {
            "id": first_id + i,
            "task_name": "t.any",
            "queue": "default",
            "state": state,
            "payload": b"[[],{}]",
            "created_at": finished - timedelta(minutes=5),
            "finished_at": finished,
            "archived_at": archived or finished,
        }
        for i, (state, finished, archived) in enumerate(rows)
    ]
    with app.engine.begin() as conn:
        conn.execute(sa.insert(app.tables.archive), values)


def test_counts_per_minute_of_the_last_hour(app: JobQueue) -> None:
    archive(
        app,
        [
            ("COMPLETED", datetime(2030, 3, 1, 9, 30, 5), None),  # the minute now is in: the last entry
            ("COMPLETED", datetime(2030, 3, 1, 9, 30, 0), None),
            ("FAILED", datetime(2030, 3, 1, 9, 29, 59, 999999), None),
            ("COMPLETED", datetime(2030, 3, 1, 8, 31, 0), None),  # the first minute of the hour
            ("COMPLETED", datetime(2030, 3, 1, 8, 30, 59), None),  # before it: not counted
            ("CANCELLED", datetime(2030, 3, 1, 9, 15, 0), None),  # neither completed nor failed
            ("FAILED", datetime(2030, 3, 1, 9, 31, 0), None),  # after the minute now is in
            # archived a little before it finished, by a clock that runs behind the worker's
            ("FAILED", datetime(2030, 3, 1, 9, 0, 30), datetime(2030, 3, 1, 8, 58, 0)),
        ],
    )
    minutes = throughput(app.store, now=NOW)
    assert len(minutes) == 60
    assert (minutes[0].minute, minutes[-1].minute) == (datetime(2030, 3, 1, 8, 31), datetime(2030, 3, 1, 9, 30))
    assert minutes[-1] == MinuteCount(datetime(2030, 3, 1, 9, 30), completed=2, failed=0)
    assert minutes[-2] == MinuteCount(datetime(2030, 3, 1, 9, 29), completed=0, failed=1)
    assert minutes[0] == MinuteCount(datetime(2030, 3, 1, 8, 31), completed=1, failed=0)
    assert minutes[29] == MinuteCount(datetime(2030, 3, 1, 9, 0), completed=0, failed=1)
    assert sum(m.completed for m in minutes) == 3 and sum(m.failed for m in minutes) == 2


def test_other_windows_and_an_empty_archive(app: JobQueue) -> None:
    assert throughput(app.store, minutes=5, now=NOW) == [MinuteCount(datetime(2030, 3, 1, 9, 26 + i)) for i in range(5)]
    archive(app, [("COMPLETED", datetime(2030, 3, 1, 9, 30, 1), None)])
    assert throughput(app.store, minutes=1, now=NOW) == [MinuteCount(datetime(2030, 3, 1, 9, 30), completed=1)]
    with pytest.raises(ValueError, match="at least 1"):
        throughput(app.store, minutes=0)
