"""enqueue_dataframe on SQLite, PostgreSQL and MariaDB, checked against the tables and a real worker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.errors import ConfigurationError, SchemaError, SerializationError
from jobqueue.serialization import loads_call
from tests.acceptance.cli import jobqueue
from tests.apps import pipeline
from tests.conftest import only

ROWS = 100_000


@pytest.fixture
def score(db_url: str) -> Any:
    """The pipeline app's task, its app pointed at this test's database."""
    pipeline.app.configure(database_url=db_url)
    yield pipeline.score
    pipeline.app.close()


def users(spark: Any, count: int, start: int = 0) -> Any:
    from pyspark.sql import functions as F

    return spark.range(start, start + count, numPartitions=4).select(
        F.col("id").alias("user_id"),
        (F.col("id") % 7 / 2).alias("weight"),
        F.concat(F.lit("user-"), F.col("id")).alias("key"),
    )


def messages(app: JobQueue) -> list[tuple[Any, ...]]:
    m = app.tables.message
    with app.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.select(m.c.task_name, m.c.unique_key, m.c.payload, m.c.queue, m.c.priority, m.c.state)
            )
        ]


def test_a_dataframe_is_enqueued_once_and_a_keyed_rerun_adds_nothing(spark: Any, score: Any, app: JobQueue) -> None:
    from jobqueue.spark import enqueue_dataframe

    df = users(spark, ROWS)
    assert (
        enqueue_dataframe(
            df, score, args=["user_id"], kwargs={"weight": "weight"}, unique_key="key", queue="scoring", priority=3
        )
        == ROWS
    )
    assert (
        enqueue_dataframe(df, score, args=["user_id"], kwargs={"weight": "weight"}, unique_key="key", queue="scoring")
        == 0
    )
    rows = messages(app)
    assert len(rows) == ROWS
    assert {r[1] for r in rows} == {f"user-{i}" for i in range(ROWS)}
    assert {(r[0], r[3], r[4], r[5]) for r in rows} == {("pipeline.score", "scoring", 3, "PENDING")}
    calls = {r[1]: loads_call(app.serializer, r[2]) for r in rows}
    assert calls["user-12"] == ([12], {"weight": 2.5})
    # A bigger DataFrame: only the new keys go in.
    assert enqueue_dataframe(users(spark, ROWS + 500), score, args=["user_id"], unique_key="key") == 500
    assert len(messages(app)) == ROWS + 500


def test_unkeyed_rows_are_all_enqueued_with_their_values(spark: Any, score: Any, app: JobQueue) -> None:
    from pyspark.sql import functions as F

    from jobqueue.spark import enqueue_dataframe

    seen = datetime(2026, 3, 1, 12, 30, 15, 250_000, tzinfo=timezone.utc)
    df = (
        users(spark, 5000)
        .withColumn("seen_at", F.lit(seen))
        .withColumn("weight", F.col("weight").cast("decimal(10,2)"))
        .withColumn(
            "seen",
            F.struct(
                F.col("seen_at").alias("at"), F.array(F.col("seen_at")).alias("all"), F.lit(b"\x00\xff").alias("raw")
            ),
        )
    )
    assert enqueue_dataframe(df, score, args=["user_id", "weight", "seen_at"], batch_size=700) == 5000
    assert enqueue_dataframe(df, score, args=["user_id", "weight", "seen"]) == 5000  # no key: twice
    rows = messages(app)
    assert len(rows) == 10_000 and all(r[1] is None for r in rows)
    args = sorted((loads_call(app.serializer, r[2])[0] for r in rows), key=lambda a: (a[0], isinstance(a[2], dict)))
    # A TIMESTAMP is an instant: it arrives as the same instant, at any depth, whatever the
    # executors' time zone (the fixture runs them in New York); structs come as dicts.
    assert args[:2] == [
        [0, Decimal("0.00"), seen],
        [0, Decimal("0.00"), {"at": seen, "all": [seen], "raw": b"\x00\xff"}],
    ]
    assert args[-2] == [4999, Decimal("0.50"), seen]


def test_a_key_column_of_any_type_is_read_as_its_text(spark: Any, score: Any, app: JobQueue) -> None:
    """The key column is cast to a string, as documented, but its values were then converted as
    the column's type: a timestamp, binary, struct or map key failed on the executors with a raw
    PythonException, and an array key was taken letter by letter."""
    from pyspark.sql import functions as F

    from jobqueue.spark import enqueue_dataframe

    df = users(spark, 3).select(
        "user_id",
        F.to_timestamp(F.lit("2024-01-01 12:00:00")).alias("at"),
        F.array(F.col("user_id")).alias("ids"),
        F.struct(F.col("user_id").alias("n")).alias("one"),
    )
    for key in ("at", "ids", "one"):
        assert enqueue_dataframe(df, score, args=["user_id"], unique_key=key) == (1 if key == "at" else 3), key
    keys = sorted(r[1] for r in messages(app))
    assert len(keys) == 7 and "[0]" in keys and all(isinstance(k, str) and k for k in keys), keys


def test_a_timestamp_key_is_its_utc_time_whatever_the_session_time_zone(spark: Any, score: Any, app: JobQueue) -> None:
    """Cast to a string in the session's zone, a TIMESTAMP key changed with the zone (a re-run
    elsewhere enqueued every row again), and the two instants of a clock's repeated autumn hour
    shared one key (4 of 8 rows were dropped in New York)."""
    from jobqueue.spark import enqueue_dataframe

    # 8 instants 15 minutes apart from 05:00 UTC on 3 November 2024, when New York's 01:00-02:00 repeats.
    events = spark.sql("SELECT id AS user_id, timestamp_seconds(1730610000 + id * 900) AS at FROM range(8)")
    zone = spark.conf.get("spark.sql.session.timeZone")
    try:
        spark.conf.set("spark.sql.session.timeZone", "America/New_York")
        assert enqueue_dataframe(events, score, args=["user_id"], unique_key="at") == 8
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        assert enqueue_dataframe(events, score, args=["user_id"], unique_key="at") == 0
        spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
        assert enqueue_dataframe(events, score, args=["user_id"], unique_key="at") == 0
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    keys = sorted(r[1] for r in messages(app))
    assert keys[:2] == ["2024-11-03 05:00:00", "2024-11-03 05:15:00"] and keys[-1] == "2024-11-03 06:45:00"


def test_timestamps_at_the_ends_of_the_calendar_are_enqueued(spark: Any, score: Any, app: JobQueue) -> None:
    """A TIMESTAMP in the year 1 failed on the executors with a long PythonException ("year 0 is out
    of range"): PySpark converts it through local time (New York, in the fixture)."""
    from jobqueue.spark import enqueue_dataframe

    ends = spark.sql(
        "SELECT id AS user_id, CASE id WHEN 0 THEN TIMESTAMP'0001-01-01 00:00:00 UTC' "
        "ELSE TIMESTAMP'9999-12-31 23:59:59.999999 UTC' END AS at FROM range(2)"
    )
    assert enqueue_dataframe(ends, score, args=["user_id", "at"], unique_key="at") == 2
    stored = sorted((r[1], loads_call(app.serializer, r[2])[0]) for r in messages(app))
    first, last = (
        datetime(1, 1, 1, tzinfo=timezone.utc),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=timezone.utc),
    )
    assert stored == [("0001-01-01 00:00:00", [0, first]), ("9999-12-31 23:59:59.999999", [1, last])]


