"""Two schedules whose names differ only in case: two schedules on every database."""

from __future__ import annotations

from jobqueue import JobQueue

app = JobQueue()


@app.periodic(every=60, name="Digest", kwargs={"kind": "weekly"})
@app.periodic(every=60, name="digest", kwargs={"kind": "daily"})
@app.task(name="pd.digest")
def digest(kind: str) -> str:
    return kind
