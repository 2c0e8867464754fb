"""What the database refuses, and bad values at enqueue: one job pays, nothing else is lost.

Refusals are real: a trigger that refuses one value, a statement over MariaDB's max_allowed_packet,
a TRUNCATE that sends AUTO_INCREMENT back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from jobqueue import ConfigurationError, JobFailed, JobQueue, SerializationError
from jobqueue.clock import utcnow
from jobqueue.job import ErrorInfo, MessageState, Outcome, OutcomeKind
from jobqueue.retry import NoRetryStrategy
from jobqueue.runtime.resilience import DatabaseGuard
from jobqueue.runtime.writer import OutcomeWriter, Unwritten
from jobqueue.testing import drain
from tests.conftest import only

WORKER = "w" * 32


@pytest.fixture
def add(app: JobQueue):
    @app.task(name="t.add")
    def add(x: object, y: object = 0) -> object:
        return x

    return add


def count(app: JobQueue, table: str = "message") -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(getattr(app.tables, table))).scalar_one())


@contextmanager
def refusing(app: JobQueue, table: str, column: str, word: str) -> Iterator[None]:
    """A trigger that makes the database refuse a row of ``table`` whose ``column`` contains ``word``."""
    backend = app.engine.dialect.name
    name = f"jobqueue_test_refuse_{table}"
    full = f"jobqueue_{table}"
    with app.engine.begin() as conn:
        if backend == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE INSERT ON {full} WHEN instr(NEW.{column}, '{word}') > 0 "
                "BEGIN SELECT RAISE(ABORT, 'no thanks'); END"
            )
        elif backend == "postgresql":
            conn.exec_driver_sql(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF position('{word}' in encode(NEW.{column}::bytea, 'escape')) > 0 THEN "
                "RAISE EXCEPTION 'no thanks'; END IF; RETURN NEW; END $$"
                if column == "payload"
                else f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF position('{word}' in NEW.{column}) > 0 THEN RAISE EXCEPTION 'no thanks'; "
                "END IF; RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE INSERT ON {full} FOR EACH ROW EXECUTE FUNCTION {name}()"
            )
        else:
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE INSERT ON {full} FOR EACH ROW BEGIN "
                f"IF INSTR(NEW.{column}, '{word}') > 0 THEN "
                "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no thanks'; END IF; END"
            )
    try:
        yield
    finally:
        with app.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TRIGGER {name}" + (f" ON {full}" if backend == "postgresql" else ""))
            if backend == "postgresql":
                conn.exec_driver_sql(f"DROP FUNCTION {name}()")


def finished(message, state=MessageState.COMPLETED, error=None, result=None):
    return Outcome(
        message=message,
        kind=OutcomeKind.ARCHIVE,
        state=state,
        finished_at=utcnow(),
        started_at=utcnow(),
        error=error,
        result=result,
        checkpoint=message.checkpoint,
    )


def packet_app(db_url: str) -> tuple[JobQueue, int]:
    """An app on MySQL whose payload limit is far above the server's max_allowed_packet (16 MiB on
    MariaDB, 64 MiB on MySQL 8), and that packet: values over the packet reach the packet checks."""
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        packet = int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())
    engine.dispose()
    return JobQueue(db_url, max_payload_bytes=4 * packet), packet


def writer(app: JobQueue) -> OutcomeWriter:
    return OutcomeWriter(app.store, DatabaseGuard(logging.getLogger("test"), "database (test)", app.store.classify))


def test_a_refused_outcome_fails_its_own_job_and_the_rest_are_written(app: JobQueue, add) -> None:
    add.bulk([(i,) for i in range(10)])
    held = app.store.acquire(WORKER, None, 10, 30.0)
    outcomes = [finished(m, result=b"1") for m in held]
    outcomes[6] = finished(held[6], MessageState.FAILED, ErrorInfo("ValueError", "please refuse-me"))
    with refusing(app, "archive", "error_message", "refuse-me"):
        result = writer(app).write(outcomes)
    assert len(result.applied) == 10 and not result.lost
    a = app.tables.archive
    with app.engine.connect() as conn:
        rows = {
            r.id: r for r in conn.execute(sa.select(a.c.id, a.c.state, a.c.result, a.c.error_type, a.c.error_message))
        }
    assert len(rows) == 10 and count(app) == 0
    refused = rows[held[6].id]
    assert (refused.state, refused.error_type) == ("FAILED", "jobqueue.errors.OutcomeRefused")
    assert "no thanks" in refused.error_message and "refuse-me" not in refused.error_message
    assert {rows[m.id].result for m in held if m.id != held[6].id} == {b"1"}


def test_when_the_archive_refuses_even_a_bare_failure_the_job_waits_in_the_queue(app: JobQueue, add) -> None:
    add.bulk([(i,) for i in range(3)])
    held = app.store.acquire(WORKER, None, 3, 30.0)
    with refusing(app, "archive", "task_name", "t.add"):  # every archive row of this task
        result = writer(app).write([finished(m) for m in held])
    assert len(result.applied) == 3 and count(app, "archive") == 0
    m = app.tables.message
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(m.c.state, m.c.last_error_type, m.c.next_attempt_at)).all()
    assert {(state, error) for state, error, _ in rows} == {("RETRYABLE", "jobqueue.errors.OutcomeRefused")}
    assert all(at > utcnow() + timedelta(seconds=30) for _, _, at in rows)  # tried again later, not at once


def read_only(url: str) -> str:
    """The same database through connections that refuse every write."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"sqlite:///file:{parsed.database}?mode=ro&uri=true"
    if parsed.get_backend_name() == "postgresql":
        return parsed.update_query_dict({"options": "-c default_transaction_read_only=on"}).render_as_string(False)
    return parsed.update_query_dict({"init_command": "SET SESSION TRANSACTION READ ONLY"}).render_as_string(False)


