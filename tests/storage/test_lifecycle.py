"""Every transition of the message lifecycle, ack policies, retries, the job context and the archive.

Runs the real Executor and Store in this process (no fork) on SQLite, PostgreSQL and MariaDB, with
the clock pinned by freezegun where schedules matter.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from freezegun import freeze_time

from jobqueue import (
    AckPolicy,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobQueue,
    SerializationError,
    TimeLimitExceeded,
    current_job,
)
from jobqueue.clock import utcnow
from jobqueue.job import Outcome
from jobqueue.retry import ConstantRetryStrategy, ExponentialBackoffRetryStrategy, NoRetryStrategy
from jobqueue.runtime.executor import Executor, StoreDeliveryWriter
from jobqueue.storage import deadletter

WORKER = "lifecycle".ljust(32, "x")
T0 = datetime(2030, 3, 1, 9, 0, 0)  # after any real "now": jobs enqueued before it are due


def run_due(app: JobQueue, now: datetime | None = None) -> list[Outcome | None]:
    """One worker step in this process: acquire what is due, run it, flush the outcomes."""
    store = app.store
    executor = Executor(app, writes=StoreDeliveryWriter(store), ack_first=lambda o: bool(store.flush([o]).applied))
    messages = store.acquire(WORKER, None, 100, 30.0, now=now or utcnow())
    outcomes = [executor.execute(m) for m in messages]
    store.flush([o for o in outcomes if o is not None])
    return outcomes


def row(app: JobQueue, job_id: int, table: str = "message") -> dict[str, Any] | None:
    t = getattr(app.tables, table)
    with app.engine.connect() as conn:
        found = conn.execute(sa.select(t).where(t.c.id == job_id)).mappings().first()
    return dict(found) if found else None


# -- the lifecycle diagram (jobqueue/job.py) ------------------------------------------------------


def test_pending_to_processing_to_completed(app: JobQueue) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    handle = add.delay(2, 3)
    assert handle.status() == "pending"
    seen = []

    @app.task(name="probe")
    def probe() -> None:
        seen.append(app.job(current_job().id).status())

    probe_handle = probe.delay()
    run_due(app)
    assert seen == ["processing"]  # PROCESSING while its handler runs
    assert handle.status() == "completed" and handle.get(timeout=1) == 5
    assert probe_handle.status() == "completed"
    assert row(app, handle.id) is None and row(app, handle.id, "archive")["attempts_count"] == 1


def test_over_max_deliveries_fails_without_running(app: JobQueue) -> None:
    ran = []

    @app.task(max_deliveries=2)
    def fragile() -> None:
        ran.append(1)

    handle = fragile.delay()
    now = utcnow()
    for step in range(2):  # two deliveries whose processes "died": leases expire, no outcome
        app.store.acquire(WORKER, None, 1, 1.0, now=now + timedelta(seconds=10 * step))
        app.store.release_expired(now=now + timedelta(seconds=10 * step + 5))
    run_due(app, now=now + timedelta(seconds=30))
    assert ran == []
    with pytest.raises(JobFailed, match="max_deliveries=2") as info:
        handle.get(timeout=1)
    assert info.value.error_type == "jobqueue.errors.MaxDeliveriesExceeded"
    # Two expired leases count their attempts (nobody knows if they started); the refusal does not.
    assert (row(app, handle.id, "archive")["attempts_count"], row(app, handle.id, "archive")["deliveries_count"]) == (
        2,
        3,
    )


def test_reject_fails_at_once(app: JobQueue) -> None:
    @app.task(bind=True)
    def picky(job, value: int) -> None:
        job.reject(f"bad value {value}")

    handle = picky.delay(7)
    run_due(app)
    with pytest.raises(JobFailed, match="bad value 7") as info:
        handle.get(timeout=1)
    assert info.value.error_type == "jobqueue.errors.Rejected"


def test_nack_with_retry_allowed_goes_retryable_then_processing_again(app: JobQueue) -> None:
    @app.task(retry_strategy=ConstantRetryStrategy(delay_seconds=10, max_attempts=3))
    def flaky() -> str:
        if current_job().attempt < 3:
            raise ConnectionError(f"attempt {current_job().attempt}")
        return f"ok on attempt {current_job().attempt}"

    handle = flaky.delay()
    with freeze_time(T0) as clock:
        run_due(app, now=utcnow())
        first = row(app, handle.id)
        assert (first["state"], first["attempts_count"], first["deliveries_count"]) == ("RETRYABLE", 1, 0)
        assert first["next_attempt_at"] == T0 + timedelta(seconds=10)
        assert first["last_error_type"] == "ConnectionError" and first["last_error_message"] == "attempt 1"
        assert run_due(app, now=utcnow()) == []  # not due yet
        clock.tick(10)
        run_due(app, now=utcnow())
        assert row(app, handle.id)["next_attempt_at"] == T0 + timedelta(seconds=20)
        clock.tick(10)
        run_due(app, now=utcnow())
    assert handle.get(timeout=1) == "ok on attempt 3"


def test_a_job_handed_back_unstarted_has_its_first_attempt_still_to_come(app: JobQueue) -> None:
    """A fetched job taken back before it started (behind a slow job, by a stopping process) kept
    its fetch's time as its first attempt: max_total_delay_seconds counted the wait, and its first
    error, minutes later, was final, where the strategy allowed retries."""
    from jobqueue.runtime.holdings import hand_back

    strategy = ConstantRetryStrategy(delay_seconds=1, max_attempts=5, max_total_delay_seconds=5)

    @app.task(retry_strategy=strategy)
    def flaky() -> None:
        raise ConnectionError(f"attempt {current_job().attempt}")

    handle = flaky.delay()
    store = app.store
    with freeze_time(T0) as clock:
        for take_back in ("by its process", "by the supervisor"):
            (message,) = store.acquire(WORKER, None, 10, 30.0, now=utcnow(), token=7)
            assert row(app, handle.id)["first_attempt_at"] is not None  # the fetch's time
            if take_back == "by its process":
                store.flush([hand_back(message)])
            else:
                store.release_unstarted(WORKER, [7], [])
            again = row(app, handle.id)
            assert (again["attempts_count"], again["first_attempt_at"]) == (0, None), take_back
            clock.tick(60)  # a minute later, its first attempt fails: it is retried
        run_due(app, now=utcnow())
        first = row(app, handle.id)
        assert (first["state"], first["attempts_count"]) == ("RETRYABLE", 1)
        assert first["first_attempt_at"] == T0 + timedelta(seconds=120)
    assert handle.status() == "retryable"


def test_nack_without_retry_left_fails_with_traceback(app: JobQueue) -> None:
    @app.task(retry_strategy=ConstantRetryStrategy(delay_seconds=5, max_attempts=3))
    def doomed() -> None:
        raise ValueError("always broken")

    handle = doomed.delay()
    with freeze_time(T0) as clock:
        for _ in range(3):
            run_due(app, now=utcnow())
            clock.tick(5)
    with pytest.raises(JobFailed) as info:
        handle.get(timeout=1)
    assert str(info.value) == f"job {handle.id} failed: ValueError: always broken"  # the original message
    assert 'raise ValueError("always broken")' in info.value.traceback
    assert row(app, handle.id, "archive")["attempts_count"] == 3


def test_exponential_schedule_with_max_total_delay(app: JobQueue) -> None:
    strategy = ExponentialBackoffRetryStrategy(initial_delay_seconds=2, multiplier=3, max_total_delay_seconds=30)

    @app.task(retry_strategy=strategy)
    def failing() -> None:
        raise OSError("down")

    handle = failing.delay()
    delays = []
    with freeze_time(T0) as clock:
        while True:
            run_due(app, now=utcnow())
            current = row(app, handle.id)
            if current is None:
                break
            delays.append((current["next_attempt_at"] - utcnow()).total_seconds())
            clock.move_to(current["next_attempt_at"])
    assert delays == [2, 6, 18]  # the next (54 s) would land 80 s after the first attempt: > 30 s
    assert handle.status() == "failed"


# -- ack policies ---------------------------------------------------------------------------------


def test_ack_first_completes_before_the_handler_runs(app: JobQueue) -> None:
    seen = []

    @app.task(ack_policy=AckPolicy.ACK_FIRST)
    def at_most_once() -> None:
        seen.append(app.job(current_job().id).status())
        raise RuntimeError("ignored: already acked")

    handle = at_most_once.delay()
    run_due(app)
    assert seen == ["completed"]
    assert handle.status() == "completed" and handle.get(timeout=1) is None


def test_ack_policy_completes_even_on_error(app: JobQueue) -> None:
    @app.task(ack_policy=AckPolicy.ACK)
    def careless() -> None:
        raise RuntimeError("noted, not retried")

    handle = careless.delay()
    run_due(app)
    assert handle.status() == "completed"
    assert row(app, handle.id, "archive")["error_message"] == "noted, not retried"


def test_reject_on_error_fails_on_the_first_exception(app: JobQueue) -> None:
    @app.task(
        ack_policy=AckPolicy.REJECT_ON_ERROR, retry_strategy=ConstantRetryStrategy(delay_seconds=0, max_attempts=5)
    )
    def strict() -> None:
        raise KeyError("missing")

    handle = strict.delay()
    run_due(app)
    assert handle.status() == "failed" and row(app, handle.id, "archive")["attempts_count"] == 1


def test_retry_on_retries_only_the_listed_exceptions(app: JobQueue) -> None:
    @app.task(retry_on=(ConnectionError,), retry_strategy=ConstantRetryStrategy(delay_seconds=0, max_attempts=5))
    def fetch(kind: str) -> None:
        raise ConnectionError("net") if kind == "net" else ValueError("bug")

    net, bug = fetch.delay("net"), fetch.delay("bug")
    run_due(app)
    assert net.status() == "retryable"
    assert bug.status() == "failed"


def test_manual_policy(app: JobQueue, caplog: pytest.LogCaptureFixture) -> None:
    @app.task(
        ack_policy=AckPolicy.MANUAL, bind=True, retry_strategy=ConstantRetryStrategy(delay_seconds=1, max_attempts=3)
    )
    def manual(job, action: str) -> str:
        if action == "ack":
            job.ack()
        elif action == "nack":
            job.nack(delay_seconds=60)
        elif action == "reject":
            job.reject("not wanted")
        elif action == "raise":
            raise ConnectionError("no decision")
        return action

    acked, nacked, rejected, silent, raised = (manual.delay(a) for a in ("ack", "nack", "reject", "none", "raise"))
    with caplog.at_level(logging.WARNING, "jobqueue.worker"):
        with freeze_time(T0):
            run_due(app, now=utcnow())
    assert acked.get(timeout=1) == "ack"
    assert nacked.status() == "retryable" and row(app, nacked.id)["next_attempt_at"] == T0 + timedelta(seconds=60)
    assert rejected.status() == "failed"
    assert silent.get(timeout=1) == "none" and "returned without ack/nack/reject" in caplog.text
    assert raised.status() == "retryable"


def test_deciding_twice_is_an_error(app: JobQueue) -> None:
    @app.task(bind=True, retry_strategy=NoRetryStrategy())
    def twice(job) -> None:
        job.ack()
        job.nack()

    handle = twice.delay()
    run_due(app)
    assert handle.status() == "completed"  # the first decision stands; the second raised inside the job


# -- the job context --------------------------------------------------------------------------------


def test_context_fields(app: JobQueue) -> None:
    seen: dict[str, Any] = {}

    @app.task(bind=True)
    def inspect(job) -> None:
        seen.update(
            id=job.id,
            attempt=job.attempt,
            deliveries=job.deliveries,
            headers=job.headers,
            state=job.state,
            same=current_job() is job,
        )

    handle = inspect.apply_async(headers={"request_id": "r-1"})
    run_due(app)
    assert seen == {
        "id": handle.id,
        "attempt": 1,
        "deliveries": 1,
        "headers": {"request_id": "r-1"},
        "state": None,
        "same": True,
    }


def test_checkpoint_is_durable_at_once_and_read_by_the_next_attempt(app: JobQueue) -> None:
    stored = []

    @app.task(bind=True, retry_strategy=ConstantRetryStrategy(delay_seconds=0, max_attempts=2))
    def resumable(job, items: list[int]) -> list[int]:
        done = job.state or []
        for item in items[len(done) :]:
            done = done + [item * 10]
            job.checkpoint(done)
            stored.append(app.serializer.loads(row(app, job.id)["checkpoint"]))
            if job.attempt == 1 and len(done) == 2:
                raise ConnectionError("interrupted")
        return done

    handle = resumable.delay([1, 2, 3, 4])
    run_due(app)
    assert stored == [[10], [10, 20]]  # written to the row while the job ran
    run_due(app)
    assert handle.get(timeout=1) == [10, 20, 30, 40]
    assert stored[-2:] == [[10, 20, 30], [10, 20, 30, 40]]  # the second attempt started from [10, 20]


def test_defer_yields_and_comes_back_with_its_state(app: JobQueue) -> None:
    @app.task(bind=True)
    def cooperative(job, total: int) -> int:
        done = job.state or 0
        done += min(3, total - done)  # a bounded slice of work per run
        if done < total:
            job.defer(until=5, state=done)  # come back in 5 s
            return -1
        return done

    handle = cooperative.delay(10)
    with freeze_time(T0) as clock:
        for runs in range(1, 5):
            run_due(app, now=utcnow())
            current = row(app, handle.id)
            if current is None:
                break
            assert current["state"] == "PENDING" and current["next_attempt_at"] == T0 + timedelta(seconds=5 * runs)
            assert current["deliveries_count"] == 0  # a recorded outcome resets deliveries
            clock.tick(5)
    assert runs == 4 and handle.get(timeout=1) == 10


def test_per_call_retry_strategy_overrides_the_task(app: JobQueue) -> None:
    @app.task(retry_strategy=ConstantRetryStrategy(delay_seconds=100, max_attempts=5))
    def failing() -> None:
        raise OSError("x")

    default, override = failing.delay(), failing.apply_async(retry_strategy=NoRetryStrategy())
    run_due(app)
    assert default.status() == "retryable" and override.status() == "failed"


# -- the archive ------------------------------------------------------------------------------------


def test_results_and_unserializable_results(app: JobQueue) -> None:
    @app.task
    def give(kind: str) -> Any:
        return object() if kind == "bad" else {"when": T0, "raw": b"\x00"}

    good, bad = give.delay("good"), give.delay("bad")
    run_due(app)
    assert good.get(timeout=1) == {"when": T0, "raw": b"\x00"}
    with pytest.raises(JobFailed, match="cannot be stored"):
        bad.get(timeout=1)


def test_binary_results_and_checkpoints_are_archived_byte_for_byte(db_url: str) -> None:
    # Pickled values are bytes that are not UTF-8 text: the archive must keep them as they are.
    app = JobQueue(db_url, serializer="pickle")

    @app.task(bind=True)
    def give(job) -> Any:
        job.checkpoint({"done": {1, 2}, "ratio": 0.5})
        return {"set": {1, 2}, "nan": float("nan"), "error": ValueError("kept")}

    handle = give.delay()
    run_due(app)
    result = handle.get(timeout=1)
    assert result["set"] == {1, 2} and result["nan"] != result["nan"] and result["error"].args == ("kept",)
    assert app.serializer.loads(row(app, handle.id, "archive")["checkpoint"]) == {"done": {1, 2}, "ratio": 0.5}
    app.close()


class _OddInit(Exception):
    """Pickles, but cannot be unpickled: its __init__ takes an argument it does not pass on."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def test_a_value_that_pickles_but_cannot_be_unpickled_is_refused_where_it_is_made(db_url: str) -> None:
    app = JobQueue(db_url, serializer="pickle")

    @app.task(retry_strategy=NoRetryStrategy())
    def take(value: Any) -> str:
        return "ran"

    @app.task(retry_strategy=NoRetryStrategy())
    def give() -> Any:
        return _OddInit("declined", 2)

    with pytest.raises(SerializationError, match=r"arguments: pickles, but cannot be unpickled: .*__reduce__"):
        take.delay(_OddInit("declined", 2))  # at the enqueue, where it can be fixed; nothing stored
    handle = give.delay()
    run_due(app)
    # The job fails saying why, where it completed with a result that no caller could read.
    with pytest.raises(JobFailed, match=r"result: pickles, but cannot be unpickled"):
        handle.get(timeout=1)
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(app.tables.archive)).scalar_one() == 1
    app.close()


