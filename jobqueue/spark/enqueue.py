"""``enqueue_dataframe``: one job per DataFrame row, each partition writing through its own connection."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from pyspark import SparkContext
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType, TimestampType

from jobqueue.errors import ConfigurationError, SchemaError, SerializationError
from jobqueue.job import Batch
from jobqueue.retry import RetryStrategy
from jobqueue.serialization import dumps_call, get_serializer
from jobqueue.spark.columns import check_keys, check_types, column
from jobqueue.storage.engine import absolute_url, create_engine
from jobqueue.storage.schema_manager import check_schema
from jobqueue.storage.store import Store
from jobqueue.storage.tables import build_tables
from jobqueue.task import Task, check_key

DEFAULT_BATCH_SIZE = 1000


def enqueue_dataframe(
    df: DataFrame,
    task: Task,
    args: Sequence[str] | None = None,
    kwargs: Mapping[str, str] | None = None,
    *,
    unique_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    eta: datetime | None = None,
    countdown: float | None = None,
    headers: dict[str, Any] | None = None,
    partition_key: str | None = None,
    retry_strategy: RetryStrategy | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    database_url: str | None = None,
) -> int:
    """Enqueue one call of ``task`` per row of ``df`` and return how many jobs were inserted.

    Args:
        args: column names whose values are the positional arguments, in order.
        kwargs: ``{parameter: column}`` for keyword arguments.
        unique_key: a column (cast to string) whose value is the job's unique key. A key any job
            of this task already has, active or archived, is skipped, so running the same pipeline
            again enqueues nothing twice. A null key is an error.
        batch_size: rows per INSERT round trip in each partition.
        database_url: where the executors connect; default the task's app's URL. On a cluster it
            must reach the database from every executor.

    The other options are ``apply_async``'s, the same for every row. Executors get the task's name
    and the URL, never the task object: the function does not have to be importable there.
    """
    if not isinstance(task, Task):
        raise ConfigurationError(f"task must be a task (a function decorated with @app.task), got {task!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or not 1 <= batch_size <= 100_000:
        raise ConfigurationError(f"batch_size must be an integer from 1 to 100000, got {batch_size!r}")
    if isinstance(args, str):
        raise ConfigurationError(f"args takes a list of column names, for one column: args=[{args!r}]")
    arg_columns = list(args or [])
    kwarg_columns = dict(kwargs or {})
    if not all(isinstance(name, str) for name in [*arg_columns, *kwarg_columns, *kwarg_columns.values()]):
        raise ConfigurationError(
            "args lists column names and kwargs maps parameter names to column names, "
            "all as strings (select or alias computed columns first)"
        )
    if unique_key is not None and not isinstance(unique_key, str):
        raise ConfigurationError(f"unique_key takes a column name, got {unique_key!r}")
    # Every row makes the same shape of call: checked once, before any executor writes a row.
    task.check_call([None] * len(arg_columns), dict.fromkeys(kwarg_columns))
    wanted = arg_columns + list(kwarg_columns.values()) + ([unique_key] if unique_key is not None else [])
    missing = [name for name in wanted if name not in df.columns]
    if missing:
        raise ConfigurationError(
            f"column(s) {', '.join(map(repr, missing))} not in the DataFrame; its columns: {', '.join(df.columns)}"
        )
    if partition_key is not None and partition_key in df.columns:
        raise ConfigurationError(
            f"partition_key={partition_key!r} is one key for every job of this call, and also the name of "
            "a column: enqueue_dataframe does not read keys from columns. For one key per value, enqueue "
            "each value's rows apart (df.where(...)) with its key; nothing was enqueued"
        )
    if task.flow.per_call:
        raise ConfigurationError(
            f"task {task.name} takes its concurrency_key from its arguments, which enqueue_dataframe does "
            "not compute; give the task a fixed concurrency_key, or enqueue with task.bulk()"
        )
    common = task.common_row(
        eta=eta,
        countdown=countdown,
        queue=queue,
        priority=priority,
        headers=headers,
        partition_key=partition_key,
        retry_strategy=retry_strategy,
    )
    app = task.app
    check_types(df, arg_columns + list(kwarg_columns.values()), app.settings.serializer, task.name)
    if unique_key is not None:
        check_keys(df, unique_key, task.name)
    schema = {entry.name: entry.dataType for entry in df.schema.fields}
    # A TIMESTAMP key is an instant, written as its UTC time: cast to a string it would be written
    # in the session's time zone, a re-run in another zone would enqueue every row again, and two
    # instants an hour apart (a clock set back in the autumn) would share one key.
    instant_key = unique_key is not None and isinstance(schema[unique_key], TimestampType)
    spec = _EnqueueSpec(
        url=executor_url(database_url or app.database_url),
        prefix=app.settings.table_prefix,
        serializer=app.settings.serializer,
        max_payload_bytes=app.settings.max_payload_bytes,
        task_name=task.name,
        common=common,
        positional=len(arg_columns),
        keywords=tuple(kwarg_columns),
        keyed=unique_key is not None,
        batch_size=batch_size,
        # The key is read cast to a string, whatever the column's type (a TIMESTAMP as its UTC time).
        types=tuple(schema[name] for name in wanted[: len(wanted) - (unique_key is not None)])
        + ((StringType(),) if unique_key is not None else ()),
        instant_key=instant_key,
    )
    # Missing or older tables said before any executor writes: nothing was enqueued.
    if database_url is None:
        app.check_schema(beyond_tables=False)
    else:
        _check_tables(spec.url, spec.prefix)
    # A TIMESTAMP column is read as microseconds since 1970 (UTC), turned into its instant by the
    # executor: PySpark's own conversion goes through local time, which fails for the year 1.
    selected = [
        F.unix_micros(column(name)) if isinstance(schema[name], TimestampType) else column(name)
        for name in arg_columns + list(kwarg_columns.values())
    ]
    if unique_key is not None:
        selected.append(F.unix_micros(column(unique_key)) if instant_key else column(unique_key).cast("string"))
    rows = df.select(*selected).rdd
    return _settled(rows.context, task.name, lambda: int(rows.mapPartitions(spec.write).sum()))


def _check_tables(url: str, prefix: str) -> None:
    engine = create_engine(url)
    try:
        check_schema(engine, build_tables(prefix), beyond_tables=False)
    finally:
        engine.dispose()


# The errors of ours an executor may raise (a row over max_payload_bytes, tables missing), as the
# last line of the Python traceback that Spark's exception carries.
_EXECUTOR_ERRORS = {error.__name__: error for error in (ConfigurationError, SchemaError, SerializationError)}
_PYTHON_ERROR = re.compile(r"^jobqueue\.errors\.(\w+): (.+)$", re.MULTILINE)
SETTLE_SECONDS = 120.0


def _settled(context: SparkContext, task_name: str, write: Callable[[], int]) -> int:
    """Run ``write`` (a Spark job); if it fails, return only once every task of the job has ended.

    When one task fails, Spark fails the job at once but stops the tasks still running only a few
    seconds later: until then they go on committing batches. Waiting for them means the queue no
    longer changes once the error is raised. One of our errors from an executor is raised again as
    itself, saying what stays enqueued.
    """
    tracker = context.statusTracker()
    group = context.getLocalProperty("spark.jobGroup.id")
    before = set(tracker.getJobIdsForGroup(group))
    try:
        return write()
    except BaseException as exc:
        deadline = time.monotonic() + SETTLE_SECONDS
        while not (ended := _ended(tracker, set(tracker.getJobIdsForGroup(group)) - before)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)  # Spark offers no way to wait for killed tasks
        found = _PYTHON_ERROR.findall(str(exc)) if isinstance(exc, Exception) else []
        if not found or found[-1][0] not in _EXECUTOR_ERRORS:
            raise
        name, message = found[-1]
        still = "" if ended else f"; some of its Spark tasks still ran {SETTLE_SECONDS:.0f} s later, and may add more"
        raise _EXECUTOR_ERRORS[name](
            f"{message}. enqueue_dataframe stopped: the batches of {task_name} committed before stay enqueued "
            f"(with unique_key, running it again adds only the rest){still}"
        ) from exc


def _ended(tracker: Any, jobs: set[int]) -> bool:
    """Whether these Spark jobs are over and none of their tasks still runs."""
    infos = [tracker.getJobInfo(job) for job in jobs]
    if any(info is not None and info.status in ("RUNNING", "UNKNOWN") for info in infos):
        return False
    stages = [tracker.getStageInfo(stage) for info in infos if info is not None for stage in info.stageIds]
    return not any(stage is not None and stage.numActiveTasks for stage in stages)


def executor_url(url: str | sa.URL) -> str:
    """The URL as executors should see it: a relative SQLite path made absolute (their working
    directory may differ), the password kept (``str(URL)`` would mask it)."""
    return absolute_url(url).render_as_string(hide_password=False)


@dataclass(frozen=True)
class _EnqueueSpec:
    """What an executor needs to write its partition: picklable, no task object."""

    url: str = field(repr=False)  # holds the password
    prefix: str
    serializer: str
    max_payload_bytes: int
    task_name: str
    common: dict[str, Any]
    positional: int
    keywords: tuple[str, ...]
    keyed: bool
    batch_size: int
    types: tuple[DataType, ...]
    instant_key: bool = False  # the key column is a TIMESTAMP, read as it is

    def write(self, rows: Iterable[Row]) -> Iterator[int]:
        store = Store(create_engine(self.url), build_tables(self.prefix))
        serializer = get_serializer(self.serializer)
        converters = [_converter(data_type) for data_type in self.types]
        if self.instant_key:
            converters[-1] = lambda micros: utc_key(_instant(micros))
        inserted = 0
        try:
            iterator = iter(rows)
            while chunk := list(itertools.islice(iterator, self.batch_size)):
                payloads, keys = [], []
                for row in chunk:
                    values = [convert(value) for convert, value in zip(converters, row, strict=True)]
                    payloads.append(self._payload(serializer, values))
                    keys.append(self._key(values[-1]) if self.keyed else None)
                batch = Batch(self.common, payloads, keys)
                inserted += store.enqueue_new(batch) if self.keyed else len(store.enqueue_batch(batch))
        finally:
            store.dispose()
        yield inserted

    def _payload(self, serializer: Any, values: list[Any]) -> bytes:
        args = values[: self.positional]
        kwargs = dict(zip(self.keywords, values[self.positional : self.positional + len(self.keywords)], strict=False))
        try:
            payload = dumps_call(serializer, args, kwargs)
        except SerializationError as exc:
            raise SerializationError(f"task {self.task_name}: a row's {exc}") from None
        if len(payload) > self.max_payload_bytes:
            raise SerializationError(
                f"task {self.task_name}: a row's arguments serialize to {len(payload)} bytes, "
                f"over max_payload_bytes={self.max_payload_bytes}"
            )
        return payload

    def _key(self, key: Any) -> str:
        # The driver checked every key before Spark ran (check_keys): this is a second guard.
        return check_key(f"task {self.task_name}: unique_key", key)


def utc_key(value: datetime | None) -> str | None:
    """A TIMESTAMP key as Spark casts one to a string in a UTC session (``2024-11-03 05:00:00``,
    a fraction of a second without its trailing zeros), whatever the session's time zone.
    PySpark hands the instant over as naive local time, its fold set in a clock's repeated hour."""
    if value is None:
        return None
    at = value.astimezone(timezone.utc)
    text = f"{at.year:04d}-{at:%m-%d %H:%M:%S}"
    return f"{text}.{at.microsecond:06d}".rstrip("0") if at.microsecond else text


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _instant(micros: int | None) -> datetime | None:
    """A TIMESTAMP read as microseconds since 1970 (UTC), as an aware UTC datetime."""
    return None if micros is None else EPOCH + timedelta(microseconds=micros)


