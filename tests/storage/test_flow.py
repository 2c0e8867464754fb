"""Flow control in storage, on every database: concurrency limits, rate limits, keys in turn."""

from __future__ import annotations

import hashlib
import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError, SerializationError
from jobqueue.job import Message, MessageState, OutcomeKind
from jobqueue.runtime.holdings import hand_back
from jobqueue.storage import deadletter, flowkeys, waiting
from tests.conftest import only
from tests.storage.test_store import outcome, rows

WORKER = "w" * 32


def take(app: JobQueue, limit: int = 50, now=None, flow: bool = True) -> list[Message]:
    return app.store.acquire(WORKER, None, limit, 30.0, now=now, token=7, flow=flow, rated=flow)


def test_a_concurrency_limit_holds_across_acquires_and_every_end_frees_a_slot(app: JobQueue) -> None:
    @app.task(name="t.api", concurrency_key="partner", concurrency_limit=2)
    def api(n: int) -> None: ...

    @app.task(name="t.free")
    def free() -> None: ...

    handles = [api.delay(n) for n in range(6)]
    free.delay()
    (plain,) = take(app, flow=False)
    assert plain.task_name == "t.free"  # the plain walk leaves keyed jobs alone
    app.store.flush([outcome(plain)])
    first = take(app)
    assert [m.id for m in first] == [h.id for h in handles[:2]]  # in enqueue order, two at most
    assert {(m.flow_key, m.concurrency_limit) for m in first} == {("partner", 2)}
    assert take(app) == []
    # An outcome frees one slot; so does a lease that expired.
    app.store.flush([outcome(first[0])])
    (second,) = take(app)
    app.store.release_expired(now=utcnow() + timedelta(minutes=5))
    assert [m.id for m in take(app)] == [first[1].id, second.id]  # both back, in order, and running again
    assert take(app) == []
    # A retry waiting for its time holds no slot.
    app.store.flush(
        [outcome(first[1], OutcomeKind.RETRY, MessageState.RETRYABLE, next_attempt_at=utcnow() + timedelta(hours=1))]
    )
    assert len(take(app)) == 1


def test_keys_take_turns_so_a_flood_never_starves_the_others(app: JobQueue) -> None:
    @app.task(name="t.tenant", concurrency_key=lambda tenant, n: tenant)
    def work(tenant: str, n: int) -> None: ...

    work.bulk([("big", n) for n in range(100)])
    small = [(f"small-{k}", n) for k in range(5) for n in range(2)]
    handles = work.bulk(small)
    # bulk() keeps input order in its handles, whatever the keys.
    assert [r["flow_key"] for r in sorted(rows(app), key=lambda r: r["id"]) if r["id"] in {h.id for h in handles}] == [
        tenant for tenant, _ in small
    ]
    got = take(app, limit=12)
    assert sorted({m.flow_key for m in got}) == ["big"] + [f"small-{k}" for k in range(5)]
    assert len([m for m in got if m.flow_key != "big"]) == 10  # every small job in the first batch
    # The next batch goes to the key that was served longest ago: the small ones are done.
    assert {m.flow_key for m in take(app, limit=12)} == {"big"}


def test_keys_take_turns_when_a_fetch_takes_fewer_jobs_than_there_are_keys(app: JobQueue) -> None:
    """Slow jobs are fetched one or two at a time. A key the fetch found but had no room for keeps
    its place in line: every key found was marked served, so all had the same time, and the keys'
    names decided every turn. A tenant whose name sorted after the flood's waited for all of it."""

    @app.task(name="t.tenant", concurrency_key=lambda tenant, n: tenant)
    def work(tenant: str, n: int) -> None: ...

    work.bulk([("acme", n) for n in range(20)])
    work.bulk([("zeta", n) for n in range(3)])
    turns = [m.flow_key for _ in range(6) for m in take(app, limit=1)]
    assert turns == ["acme", "zeta", "acme", "zeta", "acme", "zeta"], turns


def test_a_rate_limit_spaces_starts_by_the_database_clock(app: JobQueue) -> None:
    @app.task(name="t.mail", rate_limit="10/s")
    def mail(n: int) -> None: ...

    for n in range(6):
        mail.delay(n)
    t0 = utcnow()
    # After a quiet spell one interval of slack: two starts at once, then one per 100 ms.
    assert len(take(app, now=t0)) == 2
    assert take(app, now=t0) == []
    assert app.store.flow_due_in == pytest.approx(0.1, abs=0.002)
    assert take(app, now=t0 + timedelta(milliseconds=50)) == []
    assert len(take(app, now=t0 + timedelta(milliseconds=100))) == 1
    assert len(take(app, now=t0 + timedelta(milliseconds=300))) == 2  # late: it catches up one interval
    assert take(app, now=t0 + timedelta(milliseconds=300)) == []
    assert {r["flow_key"] for r in rows(app)} == {"task:t.mail"}