def test_retention_flags(db_url: str) -> None:
    app = JobQueue(db_url, retain_in_archive_on_ack=False, retain_in_archive_on_reject=False)

    @app.task(retry_strategy=NoRetryStrategy())
    def outcome(ok: bool) -> None:
        if not ok:
            raise ValueError("x")

    ok, bad = outcome.delay(True), outcome.delay(False)
    run_due(app)
    for handle in (ok, bad):
        assert row(app, handle.id) is None and row(app, handle.id, "archive") is None
        with pytest.raises(JobNotFound):
            handle.status()
    app.close()


def test_cancelled_jobs_never_run(app: JobQueue) -> None:
    ran = []

    @app.task
    def job() -> None:
        ran.append(1)

    handle = job.delay()
    assert handle.cancel()
    run_due(app)
    assert ran == [] and handle.status() == "cancelled"
    with pytest.raises(JobCancelled):
        handle.get(timeout=1)


def test_retry_from_the_archive_keeps_the_id_and_the_history(app: JobQueue) -> None:
    calls = []

    @app.task(retry_strategy=NoRetryStrategy())
    def sometimes() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("first run fails")
        return "second run works"

    handle = sometimes.delay()
    run_due(app)
    assert handle.status() == "failed"
    report = deadletter.retry(app.store, [handle.id, handle.id + 999])
    assert report.retried == [handle.id] and "not in the archive" in report.refused[handle.id + 999]
    moved = row(app, handle.id)
    assert (moved["state"], moved["attempts_count"], moved["deliveries_count"]) == ("PENDING", 0, 0)
    assert moved["history"][0]["error_message"] == "first run fails"
    run_due(app)
    assert handle.get(timeout=1) == "second run works"  # the same handle follows the job
    archived = row(app, handle.id, "archive")
    assert archived["history"][0]["state"] == "FAILED" and archived["attempts_count"] == 1
    again = deadletter.retry(app.store, [handle.id])
    assert "completed; only failed or cancelled" in again.refused[handle.id]