def test_when_every_write_is_refused_the_error_is_raised_and_nothing_is_failed(app: JobQueue, add, db_url: str) -> None:
    add.bulk([(i,) for i in range(3)])
    held = app.store.acquire(WORKER, None, 3, 30.0)
    frozen = JobQueue()
    frozen.configure(database_url=read_only(db_url))  # over JOBQUEUE_DATABASE_URL, which the fixture sets
    try:
        with pytest.raises(Unwritten) as info:
            writer(frozen).write([finished(m) for m in held])
    finally:
        frozen.close()
    assert info.value.__cause__ is not None
    assert not info.value.written.applied and len(info.value.remaining) == 3
    assert count(app) == 3 and count(app, "archive") == 0  # still held: written later, when allowed


@only("mysql")
def test_a_flush_of_large_results_stays_under_max_allowed_packet(app: JobQueue, add) -> None:
    add.bulk([(i,) for i in range(22)])
    held = app.store.acquire(WORKER, None, 22, 30.0)
    big = b"r" * (900 * 1024)  # 22 of them: about 20 MB, over the server's 16 MB packet
    result = app.store.flush([finished(m, result=big) for m in held])
    assert len(result.applied) == 22
    a = app.tables.archive
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.sum(sa.func.length(a.c.result)))).scalar() == 22 * len(big)