def _converter(data_type: DataType, top: bool = True) -> Callable[[Any], Any]:
    """How to turn a Spark value of ``data_type`` into what the serializer takes: structs as dicts,
    binary as bytes, and a TIMESTAMP (an instant) as an aware UTC datetime, at any depth: read as
    microseconds at the top (see enqueue_dataframe), handed over by PySpark as naive local time
    within a struct, an array or a map. TIMESTAMP_NTZ stays naive."""
    if isinstance(data_type, TimestampType):
        if top:
            return _instant
        return lambda value: value.astimezone(timezone.utc) if value is not None and value.tzinfo is None else value
    if isinstance(data_type, StructType):
        fields = [(field.name, _converter(field.dataType, False)) for field in data_type.fields]
        return lambda value: None if value is None else {name: convert(value[name]) for name, convert in fields}
    if isinstance(data_type, ArrayType):
        item = _converter(data_type.elementType, False)
        return lambda value: None if value is None else [item(v) for v in value]
    if isinstance(data_type, MapType):
        key, item = _hashable(_converter(data_type.keyType, False)), _converter(data_type.valueType, False)
        return lambda value: None if value is None else {key(k): item(v) for k, v in value.items()}
    if isinstance(data_type, BinaryType):
        return lambda value: None if value is None else bytes(value)
    return _same


def _same(value: Any) -> Any:
    return value


def _hashable(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A map key's converter: a struct or an array (a dict or a list once converted) as a tuple,
    at any depth, since a dict key must be hashable."""

    def frozen(value: Any) -> Any:
        if isinstance(value, dict):
            return tuple(frozen(item) for item in value.values())
        if isinstance(value, list):
            return tuple(frozen(item) for item in value)
        return value

    return lambda value: frozen(convert(value))
