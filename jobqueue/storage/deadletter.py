"""The archive as a dead-letter queue: list, show, retry and purge jobs (``jobqueue jobs ...``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from jobqueue.job import ACTIVE_STATES, FINAL_STATES, SCHEDULE_TASK, MessageState
from jobqueue.storage.jobs import message_archive_columns
from jobqueue.storage.readable import Unreadable, readable_rows
from jobqueue.storage.store import Store

ACTIVE = {s.value for s in ACTIVE_STATES}
ARCHIVED = {s.value for s in FINAL_STATES}
UNKNOWN = "UNKNOWN"  # as a state asked for: any state jobqueue does not know
RETRYABLE_FROM_ARCHIVE = (MessageState.FAILED.value, MessageState.CANCELLED.value)
HISTORY_TRACEBACK_CHARS = 20_000
# A listing shows an error longer than this as its first LISTED_ERROR_CHARS - 1 characters and "~".
LISTED_ERROR_CHARS = 200


UNKNOWN_STATE_NOTE = "a state jobqueue does not know (edited by hand?): no worker runs it; set it to PENDING to run it"


class UnknownState(str):
    """A stored state that is none of jobqueue's (a row edited by hand): no worker runs it."""

    def __new__(cls, raw: Any) -> UnknownState:
        return super().__new__(cls, f"<unknown state: {raw!r:.50}>")


def list_jobs(
    store: Store,
    states: Iterable[str] = (),
    task: str | None = None,
    queue: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
) -> list[dict[str, Any]]:
    """The newest jobs (highest ids first) in the given states, from both tables as needed.

    ``states`` may hold UNKNOWN: the jobs in a state jobqueue does not know (edited by hand), which
    no worker runs. ``before_id`` pages on: only jobs with a lower id, so a page stays put while
    new jobs arrive.
    """
    asked = {s.upper() for s in states}
    unknown = UNKNOWN in asked
    wanted = (asked - {UNKNOWN}) or (set() if unknown else ACTIVE | ARCHIVED)
    every = not states  # with no state asked for, rows in a state jobqueue does not know are listed too
    known = sorted(ACTIVE | ARCHIVED)
    m, a = store.tables.message, store.tables.archive
    found: list[dict[str, Any]] = []
    with store.reading() as conn:
        for table, in_table, when in ((m, ACTIVE, "next_attempt_at"), (a, ARCHIVED, "archived_at")):
            chosen = sorted(wanted & in_table)
            if not chosen and not unknown:
                continue
            error = table.c.error_message if table is a else table.c.last_error_message
            stmt = sa.select(
                table.c.id,
                table.c.task_name,
                table.c.queue,
                table.c.state,
                table.c.priority,
                table.c.attempts_count,
                table.c.created_at,
                table.c[when].label("when"),
                (table.c.error_type if table is a else table.c.last_error_type).label("error_type"),
                # Cut by the database, in characters on all three (a message edited in by hand may
                # be megabytes); one more than is shown, to tell a longer error from one that fits.
                sa.func.substr(error, 1, LISTED_ERROR_CHARS + 1, type_=error.type).label("error"),
                table.c.partition_key,
                table.c.flow_key,
                table.c.concurrency_limit,
                # Known by the database's own comparison, as workers fetch (MySQL's ignores case).
                table.c.state.in_(known).label("known_state"),
            )
            if not every:
                stmt = stmt.where(
                    sa.or_(
                        table.c.state.in_(chosen) if chosen else sa.false(),
                        table.c.state.not_in(known) if unknown else sa.false(),
                    )
                )
            if task:
                stmt = stmt.where(table.c.task_name == task)
            elif table is m:
                stmt = stmt.where(table.c.task_name != SCHEDULE_TASK)  # see `jobqueue periodic list`
            if queue:
                stmt = stmt.where(table.c.queue == queue)
            if before_id is not None:
                stmt = stmt.where(table.c.id < before_id)
            found.extend(readable_rows(conn, stmt.order_by(table.c.id.desc()).limit(limit)))
    found.sort(key=lambda row: row["id"], reverse=True)
    for row in found:
        state = row["state"]
        row["state"] = state.lower() if row.pop("known_state") else UnknownState(state)
        error = row["error"]
        if isinstance(error, str) and len(error) > LISTED_ERROR_CHARS:
            row["error"] = error[: LISTED_ERROR_CHARS - 1] + "~"
    return found[:limit]