def test_archived_keys_are_skipped_and_the_jobs_run(spark: Any, score: Any, app: JobQueue, db_url: str) -> None:
    from jobqueue.spark import enqueue_dataframe

    assert (
        enqueue_dataframe(users(spark, 300), score, args=["user_id"], kwargs={"weight": "weight"}, unique_key="key")
        == 300
    )
    jobqueue(
        "worker", "--burst", "--concurrency", "2", app="tests.apps.pipeline:app", env={"JOBQUEUE_DATABASE_URL": db_url}
    )
    a = app.tables.archive
    with app.engine.connect() as conn:
        archived = conn.execute(sa.select(a.c.unique_key, a.c.state, a.c.result)).all()
    assert len(archived) == 300 and {r[1] for r in archived} == {"COMPLETED"}
    assert app.serializer.loads(dict((r[0], r[2]) for r in archived)["user-12"]) == {
        "user_id": 12,
        "score": 30.0,
        "seen_at": None,
    }
    assert messages(app) == []
    # 300 finished keys and 100 new ones: only the new ones are enqueued.
    assert enqueue_dataframe(users(spark, 400), score, args=["user_id"], unique_key="key") == 100
    assert sorted(r[1] for r in messages(app)) == sorted(f"user-{i}" for i in range(300, 400))


