"""Topics in the database: the log of published messages, consumer groups and their deliveries.

A published message is written once to the topic's log and, in the same transaction, as one
delivery per consumer group: a message row of the group's own task and queue, which the worker
runtime then acquires, leases, retries, dead-letters and archives like any job. So a group sees a
message exactly when the publishing transaction commits, one group's failures never touch
another's, and a delivery carries its own copy of the payload (a dead letter can be retried long
after the log has let the message go).

A delivery's unique key is its log id, zero-padded to 20 digits: unique per group (a group never
holds two deliveries of one message), and sorted as the ids are, so the oldest unfinished message
of a group is one probe of the (task, unique key) index. That gives each group's watermark, and
the log is trimmed below the lowest watermark.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError
from jobqueue.flow import NO_FLOW, partition_flow
from jobqueue.job import MessageState
from jobqueue.storage.dialects.common import READY_LITERALS
from jobqueue.storage.store import Store

DELIVERY_PREFIX = "topic:"
START_LATEST = "latest"
START_EARLIEST = "earliest"
ID_DIGITS = 20  # a BIGINT has at most 19 digits
COLLECT_BATCH = 5000  # log rows deleted per statement
COLLECT_MOST = 50_000  # log rows one collection deletes, per topic (the next one goes on)
UNREADABLE_KEYS_PAGE = 100  # delivery keys read at a time past one that holds no log id


def delivery_task(topic: str, group: str) -> str:
    """The task name (and queue) of a group's deliveries."""
    return f"{DELIVERY_PREFIX}{topic}:{group}"


def delivery_key(message_id: int) -> str:
    return str(message_id).zfill(ID_DIGITS)


def _log_id(key: str) -> int | None:
    """The log id a delivery's unique key holds, or None for text no delivery_key makes."""
    if len(key) == ID_DIGITS and key.isascii() and key.isdigit():
        return int(key)
    return None


def delivery_partition(topic: str, group: str, key: str) -> str:
    """A message key, as the partition key of a group's deliveries: ordered within the group only."""
    partition = f"{topic}:{group}:{key}"
    if len(partition) > 255:
        partition = f"{topic}:{group}:#" + hashlib.sha256(key.encode()).hexdigest()
    return partition


@dataclass(frozen=True)
class Published:
    """One message to publish: its serialized payload (as a call with the payload as its only
    argument), key and headers."""

    payload: bytes
    key: str | None
    headers: dict[str, Any] | None


def _delivery_rows(topic: str, groups: Sequence[str], logged: Iterable[Any], now: datetime) -> list[dict[str, Any]]:
    """The message rows that deliver the log rows ``logged`` (id, message_key, payload, headers,
    published_at) to ``groups``."""
    rows = []
    for group in groups:
        task = delivery_task(topic, group)
        for entry in logged:
            partition = None if entry.message_key is None else delivery_partition(topic, group, entry.message_key)
            rows.append(
                {
                    "task_name": task,
                    "queue": task,
                    "priority": 0,
                    "state": MessageState.PENDING.value,
                    "payload": entry.payload,
                    "headers": entry.headers,
                    "unique_key": delivery_key(entry.id),
                    "partition_key": partition,
                    **(partition_flow(partition) if partition is not None else NO_FLOW),
                    "options": None,
                    "attempts_count": 0,
                    "deliveries_count": 0,
                    "created_at": entry.published_at,
                    "next_attempt_at": now,
                }
            )
    return rows


def _spelled_otherwise(kind: str, name: str, stored: str) -> str:
    """Names compare exactly (on MySQL and MariaDB from schema 7), unless a name column's collation
    was changed by hand to one that ignores case: then two names would share one topic or group."""
    return (
        f"{kind} {name!r} is the {kind} {stored!r} on this database, which compares names regardless of "
        "case (a name column's collation was changed): give it a name that differs in more than case"
    )


def _registered(topic: str, group: str, row: Any) -> bool:
    """False: the group is registered already, under this spelling (an error under another)."""
    if row.topic != topic:
        raise ConfigurationError(_spelled_otherwise("topic", topic, row.topic))
    if row.group_name != group:
        raise ConfigurationError(_spelled_otherwise(f"topic {topic!r}: group", group, row.group_name))
    return False


@dataclass(frozen=True)
class _Logged:
    id: int
    message_key: str | None
    payload: bytes
    headers: dict[str, Any] | None
    published_at: datetime


