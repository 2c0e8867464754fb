"""A synthetic archive with known contents, and the SQL the Spark figures are checked against."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow

TASKS = ("etl.load", "etl.transform", "mail.send", "report.build")
QUEUES = ("default", "bulk")


def fill_archive(app: JobQueue, count: int = 3000, days: float = 3.0, seed: int = 7) -> list[dict[str, Any]]:
    """Insert ``count`` archived jobs spread over the last ``days``, with microsecond timings."""
    rng = random.Random(seed)
    now = utcnow()
    rows = []
    for job_id in range(1, count + 1):
        task = TASKS[job_id % len(TASKS)]
        state = rng.choices(("COMPLETED", "FAILED", "CANCELLED"), (80, 15 + 10 * (task == "mail.send"), 5))[0]
        created = now - timedelta(seconds=rng.uniform(60, days * 86400))
        row: dict[str, Any] = {
            "id": job_id,
            "task_name": task,
            "queue": QUEUES[rng.random() < 0.3],
            "priority": 0,
            "state": state,
            "payload": b"[[%d],{}]" % job_id,
            "headers": {"trace": f"t{job_id}"} if job_id % 5 == 0 else None,
            "attempts_count": 0,
            "deliveries_count": 0,
            "created_at": created,
            "first_attempt_at": None,
            "last_attempt_at": None,
            "result": None,
            "error_type": None,
            "error_message": None,
        }
        if state == "CANCELLED":
            row.update(finished_at=created + timedelta(seconds=rng.uniform(0, 30)))
        else:
            first = created + timedelta(microseconds=rng.randint(200, 5_000_000))
            attempts = rng.choice((1, 1, 1, 2, 3)) if state == "COMPLETED" else 3
            last = first + timedelta(seconds=rng.uniform(0, 20) * (attempts - 1))
            run = timedelta(microseconds=int(rng.lognormvariate(11, 1.5)))
            row.update(
                attempts_count=attempts,
                deliveries_count=attempts,
                first_attempt_at=first,
                last_attempt_at=last,
                finished_at=last + run,
                result=b'{"ok":true}' if state == "COMPLETED" else None,
                error_type="ValueError" if state == "FAILED" else None,
                error_message=f"job {job_id} failed" if state == "FAILED" else None,
            )
        row["archived_at"] = row["finished_at"] + timedelta(microseconds=rng.randint(1, 900_000))
        rows.append(row)
    with app.engine.begin() as conn:
        conn.execute(sa.insert(app.tables.archive), rows)
    return rows


def group_counts(app: JobQueue) -> dict[tuple[str, str], dict[str, Any]]:
    """Counts, attempts and failure rate per (task, queue), by SQL GROUP BY."""
    a = app.tables.archive

    def state_count(state: str) -> Any:
        return sa.func.sum(sa.case((a.c.state == state, 1), else_=0))

    stmt = sa.select(
        a.c.task_name,
        a.c.queue,
        sa.func.count().label("total"),
        state_count("COMPLETED").label("completed"),
        state_count("FAILED").label("failed"),
        state_count("CANCELLED").label("cancelled"),
        sa.func.sum(a.c.attempts_count).label("attempts_sum"),
        sa.func.max(a.c.attempts_count).label("attempts_max"),
    ).group_by(a.c.task_name, a.c.queue)
    with app.engine.connect() as conn:
        found = {}
        for row in conn.execute(stmt).mappings():
            values = {key: row[key] for key in ("total", "completed", "failed", "cancelled", "attempts_max")}
            values = {key: int(value) for key, value in values.items()}
            decided = values["completed"] + values["failed"]
            values["failure_rate"] = values["failed"] / decided if decided else None
            values["attempts_avg"] = int(row["attempts_sum"]) / values["total"]  # MySQL AVG rounds to 4 places
            found[(row["task_name"], row["queue"])] = values
    return found


def durations(app: JobQueue, start: str, end: str) -> dict[tuple[str, str], list[float]]:
    """Seconds from ``start`` to ``end`` per (task, queue), from the rows as SQL returns them."""
    a = app.tables.archive
    found: dict[tuple[str, str], list[float]] = defaultdict(list)
    with app.engine.connect() as conn:
        for task, queue, began, ended in conn.execute(
            sa.select(a.c.task_name, a.c.queue, a.c[start], a.c[end]).where(
                a.c[start].isnot(None), a.c[end].isnot(None)
            )
        ):
            found[(task, queue)].append((ended - began) / timedelta(microseconds=1) / 1e6)
    return found


def percentile(values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks, as SQL's percentile_cont."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def postgresql_percentiles(app: JobQueue, start: str, end: str) -> dict[tuple[str, str], list[float]]:
    """p50/p95/p99 of ``end - start`` per (task, queue) by PostgreSQL's percentile_cont."""
    query = sa.text(
        f"SELECT task_name, queue, percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP "
        f"(ORDER BY EXTRACT(EPOCH FROM {end} - {start})) FROM {app.tables.archive.name} "
        f"WHERE {start} IS NOT NULL AND {end} IS NOT NULL GROUP BY task_name, queue"
    )
    with app.engine.connect() as conn:
        return {(row[0], row[1]): [float(v) for v in row[2]] for row in conn.execute(query)}


def per_minute(app: JobQueue) -> dict[tuple[str, str], int]:
    """Jobs per (minute 'YYYY-MM-DD HH:MM', state), by SQL GROUP BY on the database's own minute."""
    a = app.tables.archive
    finished = sa.func.coalesce(a.c.finished_at, a.c.archived_at)
    name = app.engine.dialect.name
    if name == "postgresql":
        minute: Any = sa.func.to_char(finished, "YYYY-MM-DD HH24:MI")
    elif name == "sqlite":
        minute = sa.func.strftime("%Y-%m-%d %H:%M", finished)
    else:
        minute = sa.func.date_format(finished, "%Y-%m-%d %H:%i")
    stmt = sa.select(minute, a.c.state, sa.func.count()).group_by(minute, a.c.state)
    with app.engine.connect() as conn:
        return {(row[0], row[1]): int(row[2]) for row in conn.execute(stmt)}


def ids_archived_before(app: JobQueue, cutoff: datetime) -> list[int]:
    a = app.tables.archive
    with app.engine.connect() as conn:
        return list(conn.execute(sa.select(a.c.id).where(a.c.archived_at < cutoff).order_by(a.c.id)).scalars())


def archive_ids(app: JobQueue) -> list[int]:
    a = app.tables.archive
    with app.engine.connect() as conn:
        return list(conn.execute(sa.select(a.c.id).order_by(a.c.id)).scalars())
