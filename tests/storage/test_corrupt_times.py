"""Rows edited by hand to hold a time that Python cannot: each such message fails alone.

PostgreSQL holds years up to 294276 and before Christ, which its driver refused to read, failing
the whole fetch; MySQL and MariaDB hold zero dates, read as None. SQLite holds any text.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.testing import drain
from tests.acceptance.cli import jobqueue

# Per backend, the edits of three jobs: (column, SQL of the value). Each job is failed with
# CorruptMessage naming the column, except on MySQL a zero date where a column may hold no time
# (first_attempt_at), read as none: that job runs.
EDITS = {
    "sqlite": [
        ("created_at", "'the year 200000'"),
        ("next_attempt_at", "'0 o''clock'"),  # text that sorts before every time: due
        ("first_attempt_at", "'-1'"),
    ],
    "postgresql": [
        ("created_at", "'200000-01-01'"),
        ("next_attempt_at", "'4713-01-01 BC'"),
        ("first_attempt_at", "'0044-03-15 BC'"),
    ],
    "mysql": [
        ("created_at", "'0000-00-00 00:00:00'"),
        ("next_attempt_at", "'0000-00-00 00:00:00'"),
        ("first_attempt_at", "'0000-00-00 00:00:00'"),
    ],
}


@pytest.fixture
def echo(app: JobQueue):
    @app.task(name="basic.add")  # a name tests.apps.basic knows, for the CLI
    def add(x: int, y: int) -> int:
        return x + y

    return add


def test_a_time_python_cannot_hold_fails_its_message_alone(
    app: JobQueue, echo, backend: str, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = echo.bulk([(1, 1)] * 3)
    bad = echo.bulk([(2, 2)] * 3)
    m = app.tables.message
    with app.engine.begin() as conn:
        if backend == "mysql":
            conn.exec_driver_sql("SET SESSION sql_mode = ''")  # zero dates allowed, as on older servers
        for handle, (column, value) in zip(bad, EDITS[backend], strict=True):
            extra = ", state = 'RETRYABLE', attempts_count = 1" if column == "first_attempt_at" else ""
            conn.exec_driver_sql(f"UPDATE {m.name} SET {column} = {value}{extra} WHERE id = {handle.id}")
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", db_url)
    listed = json.loads(jobqueue("jobs", "list", "--json").stdout)
    assert {h.id for h in good + bad} <= {row["id"] for row in listed}
    for handle in bad:
        assert json.loads(jobqueue("jobs", "show", str(handle.id), "--json").stdout)["id"] == handle.id
    jobqueue("status", "--json")

    drain(app)

    a = app.tables.archive
    with app.engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(a.c.id, a.c.state, a.c.error_type, a.c.error_message))}
    assert {rows[h.id].state for h in good} == {"COMPLETED"}
    for handle, (column, _) in zip(bad, EDITS[backend], strict=True):
        row = rows[handle.id]
        if backend == "mysql" and column == "first_attempt_at":
            assert row.state == "COMPLETED", row
            continue
        assert (row.state, row.error_type) == ("FAILED", "jobqueue.errors.CorruptMessage"), row
        assert column in row.error_message, row.error_message
    listed = json.loads(jobqueue("jobs", "list", "--json", "--state", "failed").stdout)
    assert {h.id for h in bad[:2]} <= {row["id"] for row in listed}


# Per backend, due times edited into what sorts after every time and no worker reads: such a job was
# never taken, never failed, and held its partition for ever. MySQL and MariaDB hold no such value.
NEVER_DUE = {
    "sqlite": ["'soon'", "x'00ff'", "'T+1'"],
    "postgresql": ["'infinity'", "'12000-01-01'", "'294276-12-31'"],
}


def test_a_due_time_that_is_no_time_fails_its_message_and_frees_its_partition(
    app: JobQueue, echo, backend: str, db_url: str
) -> None:
    if backend not in NEVER_DUE:
        pytest.skip("MySQL and MariaDB hold no time after 9999, and read their zero date as due")
    bad = [echo.apply_async((3, 3), partition_key=f"customer-{n}") for n in range(3)]
    behind = [echo.apply_async((4, 4), partition_key=f"customer-{n}") for n in range(3)]
    good = echo.bulk([(1, 1)] * 3)
    m = app.tables.message
    with app.engine.begin() as conn:
        for handle, value in zip(bad, NEVER_DUE[backend], strict=True):
            conn.exec_driver_sql(f"UPDATE {m.name} SET next_attempt_at = {value} WHERE id = {handle.id}")

    run = jobqueue("worker", "--burst", "--concurrency", "1", env={"JOBQUEUE_DATABASE_URL": db_url})

    a = app.tables.archive
    with app.engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(a.c.id, a.c.state, a.c.error_type, a.c.error_message))}
        left = conn.execute(sa.select(sa.func.count()).select_from(m)).scalar()
    assert left == 0
    assert {rows[h.id].state for h in good + behind} == {"COMPLETED"}
    for handle in bad:
        row = rows[handle.id]
        assert (row.state, row.error_type) == ("FAILED", "jobqueue.errors.CorruptMessage"), row
        assert "next_attempt_at" in row.error_message and "holds no time" in row.error_message, row
    assert run.stderr.count("is failed with CorruptMessage") == 3, run.stderr