def job_row(store: Store, job_id: int) -> tuple[str, dict[str, Any]] | None:
    """The job's full row and which table it is in ("message" or "archive"), or None. A state
    jobqueue does not know (edited by hand) comes as an :class:`UnknownState`."""
    known = sorted(ACTIVE | ARCHIVED)
    with store.reading() as conn:
        for name in ("message", "archive"):
            table = getattr(store.tables, name)
            # Known by the database's own comparison, as workers fetch (MySQL's ignores case).
            stmt = sa.select(table, table.c.state.in_(known).label("_known_state")).where(table.c.id == job_id)
            found = readable_rows(conn, stmt)
            if found:
                row = found[0]
                if not row.pop("_known_state"):
                    row["state"] = UnknownState(row["state"])
                return name, row
    return None


@dataclass
class RetryReport:
    retried: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    tasks: dict[int, str] = field(default_factory=dict)  # the task of each retried job

    def add(self, other: RetryReport) -> None:
        """Take in what a later call did."""
        self.retried += other.retried
        self.refused.update(other.refused)
        self.tasks.update(other.tasks)


def _history_entry(row: dict[str, Any]) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:  # stored times are UTC: say so
        return value.replace(tzinfo=timezone.utc).isoformat() if value is not None else None

    traceback = row.get("error_traceback")
    return {
        "state": row["state"],
        "attempts": row["attempts_count"],
        "deliveries": row["deliveries_count"],
        "first_attempt_at": iso(row.get("first_attempt_at")),
        "last_attempt_at": iso(row.get("last_attempt_at")),
        "finished_at": iso(row.get("finished_at")),
        "archived_at": iso(row.get("archived_at")),
        "error_type": row.get("error_type"),
        "error_message": row.get("error_message"),
        "error_traceback": traceback[-HISTORY_TRACEBACK_CHARS:] if traceback else None,
    }


RETRY_BATCH = 200  # jobs moved back per transaction


def retry(store: Store, job_ids: Iterable[int], now: datetime | None = None) -> RetryReport:
    """Move FAILED or CANCELLED jobs back to PENDING under the same id, attempts reset.

    The archived outcome is appended to the job's ``history``, so earlier failures stay readable;
    the checkpoint is kept, so a job that saved progress resumes from it. Jobs go back
    ``RETRY_BATCH`` to a transaction; a batch one of whose jobs an active job's unique key refuses
    goes again job by job, so that only that one is refused.
    """
    now = now or store.clock_now()
    report = RetryReport()
    ids = list(job_ids)
    for start in range(0, len(ids), RETRY_BATCH):
        batch = ids[start : start + RETRY_BATCH]
        try:
            done = _retry_batch(store, batch, now)
        except sa.exc.IntegrityError:
            done = RetryReport()
            for job_id in batch:
                try:
                    done.add(_retry_batch(store, [job_id], now))
                except sa.exc.IntegrityError:
                    done.refused[job_id] = "an active job holds the same unique_key; cancel it or wait for it to end"
        report.add(done)
    return report