def test_repeated_archived_and_active_keys_are_skipped(spark: Any, score: Any, app: JobQueue) -> None:
    from jobqueue.spark import enqueue_dataframe

    now = datetime.now(timezone.utc).replace(tzinfo=None)
    archived = {"queue": "default", "state": "COMPLETED", "payload": b"[[],{}]", "created_at": now, "archived_at": now}
    with app.engine.begin() as conn:
        conn.execute(
            sa.insert(app.tables.archive),
            [
                {**archived, "id": 10**9, "task_name": "pipeline.score", "unique_key": "user-3"},
                {**archived, "id": 10**9 + 1, "task_name": "pipeline.other", "unique_key": "user-4"},
            ],
        )
    score.apply_async((99,), unique_key="user-5")
    # One partition, each key four times: repeated within a batch of 25 rows and across batches.
    df = spark.createDataFrame([(i, f"user-{i % 10}") for i in range(40)], "user_id long, key string").coalesce(1)
    assert enqueue_dataframe(df, score, args=["user_id"], unique_key="key", batch_size=25) == 8
    rows = {r[1]: loads_call(app.serializer, r[2])[0] for r in messages(app)}
    assert sorted(rows) == sorted(f"user-{i}" for i in range(10) if i != 3)  # user-3 is archived
    assert all(rows[f"user-{i}"] == [i] for i in range(10) if i not in (3, 5))  # each key's first row
    assert rows["user-5"] == [99]  # the active job, untouched
    assert enqueue_dataframe(df, score, args=["user_id"], unique_key="key", batch_size=25) == 0


def test_a_relative_sqlite_path_reaches_the_executors(spark: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """Executors (and a local master's Python workers) do not run in this process's working
    directory: the path they are given must be absolute."""
    from jobqueue.spark import enqueue_dataframe, read_archive
    from tests.spark import archive_data

    monkeypatch.chdir(tmp_path)
    pipeline.app.configure(database_url="sqlite:///relative.sqlite3")
    try:
        pipeline.app.init_schema()
        archive_data.fill_archive(pipeline.app, 50)
        assert enqueue_dataframe(users(spark, 200), pipeline.score, args=["user_id"], unique_key="key") == 200
        assert len(messages(pipeline.app)) == 200
        assert read_archive(spark, "sqlite:///relative.sqlite3").count() == 50
    finally:
        pipeline.app.close()


@only("sqlite")
def test_a_database_without_the_tables_is_said_before_spark_runs(spark: Any, score: Any, tmp_path: Any) -> None:
    """It failed in the executors, saying that the batches committed before stayed enqueued."""
    from jobqueue.spark import enqueue_dataframe

    empty = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    (tmp_path / "empty.sqlite3").touch()  # a database, without jobqueue's tables
    with pytest.raises(SchemaError) as raised:
        enqueue_dataframe(users(spark, 10), score, args=["user_id"], database_url=empty)
    assert "jobqueue db init" in str(raised.value) and "stay enqueued" not in str(raised.value)
    assert "PythonException" not in str(raised.value)


@only("sqlite")
def test_bad_input_is_refused_with_the_fix(spark: Any, score: Any, app: JobQueue) -> None:
    from pyspark.sql import functions as F

    from jobqueue.spark import enqueue_dataframe

    df = users(spark, 10)
    with pytest.raises(ConfigurationError, match=r"'uid' not in the DataFrame; its columns: user_id, weight, key"):
        enqueue_dataframe(df, score, args=["uid"])
    with pytest.raises(ConfigurationError, match=r"args=\['user_id'\]"):
        enqueue_dataframe(df, score, args="user_id")
    with pytest.raises(ConfigurationError, match="decorated with @app.task"):
        enqueue_dataframe(df, pipeline.score.fn, args=["user_id"])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="batch_size"):
        enqueue_dataframe(df, score, args=["user_id"], batch_size=0)
    with pytest.raises(TypeError, match=r"task pipeline.score: score\(\) got an unexpected keyword argument 'label'"):
        enqueue_dataframe(df, score, args=["user_id"], kwargs={"label": "key"})  # checked once, before Spark runs
    with pytest.raises(ConfigurationError, match=r"'key' holds 10 null, of 10 rows; nothing was enqueued"):
        enqueue_dataframe(df.withColumn("key", F.lit(None).cast("string")), score, args=["user_id"], unique_key="key")
    with pytest.raises(ConfigurationError, match="'key' is one key for every job of this call, and also the name of a"):
        enqueue_dataframe(df, score, args=["user_id"], partition_key="key")  # a key per row was meant
    assert messages(app) == []


