"""The same app after an edit: the every-second schedule became a cron one; the morning report was deleted."""

from __future__ import annotations

from jobqueue import JobQueue

app = JobQueue()


@app.periodic(cron="*/15 * * * *", timezone="America/New_York")
@app.task(name="pd.tick")
def tick() -> str:
    return "edited"


@app.task(name="pd.report")
def report(kind: str) -> str:
    return kind