class TopicStore:
    """The topic operations of one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.tables = store.tables
        self.dialect = store.dialect

    # -- publishing ----------------------------------------------------------------------------------
    def publish(self, topic: str, messages: Sequence[Published], connection: Any = None) -> list[int]:
        """Write ``messages`` to the log and deliver them to every group of ``topic``; their log ids."""
        t = self.tables.topic_message
        now = self.store.clock_now()
        with self.store.writing(connection) as conn:
            groups = self._groups_locked(conn, topic, now, exclusive=False)
            rows = [
                {"topic": topic, "message_key": m.key, "payload": m.payload, "headers": m.headers, "published_at": now}
                for m in messages
            ]
            ids = [i for page in self.dialect.row_pages(conn, rows) for i in self.dialect.insert_rows(conn, t, page)]
            if groups:
                logged = [_Logged(i, m.key, m.payload, m.headers, now) for i, m in zip(ids, messages, strict=True)]
                self._deliver(conn, topic, groups, logged, now)
        return ids

    def _groups_locked(
        self, conn: sa.Connection, topic: str, now: datetime, exclusive: bool, create: bool = True
    ) -> list[str] | None:
        """Lock the topic's row (creating it if new, or returning None unless ``create``) and
        return its groups.

        Publishers share the lock and a group being added takes it alone: so a publish sees either
        all of a new group's registration or none of it. The groups are read by a statement after
        the lock is held, which sees a registration that committed meanwhile.
        """
        tp, g = self.tables.topic, self.tables.topic_group
        lock = self._topic_lock(topic, exclusive)
        row = conn.execute(lock).first()
        if row is None and not create:
            return None
        if row is None:
            conn.execute(
                self.dialect.insert_ignoring(tp, [tp.c.name]),
                {"name": topic, "created_at": now, "groups_changed_at": now},
            )
            row = conn.execute(lock).first()
        if row is not None and row.name != topic:
            raise ConfigurationError(_spelled_otherwise("topic", topic, row.name))
        groups = sa.select(g.c.group_name).where(g.c.topic == topic).order_by(g.c.group_name)
        if self.dialect.snapshot_reads:
            # In a caller's REPEATABLE READ transaction that read before, a plain SELECT would see
            # the groups of that first read, missing one added since: a locking read sees it.
            groups = groups.with_for_update(read=True)
        return list(conn.execute(groups).scalars())

    def _topic_lock(self, topic: str, exclusive: bool) -> sa.Select[Any]:
        """The topic row's lock: shared by publishes and collections, taken alone by a group's change."""
        tp = self.tables.topic
        lock = sa.select(tp.c.name).where(tp.c.name == topic)
        return lock.with_for_update() if exclusive else lock.with_for_update(read=True, key_share=True)

    def _deliver(
        self,
        conn: sa.Connection,
        topic: str,
        groups: Sequence[str],
        logged: Sequence[Any],
        now: datetime,
        fresh: bool = True,
    ) -> None:
        """Insert the deliveries of ``logged`` to ``groups``. Not ``fresh`` (a new group's catch-up),
        a delivery already there is skipped."""
        rows = _delivery_rows(topic, groups, logged, now)
        flow_keys = {row["flow_key"] for row in rows if row["flow_key"] is not None}
        if flow_keys:
            self.dialect.hold_flow_keys(conn, flow_keys, now)
        for page in self.dialect.row_pages(conn, rows):
            if fresh:  # new log ids: nothing to skip, and no ids to read back
                conn.execute(sa.insert(self.tables.message), page)
            else:
                self.dialect.insert_new(conn, page)

    # -- groups ----------------------------------------------------------------------------------------
    def register(self, topic: str, group: str, start: str) -> bool:
        """Add ``group`` to ``topic`` unless it exists; True if it was added.

        A new "latest" group gets the messages published after this; an "earliest" one also every
        message the log still holds, delivered here in the same transaction.
        """
        g, t = self.tables.topic_group, self.tables.topic_message
        stored = sa.select(g.c.topic, g.c.group_name).where(g.c.topic == topic, g.c.group_name == group)
        with self.store.reading() as conn:
            exists = conn.execute(stored).first()
        if exists is not None:
            return _registered(topic, group, exists)
        now = self.store.clock_now()
        tp = self.tables.topic
        with self.store.writing() as conn:
            # The topic's row first, in a transaction of its own. Made in the one below, a
            # brand-new topic's row could deadlock two workers registering its groups at once on
            # MariaDB: the second one's INSERT IGNORE waits for the first's row and then holds a
            # shared lock on it, which its SELECT ... FOR UPDATE must upgrade, while the first,
            # registering its next group, already waits for an exclusive lock behind that shared
            # one. Created here, the row's first lock in the transaction below is its exclusive one.
            conn.execute(
                self.dialect.insert_ignoring(tp, [tp.c.name]),
                {"name": topic, "created_at": now, "groups_changed_at": now},
            )
        with self.store.writing() as conn, self.dialect.brief_lock_waits(conn):
            # Waits for publishes in progress; publishes that begin now wait for this to commit.
            # A moment at a time (the caller tries again): while this waits for a publishing
            # transaction left open, every later publish to the topic would queue behind it.
            self._groups_locked(conn, topic, now, exclusive=True)
            exists = conn.execute(stored).first()
            if exists is not None:
                return _registered(topic, group, exists)
            conn.execute(sa.update(tp).where(tp.c.name == topic).values(groups_changed_at=now))
            newest = conn.execute(sa.select(sa.func.max(t.c.id)).where(t.c.topic == topic)).scalar()
            finished = 0 if start == START_EARLIEST or newest is None else int(newest)
            conn.execute(
                sa.insert(g),
                {"topic": topic, "group_name": group, "start": start, "finished_id": finished, "created_at": now},
            )
            if start == START_EARLIEST:
                self._catch_up(conn, topic, group, now)
        return True

    def start_of(self, topic: str, group: str) -> str | None:
        """Where ``group`` of ``topic`` started when it was added ("latest" or "earliest"), or None
        if it is not there."""
        g = self.tables.topic_group
        with self.store.reading() as conn:
            return conn.execute(sa.select(g.c.start).where(g.c.topic == topic, g.c.group_name == group)).scalar()

    def _catch_up(self, conn: sa.Connection, topic: str, group: str, now: datetime) -> None:
        """Deliver every message the log holds to a new group, a page at a time."""
        t = self.tables.topic_message
        after = 0
        while True:
            page = conn.execute(
                sa.select(t.c.id, t.c.message_key, t.c.payload, t.c.headers, t.c.published_at)
                .where(t.c.topic == topic, t.c.id > after)
                .order_by(t.c.id)
                .limit(1000)
            ).all()
            if not page:
                return
            self._deliver(conn, topic, [group], page, now, fresh=False)
            after = page[-1].id

    def drop(self, topic: str, group: str) -> int:
        """Remove a group: its row and all its deliveries; return how many were waiting (-1: no
        such group).

        A delivery running now is deleted too: its handler goes on to its end, but nothing brings
        it back (neither a retry nor its lease's expiry, when its process dies) for a group that
        is gone; its outcome finds no row to write to, as a lost lease's."""
        g, m = self.tables.topic_group, self.tables.message
        task = delivery_task(topic, group)
        with self.store.writing() as conn:
            # A topic nobody published to or consumed is not made by a mistyped drop.
            if self._groups_locked(conn, topic, utcnow(), exclusive=True, create=False) is None:
                return -1
            gone = conn.execute(sa.delete(g).where(g.c.topic == topic, g.c.group_name == group)).rowcount
            if not gone:
                return -1
            deliveries = [m.c.task_name == task, m.c.unique_key.isnot(None)]
            waiting = conn.execute(sa.delete(m).where(*deliveries, m.c.state.in_(READY_LITERALS))).rowcount
            conn.execute(sa.delete(m).where(*deliveries))  # the running ones
            return int(waiting)

    # -- the log's garbage collection --------------------------------------------------------------------
    def collect(self) -> int:
        """Move every group's watermark up to its oldest unfinished message and delete the log's
        messages that every group has finished; return how many were deleted.

        A topic without groups keeps its messages (the first group may start from the earliest).
        The watermarks and the rows to delete are read in one snapshot, so a message published
        meanwhile, with its deliveries, is either seen whole or not at all.
        """
        tp = self.tables.topic
        with self.store.reading() as conn:
            topics = list(conn.execute(sa.select(tp.c.name).order_by(tp.c.name)).scalars())
        return sum(self._collect(topic) for topic in topics)

    def _collect(self, topic: str) -> int:
        g, t = self.tables.topic_group, self.tables.topic_message
        with self.store.snapshot() as conn:
            groups = conn.execute(sa.select(g.c.group_name, g.c.finished_id).where(g.c.topic == topic)).all()
            if not groups:
                return 0
            newest = conn.execute(sa.select(sa.func.max(t.c.id)).where(t.c.topic == topic)).scalar()
            marks = {}
            for group, finished in groups:
                oldest = self._oldest_unfinished(conn, delivery_task(topic, group))
                if oldest is not None:
                    marks[group] = oldest - 1
                else:
                    marks[group] = max(int(finished), int(newest or 0))
            horizon = min(marks.values())
            ids = list(
                conn.execute(
                    sa.select(t.c.id).where(t.c.topic == topic, t.c.id <= horizon).order_by(t.c.id).limit(COLLECT_MOST)
                ).scalars()
            )
        stored = dict(groups)
        moved = {group: mark for group, mark in marks.items() if mark != stored[group]}
        if not ids and not moved:
            return 0
        with self.store.writing() as conn:
            # A new "earliest" group reads the log a page at a time under the topic's lock taken
            # alone: this waits for it, so it never loses the pages it has not read yet. (A group
            # added since the snapshot above has its own copies of the messages it was given.)
            conn.execute(self._topic_lock(topic, exclusive=False))
            for group, mark in moved.items():
                conn.execute(sa.update(g).where(g.c.topic == topic, g.c.group_name == group).values(finished_id=mark))
            for start in range(0, len(ids), COLLECT_BATCH):
                conn.execute(sa.delete(t).where(t.c.id.in_(ids[start : start + COLLECT_BATCH])))
        return len(ids)

    def _oldest_unfinished(self, conn: sa.Connection, task: str) -> int | None:
        """The log id of the group's oldest unfinished delivery (its unique key, the id zero-padded
        so that text order is id order), or None if it has none.

        A key that holds no log id (edited by hand) is passed over: that delivery keeps its own
        copy of the payload, so it needs nothing of the log, and the others go on being trimmed.
        """
        m = self.tables.message
        keys = sa.select(m.c.unique_key).where(m.c.task_name == task, m.c.unique_key.isnot(None))
        after, most = None, 1  # the oldest key alone, unless it holds no log id
        while True:
            page = keys if after is None else keys.where(m.c.unique_key > after)
            found = list(conn.execute(page.order_by(m.c.unique_key).limit(most)).scalars())
            for key in found:
                if (log_id := _log_id(key)) is not None:
                    return log_id
            if len(found) < most:
                return None
            after, most = found[-1], UNREADABLE_KEYS_PAGE

    # -- what the CLI shows ---------------------------------------------------------------------------------
    def stats(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """Per topic and group: lag, in flight, retrying, dead letters, oldest unfinished age, kept."""
        now = now or self.store.clock_now()
        tp, g, t, m, a = (
            self.tables.topic,
            self.tables.topic_group,
            self.tables.topic_message,
            self.tables.message,
            self.tables.archive,
        )
        entries = []
        with self.store.reading() as conn:
            kept: dict[str, int] = dict(conn.execute(sa.select(t.c.topic, sa.func.count()).group_by(t.c.topic)).all())
            groups: dict[str, list[Any]] = {
                topic: [] for topic in conn.execute(sa.select(tp.c.name).order_by(tp.c.name)).scalars()
            }
            for row in conn.execute(sa.select(g).order_by(g.c.topic, g.c.group_name)).mappings():
                groups.setdefault(row["topic"], []).append(row)
            for topic, rows in groups.items():
                if not rows:  # a topic no group reads yet: every field a group's row has, empty
                    entries.append(
                        {
                            "topic": topic,
                            "group": None,
                            "start": None,
                            "lag": 0,
                            "in_flight": 0,
                            "retrying": 0,
                            "dead_letters": 0,
                            "oldest_unfinished_seconds": None,
                            "watermark": None,
                            "kept": int(kept.get(topic, 0)),
                            "queue": None,
                        }
                    )
                for row in rows:
                    task = delivery_task(topic, row["group_name"])
                    counts = dict.fromkeys(("PENDING", "PROCESSING", "RETRYABLE"), 0)
                    oldest = None
                    for state, count, first in conn.execute(
                        sa.select(m.c.state, sa.func.count(), sa.func.min(m.c.created_at))
                        .where(m.c.task_name == task, m.c.unique_key.isnot(None))
                        .group_by(m.c.state)
                    ):
                        counts[state] = int(count)
                        oldest = first if oldest is None else min(oldest, first)
                    dead = conn.execute(
                        sa.select(sa.func.count()).where(
                            a.c.task_name == task,
                            a.c.unique_key.isnot(None),
                            a.c.state == MessageState.FAILED.value,
                        )
                    ).scalar()
                    entries.append(
                        {
                            "topic": topic,
                            "group": row["group_name"],
                            "start": row["start"],
                            "lag": sum(counts.values()),
                            "in_flight": counts["PROCESSING"],
                            "retrying": counts["RETRYABLE"],
                            "dead_letters": int(dead or 0),
                            "oldest_unfinished_seconds": None
                            if oldest is None
                            else max(0.0, (now - oldest).total_seconds()),
                            "watermark": int(row["finished_id"]),
                            "kept": int(kept.get(topic, 0)),
                            "queue": task,
                        }
                    )
        return entries
