"""A periodic app for the tests: an every-second schedule and a daily cron one."""

from __future__ import annotations

from datetime import timedelta

from jobqueue import JobQueue, current_job

app = JobQueue()


@app.periodic(every=timedelta(seconds=1))
@app.task(name="pd.tick")
def tick() -> str:
    return str(current_job().headers["fire_time"])


@app.periodic(cron="0 7 * * *", timezone="Europe/Paris", name="morning-report", kwargs={"kind": "daily"})
@app.task(name="pd.report")
def report(kind: str) -> str:
    return kind