def test_retry_refuses_when_an_active_job_holds_the_unique_key(app: JobQueue) -> None:
    @app.task(retry_strategy=NoRetryStrategy())
    def keyed() -> None:
        raise ValueError("x")

    first = keyed.apply_async(unique_key="k")
    run_due(app)
    second = keyed.apply_async(unique_key="k")
    assert second.id != first.id  # the first ended, so the key was free again
    report = deadletter.retry(app.store, [first.id])
    assert "unique_key" in report.refused[first.id] and first.status() == "failed"


def test_retry_of_many_refuses_only_the_job_whose_unique_key_is_held(app: JobQueue) -> None:
    """Jobs go back in batches, one transaction each: one refused job does not keep its batch back."""

    @app.task(retry_strategy=NoRetryStrategy())
    def keyed(n: int) -> None:
        raise ValueError("x")

    failed = [keyed.apply_async((n,), unique_key=f"k{n}") for n in range(450)]
    while run_due(app):
        pass
    holder = keyed.apply_async((1,), unique_key="k300")  # the key is free again, and taken
    ids = [h.id for h in failed]
    report = deadletter.retry(app.store, [*ids, ids[0]])
    assert report.retried == [i for i in ids if i != failed[300].id]
    assert list(report.refused) == [failed[300].id, ids[0]]
    assert "unique_key" in report.refused[failed[300].id] and "still active" in report.refused[ids[0]]
    assert failed[300].status() == "failed" and holder.status() == "pending"
    assert {h.status() for n, h in enumerate(failed) if n != 300} == {"pending"}