def test_flow_options_are_checked_when_the_task_is_declared(app: JobQueue) -> None:
    with pytest.raises(ConfigurationError, match="rate_limit must read like '20/s'"):
        app.task(name="t.bad", rate_limit="20 per second")(lambda: None)
    for too_slow in ("0/s", "0.04/h", "0.0001/m"):
        with pytest.raises(ConfigurationError, match="at least one start a day"):
            app.task(name="t.bad", rate_limit=too_slow)(lambda: None)
    for half in (".5/s", "0.5/s", "0.5 / sec"):  # ".5/s" was refused as unreadable
        assert app.task(name="t.half", rate_limit=half)(lambda: None).flow.interval_us == 2_000_000
    for upper in ("20/S", "20/Sec", " 1200 / M ", "72000/H"):  # "20/S" was refused, "20/ s" taken
        assert app.task(name="t.upper", rate_limit=upper)(lambda: None).flow.interval_us == 50_000
    for unreadable in ("\uff12\uff10/s", "20\u3000/s", "20/s\u00a0"):  # full-width digits, ideographic space
        with pytest.raises(ConfigurationError, match="rate_limit must read like '20/s'"):
            app.task(name="t.bad", rate_limit=unreadable)(lambda: None)
    for bad_limit in (0, True, 2**31):  # the column holds a 32-bit integer on PostgreSQL and MySQL
        with pytest.raises(ConfigurationError, match="concurrency_limit must be an integer from 1 to 2147483647"):
            app.task(name="t.bad", concurrency_limit=bad_limit)(lambda: None)
    with pytest.raises(ConfigurationError, match="concurrency_key must be a string"):
        app.task(name="t.bad", concurrency_key="")(lambda: None)
    # Text no database can store fails at the declaration (or the enqueue), not inside the driver.
    with pytest.raises(ConfigurationError, match="concurrency_key is not valid Unicode"):
        app.task(name="t.bad", concurrency_key="\ud800")(lambda: None)

    @app.task(name="t.surrogate", concurrency_key=lambda n: "\udc00" * n)
    def surrogate(n: int) -> None: ...

    with pytest.raises(ConfigurationError, match="concurrency_key of task t.surrogate is not valid Unicode"):
        surrogate.delay(1)

    # Limits without a key are the task's, under "task:<name>": a flow key of 255 characters at most.
    keyless: list[dict[str, Any]] = [
        {"concurrency_limit": 1},
        {"rate_limit": "5/s"},
        {"concurrency_key": lambda: None, "rate_limit": "5/s"},  # a key function may return None
    ]
    for options in keyless:
        with pytest.raises(ConfigurationError, match="give the task a name of at most 250 characters"):
            app.task(name="t" * 251, **options)(lambda: None)
    app.task(name="t" * 251, concurrency_key="partner", rate_limit="5/s")(lambda: None)

    @app.task(name="t." + "w" * 248, concurrency_limit=2**31 - 1)
    def widest() -> None: ...

    widest.delay()

    @app.task(name="t.keyed", concurrency_key=lambda n: None if n < 0 else n)
    def keyed(n: int) -> None: ...

    keyed.delay(7)  # an int key is stored as text
    keyed.delay(-1)  # None: no key, no flow control
    assert sorted((r["flow_key"] or "") for r in rows(app)) == ["", "7", "task:t." + "w" * 248]


def test_a_bulk_whose_key_depends_on_each_item_names_the_bad_item_and_writes_nothing(app: JobQueue) -> None:
    """An item the task cannot take is a TypeError, as for delay(), not a failure of the key
    function (which cannot take it either); a key that fails says which item gave it."""

    @app.task(name="t.tenant", concurrency_key=lambda tenant, n=0: tenant, concurrency_limit=1)
    def work(tenant: Any, n: int = 0) -> None: ...

    with pytest.raises(TypeError, match=r"^item 1: task t.tenant: .*nothing was enqueued"):
        work.bulk([("acme",), ("acme", 1, 2)])
    with pytest.raises(TypeError, match=r"^item 0: task t.tenant: .*nothing was enqueued"):
        work.bulk([{"tenant": "acme", "extra": 1}])
    for bad in ("x" * 256, 2.5, "a\x00b"):
        with pytest.raises(ConfigurationError, match=r"^item 2: concurrency_key of task t.tenant must be"):
            work.bulk([("acme",), ("globex",), (bad,)])
    # An argument it cannot serialize is named by its place in the bulk, not in its key's group.
    with pytest.raises(SerializationError, match=r"^item 2: "):
        work.bulk([("acme",), ("globex",), ("acme", object())])

    @app.task(name="t.region", concurrency_key=lambda region: f"region-{region['code']}")
    def refresh(region: dict[str, str]) -> None: ...

    with pytest.raises(ConfigurationError, match=r"^item 1: concurrency_key of task t.region failed .*KeyError"):
        refresh.bulk([({"code": "eu"},), ({"name": "us"},)])
    assert rows(app) == []
    assert len(work.bulk([("acme",), ("globex", 1)])) == 2