def _retry_batch(store: Store, job_ids: list[int], now: datetime) -> RetryReport:
    """Move back what can be of ``job_ids``, in one transaction; what it did, or IntegrityError."""
    m, a = store.tables.message, store.tables.archive
    columns = message_archive_columns(store.tables)
    done = RetryReport()
    rows: list[dict[str, Any]] = []
    with store.writing() as conn:
        found = {
            row["id"]: row
            for row in readable_rows(conn, sa.select(a).where(a.c.id.in_(set(job_ids))).with_for_update())
        }
        for job_id in job_ids:
            row = found.pop(job_id, None)  # an id given twice goes back once
            if row is None:
                where = "still active" if _active(conn, store, job_id) or job_id in done.tasks else "not in the archive"
                done.refused[job_id] = f"{where}; only archived jobs can be retried"
                continue
            if row["state"] not in RETRYABLE_FROM_ARCHIVE:
                done.refused[job_id] = f"{row['state'].lower()}; only failed or cancelled jobs are retried"
                continue
            if unreadable := _unreadable(row, a):
                done.refused[job_id] = unreadable
                continue
            values = {name: row[name] for name in columns}
            values.update(
                state=MessageState.PENDING.value,
                attempts_count=0,
                deliveries_count=0,
                first_attempt_at=None,
                last_attempt_at=None,
                next_attempt_at=now,
                history=list(row["history"] or []) + [_history_entry(dict(row))],
                last_error_type=row["error_type"],
                last_error_message=row["error_message"],
                last_error_traceback=row["error_traceback"],
            )
            rows.append(values)
            done.retried.append(job_id)
            done.tasks[job_id] = row["task_name"]
        if rows:
            keys = {values["flow_key"] for values in rows if values.get("flow_key") is not None}
            if keys:
                store.dialect.hold_flow_keys(conn, keys, now)
            conn.execute(sa.insert(m), rows)
            conn.execute(sa.delete(a).where(a.c.id.in_(done.retried)))
    return done


def _unreadable(row: dict[str, Any], table: sa.Table) -> str | None:
    """Why an archived row (edited by hand) cannot go back to the queue as it is, or None."""
    for name, value in row.items():
        if isinstance(value, Unreadable):
            fix = "correct it (or set it to NULL)" if table.c[name].nullable else "correct it"
            return f"its {name} cannot be read as stored, {value}; {fix} to retry the job"
    history = row.get("history")
    if history is not None and not isinstance(history, list):
        shown = Unreadable(history)
        return f"its history is {shown}, not a list of earlier outcomes; set it to NULL to retry the job"
    return None


def _active(conn: sa.Connection, store: Store, job_id: int) -> bool:
    m = store.tables.message
    return conn.execute(sa.select(m.c.id).where(m.c.id == job_id)).first() is not None


def archived_ids(
    store: Store,
    state: str,
    task: str | None = None,
    before: datetime | None = None,
    limit: int = 1000,
    after_id: int = 0,
) -> list[int]:
    """Ids of archived jobs in ``state`` (optionally of ``task``, archived before ``before``), ascending."""
    a = store.tables.archive
    stmt = sa.select(a.c.id).where(a.c.state == state.upper(), a.c.id > after_id)
    if task:
        stmt = stmt.where(a.c.task_name == task)
    if before is not None:
        stmt = stmt.where(a.c.archived_at < before)
    with store.reading() as conn:
        return [row[0] for row in conn.execute(stmt.order_by(a.c.id).limit(limit))]


def count_archived(store: Store, state: str, task: str | None = None, before: datetime | None = None) -> int:
    a = store.tables.archive
    stmt = sa.select(sa.func.count()).select_from(a).where(a.c.state == state.upper())
    if task:
        stmt = stmt.where(a.c.task_name == task)
    if before is not None:
        stmt = stmt.where(a.c.archived_at < before)
    with store.reading() as conn:
        return int(conn.execute(stmt).scalar_one())


def purge(
    store: Store,
    state: str,
    before: datetime | None,
    task: str | None = None,
    batch_size: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete archived jobs in ``state`` archived before ``before``, one short transaction per batch."""
    a = store.tables.archive
    deleted = 0
    while True:
        ids = archived_ids(store, state, task, before, batch_size)
        if not ids:
            return deleted
        # The picked rows again as picked: one retried and archived again meanwhile is a new failure.
        stmt = sa.delete(a).where(a.c.id.in_(ids), a.c.state == state.upper())
        if before is not None:
            stmt = stmt.where(a.c.archived_at < before)
        with store.writing() as conn:
            gone = conn.execute(stmt).rowcount
        deleted += gone
        if progress is not None:
            progress(gone)