@only("sqlite")
def test_columns_the_serializer_cannot_carry_are_refused_before_spark_runs(
    spark: Any, score: Any, app: JobQueue
) -> None:
    from pyspark.sql import functions as F

    from jobqueue.spark import enqueue_dataframe

    df = users(spark, 3000)
    odd = {
        "INTERVAL 3 DAYS": r"column 'odd' \(interval day\)",
        "named_struct('at', 1, 'wait', array(INTERVAL 3 DAYS))": r"column 'odd', field wait\[\] \(interval day\)",
        "INTERVAL '1' YEAR": r"column 'odd' \(interval year\)",
        "make_interval(1, 2, 0, 3)": r"column 'odd' \(interval\)",
        "parse_json('{\"x\": 1}')": r"column 'odd' \(variant\)",
        "map(array(1), 1)": r"column 'odd', field \[key\] \(array<int>\): a map whose keys are arrays",
    }
    for expression, named in odd.items():
        with pytest.raises(ConfigurationError, match=rf"{named}.*cast\('string'\).*nothing was enqueued") as refused:
            enqueue_dataframe(df.withColumn("odd", F.expr(expression)), score, args=["user_id", "odd"])
        assert "task pipeline.score" in str(refused.value)
    assert messages(app) == []
    # Values Python can hold, however nested, go in: nulls as None, map keys that are structs as
    # tuples (a dict key must be hashable), from columns of any name.
    odd_names = df.select(
        F.col("user_id").alias("user.id"),
        F.create_map(F.struct(F.col("user_id").alias("a"), F.lit("b")), F.lit(None).cast("string")).alias("m`x"),
        F.lit(None).alias("by list"),
    )
    assert enqueue_dataframe(odd_names, score, args=["user.id", "m`x", "by list"]) == 3000
    calls = [loads_call(app.serializer, r[2])[0] for r in messages(app)]
    assert sorted(calls)[7] == [7, {(7, "b"): None}, None]


def test_bad_unique_keys_are_refused_before_anything_is_written(spark: Any, score: Any, app: JobQueue) -> None:
    from pyspark.sql import functions as F

    from jobqueue.spark import enqueue_dataframe

    ids = F.col("id")
    key = (
        F.when(ids == 2500, None)
        .when(ids.isin(2600, 2601), "")
        .when(ids == 2700, "x" * 256)
        .when(ids == 2800, "a\x00b")
        .otherwise(F.concat(F.lit("user-"), ids))
    )
    df = spark.range(3000, numPartitions=3).select(ids.alias("user_id"), key.alias("user key"))
    refused = (
        r"task pipeline.score: unique_key column 'user key' holds 1 null, 2 empty, 1 longer than 255 "
        r"characters and 1 with a NUL character, of 3,000 rows; nothing was enqueued"
    )
    with pytest.raises(ConfigurationError, match=refused):
        enqueue_dataframe(df, score, args=["user_id"], unique_key="user key", batch_size=100)
    assert messages(app) == []