def test_a_key_far_too_long_is_named_by_its_length_not_copied_into_the_error(app: JobQueue, add) -> None:
    @app.task(name="t.tenant", concurrency_key=lambda tenant: tenant)
    def work(tenant: str) -> None: ...

    huge, nul = "k" * 1_000_000, "k\x00" * 100_000
    attempts = [
        (huge, lambda: work.delay(huge)),
        (huge, lambda: add.apply_async((1, 2), partition_key=huge)),
        (huge, lambda: add.apply_async((1, 2), unique_key=huge)),
        (nul, lambda: add.apply_async((1, 2), partition_key=nul)),
        (huge, lambda: app.topic("orders").publish({"n": 1}, key=huge)),
        (huge, lambda: app.task(name="t.static", concurrency_key=huge)(lambda: None)),
    ]
    for key, attempt in attempts:
        with pytest.raises(ConfigurationError) as refused:
            attempt()
        message = str(refused.value)
        assert len(message) < 400, message[:400]
        assert f"got a string of {len(key)} characters, {key[:40]!r}..." in message
    assert rows(app) == []


def test_a_retried_dead_letter_keeps_its_key_and_limits(app: JobQueue) -> None:
    @app.task(name="t.api", concurrency_key="partner", concurrency_limit=1)
    def api() -> None: ...

    api.delay()
    (message,) = take(app)
    app.store.flush([outcome(message, OutcomeKind.ARCHIVE, MessageState.FAILED)])
    with app.engine.begin() as conn:  # the key's row gone: a retry brings it back
        conn.execute(sa.delete(app.tables.flow))
    assert deadletter.retry(app.store, [message.id]).retried == [message.id]
    (again,) = take(app)
    assert (again.id, again.flow_key, again.concurrency_limit) == (message.id, "partner", 1)


def flow_keys(app: JobQueue) -> set[str]:
    f = app.store.tables.flow
    with app.store.reading() as conn:
        return set(conn.execute(sa.select(f.c.flow_key)).scalars())


def test_keys_without_jobs_are_forgotten_once_quiet_and_come_back_with_their_next_job(app: JobQueue) -> None:
    @app.task(name="t.tenant", concurrency_key=lambda tenant: tenant)
    def work(tenant: str) -> None: ...

    @app.task(name="t.mail", rate_limit="1/h")
    def mail() -> None: ...

    done, busy = work.delay("done"), work.delay("busy")
    mail.delay()
    got = {m.flow_key: m for m in take(app)}
    app.store.flush([outcome(got["done"]), outcome(got["task:t.mail"])])
    later = utcnow() + timedelta(minutes=2)
    assert app.store.forget_idle_flow_keys(60, now=utcnow()) == 0  # served just now: kept
    # A key with a job (even a running one) stays; so does one whose rate allows no start yet.
    assert app.store.forget_idle_flow_keys(60, now=later) == 1
    assert flow_keys(app) == {"busy", "task:t.mail"}
    assert done.status() == "completed"
    again = work.delay("done")
    assert flow_keys(app) == {"busy", "done", "task:t.mail"}
    assert [m.id for m in take(app)] == [again.id]
    assert busy.status() == "processing"
    # A key's rate is remembered for a day after its last start.
    assert app.store.forget_idle_flow_keys(60, now=utcnow() + timedelta(hours=25)) == 1
    assert flow_keys(app) == {"busy", "done"}