@only("mysql")
def test_a_result_over_max_allowed_packet_fails_its_job_instead_of_retrying_for_ever(db_url: str) -> None:
    app, packet = packet_app(db_url)

    @app.task(name="t.big")
    def big() -> None: ...

    big.bulk([()] * 3)
    held = app.store.acquire(WORKER, None, 3, 30.0)
    outcomes = [finished(m, result=b"1") for m in held]
    outcomes[1] = finished(held[1], result=b"x" * (packet + 1024))
    # Not kept in the archive: the result is never sent, so nothing is refused.
    outcomes[2] = dataclasses.replace(finished(held[2], result=b"x" * (packet + 1024)), retain=False)
    began = time.monotonic()
    result = writer(app).write(outcomes)
    assert time.monotonic() - began < 60
    a = app.tables.archive
    with app.engine.connect() as conn:
        rows = {
            r.id: (r.state, r.error_type, r.error_message)
            for r in conn.execute(sa.select(a.c.id, a.c.state, a.c.error_type, a.c.error_message))
        }
    assert rows[held[1].id][:2] == ("FAILED", "jobqueue.errors.OutcomeRefused")
    assert f"over this server's max_allowed_packet ({packet:,} bytes)" in rows[held[1].id][2]  # the reason, and the fix
    assert rows[held[0].id] == ("COMPLETED", None, None) and held[2].id not in rows
    assert len(result.applied) == 3 and count(app) == 0
    app.close()