def test_purge_deletes_only_old_rows_of_the_state(app: JobQueue) -> None:
    @app.task(retry_strategy=NoRetryStrategy())
    def outcome(ok: bool) -> None:
        if not ok:
            raise ValueError("x")

    with freeze_time(utcnow() - timedelta(days=10)):
        old = outcome.bulk([(True,)] * 5)
        run_due(app, now=utcnow())
    recent, failed = outcome.delay(True), outcome.delay(False)
    run_due(app)
    purged = deadletter.purge(app.store, "completed", utcnow() - timedelta(days=7), batch_size=2)
    assert purged == 5
    assert all(row(app, h.id, "archive") is None for h in old)
    assert recent.status() == "completed" and failed.status() == "failed"


def test_purge_leaves_a_job_archived_again_since_it_was_picked(app: JobQueue) -> None:
    """A failed job picked as old, then retried and failed again before the delete (its row now
    archived just now): the delete took it by id and state, and its new failure was gone."""

    @app.task(retry_strategy=NoRetryStrategy())
    def fails() -> None:
        raise ValueError("x")

    with freeze_time(utcnow() - timedelta(days=10)):
        job = fails.delay()
        run_due(app, now=utcnow())
    a = app.tables.archive

    picked: list[str] = []

    def archived_again(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("SELECT") and not picked:  # the ids to delete, read
            picked.append(statement)
            with app.engine.begin() as other:  # another session retries the job, which fails again
                other.execute(sa.update(a).where(a.c.id == job.id).values(archived_at=utcnow()))

    sa.event.listen(app.engine, "after_cursor_execute", archived_again)
    try:
        purged = deadletter.purge(app.store, "failed", utcnow() - timedelta(days=7))
    finally:
        sa.event.remove(app.engine, "after_cursor_execute", archived_again)
    assert "archived_at <" in picked[0]
    assert purged == 0 and job.status() == "failed"


def test_a_hard_timeout_is_decided_by_the_ack_policy_and_retry_on(app: JobQueue) -> None:
    """The supervisor records a killed job's timeout as the error the job would have raised."""

    @app.task(name="t.default")
    def default() -> None: ...

    @app.task(name="t.rejecting", ack_policy=AckPolicy.REJECT_ON_ERROR)
    def rejecting() -> None: ...

    @app.task(name="t.acking", ack_policy=AckPolicy.ACK)
    def acking() -> None: ...

    @app.task(name="t.network_only", retry_on=(ConnectionError,))
    def network_only() -> None: ...

    @app.task(name="t.timeouts_too", retry_on=(ConnectionError, TimeLimitExceeded))
    def timeouts_too() -> None: ...

    handles = {task.name: task.delay() for task in (default, rejecting, acking, network_only, timeouts_too)}
    executor = Executor(app)
    for message in app.store.acquire(WORKER, None, 10, 30.0):
        outcome = executor.nack_for_timeout(message, TimeLimitExceeded("ran past its timeout of 1 s"))
        assert app.store.flush([outcome]).applied
    states = {name: handle.status() for name, handle in handles.items()}
    assert states == {
        "t.default": "retryable",
        "t.rejecting": "failed",
        "t.acking": "completed",
        "t.network_only": "failed",
        "t.timeouts_too": "retryable",
    }
    with pytest.raises(JobFailed, match="TimeLimitExceeded: ran past its timeout"):
        handles["t.rejecting"].get(timeout=0)


def test_an_integer_no_float_holds_is_a_value_error_naming_the_argument_in_a_job(app: JobQueue) -> None:
    """defer, nack and extend with 10**400 seconds raised OverflowError, where a number past the
    year 9999 (or NaN) gets a ValueError that names the argument."""
    seen: list[str] = []

    @app.task(bind=True)
    def stretches(job) -> None:
        for call in (
            lambda: job.defer(until=10**400),
            lambda: job.nack(delay_seconds=10**400),
            lambda: job.extend(10**400),
        ):
            try:
                call()
            except ValueError as exc:
                seen.append(str(exc))

    handle = stretches.delay()
    run_due(app)
    assert handle.status() == "completed"
    assert [text.split(":")[0].split(" must")[0] for text in seen] == [
        "defer(until=...)",
        "nack(delay_seconds=...)",
        "extend(seconds=...)",
    ], seen