def test_a_binary_unique_key_column_is_refused_naming_a_text_form(spark: Any, score: Any, app: JobQueue) -> None:
    """Cast to a string, bytes that are not UTF-8 became U+FFFD: b"\\xfe" and b"\\x80" were taken for
    the key of b"\\xff", and their rows skipped as repeats."""
    from jobqueue.spark import enqueue_dataframe

    df = spark.createDataFrame(
        [(1, bytearray(b"\xff")), (2, bytearray(b"\xfe")), (3, bytearray(b"\x80"))], "user_id long, k binary"
    )
    with pytest.raises(ConfigurationError, match=r"unique_key column 'k' is BINARY.*F\.hex\(F\.col\('k'\)\)"):
        enqueue_dataframe(df, score, args=["user_id"], unique_key="k")
    assert messages(app) == []


def running_tasks(spark: Any) -> int:
    """How many Spark tasks run now, in jobs that failed too (Spark kills those within seconds)."""
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(None)]
    stages = [tracker.getStageInfo(stage) for job in jobs if job is not None for stage in job.stageIds]
    return sum(stage.numActiveTasks for stage in stages if stage is not None)


@contextmanager
def message_table_locked(app: JobQueue, backend: str) -> Iterator[Callable[[], None]]:
    """Hold a lock that makes every insert into the message table wait; yield what releases it.

    The holder waits as long as Spark takes, which on a loaded machine is longer than the 10 s a
    jobqueue session may stay idle in a transaction: its server would end it, so it may wait."""
    table = app.tables.message.name
    conn = app.engine.raw_connection()
    cursor = conn.cursor()
    if backend == "sqlite":
        conn.driver_connection.isolation_level = None
        cursor.execute("BEGIN IMMEDIATE")
    elif backend == "postgresql":
        cursor.execute("SET idle_in_transaction_session_timeout = 0")
        cursor.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
    else:
        cursor.execute("SET SESSION idle_transaction_timeout = 0")
        cursor.execute(f"LOCK TABLES {table} WRITE")
    try:
        yield conn.rollback if backend != "mysql" else lambda: cursor.execute("UNLOCK TABLES")
    finally:
        conn.close()


def test_a_failed_enqueue_has_stopped_writing_when_it_raises(
    spark: Any, app: JobQueue, db_url: str, backend: str
) -> None:
    """One partition fails at once while the other waits to insert: the Spark job fails, and Spark
    kills the tasks still running a few seconds later. enqueue_dataframe raises once they have
    ended, so the queue no longer changes after it: here, nothing was written."""
    from pyspark.sql import functions as F

    from jobqueue.spark import enqueue_dataframe

    small = JobQueue(db_url, max_payload_bytes=1024)
    text = small.task(name="pipeline.text")(lambda text: text)
    ids = F.col("id")
    # Partition 0 holds ids 0 to 999; partition 1 starts with a row over max_payload_bytes.
    df = spark.range(2000, numPartitions=2).select(
        F.when(ids == 1000, F.repeat(F.lit("x"), 2000)).otherwise(F.concat(F.lit("row-"), ids)).alias("text")
    )
    try:
        with message_table_locked(app, backend) as release:
            with pytest.raises(SerializationError, match=r"over max_payload_bytes=1024.* committed before") as failed:
                enqueue_dataframe(df, text, args=["text"])
            release()
            assert messages(app) == []
            deadline = time.monotonic() + 60
            while running_tasks(spark) and time.monotonic() < deadline:
                time.sleep(0.1)
        assert messages(app) == [], "rows were written after enqueue_dataframe raised"
        assert "task pipeline.text: a row's arguments serialize to 2" in str(failed.value)
    finally:
        small.close()