@only("mysql")
def test_arguments_over_max_allowed_packet_are_refused_before_they_are_sent(db_url: str, caplog) -> None:
    """Sent, a statement over the packet is not refused with a reason: the server drops the
    connection. Refused before, with the fix named, and nothing written."""
    app, packet = packet_app(db_url)

    @app.task(name="t.echo")
    def echo(value: str) -> str:
        return value

    escaped = "'" * (packet // 2 + 1024)  # under the packet as it is, over it once escaped
    topic = app.topic("t.news")

    @app.consumer("t.news", group="g", start="earliest")
    def read(value: str) -> None: ...

    enqueues = [
        (lambda: echo.delay(escaped), "the job's arguments take"),
        (lambda: echo.bulk([("a",), (escaped,)]), "the job's arguments take"),
        (lambda: echo.apply_async((escaped,), unique_key="u"), "the job's arguments take"),
        (lambda: topic.publish(escaped), "the published message's payload takes"),  # it is no job's
    ]
    for enqueue, what in enqueues:
        with pytest.raises(SerializationError, match="raise max_allowed_packet on the MySQL or MariaDB server") as e:
            enqueue()
        assert str(e.value).startswith(what), e.value
    with app.engine.begin() as conn, pytest.raises(SerializationError, match="max_allowed_packet"):
        echo.apply_async(("x" * (packet + 1),), connection=conn)
    assert count(app) == 0 and "unavailable" not in caplog.text
    assert echo.delay("fits").status() == "pending"
    app.close()


@only("mysql")
def test_a_checkpoint_over_max_allowed_packet_is_refused_before_it_is_sent(db_url: str, caplog) -> None:
    """The job's code gets a SerializationError it can catch, naming the fix, instead of a dropped
    connection; the checkpoint saved before stays, and the job's next writes work."""
    app, packet = packet_app(db_url)
    m = app.tables.message
    seen: list[object] = []

    def stored(job_id: int | None) -> object:
        with app.engine.connect() as conn:
            data = conn.execute(sa.select(m.c.checkpoint).where(m.c.id == job_id)).scalar_one()
        return app.serializer.loads(data)

    @app.task(name="t.resumable", bind=True, retry_strategy=NoRetryStrategy())
    def resumable(job, catch: bool) -> str:
        job.checkpoint("small")
        if not catch:
            job.checkpoint("x" * (packet + 1024))
        try:
            job.checkpoint("'" * (packet // 2 + 1024))  # under the packet as it is, over it once escaped
        except SerializationError as exc:
            seen.extend([str(exc), stored(job.id), job.state])
        job.checkpoint("after")
        return "done"

    caught, raised = resumable.delay(True), resumable.delay(False)
    drain(app)
    assert seen, "the job's code did not get a SerializationError"
    message, row, state = seen
    assert "the job's checkpoint takes" in str(message)
    assert f"over this server's max_allowed_packet ({packet:,} bytes)" in str(message)
    assert "raise max_allowed_packet on the MySQL or MariaDB server" in str(message)
    assert (row, state) == ("small", "small")  # nothing was written, and the job still reads its last state
    assert caught.get(timeout=1) == "done"
    a = app.tables.archive
    with app.engine.connect() as conn:
        columns = (a.c.id, a.c.state, a.c.error_type, a.c.error_message, a.c.checkpoint)
        rows = {r.id: r for r in conn.execute(sa.select(*columns))}
    assert app.serializer.loads(rows[caught.id].checkpoint) == "after"
    failed = rows[raised.id]
    assert (failed.state, failed.error_type) == ("FAILED", "jobqueue.errors.SerializationError")
    assert "the job's checkpoint takes" in failed.error_message and "max_allowed_packet" in failed.error_message
    assert app.serializer.loads(failed.checkpoint) == "small"
    assert "gone away" not in caplog.text and "Lost connection" not in caplog.text
    app.close()


def test_drain_fails_a_job_whose_outcome_the_database_refuses_and_runs_the_rest(app: JobQueue, add) -> None:
    """drain() writes outcomes as a worker does: a refused one fails its own job, with the reason."""

    @app.task(name="t.says", retry_strategy=NoRetryStrategy())
    def says(word: str) -> None:
        raise ValueError(word)

    first, refused, last = add.delay(1), says.delay("please refuse-me"), add.delay(2)
    with refusing(app, "archive", "error_message", "refuse-me"):
        handles = drain(app)
    assert [h.id for h in handles] == [first.id, refused.id, last.id]
    assert (first.get(timeout=0), last.get(timeout=0)) == (1, 2)
    with pytest.raises(JobFailed, match="OutcomeRefused: the database refused") as info:
        refused.get(timeout=0)
    assert "refuse-me" not in str(info.value)


@only("mysql")
def test_drain_fails_a_job_whose_result_is_over_max_allowed_packet(db_url: str) -> None:
    app, packet = packet_app(db_url)

    @app.task(name="t.big", retry_strategy=NoRetryStrategy())
    def big(size: int) -> str:
        return "x" * size

    handles = [big.delay(1), big.delay(packet + 1024), big.delay(2)]
    assert [h.id for h in drain(app)] == [h.id for h in handles]
    assert handles[0].get(timeout=0) == "x" and handles[2].get(timeout=0) == "xx"
    with pytest.raises(JobFailed, match="max_allowed_packet"):
        handles[1].get(timeout=0)
    assert count(app) == 0
    app.close()


# -- bulk() is all or nothing -------------------------------------------------------------------------


def test_bulk_commits_every_batch_or_none(app: JobQueue, add) -> None:
    items = [("fine",)] * 2500
    items[2100] = ("boom",)  # the third batch of 1,000 is refused by the database
    with refusing(app, "message", "payload", "boom"), pytest.raises(sa.exc.DBAPIError):
        add.bulk(items, batch_size=1000)
    assert count(app) == 0, "the batches before the refused one were committed"


@only("mysql")
def test_bulk_of_large_arguments_stays_under_max_allowed_packet(app: JobQueue, add) -> None:
    handles = add.bulk([("a" * 20_000,)] * 2000)
    assert len(handles) == 2000 and count(app) == 2000
    assert len({h.id for h in handles}) == 2000


# -- bad values at enqueue ------------------------------------------------------------------------------


def cyclic() -> list[object]:
    value: list[object] = []
    value.append(value)
    return value


def deep() -> list[object]:
    value: list[object] = []
    for _ in range(1200):
        value = [value]
    return value


def nested(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = {"span": value}
    return value


def test_headers_nested_as_deep_as_every_database_takes_are_stored(app: JobQueue, add) -> None:
    handle = add.apply_async((1,), headers={"trace": nested(30), "flat": [1, [2]]})  # 31 levels in all
    with app.engine.connect() as conn:
        stored = conn.execute(sa.select(app.tables.message.c.headers)).scalar_one()
    assert stored["trace"] == nested(30) and handle.id


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda t: t.delay(10**5000), SerializationError, "args[0]"),
        (lambda t: t.delay(1, y=cyclic()), SerializationError, "kwargs['y']"),
        (lambda t: t.delay(deep()), SerializationError, "args[0]"),
        (lambda t: t.delay("lone \ud800 surrogate"), SerializationError, "args[0]"),
        (lambda t: t.apply_async((1,), headers={"at": datetime(2030, 1, 1)}), ConfigurationError, "headers['at']"),
        (lambda t: t.apply_async((1,), headers={"x": math.nan}), ConfigurationError, "headers['x']"),
        # 32 levels of dicts, the headers' own counted: MariaDB's JSON columns refuse it (a raw
        # CONSTRAINT error at the insert), so every database does, with the fix.
        (lambda t: t.apply_async((1,), headers={"trace": nested(31)}), ConfigurationError, "more than 31 deep"),
        (lambda t: t.apply_async((1,), countdown=math.inf), ValueError, "countdown"),
        (lambda t: t.apply_async((1,), countdown=math.nan), ValueError, "countdown"),
        (lambda t: t.apply_async((1,), countdown=1e300), ValueError, "countdown: 1e+300 seconds from now is past"),
        (lambda t: t.apply_async((1,), countdown=3e11), ValueError, "the last date a job can be given; give fewer"),
        (lambda t: t.apply_async((1,), countdown=10**400), ValueError, "the last date a job can be given; give fewer"),
        (
            lambda t: t.apply_at(datetime.max.replace(tzinfo=timezone(-timedelta(hours=1))), 1),
            ConfigurationError,
            "eta",
        ),
        (
            lambda t: t.apply_at(datetime.max.replace(tzinfo=timezone(-timedelta(hours=1))), 1),
            ConfigurationError,
            "give a time",
        ),
        (lambda t: t.apply_async((1,), countdown="soon"), TypeError, "countdown"),
        (lambda t: t.apply_async((1,), unique_key="a\x00b"), ConfigurationError, "unique_key"),
        (lambda t: t.apply_async((1,), partition_key="a\x00b"), ConfigurationError, "partition_key"),
        (lambda t: t.apply_async((1,), partition_key="\udc80"), ConfigurationError, "partition_key"),
        (lambda t: t.bulk([(1,), (10**5000,)]), SerializationError, "item 1"),
        (lambda t: t.bulk([(1,), (2,)], unique_key=["a", "b\x00"]), ConfigurationError, "unique_key of item 1"),
    ],
)
def test_bad_values_at_enqueue_name_the_argument_and_write_nothing(app: JobQueue, add, call, error, words) -> None:
    with pytest.raises(error) as info:
        call(add)
    assert words in str(info.value)
    assert count(app) == 0


# -- ids never collide with archived jobs -----------------------------------------------------------


@only("mysql")
def test_after_a_truncate_new_ids_never_collide_with_archived_ones(app: JobQueue, add) -> None:
    old = add.bulk([(i,) for i in range(5)])
    held = app.store.acquire(WORKER, None, 5, 30.0)
    app.store.flush([finished(m, result=app.serializer.dumps("old")) for m in held])
    with app.engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE TABLE jobqueue_message")
    archived = {h.id for h in old}
    fresh = [add.delay("new"), *add.bulk([("new",)] * 3), add.apply_async(("new",), unique_key="k")]
    with app.engine.begin() as conn:
        fresh.append(add.apply_async(("new",), connection=conn))
    assert not {h.id for h in fresh} & archived and all(h.id > max(archived) for h in fresh)
    assert {h.status() for h in fresh} == {"pending"}
    # A worker acquires and archives them under their own ids: no duplicate key, no old result.
    taken = app.store.acquire(WORKER, None, 10, 30.0)
    assert {m.id for m in taken} == {h.id for h in fresh}
    app.store.flush([finished(m, result=app.serializer.dumps("new")) for m in taken])
    assert [h.get(timeout=1) for h in fresh] == ["new"] * len(fresh)
    assert [h.get(timeout=1) for h in old] == ["old"] * 5


def insert_colliding(app: JobQueue, job_id: int) -> None:
    """A PENDING row of t.add(2) under ``job_id``, an id the archive already holds."""
    row = {
        "id": job_id,
        "task_name": "t.add",
        "queue": "default",
        "priority": 0,
        "state": "PENDING",
        "payload": app.serializer.dumps([[2], {}]),
        "attempts_count": 0,
        "deliveries_count": 0,
        "created_at": utcnow(),
        "next_attempt_at": utcnow() - timedelta(seconds=1),
    }
    with app.engine.begin() as conn:
        conn.execute(sa.insert(app.tables.message), row)


@only("mysql")
def test_a_colliding_row_left_behind_gets_a_fresh_id_when_a_worker_starts(app: JobQueue, add) -> None:
    (first,) = add.bulk([(1,)])
    (m,) = app.store.acquire(WORKER, None, 1, 30.0)
    app.store.flush([finished(m)])
    insert_colliding(app, first.id)  # as if its enqueuer died between its insert and the move
    assert app.store.repair_ids() == 1  # what a worker does when it starts
    (again,) = app.store.acquire(WORKER, None, 1, 30.0)
    assert again.id > first.id


@only("mysql")
def test_a_colliding_row_a_worker_took_before_its_move_is_released_and_fenced(app: JobQueue, add) -> None:
    (first,) = add.bulk([(1,)])
    (m,) = app.store.acquire(WORKER, None, 1, 30.0)
    app.store.flush([finished(m)])
    insert_colliding(app, first.id)
    (early,) = app.store.acquire(WORKER, None, 1, 30.0)  # taken in the instant before its enqueuer moved it
    assert app.store.repair_ids() == 1
    assert app.store.flush([finished(early)]).lost  # that delivery's outcome is fenced out
    (again,) = app.store.acquire(WORKER, None, 1, 30.0)
    assert again.id > first.id and (again.attempts_count, again.deliveries_count) == (1, 1)
    assert count(app, "archive") == 1


@only("postgresql", "mysql")
def test_lease_times_come_from_the_database_servers_clock(
    app: JobQueue, add, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This host's clock is 20 minutes fast: leases still start and end by the server's clock, and
    this host's release loop sees no expired lease."""
    add.bulk([(1,), (2,)])
    (theirs,) = app.store.acquire("o" * 32, None, 1, 30.0)  # another host's delivery, taken honestly

    import jobqueue.clock

    # Every time jobqueue reads from this host's clock counts from this epoch (see tests.apps.skewed).
    monkeypatch.setattr("jobqueue.clock._EPOCH", jobqueue.clock._EPOCH + timedelta(minutes=20))
    assert utcnow() - datetime.now(timezone.utc).replace(tzinfo=None) > timedelta(minutes=19)
    (mine,) = app.store.acquire(WORKER, None, 1, 30.0)
    server_now = {"postgresql": "SELECT timezone('UTC', now())", "mysql": "SELECT UTC_TIMESTAMP(6)"}[backend]
    with app.engine.connect() as conn:
        now = conn.exec_driver_sql(server_now).scalar()
        leases = dict(conn.execute(sa.select(app.tables.message.c.id, app.tables.message.c.lease_expires_at)).all())
    assert abs((mine.acquired_at - now).total_seconds()) < 5, (mine.acquired_at, now)
    assert abs((leases[mine.id] - mine.acquired_at).total_seconds() - 30.0) < 0.01
    assert app.store.release_expired() == 0  # by this host's clock both leases ran out 19 minutes ago
    app.store.heartbeat([WORKER], 30.0)
    with app.engine.connect() as conn:
        renewed = conn.execute(
            sa.select(app.tables.message.c.lease_expires_at).where(app.tables.message.c.id == mine.id)
        ).scalar_one()
    assert abs((renewed - now).total_seconds() - 30.0) < 5  # renewal does not move it 20 minutes ahead either
