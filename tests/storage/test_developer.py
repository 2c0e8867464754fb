"""The developer's side: calls checked at enqueue, async tasks, drain() in tests, uncommitted handles."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from freezegun import freeze_time
from sqlalchemy.orm import Session

from jobqueue import ConfigurationError, JobFailed, JobNotCommitted, JobNotFound, JobQueue, current_job
from jobqueue.clock import utcnow
from jobqueue.retry import ConstantRetryStrategy, NoRetryStrategy
from jobqueue.schedule_sync import sync
from jobqueue.signals import job_failed
from jobqueue.testing import drain


def rows(app: JobQueue) -> tuple[int, int]:
    with app.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (app.tables.message, app.tables.archive)
        )


# -- calls checked against the signature ------------------------------------------------------------


def test_a_call_that_cannot_bind_raises_type_error_and_writes_nothing(app: JobQueue) -> None:
    @app.task(name="t.add")
    def add(x: int, y: int, *, scale: int = 1) -> int:
        return (x + y) * scale

    @app.task(name="t.bound", bind=True)
    def bound(job, item: str) -> str:
        return item

    cases = [
        (lambda: add.delay(1), "task t.add: add() missing 1 required positional argument: 'y'"),
        (lambda: add.delay(1, 2, 3), "add() takes 2 positional arguments but 3 were given"),
        (lambda: add.delay(1, 2, scael=2), "add() got an unexpected keyword argument 'scael'"),
        (lambda: add.apply_async((1,), {"x": 2}), "add() got multiple values for argument 'x'"),
        (lambda: add.apply_at(utcnow(), 1), "add() missing 1 required positional argument"),
        (lambda: add.bulk([(1, 2), (3,), (4, 5)]), "item 1: task t.add: add() missing 1 required"),
        (lambda: add.bulk([{"x": 1, "y": 2, "z": 3}]), "item 0: task t.add: add() got an unexpected keyword"),
        (lambda: bound.delay(), "bound() missing 1 required positional argument: 'item'"),
        (lambda: bound.delay("a", "b"), "bound() takes 1 positional argument but 2 were given"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as info:
            call()
        assert message in str(info.value) and str(info.value).endswith("; nothing was enqueued")
    assert rows(app) == (0, 0)  # nothing written, not even the good items of the bulk
    assert add.delay(1, 2, scale=3).id and bound.delay("a").id and len(add.bulk([(1, 2), {"x": 1, "y": 1}])) == 2
    assert rows(app) == (4, 0)
    assert add(1, 2) == 3  # an inline call is a plain call


def test_args_and_kwargs_of_none_are_an_empty_call(app: JobQueue) -> None:
    """As Celery takes them: kwargs=None was taken, args=None refused as not a tuple or list."""

    @app.task(name="t.zero")
    def zero() -> int:
        return 0

    handles = [zero.apply_async(args=None), zero.apply_async(kwargs=None), zero.apply_async(None, None)]
    assert rows(app) == (3, 0)
    drain(app)
    assert [h.get(timeout=5) for h in handles] == [0, 0, 0]


def test_periodic_arguments_are_checked_when_the_decorator_runs(app: JobQueue) -> None:
    @app.task(name="t.report")
    def report(day: str) -> None: ...

    with pytest.raises(ConfigurationError, match=r"do not fit task t.report: report\(\) missing 1 required"):
        app.periodic(every=60)(report)
    app.periodic(every=60, args=("monday",))(report)


def test_builtins_and_decorator_wrappers_are_checked_as_python_sees_them(app: JobQueue) -> None:
    task = app.task(name="t.builtin")(max)  # a builtin without a readable signature
    assert task.checker is None and task.delay(1, 2).status() == "pending"

    def with_session(fn):  # a decorator that supplies an argument itself
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn("session", *args, **kwargs)

        return wrapper

    @app.task(name="t.wrapped")
    @with_session
    def wrapped(session: str, order_id: int) -> str:
        return f"{session} {order_id}"

    assert wrapped.delay(7).status() == "pending"  # the wrapper's (*args, **kwargs) is what callers call


# -- async def tasks --------------------------------------------------------------------------------


def test_an_async_task_called_inline_returns_its_coroutine(app: JobQueue) -> None:
    @app.task(name="t.double")
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    @app.task(name="t.whoami", bind=True)
    async def whoami(job) -> bool:
        await asyncio.sleep(0)
        return current_job() is job

    pending = double(21)
    assert asyncio.iscoroutine(pending) and asyncio.run(pending) == 42
    assert asyncio.run(whoami()) is True  # a bound task's inline context is current while it runs
    assert double.is_async and not app.task(name="t.sync")(lambda: None).is_async


# -- drain() ----------------------------------------------------------------------------------------


def test_drain_runs_what_is_due_through_the_worker_executor(app: JobQueue) -> None:
    seen: list[tuple[str, int]] = []

    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        seen.append(("add", current_job().attempt))
        return x + y

    @app.task(name="t.flaky", bind=True, retry_strategy=ConstantRetryStrategy(delay_seconds=0, max_attempts=3))
    async def flaky(job, succeed_on: int) -> int:
        await asyncio.sleep(0)
        seen.append(("flaky", job.attempt))
        if job.attempt < succeed_on:
            raise ValueError(f"attempt {job.attempt}")
        return int(job.attempt)

    @app.task(name="t.broken", retry_strategy=NoRetryStrategy())
    def broken() -> None:
        raise KeyError("missing")

    later = add.apply_async((5, 5), countdown=3600)
    ok, twice, never, bad = add.delay(1, 2), flaky.delay(2), flaky.delay(9), broken.delay()
    handles = drain(app)
    assert handles == [ok, twice, never, bad]  # one handle per job, in the order each first ran
    assert ok.get(timeout=0) == 3 and twice.get(timeout=0) == 2
    with pytest.raises(JobFailed, match="ValueError: attempt 3"):
        never.get(timeout=0)  # retried within the call: its retries fell due at once
    with pytest.raises(JobFailed, match="KeyError"):
        bad.get(timeout=0)
    assert seen.count(("flaky", 1)) == 2 and ("flaky", 3) in seen
    assert later.status() == "pending" and drain(app) == []  # not due yet: left alone
    with freeze_time(utcnow() + timedelta(hours=2)):
        assert drain(app) == [later]
    assert later.get(timeout=0) == 10


def test_drain_stops_at_retries_not_yet_due_and_honours_queues_and_max_jobs(app: JobQueue) -> None:
    @app.task(name="t.later", retry_strategy=ConstantRetryStrategy(delay_seconds=600, max_attempts=2))
    def later() -> None:
        raise RuntimeError("try again in ten minutes")

    @app.task(name="t.mail", queue="emails")
    def mail(to: str) -> str:
        return to

    failing = later.delay()
    mails = mail.bulk([("a",), ("b",), ("c",)])
    assert drain(app, queues=["emails"], max_jobs=2) == mails[:2]
    assert failing.status() == "pending" and mails[2].status() == "pending"
    assert drain(app, queues="default") == [failing]
    assert failing.status() == "retryable"  # its retry is ten minutes away
    assert drain(app) == [mails[2]]
    assert drain(app, max_jobs=0) == []
    with pytest.raises(ConfigurationError, match="max_jobs"):
        drain(app, max_jobs=-1)


def test_a_job_waiting_for_another_jobs_result_is_told_once_why_that_can_wait_for_ever(
    app: JobQueue, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In drain() (or a worker of one process) the job waited for cannot run while its parent
    waits: the wait ran to its timeout without a word (Celery refuses such a get() outright)."""
    monkeypatch.setattr("jobqueue.handle.WARNED_WAITING_TASKS", set())  # as in a fresh process

    @app.task(name="t.child")
    def child() -> int:
        return 1

    @app.task(name="t.parent")
    def parent() -> str:
        try:
            child.delay().get(timeout=0.2)
        except TimeoutError:
            return "timed out"
        return "done"

    handles = parent.bulk([(), ()])
    with caplog.at_level(logging.WARNING, logger="jobqueue.handle"):
        drain(app, queues="default", max_jobs=2)
    assert [h.get(timeout=0) for h in handles] == ["timed out", "timed out"]
    said = [r.getMessage() for r in caplog.records if "waits with handle.get()" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"job {handles[0].id} t.parent waits with handle.get() for job ")
    assert "Enqueue the next step from the job that makes its input" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobqueue.handle"), pytest.raises(TimeoutError):
        child.delay().get(timeout=0.05)  # outside a job: nothing said
    assert "waits with handle.get()" not in caplog.text


