"""jobqueue quickstart: tasks, enqueueing, a worker with progress, results.

Run it as a script (it enqueues jobs, runs a worker until the queues are drained, prints results):

    python examples/quickstart.py [--jobs 5000] [--concurrency 2]

or use its tasks from the CLI:

    jobqueue --app examples/quickstart.py db init
    jobqueue --app examples/quickstart.py enqueue quickstart.add --args '[2, 3]'
    jobqueue --app examples/quickstart.py worker --burst --progress

The database is ``sqlite:///jobqueue.sqlite3`` in the working directory unless
``JOBQUEUE_DATABASE_URL`` names another.
"""

from __future__ import annotations

import argparse
import logging
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from jobqueue import JobFailed, JobQueue, current_job
from jobqueue.retry import ConstantRetryStrategy

app = JobQueue()


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(queue="reports", priority=5)
def invoice_total(lines: list[dict[str, Decimal]], issued: datetime) -> dict[str, object]:
    """Decimal and datetime arguments and results round-trip through the JSON serializer."""
    total = sum((line["price"] * line["quantity"] for line in lines), Decimal("0"))
    return {"total": total, "issued": issued, "due": issued + timedelta(days=30)}


@app.task(retry_strategy=ConstantRetryStrategy(delay_seconds=0.2, max_attempts=3))
def flaky(n: int) -> str:
    """Fails on its first attempt, succeeds on the second: the retry strategy at work."""
    if current_job().attempt < 2:
        raise ConnectionError(f"simulated outage for job {n}")
    return f"job {n} succeeded on attempt {current_job().attempt}"


@app.task(retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=2))
def always_fails() -> None:
    raise ValueError("this job always fails; it ends in the archive as a dead letter")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000, help="how many add() jobs to enqueue")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    options = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(processName)s: %(message)s")

    print(app.init_schema(), "in", app.database_url)
    started = time.perf_counter()
    half = options.jobs // 2
    adds = [add.delay(i, i) for i in range(half)]  # one INSERT each
    adds += add.bulk([(i, 1) for i in range(half, options.jobs)])  # one round trip per 1,000
    invoice = invoice_total.delay(
        [{"price": Decimal("9.99"), "quantity": Decimal(3)}], datetime(2026, 11, 1, tzinfo=timezone.utc)
    )
    flakies = [flaky.delay(n) for n in range(3)]
    doomed = always_fails.delay()
    later = add.apply_async((40, 2), countdown=1.5)  # runs once its time has come
    print(f"enqueued {options.jobs + 6} jobs in {time.perf_counter() - started:.2f} s")

    code = app.run_worker(concurrency=options.concurrency, burst=True, progress=True)

    print(f"add(0, 0) = {adds[0].get(timeout=5)}, add({options.jobs - 1}, 1) = {adds[-1].get(timeout=5)}")
    print(f"invoice_total = {invoice.get(timeout=5)}")
    for handle in flakies:
        print(handle.get(timeout=5))
    print(f"add(40, 2) with countdown=1.5 -> {later.get(timeout=5)} ({later.status()})")
    try:
        doomed.get(timeout=5)
    except JobFailed as exc:
        print(f"always_fails -> {doomed.status()}: {exc}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