@pytest.mark.parametrize("first", ["enqueue", "sweep"])
def test_a_key_swept_while_a_job_of_it_is_enqueued_keeps_its_row(app: JobQueue, backend: str, first: str) -> None:
    """The sweep forgets a quiet key while an application's transaction enqueues a job of it, at
    the isolation applications run in (MariaDB: REPEATABLE READ, the server's and SQLAlchemy's
    default), in a transaction that read before it enqueued. Whichever takes the key's row first,
    the key has its row once the job is committed, and the job is acquired."""

    @app.task(name="t.tenant", concurrency_key=lambda tenant: tenant)
    def work(tenant: str) -> None: ...

    (done,) = take(app) if work.delay("quiet") else []
    app.store.flush([outcome(done)])
    later = utcnow() + timedelta(minutes=2)
    swept: list[int] = []
    handles: list[Any] = []
    sweep_locked, enqueued, go_on = threading.Event(), threading.Event(), threading.Event()

    def sweep() -> None:
        swept.append(app.store.forget_idle_flow_keys(60, now=later))

    def enqueue() -> None:
        with app.store.engine.connect() as conn:
            if backend == "mysql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar()
                handles.append(work.apply_async(("quiet",), connection=conn))
                enqueued.set()
                go_on.wait(30)  # a long transaction: it goes on after its enqueue

    def pause_before_delete(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The sweep has found the key idle and locked its row; it deletes it once told to.
        if threading.current_thread() is sweeper and statement.lstrip().upper().startswith("DELETE"):
            sweep_locked.set()
            go_on.wait(30)

    sweeper = threading.Thread(target=sweep)
    enqueuer = threading.Thread(target=enqueue)
    sa.event.listen(app.store.engine, "before_cursor_execute", pause_before_delete)
    try:
        if first == "sweep":
            sweeper.start()
            assert sweep_locked.wait(10)
            enqueuer.start()
            enqueuer.join(timeout=0.5)
            assert not enqueued.is_set()  # the enqueue waits for the row the sweep holds
        else:
            enqueuer.start()
            assert enqueued.wait(10)
            # SQLite: the sweep waits for the write lock; the others skip the held row.
            sweeper.start()
            sweeper.join(timeout=0.5)
        go_on.set()
        sweeper.join(timeout=30)
        enqueuer.join(timeout=30)
    finally:
        go_on.set()
        sa.event.remove(app.store.engine, "before_cursor_execute", pause_before_delete)
    assert swept == ([1] if first == "sweep" else [0])  # first: the row had no job when it was locked
    assert flow_keys(app) == {"quiet"}
    assert [m.id for m in take(app)] == [handles[0].id]


def test_the_jobs_of_a_key_whose_flow_row_was_deleted_get_it_back(app: JobQueue, add) -> None:
    """Flow rows deleted by hand: no fetch takes their keys' jobs (a fetch finds keys through their
    rows) while --burst counts them as work, so it waited forever, and jobs list and status said
    nothing. They say why now, and the rows come back, the keys' limits with them."""

    @app.task(name="t.api", concurrency_key="partner", concurrency_limit=1)
    def api(n: int) -> None: ...

    @app.task(name="t.mail", rate_limit="1/h")
    def mail(n: int) -> None: ...

    limited = [api.delay(n) for n in range(2)]
    rated = [mail.delay(n) for n in range(3)]
    ordered = [add.apply_async((n, 0), partition_key="acct") for n in range(2)]
    kept = add.apply_async((9, 9), partition_key="kept")
    f = app.tables.flow
    with app.engine.begin() as conn:
        conn.execute(sa.delete(f).where(f.c.flow_key != "partition:kept"))
    assert [m.id for m in take(app)] == [kept.id]
    assert take(app) == []
    assert app.store.has_work(None, utcnow() + timedelta(seconds=5))
    reasons = waiting.explain(app.store, rows(app))
    assert (reasons[limited[1].id].reason or "").startswith("key 'partner' has no row in the flow table")
    assert (reasons[ordered[0].id].reason or "").startswith("key 'partition:acct' has no row in the flow table")
    held = {entry["key"]: entry for entry in waiting.blocked_keys(app.store)}
    assert held["task:t.mail"]["waiting"] == 3 and held["task:t.mail"]["reason"].startswith("no row in the flow")

    restored = app.store.restore_missing_flow_keys()
    assert sorted(restored.keys) == ["partition:acct", "partner", "task:t.mail"]
    assert restored.resume_after is None
    assert flow_keys(app) == {"partition:acct", "partition:kept", "partner", "task:t.mail"}
    assert not [entry for entry in waiting.blocked_keys(app.store) if "no row" in entry["reason"]]
    # Each key within its limits: one job of 'partner' (a limit of 1), two of the rate (a start and
    # its slack), the partition's run in its order.
    got = [m.id for m in take(app)]
    assert sorted(got) == sorted([limited[0].id, rated[0].id, rated[1].id, ordered[0].id, ordered[1].id])
    assert got.index(ordered[0].id) < got.index(ordered[1].id)
    assert take(app) == []
    assert app.store.restore_missing_flow_keys().keys == []


def test_the_look_for_keys_without_a_row_goes_on_where_it_stopped(app: JobQueue, add) -> None:
    """Each look walks a bounded number of keys, in pages, and says where the next one goes on."""
    for n in range(12):
        add.apply_async((n, 0), partition_key=f"k{n:02d}")
    f = app.tables.flow
    lost = ["partition:k03", "partition:k07", "partition:k11"]
    with app.engine.begin() as conn:
        conn.execute(sa.delete(f).where(f.c.flow_key.in_(lost)))
    first = flowkeys.restore_missing(app.store, most=5, page=2)
    assert (first.keys, first.resume_after) == (["partition:k03"], "partition:k04")
    second = flowkeys.restore_missing(app.store, first.resume_after, most=5, page=2)
    assert (second.keys, second.resume_after) == (["partition:k07"], "partition:k09")
    third = flowkeys.restore_missing(app.store, second.resume_after, most=5, page=2)
    assert (third.keys, third.resume_after) == (["partition:k11"], None)  # past the last key
    assert flow_keys(app) == {f"partition:k{n:02d}" for n in range(12)}
    assert len(take(app)) == 12


def test_a_partition_is_acquired_by_the_run_of_its_oldest_ready_jobs(app: JobQueue, add) -> None:
    first, second, third = (add.apply_async((n, 0), partition_key="acct-7") for n in range(3))
    other = add.apply_async((9, 0), partition_key="x" * 255)  # too long to prefix: its key is hashed
    plain = add.delay(1, 1)
    assert [m.id for m in take(app, flow=False)] == [plain.id]  # the plain walk leaves keyed jobs alone
    got = take(app)
    # A partition's ready jobs are taken as a run, in enqueue order, by one worker, which runs
    # them one at a time.
    run = [m for m in got if m.partition_key == "acct-7"]
    assert [m.id for m in run] == [first.id, second.id, third.id]
    assert [m.id for m in got if m.partition_key != "acct-7"] == [other.id]
    # In rounds: each partition's first job, then each one's second...
    assert [m.id for m in got] == [first.id, other.id, second.id, third.id]
    assert {m.flow_key for m in got} == {"partition:acct-7", "partition:" + hashlib.sha256(b"x" * 255).hexdigest()}
    fourth = add.apply_async((3, 0), partition_key="acct-7")
    assert take(app) == []  # nothing of a partition is taken while any of its jobs runs
    # The run's first job retries: the worker hands back the rest; the retrying job holds them.
    later = utcnow() + timedelta(hours=1)
    app.store.flush(
        [
            outcome(run[0], OutcomeKind.RETRY, MessageState.RETRYABLE, next_attempt_at=later),
            *[hand_back(m) for m in run[1:]],
        ]
    )
    assert take(app) == []  # a job waiting to retry holds its partition
    # Once due, the run starts again at it; a job behind one that is not yet due is not taken.
    (retried, *rest) = take(app, now=later + timedelta(seconds=1))
    assert [retried.id, *[m.id for m in rest]] == [first.id, second.id, third.id, fourth.id]
    app.store.flush([outcome(m) for m in (retried, *rest)])
    assert [first.status(), second.status(), fourth.status()] == ["completed"] * 3


def test_partition_keys_that_look_hashed_or_hold_wildcards_are_runs_of_their_own(app: JobQueue, add) -> None:
    # A flow key holds its partition key after a prefix, or the key's hash when it is too long; a
    # key as long as a hash, or one with LIKE's wildcards, is still found as itself.
    keys = ["a" * 64, "b" * 64, "50%_off", "50x_off", "x" * 250]
    handles = {key: [add.apply_async((n, 0), partition_key=key) for n in range(2)] for key in keys}
    got = take(app)
    assert {key: [m.id for m in got if m.partition_key == key] for key in keys} == {
        key: [h.id for h in handles[key]] for key in keys
    }
    later = {key: add.apply_async((9, 0), partition_key=key) for key in keys}
    assert take(app) == []  # each partition waits for its run
    app.store.flush([outcome(m) for m in got if m.partition_key != "50%_off"])
    # The other partitions' next jobs, each under its own key; "50%_off" still runs.
    assert {m.id for m in take(app)} == {later[key].id for key in keys if key != "50%_off"}


def test_a_partition_waits_behind_its_oldest_job_even_of_a_concurrency_key(app: JobQueue, add) -> None:
    @app.task(name="t.limited", concurrency_key="partner", concurrency_limit=5)
    def limited(n: int) -> None: ...

    first = limited.apply_async((1,), partition_key="p")  # taken under "partner", not the partition
    second = add.apply_async((2, 0), partition_key="p")
    got = take(app)
    assert [(m.id, m.flow_key) for m in got] == [(first.id, "partner")]
    assert take(app) == []  # the partition's next job waits while its oldest runs
    app.store.flush([outcome(got[0])])
    assert [m.id for m in take(app)] == [second.id]


def test_a_partition_run_ends_at_the_fetch_limit_and_at_a_job_of_another_queue(app: JobQueue, add) -> None:
    run = [add.apply_async((n, 0), partition_key="p") for n in range(3)]
    other = add.apply_async((3, 0), partition_key="p", queue="elsewhere")
    last = add.apply_async((4, 0), partition_key="p")
    got = take(app, limit=2)  # the fetch's limit cuts the run
    assert [m.id for m in got] == [h.id for h in run[:2]]
    assert take(app) == []  # the rest waits behind the run
    app.store.flush([outcome(m) for m in got])
    # A worker of the default queue takes the partition up to its job of another queue.
    served = app.store.acquire(WORKER, ("default",), 50, 30.0, token=8, flow=True)
    assert [m.id for m in served] == [run[2].id]
    app.store.flush([outcome(m) for m in served])
    assert app.store.acquire(WORKER, ("default",), 50, 30.0, token=9, flow=True) == []
    (elsewhere,) = app.store.acquire(WORKER, ("elsewhere",), 50, 30.0, token=10, flow=True)
    assert elsewhere.id == other.id
    app.store.flush([outcome(elsewhere)])
    assert [m.id for m in take(app)] == [last.id]


def test_a_partition_run_stops_at_a_job_that_is_not_ready_or_not_its_own(app: JobQueue, add) -> None:
    first = add.apply_async((1, 0), partition_key="p")
    second = add.apply_async((2, 0), partition_key="p", countdown=3600)  # scheduled: holds what follows
    add.apply_async((3, 0), partition_key="p")
    (got,) = take(app)
    assert got.id == first.id
    app.store.flush([outcome(got)])
    assert take(app) == []  # the scheduled one is the oldest now: the partition waits for it
    assert second.status() == "pending"


@pytest.mark.parametrize("share", [1, 50])
@pytest.mark.parametrize("mixed", [False, True], ids=["partitions", "mixed"])
def test_a_retried_dead_letter_waits_for_the_running_job_of_its_partition(
    app: JobQueue, add, share: int, mixed: bool
) -> None:
    """A dead letter retried while a later job of its key runs comes back ahead of the key's
    waiting jobs, and starts only once the running one has ended: one job of a key at a time.
    (With a concurrency key's jobs about, PostgreSQL reads the candidates another way.)"""

    @app.task(name="t.api", concurrency_key="partner")
    def api() -> None: ...

    def fetch() -> list[Message]:
        if mixed:
            api.delay()
        return [m for m in take(app, limit=share + mixed) if m.task_name == "t.add"]

    dead = add.apply_async((1, 0), partition_key="acct")
    (message,) = take(app)
    app.store.flush([outcome(message, OutcomeKind.ARCHIVE, MessageState.FAILED)])
    later = [add.apply_async((n, 0), partition_key="acct") for n in (2, 3)]
    running = fetch()
    assert [m.id for m in running] == [h.id for h in later][:share]
    assert deadletter.retry(app.store, [dead.id]).retried == [dead.id]
    assert fetch() == []
    app.store.flush([outcome(m) for m in running])
    assert [m.id for m in fetch()][:1] == [dead.id]


def test_a_retried_dead_letter_of_a_concurrency_key_waits_for_the_running_job_of_its_partition(
    app: JobQueue,
) -> None:
    """The same for jobs of a concurrency key and a partition, which are taken as the key's."""

    @app.task(name="t.api", concurrency_key="partner", concurrency_limit=5)
    def api(n: int) -> None: ...

    dead = api.apply_async((1,), partition_key="acct")
    (message,) = take(app)
    app.store.flush([outcome(message, OutcomeKind.ARCHIVE, MessageState.FAILED)])
    later = [api.apply_async((n,), partition_key="acct") for n in (2, 3)]
    other = api.apply_async((4,), partition_key="other")
    running = take(app)
    assert {m.id for m in running} == {later[0].id, other.id}
    assert deadletter.retry(app.store, [dead.id]).retried == [dead.id]
    assert take(app) == []
    app.store.flush([outcome(m) for m in running])
    assert [m.id for m in take(app)] == [dead.id]


@only("postgresql")
def test_a_job_whose_enqueue_commits_after_a_later_one_ran_waits_for_it(app: JobQueue, add) -> None:
    """Two producers of one key in overlapping transactions: the later insert commits first and
    runs; the earlier one, committed meanwhile, waits for it to end (then runs before the rest)."""
    add.apply_async((0, 0), partition_key="acct")  # the key's row exists: enqueues need not wait to add it
    app.store.flush([outcome(m) for m in take(app)])
    with app.engine.connect() as producer:
        with producer.begin():
            early = add.apply_async((1, 0), partition_key="acct", connection=producer)
            late = add.apply_async((2, 0), partition_key="acct")
            (running,) = take(app)
        assert running.id == late.id
    assert take(app) == []
    app.store.flush([outcome(running)])
    assert [m.id for m in take(app)] == [early.id]


@only("postgresql", "mysql")
def test_a_key_being_enqueued_to_runs_its_committed_jobs_on_postgresql_not_mariadb(app: JobQueue, backend: str) -> None:
    """An enqueue holds its key's flow row until its transaction ends. PostgreSQL's lock lets
    workers take the key's committed jobs meanwhile; MariaDB's share lock makes them pass over the
    key until the application commits (as the flow control page says)."""

    @app.task(name="t.partner", concurrency_key="partner", concurrency_limit=2)
    def call(n: int) -> None: ...

    first = call.delay(1)
    with app.engine.connect() as producer:
        with producer.begin():
            second = call.apply_async((2,), connection=producer)
            meanwhile = [m.id for m in take(app)]
        assert meanwhile == ([first.id] if backend == "postgresql" else [])
    assert [m.id for m in take(app)] == ([second.id] if backend == "postgresql" else [first.id, second.id])


def test_keys_that_mimic_a_partition_are_refused(app: JobQueue) -> None:
    # Also as SQLite's LIKE and MariaDB's default collation see it: regardless of case or accents.
    for number, key in enumerate(["partition:x", "Partition:x", "PARTITION:", "pártition:x"]):
        with pytest.raises(ConfigurationError, match="must not begin with 'partition:'"):
            app.task(name=f"t.bad{number}", concurrency_key=key)(lambda: None)
    app.task(name="t.fine", concurrency_key="partitions")(lambda: None)


def test_partition_keys_that_differ_only_in_case_are_two_partitions(app: JobQueue, add) -> None:
    first = add.apply_async((1, 0), partition_key="Tenant")
    second = add.apply_async((2, 0), partition_key="tenant")
    got = take(app)
    assert [m.id for m in got] == [first.id, second.id]  # both run at once: two partitions
    assert [m.partition for m in got] == ["partition:Tenant", "partition:tenant"]


def test_concurrency_keys_are_compared_exactly_on_every_database(app: JobQueue) -> None:
    """Case, accents, emoji and trailing spaces tell keys apart, on MariaDB too (whose default
    collation would hold them equal): each key has its own slot."""

    @app.task(name="t.api", concurrency_key=lambda key: key, concurrency_limit=1)
    def api(key: str) -> None: ...

    keys = ("Acme", "acme", "acme", "acme ", "café", "cafe", "🔑", "🍕")
    jobs = [api.delay(key) for key in keys]
    taken = take(app)
    assert sorted(m.id for m in taken) == [job.id for n, job in enumerate(jobs) if n != 2]
    assert sorted(m.flow_key for m in taken) == sorted(set(keys))
    assert take(app) == []  # the second "acme" waits for the first


def test_jobs_their_key_holds_back_are_not_work_for_a_burst(app: JobQueue, add) -> None:
    """--burst stops when nothing is running or due soon: a job behind a partition's head that
    retries in an hour, or one whose key's rate allows its next start in an hour, is not due."""

    @app.task(name="t.hourly", rate_limit="1/h")
    def hourly(n: int) -> None: ...

    now = utcnow()
    head = add.apply_async((1, 1), partition_key="acct", eta=now + timedelta(hours=1))
    add.apply_async((2, 2), partition_key="acct")  # ready, but behind the head
    assert not app.store.has_work(None, now + timedelta(seconds=5))
    assert app.store.has_work(None, now + timedelta(hours=2))  # the head's time comes
    for n in range(3):
        hourly.delay(n)
    assert app.store.has_work(None, now + timedelta(seconds=5))
    started = take(app)
    assert len(started) == 2  # one start and the rate's slack; the third waits an hour
    app.store.flush([outcome(message) for message in started])
    assert not app.store.has_work(None, now + timedelta(seconds=5))
    assert head.status() == "pending"


def test_keys_that_differ_only_in_case_hold_no_job_back(app: JobQueue, add) -> None:
    """'acct' and 'Acct' are two partitions, 'partner' and 'Partner' two concurrency keys, on
    every database: each runs its job, and jobs show and jobs list give no reason to wait."""

    @app.task(name="t.api", concurrency_key=lambda key: key, concurrency_limit=1)
    def api(key: str) -> None: ...

    jobs = [add.apply_async((1, 0), partition_key="Acct"), add.apply_async((2, 0), partition_key="acct")]
    jobs += [api.delay("Partner"), api.delay("partner")]
    assert len(take(app)) == 4
    assert [waiting.explain(app.store, rows(app))[job.id].reason for job in jobs] == [None] * 4


@only("postgresql", "mysql")
def test_a_fetch_passes_over_the_keys_another_worker_holds(app: JobQueue, add) -> None:
    from jobqueue.storage.dialects.flow import KEYS_PER_ACQUIRE

    keys = [f"k{n:03d}" for n in range(KEYS_PER_ACQUIRE + 6)]
    for key in keys:
        add.apply_async((1, 1), partition_key=key)
    f = app.tables.flow
    with app.engine.connect() as other:
        first = other.execute(sa.select(f.c.flow_key).order_by(f.c.served_at, f.c.flow_key)).scalars().all()
        held = first[:KEYS_PER_ACQUIRE]  # the keys served longest ago, which every fetch looks at first
        other.rollback()
        other.begin()
        hint = "FORCE INDEX (PRIMARY)"  # as a worker locks them: only these rows, on MariaDB too
        lock = sa.select(f.c.flow_key).where(f.c.flow_key.in_(held)).with_for_update()
        other.execute(lock.with_hint(f, hint, dialect_name="mysql").with_hint(f, hint, dialect_name="mariadb")).all()
        got = take(app, limit=500)  # meanwhile, another worker's fetch
        other.rollback()
    # It takes the keys nobody holds, without waiting for the others.
    assert {m.flow_key for m in got} == set(first) - set(held) and len(got) == 6
    assert {m.flow_key for m in take(app, limit=500)} == set(held)


def test_a_fetch_without_rates_finds_keyed_work_past_its_first_look(app: JobQueue, add) -> None:
    """A worker that serves no rate-limited task first asks, in one statement that locks nothing,
    whether any key has work: keyed jobs are still taken, and none when every key is busy."""

    @app.task(name="t.api", concurrency_key="partner", concurrency_limit=1)
    def api(n: int) -> None: ...

    def fetch() -> list[Message]:
        return app.store.acquire(WORKER, None, 50, 30.0, token=7, flow=True, rated=False)

    assert fetch() == []  # no job at all
    ordered = [add.apply_async((n, 0), partition_key="acct-1") for n in range(2)]
    limited = [api.delay(n) for n in range(2)]
    got = {m.id for m in fetch()}
    assert got == {ordered[0].id, ordered[1].id, limited[0].id}  # the partition's run, one slot of the key
    assert fetch() == []  # the partition is held and the key's only slot is taken


def test_warming_up_takes_no_job(app: JobQueue, add) -> None:
    """What a supervisor runs before it forks its processes reads, and changes, nothing."""
    jobs = [add.apply_async((1, 1), partition_key="acct-1"), add.delay(2, 2)]
    app.store.warm_up(None)
    app.store.warm_up(("default", "other"))
    assert [job.status() for job in jobs] == ["pending", "pending"]
    assert len(take(app)) == 2


@pytest.mark.parametrize("older", [2, 3])
def test_more_older_jobs_come_back_than_a_fetch_reads_of_their_partition(app: JobQueue, add, older: int) -> None:
    # Dead letters of a key retried while a later job of the key runs: however many come back,
    # more than a fetch's share of the key included, none starts before the running one ends.
    dead = []
    for n in range(older):
        handle = add.apply_async((n, 0), partition_key="acct")
        (message,) = take(app)
        app.store.flush([outcome(message, OutcomeKind.ARCHIVE, MessageState.FAILED)])
        dead.append(handle.id)
    later = add.apply_async((9, 0), partition_key="acct")
    (running,) = take(app, limit=1)
    assert running.id == later.id
    assert deadletter.retry(app.store, dead).retried == dead
    for limit in (1, older - 1, 50):
        assert take(app, limit=limit) == []
    app.store.flush([outcome(running)])
    assert [m.id for m in take(app)] == dead  # then the older ones, as one run in their order


def test_a_page_of_jobs_with_more_keys_than_one_statement_may_list_is_explained(app: JobQueue, add) -> None:
    # SQLite allows 500 parts in one compound SELECT: a `jobs list --limit 1000` page of jobs with
    # 600 keys failed with "too many terms in compound SELECT".
    add.bulk([(n, 0) for n in range(600)], partition_key="k-a")  # one long partition...
    for n in range(600):
        add.apply_async((n, 1), partition_key=f"k{n}")  # ...and 600 partitions of one job each
    page = deadletter.list_jobs(app.store, limit=1200)
    found = waiting.explain(app.store, page)
    first = min(row["id"] for row in page if row["partition_key"] == "k-a")
    held = {job_id: wait.holder for job_id, wait in found.items() if wait.holder is not None}
    assert set(held.values()) == {first} and len(held) == 599  # the long partition's later jobs wait


def test_limits_edited_into_nonsense_fail_their_jobs_instead_of_holding_them_forever(app: JobQueue) -> None:
    """A row edited by hand to a concurrency limit of 0 or a negative rate interval would allow no
    start ever: its job would wait forever (and a --burst worker with it). Such jobs are taken to
    be failed, saying why; the key's other jobs and every other key go on."""

    @app.task(name="t.api", concurrency_key="partner", concurrency_limit=2)
    def api(n: int) -> None: ...

    @app.task(name="t.mail", rate_limit="10/s")
    def mail(n: int) -> None: ...

    zero, fine = api.delay(0), api.delay(1)
    negative = mail.delay(0)
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == zero.id).values(concurrency_limit=0))
        conn.execute(sa.update(m).where(m.c.id == negative.id).values(rate_interval_us=-1))
    got = {message.id: message for message in take(app)}
    assert "concurrency_limit 0 allows no job to run" in (got[zero.id].corrupt or "")
    assert "rate_interval_us -1 is not an interval" in (got[negative.id].corrupt or "")
    assert fine.id not in got or got[fine.id].corrupt is None
