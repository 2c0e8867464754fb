"""Tasks: registered functions, their options (checked when the decorator runs) and enqueueing."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobqueue.ack import AckPolicy
from jobqueue.clock import to_naive_utc
from jobqueue.context import JobContext, activate, deactivate, from_now
from jobqueue.errors import ConfigurationError, SerializationError
from jobqueue.flow import NO_FLOW, Flow, check_encodable, shown
from jobqueue.handle import JobHandle
from jobqueue.job import Batch, MessageState
from jobqueue.retry import RetryStrategy, storable
from jobqueue.serialization import dumps_call
from jobqueue.settings import validate_queue_name
from jobqueue.storage.topics import DELIVERY_PREFIX
from jobqueue.task_options import TaskOptions, call_checker, validate_priority

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

BULK_BATCH_SIZE = 1000


class Task:
    """A registered function. Call it to run inline; ``delay``/``apply_async``/``bulk`` to enqueue."""

    def __init__(self, app: JobQueue, fn: Callable[..., Any], options: TaskOptions) -> None:
        self.app = app
        self.fn = fn
        self.options = options
        self.name = options.name
        self.flow = Flow.of(options.name, options.concurrency_key, options.concurrency_limit, options.rate_limit)
        self.checker = call_checker(fn, options.bind, options.name)
        # An async def function: the worker runs its coroutine on the process's event loop.
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here and now, like a plain call (a bound task gets an inline context).

        An ``async def`` task returns its coroutine, as the plain function would.
        """
        if not self.options.bind:
            return self.fn(*args, **kwargs)
        context = JobContext(None, self.app.serializer)
        if self.is_async:
            return _bound_coroutine(self.fn, context, args, kwargs)
        token = activate(context)
        try:
            return self.fn(context, *args, **kwargs)
        finally:
            deactivate(token)

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    @property
    def queue(self) -> str:
        return self.options.queue or self.app.settings.default_queue

    def check_call(self, args: Sequence[Any], kwargs: dict[str, Any], item: int | None = None) -> None:
        """Raise TypeError, naming the task, unless the function could be called with these arguments."""
        if self.checker is None:
            return
        try:
            self.checker(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{_item(item)}task {self.name}: {exc}; nothing was enqueued") from None

    def delay(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Enqueue a call with these arguments now."""
        return self.apply_async(args, kwargs)

    def apply_at(self, when: datetime, *args: Any, **kwargs: Any) -> JobHandle:
        """Enqueue a call that runs at ``when`` (a naive datetime is UTC)."""
        return self.apply_async(args, kwargs, eta=when)

    def apply_async(
        self,
        args: Sequence[Any] | None = (),
        kwargs: dict[str, Any] | None = None,
        *,
        eta: datetime | None = None,
        countdown: float | None = None,
        queue: str | None = None,
        priority: int | None = None,
        headers: dict[str, Any] | None = None,
        unique_key: str | None = None,
        partition_key: str | None = None,
        retry_strategy: RetryStrategy | None = None,
        connection: Any = None,
    ) -> JobHandle:
        """Enqueue a call with options; with ``connection`` it is written in that transaction, uncommitted."""
        self._refuse_if_deliveries()
        now = self.app.store.clock_now()  # first: a countdown counts from the corrected clock too
        options = self._call_options(
            eta, countdown, queue, priority, headers, unique_key, partition_key, retry_strategy
        )
        args = () if args is None else args  # as Celery takes it
        kwargs = {} if kwargs is None else kwargs
        if isinstance(args, (tuple, list)) and isinstance(kwargs, dict):
            self.check_call(args, kwargs)
        row = self._row(args, kwargs, options, now)
        found: list[int] = []  # [0] when an active job holds the unique key: nothing was added
        if connection is None and self.app.framework is None:
            # Our own transaction, the common case: straight to the store (no context to enter).
            job_id = self.app.store.enqueue([row], found=found)[0]
            return JobHandle(self.app, job_id, existing=bool(found))
        # A job without a unique or concurrency key is one INSERT, on most databases.
        plain = row.get("unique_key") is None and row.get("flow_key") is None
        one_statement = plain and self.app.store.dialect.one_statement_insert
        with self.app.enqueue_connection(connection, one_statement=one_statement) as conn:
            job_id = self.app.store.enqueue([row], connection=conn, found=found)[0]
            return JobHandle(self.app, job_id, self.app.commit_watch(connection, conn), existing=bool(found))

    def bulk(
        self,
        items: Iterable[Sequence[Any] | dict[str, Any]],
        *,
        batch_size: int = BULK_BATCH_SIZE,
        eta: datetime | None = None,
        countdown: float | None = None,
        queue: str | None = None,
        priority: int | None = None,
        headers: dict[str, Any] | None = None,
        unique_key: Callable[[Any], str | None] | Sequence[str | None] | None = None,
        partition_key: str | None = None,
        retry_strategy: RetryStrategy | None = None,
        connection: Any = None,
    ) -> list[JobHandle]:
        """Enqueue one job per item (a tuple of positional args, or a dict of kwargs).

        Each batch of ``batch_size`` is one round trip; handles come back in input order. A bad
        item raises SerializationError and writes nothing: items are serialized before anything is
        sent, except on PostgreSQL with psycopg2 outside a transaction of yours, where all rows
        stream in one COPY and a bad item aborts it (nothing is committed). ``unique_key`` is a
        function of the item or a list with one key per item (None: no key for that item).
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigurationError(f"batch_size must be an integer of at least 1, got {batch_size!r}")
        if isinstance(unique_key, str):
            raise ConfigurationError(
                "one unique_key for a whole bulk() would make every item the same job; pass "
                "a function of the item, or a list with one key per item"
            )
        common = self.common_row(
            eta=eta,
            countdown=countdown,
            queue=queue,
            priority=priority,
            headers=headers,
            partition_key=partition_key,
            retry_strategy=retry_strategy,
        )
        items = list(items)
        keys = self._bulk_keys(items, unique_key)
        if self.flow.per_call:
            return self._bulk_by_flow_key(items, keys, common, batch_size, connection)
        # Payloads are serialized as the store reads them: all before anything is sent, or, where
        # the database streams a bulk of its own (PostgreSQL's COPY), while it parses the rows before.
        batch = Batch(common, _Payloads(self, items), keys)
        found: list[int] = []  # indexes of the items whose unique key an active job held
        with self.app.enqueue_connection(connection) as given:
            ids = self.app.store.enqueue_bulk(batch, batch_size, given, found)
            watch = self.app.commit_watch(connection, given)
        existing = set(found)
        return [JobHandle(self.app, job_id, watch, existing=i in existing) for i, job_id in enumerate(ids)]

    def _bulk_by_flow_key(
        self,
        items: list[Any],
        keys: list[str | None],
        common: dict[str, Any],
        batch_size: int,
        connection: Any,
    ) -> list[JobHandle]:
        """A bulk whose concurrency key depends on each item: one batch per key, in one transaction."""
        groups: dict[str | None, list[int]] = {}
        for index, item in enumerate(items):
            args, kwargs = _item_call(item, index)
            # The call first, as delay() does: arguments the task cannot take are a TypeError,
            # not a failure of the key function that cannot take them either.
            self.check_call(args, kwargs, index)
            try:
                key = self.flow.key_for(args, kwargs)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{_item(index)}{exc}; nothing was enqueued") from exc
            groups.setdefault(key, []).append(index)
        ids: list[int] = [0] * len(items)
        existing: set[int] = set()
        with self.app.enqueue_connection(connection) as given, self.app.store.writing(given) as conn:
            for key, indexes in groups.items():
                batch = Batch(
                    {**common, **self.flow.columns(key, common["partition_key"])},
                    _Payloads(self, [items[i] for i in indexes], indexes),
                    [keys[i] for i in indexes],
                )
                found: list[int] = []
                for index, new_id in zip(
                    indexes, self.app.store.enqueue_bulk(batch, batch_size, conn, found), strict=True
                ):
                    ids[index] = new_id
                existing.update(indexes[i] for i in found)
            watch = self.app.commit_watch(connection, given)
        return [JobHandle(self.app, job_id, watch, existing=i in existing) for i, job_id in enumerate(ids)]

    def _bulk_payload(self, item: Any, index: int) -> bytes:
        args, kwargs = _item_call(item, index)
        self.check_call(args, kwargs, index)
        return self._payload(args, kwargs, index)

    def common_row(
        self,
        *,
        eta: datetime | None = None,
        countdown: float | None = None,
        queue: str | None = None,
        priority: int | None = None,
        headers: dict[str, Any] | None = None,
        partition_key: str | None = None,
        retry_strategy: RetryStrategy | None = None,
    ) -> dict[str, Any]:
        """The columns every job of one bulk enqueue shares (``Batch.common``), options checked."""
        self._refuse_if_deliveries()
        now = self.app.store.clock_now()  # first: a countdown counts from the corrected clock too
        options = self._call_options(eta, countdown, queue, priority, headers, None, partition_key, retry_strategy)
        return self._row((), {}, options, now, per_call=False)

    def _refuse_if_deliveries(self) -> None:
        """A consumer group's task runs the deliveries made from its topic's log: a job enqueued
        through it is no message of the topic (no other group gets it, `jobqueue topics` does not
        count it, dropping the group leaves it to run)."""
        if self.name.startswith(DELIVERY_PREFIX):
            topic = self.name[len(DELIVERY_PREFIX) :].partition(":")[0]
            raise ConfigurationError(
                f"{self.name!r} is what a consumer group runs for each message published to a topic: publish "
                f"the message to the topic instead (app.topic({topic!r}).publish(payload)); nothing was enqueued"
            )

    @staticmethod
    def _bulk_keys(items: list[Any], unique_key: Any) -> list[str | None]:
        if unique_key is None:
            return [None] * len(items)
        keys = [unique_key(item) for item in items] if callable(unique_key) else list(unique_key)
        if len(keys) != len(items):
            raise ConfigurationError(f"unique_key lists {len(keys)} keys for {len(items)} items; give one per item")
        for index, key in enumerate(keys):
            if key is not None:
                check_key(f"unique_key of item {index}", key)
        return keys

    def _call_options(
        self,
        eta: datetime | None,
        countdown: float | None,
        queue: str | None,
        priority: int | None,
        headers: dict[str, Any] | None,
        unique_key: str | None,
        partition_key: str | None,
        retry_strategy: RetryStrategy | None,
    ) -> dict[str, Any]:
        if eta is not None and countdown is not None:
            raise ConfigurationError("give eta or countdown, not both")
        if eta is not None and not isinstance(eta, datetime):
            raise ConfigurationError(f"eta must be a datetime, got {type(eta).__name__}")
        try:
            when = to_naive_utc(eta) if eta is not None else None
        except OverflowError:
            raise ConfigurationError(
                f"eta {eta!r} is out of range once converted to UTC; give a time between the years 1 and 9999 in UTC"
            ) from None
        if countdown is not None:
            when = from_now("countdown", countdown)
        if headers is not None:
            check_headers(headers, self.app.settings.max_payload_bytes)
        for label, key in (("unique_key", unique_key), ("partition_key", partition_key)):
            if key is not None:
                check_key(label, key)
        if partition_key is not None and partition_key.count(":") >= 2 and self.app.consumers:
            topic, group, message_key = partition_key.split(":", 2)
            if (topic, group) in self.app.consumers:
                # The partition the group orders its messages of that key by: the two would share one order.
                raise ConfigurationError(
                    f"partition_key {partition_key!r} is the partition consumer group {group!r} of topic "
                    f"{topic!r} keeps its messages of key {message_key!r} in; give the task's jobs another "
                    "partition key"
                )
        if partition_key is not None and self.options.ack_policy is AckPolicy.ACK_FIRST:
            raise ConfigurationError(
                f"task {self.name} acks first (ack_policy=ACK_FIRST): each job is completed before it runs, "
                "which ends its turn in its partition at once, so the key's next job would run alongside it; "
                "enqueue it without partition_key, or give the task another ack policy"
            )
        if retry_strategy is not None and not isinstance(retry_strategy, RetryStrategy):
            raise ConfigurationError("retry_strategy must be a strategy from jobqueue.retry")
        if retry_strategy is not None and not storable(retry_strategy):
            # A per-call strategy travels with the job as data, and a worker rebuilds only its own
            # kinds (it never imports a class named in the database).
            raise ConfigurationError(
                f"a per-call retry_strategy must be one of jobqueue.retry's strategies, got "
                f"{type(retry_strategy).__name__}; give a strategy of your own to @app.task(retry_strategy=...)"
            )
        return {
            "queue": validate_queue_name(queue) if queue is not None else self.queue,
            "priority": validate_priority(priority) if priority is not None else self.options.priority,
            "headers": headers,
            "unique_key": unique_key,
            "partition_key": partition_key,
            "eta": when,
            "options": {"retry": retry_strategy.to_dict()} if retry_strategy is not None else None,
        }

    def _payload(self, args: Sequence[Any], kwargs: dict[str, Any], item: int | None = None) -> bytes:
        if not isinstance(args, (tuple, list)):
            raise SerializationError(f"{_item(item)}args must be a tuple or list, got {type(args).__name__}")
        return stored_call(self.app, f"{_item(item)}task {self.name}", "arguments", args, kwargs)

    def _row(
        self, args: Sequence[Any], kwargs: dict[str, Any], options: dict[str, Any], now: datetime, per_call: bool = True
    ) -> dict[str, Any]:
        """A message row; without ``per_call`` (the row a bulk's rows share) a flow key that depends
        on the arguments is left for each row to set."""
        payload = self._payload(args, kwargs)
        flow = NO_FLOW
        if not self.flow.enabled:
            flow = self.flow.columns(None, options["partition_key"])
        elif per_call or not self.flow.per_call:
            flow = self.flow.columns(self.flow.key_for(args, kwargs), options["partition_key"])
        return {
            "task_name": self.name,
            "queue": options["queue"],
            "priority": options["priority"],
            "state": MessageState.PENDING.value,
            "payload": payload,
            "headers": options["headers"],
            "unique_key": options["unique_key"],
            "partition_key": options["partition_key"],
            **flow,
            "options": options["options"],
            "attempts_count": 0,
            "deliveries_count": 0,
            "created_at": now,
            "next_attempt_at": options["eta"] or now,
        }


async def _bound_coroutine(
    fn: Callable[..., Any], context: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """An inline call of a bound async task: its context is current while the coroutine runs."""
    token = activate(context)
    try:
        return await fn(context, *args, **kwargs)
    finally:
        deactivate(token)


def stored_call(
    app: JobQueue,
    where: str,
    what: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    first_arg: str | None = None,
) -> bytes:
    """A call serialized for a row, within ``max_payload_bytes``; errors begin with ``where``, and
    name the first argument ``first_arg`` if given (a topic's payload)."""
    try:
        payload = dumps_call(app.serializer, args, kwargs)
    except SerializationError as exc:
        said = str(exc)
        if first_arg is not None and said.startswith("args[0]"):
            said = first_arg + said[len("args[0]") :]
        raise SerializationError(f"{where}: {said}") from None
    limit = app.settings.max_payload_bytes
    if len(payload) > limit:
        raise SerializationError(
            f"{where}: {what} serialize to {len(payload)} bytes, over max_payload_bytes={limit}; store large "
            "data elsewhere and pass a reference (or raise max_payload_bytes)"
        )
    return payload


def check_key(label: str, key: Any, longest: int = 255) -> str:
    """A unique or partition key: 1 to ``longest`` characters that every database can store."""
    if not isinstance(key, str) or not 0 < len(key) <= longest:
        raise ConfigurationError(f"{label} must be a string of 1 to {longest} characters, got {shown(key)}")
    if "\x00" in key:
        raise ConfigurationError(
            f"{label} must not contain NUL characters (PostgreSQL cannot store them), got {shown(key)}"
        )
    check_encodable(label, key)
    return key


def check_headers(headers: Any, limit: int) -> None:
    """Headers are stored as a JSON object: string keys, and values JSON carries unchanged, in
    all at most ``limit`` bytes (max_payload_bytes, as the arguments)."""
    if not isinstance(headers, dict) or not all(isinstance(key, str) for key in headers):
        raise ConfigurationError("headers must be a dict with string keys")
    size = 2
    for key, value in headers.items():
        try:
            size += len(json.dumps({key: value}, allow_nan=False, ensure_ascii=False).encode("utf-8"))
        except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
            kind = type(value).__name__
            raise ConfigurationError(
                f"headers[{key!r}]: a {kind} cannot be stored as a JSON header value ({exc}); "
                "use strings, numbers, booleans, None, lists and dicts of them"
            ) from None
    if size > limit:
        raise SerializationError(
            f"headers serialize to about {size} bytes, over max_payload_bytes={limit}: keep headers to "
            "small values (ids, trace context) and pass data as arguments, or a reference to it"
        )
    for key, value in headers.items():
        if _nesting(value) > HEADER_NESTING_MOST - 1:
            raise ConfigurationError(
                f"headers[{key!r}] nests lists and dicts more than {HEADER_NESTING_MOST} deep, the headers "
                "dict counted (MariaDB's JSON columns refuse more, so no database takes it): flatten it, or "
                "pass it as an argument"
            )


# Levels of lists and dicts a stored header may have, the headers dict counted.
HEADER_NESTING_MOST = 31


def _nesting(value: Any) -> int:
    """How many levels of lists and dicts ``value`` has (0 for a scalar); stops counting past the
    headers' limit, so that a deep value costs no more than that."""
    depth, level = 0, [value]
    while depth < HEADER_NESTING_MOST:
        containers = [item for item in level if isinstance(item, (list, dict))]
        if not containers:
            break
        depth += 1
        level = [inner for item in containers for inner in (item.values() if isinstance(item, dict) else item)]
    return depth


def _item(index: int | None) -> str:
    """Where a bulk() error happened: "item 3: " (nothing for a single call)."""
    return "" if index is None else f"item {index}: "


def _item_call(item: Any, index: int) -> tuple[tuple[Any, ...] | list[Any], dict[str, Any]]:
    """A bulk item as the call's (args, kwargs)."""
    if isinstance(item, dict):
        return (), item
    if isinstance(item, (tuple, list)):
        return item, {}
    raise SerializationError(
        f"bulk item {index} is a {type(item).__name__}: give a tuple of "
        "positional arguments (for one argument: (value,)) or a dict of kwargs"
    )


class _Payloads(Sequence[bytes]):
    """A bulk's payloads, serialized when read (the streamed bulk path reads them once, in order)."""

    def __init__(self, task: Task, items: list[Any], positions: Sequence[int] | None = None) -> None:
        self.task = task
        self.items = items
        # where each item stands in the caller's bulk() (a per-key group takes some of them), for errors
        self.positions = range(len(items)) if positions is None else positions

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self.items)))]
        return self.task._bulk_payload(self.items[index], self.positions[index])

    def __iter__(self) -> Iterator[bytes]:
        # _bulk_payload unrolled: per item, only what differs from one item to the next (the
        # error messages are made when there is an error). For 20,000 items this took a third
        # of the client's time of a bulk() on PostgreSQL.
        task = self.task
        serializer, limit, check = task.app.serializer, task.app.settings.max_payload_bytes, task.check_call
        for index, item in zip(self.positions, self.items, strict=True):
            args, kwargs = _item_call(item, index)
            check(args, kwargs, index)
            try:
                payload = dumps_call(serializer, args, kwargs)
            except SerializationError:
                payload = b""
            if not payload or len(payload) > limit:
                payload = task._payload(args, kwargs, index)  # raises, saying where and why
            yield payload
