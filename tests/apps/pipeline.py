"""Tasks the Spark pipeline tests enqueue from DataFrames; the database comes from JOBQUEUE_DATABASE_URL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobqueue import JobQueue

app = JobQueue()


@app.task(name="pipeline.score")
def score(user_id: int, weight: float = 1.0, seen_at: datetime | None = None) -> dict[str, Any]:
    return {"user_id": user_id, "score": user_id * weight, "seen_at": seen_at}
