"""Another app on the database of tests.apps.periodic (a second service) that names a schedule of its
own "pd.tick" too, with another interval and task, on a queue of its own."""

from __future__ import annotations

from datetime import timedelta

from jobqueue import JobQueue, current_job

app = JobQueue()


@app.periodic(every=timedelta(seconds=2), name="pd.tick")
@app.task(name="po.tick", queue="other")
def tick() -> str:
    return str(current_job().headers["fire_time"])
