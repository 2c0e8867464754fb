"""The periodic app after its report task was renamed: its old schedule names a task no app defines."""

from __future__ import annotations

from jobqueue import JobQueue, current_job

app = JobQueue()


@app.periodic(every=1)
@app.task(name="pd.tick")
def tick() -> str:
    return str(current_job().headers["fire_time"])


@app.periodic(cron="0 7 * * *", timezone="Europe/Paris", name="morning-report-v2", kwargs={"kind": "daily"})
@app.task(name="pd.report_v2")
def report(kind: str) -> str:
    return kind