def test_drain_names_the_declared_queue_a_mistyped_one_is_close_to(
    app: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(name="t.mail", queue="emails")
    def mail() -> None:
        pass

    sent = mail.delay()
    with caplog.at_level(logging.WARNING, logger="jobqueue.testing"):
        assert drain(app, queues="Emails,default") == []  # nothing ran: the test would wonder why
    assert "no task of this app declares the queue 'Emails': did you mean 'emails'?" in caplog.text
    assert "'default'" not in caplog.text  # not close to a declared queue: not a typo
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobqueue.testing"):
        assert drain(app, queues=["emails"]) == [sent]
    assert caplog.text == ""


def test_drain_puts_back_the_working_directory_and_umask_a_job_changed(app: JobQueue, tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    @app.task(name="t.wander")
    def wander() -> None:
        os.chdir(elsewhere)
        os.umask(0)

    @app.task(name="t.where")
    def where() -> tuple[str, int]:
        mask = os.umask(0o022)
        os.umask(mask)
        return os.getcwd(), mask

    before, mask = os.getcwd(), os.umask(0o027)
    os.umask(0o027)
    try:
        wander.delay()
        seen = where.delay()
        drain(app)
        assert seen.get(timeout=0) == [before, 0o027]  # the next job ran where the test was
        assert os.getcwd() == before  # and so does the rest of the test
    finally:
        os.chdir(before)
        os.umask(mask)


def test_drain_sets_aside_a_job_its_strategy_retries_for_ever(app: JobQueue, caplog) -> None:
    @app.task(name="t.declined", retry_strategy=ConstantRetryStrategy(delay_seconds=0))
    def declined() -> None:
        raise ValueError("card declined")

    @app.task(name="t.fine")
    def fine() -> str:
        return "fine"

    runaway = declined.delay()
    after = fine.delay()
    with caplog.at_level(logging.WARNING, logger="jobqueue.testing"):
        assert drain(app) == [runaway, after]  # it returns, and the other job ran too
    assert runaway.status() == "pending" and after.get(timeout=0) == "fine"  # handed back, not run again
    assert "ran 100 times in this drain()" in caplog.text and "max_attempts" in caplog.text
    assert drain(app, max_jobs=3) == [runaway]  # a later call runs it again: nothing was lost


@pytest.fixture
def python_ctrl_c() -> Iterator[None]:
    """Python's own SIGINT handler for the test, as a script or a plain pytest run has it (a
    pytest-xdist process has another, which drain() leaves alone)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C reaches the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_ctrl_c")
def test_ctrl_c_stops_a_drain_after_the_running_job(app: JobQueue, caplog) -> None:
    @app.task(name="t.pressed", retry_strategy=NoRetryStrategy())
    def pressed(times: int) -> str:
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs between two bytecodes of this loop
        return "finished"

    first, untouched = pressed.delay(1), pressed.delay(1)
    with caplog.at_level(logging.WARNING, logger="jobqueue.testing"), pytest.raises(KeyboardInterrupt):
        drain(app)
    assert first.get(timeout=0) == "finished"  # the running job ended as it would have
    assert untouched.status() == "pending"  # and no other job was started
    assert "Ctrl-C again to interrupt it" in caplog.text
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("python_ctrl_c")
def test_ctrl_c_while_a_drain_fetches_starts_no_job(app: JobQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    @app.task(name="t.never")
    def never() -> str:
        return "ran"

    fetch = app.store.acquire

    def pressed_meanwhile(*args: Any, **kwargs: Any) -> Any:
        found = fetch(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs before this returns
        return found

    monkeypatch.setattr(app.store, "acquire", pressed_meanwhile)
    fetched = never.delay()
    with pytest.raises(KeyboardInterrupt):
        drain(app)
    assert fetched.status() == "pending"  # handed back, not run


@pytest.mark.usefixtures("python_ctrl_c")
def test_a_second_ctrl_c_interrupts_the_job_a_drain_runs(app: JobQueue) -> None:
    @app.task(name="t.pressed", retry_strategy=NoRetryStrategy())
    def pressed(times: int) -> str:
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        return "finished"

    interrupted = pressed.delay(2)
    with pytest.raises(KeyboardInterrupt):
        drain(app)
    with pytest.raises(
        JobFailed, match=r"signals.Interrupted: Ctrl-C during drain\(\)"
    ):  # its outcome was written first
        interrupted.get(timeout=0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _BrokenStrategy(ConstantRetryStrategy):
    """A retry strategy of one's own with a bug."""

    def delay_for(self, attempt: int) -> float:
        raise ZeroDivisionError("division by zero in delay_for")


def test_a_job_whose_retry_strategy_raises_is_failed_with_its_own_error_kept(app: JobQueue) -> None:
    @app.task(name="t.unlucky", retry_strategy=_BrokenStrategy(delay_seconds=1, max_attempts=3))
    def unlucky() -> None:
        raise LookupError("the job's own error")

    handle = unlucky.delay()
    assert drain(app) == [handle]
    with pytest.raises(JobFailed) as failed:
        handle.get(timeout=0)
    # What the job raised stays the error it is listed and searched by; the strategy's fault is added.
    assert failed.value.error_type == "LookupError"
    assert "the job's own error (not retried: its retry strategy _BrokenStrategy raised ZeroDivisionError" in str(
        failed.value
    )
    assert "raise LookupError" in failed.value.traceback and "division by zero in delay_for" in failed.value.traceback


def test_a_job_whose_stored_retry_strategy_cannot_be_rebuilt_keeps_its_own_error(app: JobQueue) -> None:
    # A strategy stored by an older release that this one refuses (a fractional max_attempts).
    seen: list[object] = []

    @app.task(name="t.unlucky")
    def unlucky() -> None:
        raise LookupError("the job's own error")

    def record(sender: object, job: object, exception: object, traceback: object) -> None:
        seen.append(exception)

    handle = unlucky.apply_async((), retry_strategy=ConstantRetryStrategy(delay_seconds=1, max_attempts=3))
    m = app.tables.message
    with app.engine.begin() as conn:
        options = conn.execute(sa.select(m.c.options).where(m.c.id == handle.id)).scalar_one()
        options["retry"]["max_attempts"] = 2.5
        conn.execute(sa.update(m).where(m.c.id == handle.id).values(options=options))
    job_failed.connect(record)
    try:
        assert drain(app) == [handle]
    finally:
        job_failed.disconnect(record)
    with pytest.raises(JobFailed) as failed:
        handle.get(timeout=0)
    assert failed.value.error_type == "LookupError"
    assert "(not retried: the retry strategy stored with it raised" in str(failed.value)
    assert [type(exception) for exception in seen] == [LookupError]  # the signal carries the job's own


def test_drain_resumes_from_a_checkpoint_and_keeps_partition_order(app: JobQueue) -> None:
    order: list[str] = []

    @app.task(name="t.steps", bind=True, retry_strategy=ConstantRetryStrategy(delay_seconds=0, max_attempts=2))
    def steps(job, n: int) -> list[int]:
        done = job.state or []
        for i in range(len(done), n):
            done = [*done, i]
            job.checkpoint(done)
            if i == 1 and job.attempt == 1:
                raise ConnectionError("dropped half-way")
        return done

    @app.task(name="t.log")
    def log(item: str) -> None:
        order.append(item)

    job = steps.delay(4)
    for i in range(5):
        log.apply_async((f"a{i}",), partition_key="a")
        log.apply_async((f"b{i}",), partition_key="b")
    drain(app)
    assert job.get(timeout=0) == [0, 1, 2, 3]
    assert [x for x in order if x[0] == "a"] == [f"a{i}" for i in range(5)]
    assert [x for x in order if x[0] == "b"] == [f"b{i}" for i in range(5)]


def test_drain_leaves_periodic_schedules_alone(app: JobQueue) -> None:
    @app.periodic(every=timedelta(minutes=1))
    @app.task(name="t.tick")
    def tick() -> None: ...

    sync(app.store, app.schedules, set(app.registry), utcnow() - timedelta(minutes=5))  # its fire is due
    job = tick.delay()
    assert drain(app) == [job]
    with app.engine.connect() as conn:
        m = app.tables.message
        schedule = conn.execute(sa.select(m.c.state, m.c.attempts_count, m.c.deliveries_count)).one()
    assert tuple(schedule) == ("PENDING", 0, 0)  # handed back as it was, uncounted


def test_drain_inside_a_running_event_loop(app: JobQueue) -> None:
    @app.task(name="t.double")
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    handle = double.delay(4)

    async def a_test() -> list:
        return drain(app)

    assert asyncio.run(a_test()) == [handle] and handle.get(timeout=0) == 8


def test_drain_from_another_thread_runs_jobs_that_have_a_soft_timeout(app: JobQueue, caplog) -> None:
    @app.task(name="t.sync_soft", soft_timeout=5, retry_strategy=NoRetryStrategy())
    def sync_soft() -> str:
        return "done"

    @app.task(name="t.async_soft", soft_timeout=0.05, retry_strategy=NoRetryStrategy())
    async def async_soft() -> str:
        await asyncio.sleep(5)
        return "not reached"

    quick, slow = sync_soft.delay(), async_soft.delay()
    # Every such job failed with "signal only works in main thread" before.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(drain, app).result(timeout=30) == [quick, slow]
    assert quick.get(timeout=0) == "done"
    assert "soft_timeout=5 s is not enforced outside the main thread" in caplog.text
    with pytest.raises(JobFailed, match="SoftTimeLimitExceeded"):  # the event loop still enforces it
        slow.get(timeout=0)


# -- handles of jobs whose transaction has not committed ----------------------------------------------


def test_a_handle_says_its_transaction_has_not_committed(app: JobQueue) -> None:
    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    with app.engine.connect() as conn:
        handle = add.apply_async((1, 2), connection=conn)
        with pytest.raises(JobNotCommitted, match="has not committed yet"):
            handle.status()
        with pytest.raises(JobNotCommitted):
            handle.get(timeout=30)  # at once: waiting inside the transaction that holds it never ends
        conn.commit()
    assert handle.status() == "pending"

    with Session(app.engine) as session:
        handles = add.bulk([(1, 2), (3, 4)], connection=session)
        with pytest.raises(JobNotCommitted):
            handles[1].status()
        session.rollback()
    with pytest.raises(JobNotFound) as info:
        handles[1].status()
    assert not isinstance(info.value, JobNotCommitted)  # rolled back: it never existed
    assert app.job(handle.id).status() == "pending"


# -- a job's context used where it does not belong --------------------------------------------------


def test_a_context_kept_from_an_earlier_job_fails_the_job_that_uses_it(app: JobQueue) -> None:
    """checkpoint() on another, ended job's context: its LeaseLost was taken for the calling job's
    own lost lease, whose outcome was dropped, leaving it processing (its partition blocked) for as
    long as the worker lived. Decisions on it were taken without a word, and did nothing."""
    kept: dict[str, Any] = {}

    @app.task(name="t.keeps", bind=True)
    def keeps(job: Any) -> None:
        kept["context"] = job

    @app.task(name="t.uses", bind=True, retry_strategy=NoRetryStrategy())
    def uses(job: Any, what: str) -> None:
        if what == "checkpoint":
            kept["context"].checkpoint({"from": job.id})
        else:
            getattr(kept["context"], what)()

    keeper = keeps.delay()
    drain(app)
    used = [uses.apply_async(("checkpoint",), partition_key="p")] + [uses.delay(what) for what in ("nack", "ack")]
    after = uses.apply_async(("x",), partition_key="p")
    drain(app)
    for handle in used:
        with pytest.raises(JobFailed, match=f"job {keeper.id} has ended: .* is taken only while it runs"):
            handle.get(timeout=0)
    assert after.status() == "failed"  # ran: the partition was not held by a job left processing
    assert rows(app) == (0, 5)


def test_a_decision_after_the_job_returned_or_under_ack_first_is_refused(app: JobQueue) -> None:
    from jobqueue import AckPolicy

    late: list[str] = []

    @app.task(name="t.thread_decides", bind=True, ack_policy=AckPolicy.MANUAL)
    def thread_decides(job: Any) -> None:
        def later() -> None:
            time.sleep(0.2)
            try:
                job.nack()
            except Exception as exc:
                late.append(str(exc))

        threading.Thread(target=later).start()
        job.ack()

    @app.task(name="t.first", bind=True, ack_policy=AckPolicy.ACK_FIRST)
    def first(job: Any) -> None:
        job.extend(60)  # no lease to keep: nothing to do, and no error (a receiver may extend every job)
        late.append("extended")
        job.checkpoint({"step": 1})

    decided, acked = thread_decides.delay(), first.delay()
    drain(app)
    wait = time.monotonic() + 5
    while len(late) < 2 and time.monotonic() < wait:
        time.sleep(0.02)
    assert decided.status() == "completed"
    assert "extended" in late
    late.remove("extended")
    assert late and "has ended: nack() is taken only while it runs" in late[0], late
    assert acked.status() == "completed"  # completed before it ran; its checkpoint() raised, and said so
    with app.engine.connect() as conn:
        archive = app.tables.archive
        assert conn.execute(sa.select(archive.c.checkpoint).where(archive.c.id == acked.id)).scalar_one() is None


def test_an_error_raised_after_defer_is_kept_as_the_jobs_last(app: JobQueue, caplog: pytest.LogCaptureFixture) -> None:
    @app.task(name="t.defers_then_raises", bind=True)
    def defers_then_raises(job: Any) -> None:
        job.defer(until=3600, state="s")
        raise ValueError("a bug after defer")

    handle = defers_then_raises.delay()
    with caplog.at_level(logging.WARNING, logger="jobqueue"):
        drain(app)
    assert handle.status() == "pending"
    with app.engine.connect() as conn:
        m = app.tables.message
        error = conn.execute(sa.select(m.c.last_error_type, m.c.last_error_message)).one()
    assert tuple(error) == ("ValueError", "a bug after defer")
    assert "raised ValueError after it deferred" in caplog.text


def test_a_nack_delay_past_max_total_delay_seconds_fails_the_job(app: JobQueue) -> None:
    from jobqueue import AckPolicy

    @app.task(
        name="t.nacks_far",
        bind=True,
        ack_policy=AckPolicy.MANUAL,
        retry_strategy=ConstantRetryStrategy(delay_seconds=1, max_attempts=5, max_total_delay_seconds=60),
    )
    def nacks_far(job: Any, seconds: float) -> None:
        job.nack(delay_seconds=seconds)

    far, near = nacks_far.delay(86400), nacks_far.delay(30)
    drain(app)
    with pytest.raises(JobFailed, match="past max_total_delay_seconds=60"):
        far.get(timeout=0)
    assert near.status() == "retryable"


def test_current_job_in_a_thread_of_the_job_says_how_to_reach_the_context(app: JobQueue) -> None:
    said: list[str] = []

    @app.task(name="t.threads")
    def threads() -> None:
        def look() -> None:
            try:
                current_job()
            except Exception as exc:
                said.append(str(exc))

        thread = threading.Thread(target=look)
        thread.start()
        thread.join()

    threads.delay()
    drain(app)
    assert said and "in a thread the job started" in said[0] and "copy_context" in said[0], said
