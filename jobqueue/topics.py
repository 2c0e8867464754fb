"""Topics with consumer groups: publish once, every group gets every message.

``app.topic("orders").publish(payload, key=...)`` writes the message to the topic's log and one
delivery per consumer group, in the caller's transaction when given one. ``@app.consumer("orders",
group="billing")`` registers the group's handler; the worker runs each group's deliveries through
the same runtime as tasks (leases, heartbeats, retries, dead letters), so every group keeps its own
delivery state. Messages with the same key reach a group in publish order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobqueue.errors import ConfigurationError
from jobqueue.settings import names_given
from jobqueue.storage.topics import START_EARLIEST, START_LATEST, Published, delivery_task
from jobqueue.task import Task, check_headers, check_key, stored_call
from jobqueue.task_options import build_options, origin

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,39}$")  # the delivery queue "topic:<t>:<g>" fits in 100
CONSUMER_OPTIONS = ("retry_strategy", "retry_on", "ack_policy", "timeout", "soft_timeout", "max_deliveries", "bind")
PUBLISH_BATCH_SIZE = 1000


def validate_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigurationError(
            f"invalid {kind} name {name!r}: use 1 to 40 letters, digits, '_', '.' or '-', starting with a letter "
            "or digit"
        )
    return name


class Topic:
    """A named topic of one app: publish messages that every consumer group of it receives."""

    def __init__(self, app: JobQueue, name: str) -> None:
        self.app = app
        self.name = validate_name("topic", name)

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    def publish(
        self, payload: Any, key: str | None = None, headers: dict[str, Any] | None = None, connection: Any = None
    ) -> int:
        """Publish one message; return its id in the topic's log.

        With ``connection`` (an SQLAlchemy Connection or Session) it is written in that transaction
        and reaches the groups only if it commits. ``key``: messages with the same key reach each
        group in publish order.
        """
        message = self._message(payload, key, headers)
        with self.app.enqueue_connection(connection) as conn:
            return self.app.topic_store.publish(self.name, [message], conn)[0]

    def publish_many(
        self,
        payloads: Iterable[Any],
        key: str | Callable[[Any], str | None] | None = None,
        headers: dict[str, Any] | None = None,
        connection: Any = None,
        batch_size: int = PUBLISH_BATCH_SIZE,
    ) -> list[int]:
        """Publish several messages, all or nothing; their log ids in input order.

        ``key`` is None, one key for all, or a function of each payload returning its key. Every
        payload is serialized before anything is written; each batch is one round trip per table.
        """
        if batch_size < 1:
            raise ConfigurationError("batch_size must be >= 1")
        messages = []
        for index, payload in enumerate(payloads):
            message_key = _key_of(key, payload, index) if callable(key) else key
            messages.append(self._message(payload, message_key, headers, index))
        if not messages:
            return []
        ids: list[int] = []
        with self.app.enqueue_connection(connection) as given, self.app.store.writing(given) as conn:
            for start in range(0, len(messages), batch_size):
                ids.extend(self.app.topic_store.publish(self.name, messages[start : start + batch_size], conn))
        return ids

    def _message(self, payload: Any, key: Any, headers: Any, index: int | None = None) -> Published:
        where = "" if index is None else f"message {index}: "
        if key is not None:
            if isinstance(key, int) and not isinstance(key, bool):
                key = str(key)
            check_key(f"{where}key", key)
        if headers is not None:
            check_headers(headers, self.app.settings.max_payload_bytes)
        data = stored_call(
            self.app, f"{where}topic {self.name}", "the payload and its envelope", (payload,), {}, first_arg="payload"
        )
        return Published(data, key, headers)


def _key_of(key: Callable[[Any], Any], payload: Any, index: int) -> Any:
    """A message's key from the function of payloads ``key``; its failure says which message."""
    try:
        return key(payload)
    except Exception as exc:
        raise ConfigurationError(
            f"message {index}: the key function failed on its payload: {exc!r}; nothing was published"
        ) from exc


@dataclass(frozen=True)
class Consumer:
    """A consumer group's handler: the group ``group`` of ``topic``, run as the task ``task``."""

    topic: str
    group: str
    start: str
    task: Task

    @property
    def queue(self) -> str:
        return self.task.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the handler here and now, like a plain call."""
        return self.task(*args, **kwargs)


def check_consumer(topic: Any, group: Any, start: Any, options: dict[str, Any]) -> None:
    """The arguments of ``@app.consumer(...)``, checked when it is written (not when it decorates)."""
    validate_name("topic", topic)
    validate_name("group", group)
    if start not in (START_LATEST, START_EARLIEST):
        raise ConfigurationError(f"start must be {START_LATEST!r} or {START_EARLIEST!r}, got {start!r}")
    unknown = sorted(set(options) - set(CONSUMER_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"@app.consumer does not take {', '.join(unknown)}; it takes {', '.join(CONSUMER_OPTIONS)} "
            "(a group's deliveries have their own queue, and keep the order of their keys)"
        )


def make_consumer(
    app: JobQueue, fn: Callable[..., Any], topic: str, group: str, start: str, options: dict[str, Any]
) -> Consumer:
    check_consumer(topic, group, start, options)
    name = delivery_task(topic, group)
    task = Task(app, fn, build_options(fn, {**options, "name": name, "queue": name}, reserved_ok=True))
    if task.checker is not None:
        try:
            task.checker(None)  # a handler is called with the message's payload, and nothing else
        except TypeError as exc:
            raise ConfigurationError(
                f"consumer {origin(fn)} of topic {topic!r}, group {group!r}, cannot be called with the message's "
                f"payload alone ({exc}): it takes one argument (after the context, with bind=True)"
            ) from None
    return Consumer(topic, group, start, task)


def parse_groups(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """``"billing,orders:audit"`` as a tuple; None or empty means every group of the app."""
    if value is None:
        return None
    items = names_given("groups", value)
    groups = tuple(dict.fromkeys(item.strip() for item in items if item.strip()))
    return groups or None


def served_consumers(consumers: Iterable[Consumer], groups: tuple[str, ...] | None) -> list[Consumer]:
    """The consumers a worker runs: all, or those ``groups`` names ("group" or "topic:group")."""
    consumers = list(consumers)
    if groups is None:
        return consumers
    chosen = [c for c in consumers if c.group in groups or f"{c.topic}:{c.group}" in groups]
    named = {c.group for c in chosen} | {f"{c.topic}:{c.group}" for c in chosen}
    unknown = [g for g in groups if g not in named]
    if unknown:
        known = ", ".join(sorted(f"{c.topic}:{c.group}" for c in consumers)) or "none"
        raise ConfigurationError(
            f"--groups names {', '.join(unknown)}, which this app has no consumer for (its groups: {known})"
        )
    return chosen
