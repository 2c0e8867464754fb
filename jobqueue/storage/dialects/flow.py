"""Acquiring messages that have a flow key: partitions, concurrency limits, rate limits, keys
served in turn.

Messages without a flow key are acquired by the one-statement walk of the ready index. Those with
one are acquired here, key by key, in one short transaction:

1. Up to ``KEYS_PER_ACQUIRE`` keys with ready messages whose rate allows a start now, the keys
   served longest ago first (so every key gets its turn, however many jobs another one has). A
   partition's key has work when its oldest job is ready: one probe, however long its queue.
2. Their flow rows are locked, skipping those another worker holds (as they are found, where the
   database locks only the rows it returns): while a worker holds a key, nobody else acquires its
   messages, so what it reads next cannot change under it.
3. Each key's candidates are read in one statement, as many as its fair share of the batch: a
   partition's oldest jobs in enqueue order, another key's ready messages in delivery order.
4. Each key takes what its limits allow. A partition takes the run of its oldest jobs that are
   all ready (none while one of them runs, retries or waits), and the worker runs them in that
   order, one at a time, handing the rest back if one of them does not finish for good. Another
   key takes its concurrency limit minus those running (counted now), and the starts its rate
   allows since its last one (spaced ``1/rate`` apart, one interval of slack so that a late
   worker does not lose the rate). The key's row records when it was served and, with a rate,
   when its next start is allowed.

Steps 3 and 4 are one statement on PostgreSQL when every key locked is a partition's (none has a
limit or a rate): the database reads the runs, takes them and marks the keys served.

A slot is a PROCESSING row, so every outcome, expired lease and dead process frees it: there is
no counter that a crash could leave wrong. Times of the flow rows are read from the lease clock
(the database server's, where it has one), so that skewed hosts share one rate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.sql.util import ClauseAdapter

from jobqueue.flow import HASHED_PARTITION_LENGTH, PARTITION_KEY_PREFIX, partition_flow, rate_horizon
from jobqueue.job import Message
from jobqueue.storage.dialects.common import (
    PROCESSING,
    READY_LITERALS,
    AcquireParams,
    delivery_order,
    first_of_partition,
)
from jobqueue.storage.readable import as_stored, stored_time
from jobqueue.storage.tables import Timestamp

if TYPE_CHECKING:
    from jobqueue.storage.dialects.base import Dialect

KEYS_PER_ACQUIRE = 64


@dataclass
class FlowAcquired:
    messages: list[Message] = field(default_factory=list)
    # Seconds until a key with ready messages, held back by its rate, may start the next one (by
    # the database's clock: this host's may be skewed).
    due_in: float | None = None


def is_partition(key: str) -> bool:
    return key.startswith(PARTITION_KEY_PREFIX)


def in_partition_order(messages: list[Message]) -> list[Message]:
    """``messages`` (in delivery order) in the order a worker runs them: each partition's in
    enqueue order, and in rounds: first the other messages and each partition's oldest, then each
    partition's second, and so on, partitions in the order of their first place. A worker writes a
    partition's outcome before it starts the partition's next job: in rounds, one write serves a
    job of every partition."""
    place: dict[int, int] = {}
    turn: dict[int, int] = {}
    runs: dict[str, list[Message]] = {}
    first: dict[str, int] = {}
    for number, message in enumerate(messages):
        key = message.partition
        if key is None:
            place[message.id] = number
        else:
            runs.setdefault(key, []).append(message)
            first.setdefault(key, number)
    for key, run in runs.items():
        for number, message in enumerate(sorted(run, key=lambda m: m.id)):
            place[message.id], turn[message.id] = first[key], number
    return sorted(messages, key=lambda m: (turn.get(m.id, 0), place[m.id]))


def partition_run(candidates: list[Any], share: int) -> list[Any]:
    """The jobs of a partition that may be taken, from its candidates in id order (``share`` + 1
    of them at most): the run of its oldest jobs that are ready, up to ``share`` of them, and none
    while a job of the partition runs. A running job is normally the oldest; an older one comes
    back while it runs when a dead letter of the key is retried, or when an enqueue of the key
    commits after a later one of the key was taken (overlapping transactions on PostgreSQL). The
    older one waits for it to end: one job of a key at a time. (A running job past these
    candidates, behind more older ones than the share, is found by the fetch's look at the
    partitions with a job running: see FlowAcquirer._take.)"""
    if any(row.running for row in candidates):
        return []
    return list(itertools.takewhile(lambda row: row.takeable, candidates))[:share]


def _not_busy(key: str, found: list[Any], busy: set[int]) -> list[Any]:
    """The candidates of ``key`` that may run, ``busy`` being those whose partition has a job
    running: none of a partition whose first candidate is busy, else those not busy."""
    if is_partition(key) and found and found[0].id in busy:
        return []
    return [row for row in found if row.id not in busy]


def mariadb_hint(select: Any, table: Any, hint: str) -> Any:
    """``select`` with an index ``hint`` for ``table`` on MariaDB and MySQL (SQLAlchemy names the
    dialect either way); the other databases do not see it."""
    return select.with_hint(table, hint, dialect_name="mysql").with_hint(table, hint, dialect_name="mariadb")


def _power_of_two(count: int) -> int:
    """``count`` rounded up to a power of two (0 stays 0)."""
    return 0 if count == 0 else 1 << (count - 1).bit_length()


def _unusable_limits(row: Any) -> str | None:
    """What makes a key's limits, as its candidate ``row`` holds them, allow no start ever (a
    limit below 1, a rate interval below 1 microsecond), or None."""
    limit, interval = row.concurrency_limit, row.rate_interval_us
    if limit is not None and (type(limit) is not int or limit < 1):
        return f"concurrency_limit {limit!r} allows no job to run (a limit is at least 1)"
    if interval is not None and (type(interval) is not int or interval < 1):
        return f"rate_interval_us {interval!r} is not an interval between starts (at least 1)"
    return None


def _by_id(row: Any) -> Any:
    return row.id


class FlowAcquirer:
    """The statements of a flow acquisition, built once per dialect and queue shape."""

    def __init__(self, dialect: Dialect, shape: str) -> None:
        self.dialect = dialect
        m, f = dialect.message, dialect.tables.flow
        clock = dialect.clock()
        # A message of a key is ready: due, in the worker's queues, and first of its partition
        # (a partition's oldest message is, by how it is found).
        self.head_ready = [m.c.state.in_(READY_LITERALS), m.c.next_attempt_at <= sa.bindparam("now")]
        if shape != "all":
            self.head_ready.append(dialect.queue_filter(shape == "one"))
        self.ready_of_key = [*self.head_ready, first_of_partition(m)]
        # A partition's key has work when its oldest job is ready (its other jobs wait behind it):
        # one probe, however many jobs the partition holds. Another key's when any job is ready.
        partition_row = f.c.flow_key.startswith(PARTITION_KEY_PREFIX, autoescape=True)
        # A scalar subquery rather than EXISTS: MariaDB turned the EXISTS into a semi-join that it
        # materialized by scanning the whole message table on every fetch.
        any_ready = self._using(
            sa.select(m.c.id).where(m.c.flow_key == f.c.flow_key, *self.ready_of_key).limit(1), m, "flow_ready"
        )
        has_ready = sa.or_(
            sa.and_(partition_row, self._head_ready(f.c.flow_key)),
            sa.and_(~partition_row, any_ready.scalar_subquery().isnot(None)),
        )
        # The next start as stored: a hand-edited one that is no time must not fail every fetch.
        locked = (f.c.flow_key, as_stored(f.c.next_start_at), clock.label("now"))

        # A next start past the rate horizon is no rate's (see rate_horizon): it holds nothing back.
        beyond_any_rate = f.c.next_start_at > sa.bindparam("rate_horizon", type_=Timestamp)
        if dialect.name == "sqlite":  # nor does text that is no time, which SQLite lets a hand edit store
            beyond_any_rate = sa.or_(beyond_any_rate, sa.func.datetime(f.c.next_start_at).is_(None))

        def may_start_at(time: Any) -> list[Any]:
            return [sa.or_(f.c.next_start_at.is_(None), f.c.next_start_at <= time, beyond_any_rate), has_ready]

        may_start = may_start_at(clock)
        self.keys = sa.select(*locked).where(*may_start).order_by(f.c.served_at, f.c.flow_key).limit(KEYS_PER_ACQUIRE)
        # Whether any key has work it may start now, read without locking anything: most fetches
        # find none (most jobs have no key), and say so in one statement outside a transaction.
        self.any_keys = sa.select(f.c.flow_key).where(*may_start).limit(1)
        # Whether any key has a job due by ``now`` that its rate lets start by then (--burst asks
        # it of a time a few seconds ahead).
        self.any_keys_until = sa.select(f.c.flow_key).where(*may_start_at(sa.bindparam("now"))).limit(1)
        # FOR NO KEY UPDATE on PostgreSQL: enqueues holding a key (FOR KEY SHARE) do not keep a
        # worker from it.
        if dialect.lock_flow_keys_as_found:
            # Locked as they are found: a key another worker holds is skipped, not waited for,
            # and does not count against the LIMIT.
            self.keys = self.keys.with_for_update(skip_locked=True, key_share=True)
            self.lock = None
        else:
            # Twice as many found as locked: while another worker's fetch holds the keys served
            # longest ago, this one locks the next ones instead of none (MariaDB's two workers
            # took turns at the same 64 keys, one of them with a handful). See _lock.
            self.keys = self.keys.limit(2 * KEYS_PER_ACQUIRE)
            # On the primary key, forced: given a list of most of the table's keys, MariaDB chose
            # to scan it and locked every row, so that no other worker's fetch found a key free.
            lock = (
                sa.select(*locked)
                .where(f.c.flow_key.in_(sa.bindparam("keys", expanding=True)))
                .order_by(f.c.flow_key)
                .with_for_update(skip_locked=True, key_share=True)
            )
            self.lock = mariadb_hint(lock, f, "FORCE INDEX (PRIMARY)")
        # Counted per key as the flow row spells it: keys the database holds equal (none that
        # differ, unless a key column's collation was changed by hand to one that ignores case)
        # share one row and its limit, and their running jobs count under the spelling locked.
        self.running = (
            sa.select(f.c.flow_key, sa.func.count())
            .select_from(f.join(m, m.c.flow_key == f.c.flow_key))
            .where(f.c.flow_key.in_(sa.bindparam("keys", expanding=True)), m.c.state == PROCESSING)
            .group_by(f.c.flow_key)
        )
        # Which partitions have a job running (an older job of one may have come back while a later
        # one runs: see partition_run): their keys, read once per fetch on the running rows' index
        # (one row per running or buffered job: up to fetch_batch_size per process), then which of
        # the candidates ``ids`` belong to one of them, by id and compared by the database
        # (as the flow rows are). A join of the two read every running row once per
        # candidate on SQLite.
        self.running_partitions = (
            sa.select(m.c.partition_key).where(m.c.state == PROCESSING, m.c.partition_key.isnot(None)).distinct()
        )
        of_partitions = sa.select(m.c.id).where(
            m.c.id.in_(sa.bindparam("ids", expanding=True)),
            m.c.partition_key.in_(sa.bindparam("partitions", expanding=True)),
        )
        # By id, forced: MariaDB read every entry of the running partitions' index ranges instead.
        self.of_partitions = mariadb_hint(of_partitions, m, "FORCE INDEX (PRIMARY)")
        self.due = sa.select(sa.type_coerce(sa.func.min(f.c.next_start_at), sa.types.NullType()), clock).where(
            f.c.next_start_at > clock, ~beyond_any_rate, has_ready
        )
        self.served = (
            sa.update(f)
            .where(f.c.flow_key == sa.bindparam("key"))
            .values(served_at=sa.bindparam("served"), next_start_at=sa.bindparam("next_start"))
        )
        self.served_only = (
            sa.update(f)
            .where(f.c.flow_key.in_(sa.bindparam("keys", expanding=True)))
            .values(served_at=sa.bindparam("served"))
        )
        self._candidates: dict[tuple[int, int], Any] = {}
        # Where the database can, one statement for any number of keys, which it plans once.
        self.lateral = dialect.lateral_candidates(self)
        # Where statements cost little more than their work (an embedded database), one per key.
        self.per_key = dialect.per_key_candidates(self)
        # Where the database can, partitions' runs are chosen and taken by one statement.
        self.runs = dialect.partition_runs(self)

    def _using(self, select: Any, table: Any, index: str) -> Any:
        """``select`` reading ``table`` through the message index ``index``, on MariaDB, whose
        optimizer otherwise walked the whole delivery-order index to avoid sorting a few rows (18 s
        a fetch on a million-job backlog). The other databases find these plans themselves."""
        return mariadb_hint(select, table, f"FORCE INDEX (ix_{self.dialect.tables.prefix}message_{index})")

    def _partition_of(self, key: Any) -> Any:
        """The partition key of a partition's flow key (correlated to the flow row two levels up,
        in the keys statement, or to the key given): the flow key without its prefix, unless the
        partition key was too long and the flow key holds its hash. Then one of the partition's
        messages says it (a flow key that merely looks like a hash is read that way too)."""
        member = self.dialect.message.alias("member")
        select = sa.select(member.c.partition_key).where(member.c.flow_key == key).limit(1)
        stored = self._using(select, member, "flow_state").correlate_except(member).scalar_subquery()
        maybe_hashed = key.like(PARTITION_KEY_PREFIX + "_" * HASHED_PARTITION_LENGTH)
        return sa.case((maybe_hashed, stored), else_=sa.func.substr(key, len(PARTITION_KEY_PREFIX) + 1))

    def _head_ready(self, key: Any) -> Any:
        """Whether a partition's oldest active message is ready and of this flow key: one read
        of the partition's first index entry and its row."""
        head = self.dialect.message.alias("head")
        on_head = ClauseAdapter(head).traverse  # the conditions on the message table, read on ``head``
        ready = sa.and_(*[on_head(c) for c in [self.dialect.message.c.flow_key == key, *self.head_ready]])
        select = (
            sa.select(sa.case((ready, 1), else_=0))
            .where(head.c.partition_key == self._partition_of(key))
            .order_by(head.c.id)  # not min(): MariaDB would read the whole partition for it
            .limit(1)
        )
        # A scalar subquery rather than EXISTS, which MariaDB would rewrite into an IN it refuses.
        return self._using(select, head, "partition").correlate_except(head).scalar_subquery() == 1

    def part(self, number: Any, key: Any, share: Any, partition: bool) -> Any:
        """The candidates of one key: ``number`` labels its rows (``part``), ``key`` and ``share``
        are SQL expressions. Each row says whether it may be taken (``takeable``) and, of a
        partition, whether it is running (``running``): a partition reads one row past its share
        (see :func:`partition_run`)."""
        m = self.dialect.message
        columns = [
            number.label("part"),
            m.c.id,
            m.c.priority,
            m.c.next_attempt_at,
            m.c.concurrency_limit,
            m.c.rate_interval_us,
            m.c.partition_key,
        ]
        if partition:
            # The partition's active jobs from its oldest, whatever their state or flow key: the
            # run that may be taken ends at the first one that is not ready and of this key.
            takeable = sa.case((sa.and_(m.c.flow_key == key, *self.head_ready), 1), else_=0)
            running = sa.case((m.c.state == PROCESSING, 1), else_=0)
            part = (
                sa.select(*columns, takeable.label("takeable"), running.label("running"))
                .where(m.c.partition_key == self._partition_of(key))
                .order_by(m.c.id)
            )
            part = self._using(part, m, "partition")
        else:
            part = (
                sa.select(*columns, sa.literal_column("1").label("takeable"), sa.literal_column("0").label("running"))
                .where(m.c.flow_key == key, *self.ready_of_key)
                .order_by(m.c.priority.desc(), m.c.next_attempt_at, m.c.id)
            )
            part = self._using(part, m, "flow_ready")
        return part.limit(share)

    def candidates(self, partitions: int, others: int) -> Any:
        """One statement reading the candidates of ``partitions`` partition keys, then of ``others``
        other keys: bind ``key<n>`` and ``share<n>`` for the n-th. Cached by the two counts, so
        that it is compiled once per shape (the counts are rounded up to a power of two by
        :meth:`read_candidates`: a few shapes, each compiled once, where a 64-key statement took
        40 ms to compile)."""
        cached = self._candidates.get((partitions, others))
        if cached is not None:
            return cached
        parts = []
        for number in range(partitions + others):
            key = sa.bindparam(f"key{number}", type_=sa.String)
            share = sa.bindparam(f"share{number}", type_=sa.Integer)
            part = self.part(sa.literal_column(str(number)), key, share, number < partitions)
            parts.append(sa.select(*part.subquery(f"k{number}").c))
        statement = parts[0] if len(parts) == 1 else sa.union_all(*parts)
        self._candidates[(partitions, others)] = statement
        return statement

    def read_candidates(
        self, connection: sa.Connection, binds: dict[str, Any], keys: list[str], share: int
    ) -> dict[str, list[Any]]:
        """The candidate rows of each of ``keys`` (partition keys first), ``share`` at most each:
        a partition's in id order, another key's in delivery order."""
        if self.per_key is not None:
            return self.per_key(connection, binds, keys, share)
        partitions = sum(1 for key in keys if is_partition(key))
        if self.lateral is not None:
            values = {
                "partition_keys": keys[:partitions],
                "other_keys": keys[partitions:],
                "share": share,
                "partition_share": share + 1,
            }
            read, listed = connection.execute(self.lateral, {**binds, **values}).all(), keys
        else:
            # Padded with keys that match nothing and read nothing (a share of 0).
            padded = [_power_of_two(partitions), _power_of_two(len(keys) - partitions)]
            listed = [*keys[:partitions], *[""] * (padded[0] - partitions), *keys[partitions:]]
            listed += [""] * (sum(padded) - len(listed))
            numbered = {f"key{number}": key for number, key in enumerate(listed)}
            shares = {
                f"share{number}": (share + (number < padded[0])) if key else 0 for number, key in enumerate(listed)
            }
            read = connection.execute(self.candidates(*padded), {**binds, **numbered, **shares}).all()
        rows: dict[str, list[Any]] = {key: [] for key in keys}
        for row in read:
            rows[listed[row.part]].append(row)
        for key, found in rows.items():  # the parts of one statement come in no set order
            found.sort(key=_by_id if is_partition(key) else delivery_order)
        return rows

    def run(self, connection: sa.Connection, params: AcquireParams, take: Callable[..., list[Message]]) -> FlowAcquired:
        binds = params.binds()
        locked = connection.execute(self.keys, binds).all()
        if locked and self.lock is not None:
            locked = self._lock(connection, binds, [row.flow_key for row in locked])
        result = FlowAcquired()
        if locked:
            result.messages = self._take(connection, params, binds, locked, take)
        if params.rated:
            stored, now = connection.execute(self.due, binds).one()
            if (due := stored_time(stored)) is not None:
                result.due_in = (due - now).total_seconds()
        return result

    def _lock(self, connection: sa.Connection, binds: dict[str, Any], found: list[str]) -> list[Any]:
        """Lock up to KEYS_PER_ACQUIRE of the ``found`` keys, those served longest ago first,
        passing over the keys another worker holds: the first ones found, then as many of the
        next as were held, and so on."""
        assert self.lock is not None
        order = {key: number for number, key in enumerate(found)}
        locked: list[Any] = []
        start = 0
        while start < len(found) and len(locked) < KEYS_PER_ACQUIRE:
            batch = found[start : start + KEYS_PER_ACQUIRE - len(locked)]
            start += len(batch)
            locked += connection.execute(self.lock, {**binds, "keys": batch}).all()
        # In the order found (a key the database deems equal to one found but spelled otherwise,
        # re-added meanwhile, goes last).
        return sorted(locked, key=lambda row: order.get(row.flow_key, len(order)))

    def _take(
        self,
        connection: sa.Connection,
        params: AcquireParams,
        binds: dict[str, Any],
        locked: Sequence[Any],
        take: Callable[..., list[Message]],
    ) -> list[Message]:
        now = locked[0].now
        keys = sorted((row.flow_key for row in locked), key=lambda key: not is_partition(key))
        share = max(1, math.ceil(params.limit / len(keys)))
        if self.runs is not None and is_partition(keys[-1]):
            # Only partitions: their runs need no limit or rate of a key, so the database chooses,
            # leaving out the partitions with a job running (see partition_run). Compared exactly:
            # this statement serves PostgreSQL, which compares text so.
            running_partitions = connection.execute(self.running_partitions).scalars()
            busy_keys = {partition_flow(partition)["flow_key"] for partition in running_partitions}
            free = [row.flow_key for row in locked if row.flow_key not in busy_keys]
            if not free:
                return []
            values = {
                "partition_keys": free,
                "share": share,
                "partition_share": share + 1,
                "served": now,
            }
            messages = self.dialect.take_runs(connection, self.runs, {**binds, **values})
            for message in messages:
                message.run_key = message.flow_key  # taken under its own flow key (compared exactly)
            return in_partition_order(messages)
        rows = self.read_candidates(connection, binds, keys, share)
        # A partition's run, and a concurrency key's job with a partition (its partition's
        # oldest), wait while a job of the partition runs: asked of each partition's first
        # candidate, and of each such job (see partition_run).
        heads = [
            row.id
            for key, found in rows.items()
            for row in (found[:1] if is_partition(key) else found)
            if row.partition_key
        ]
        partitions = list(connection.execute(self.running_partitions).scalars()) if heads else []
        if partitions:
            busy = set(connection.execute(self.of_partitions, {"ids": heads, "partitions": partitions}).scalars())
            if busy:
                rows = {key: _not_busy(key, found, busy) for key, found in rows.items()}
        limited = [key for key, found in rows.items() if found and found[0].concurrency_limit is not None]
        running: dict[str, int] = {}
        if limited:
            running = dict(connection.execute(self.running, {**binds, "keys": limited}).all())
        chosen: list[int] = []
        served: list[dict[str, Any]] = []  # keys whose next start changes
        served_only: list[str] = []
        runs: dict[int, str] = {}  # a partition run's ids: the key they were taken under
        corrupt: dict[int, str] = {}  # ids taken only to be failed: their limits are not limits
        for lock in locked:
            candidates = rows[lock.flow_key]
            partition = is_partition(lock.flow_key)
            if partition:
                candidates = partition_run(candidates, share)
            if any(_unusable_limits(row) for row in candidates):
                # A row edited by hand (a limit of 0, a negative rate) would allow no start ever,
                # and wait forever: taken, to be failed saying why, apart from the key's others.
                for row in candidates:
                    if (problem := _unusable_limits(row)) and len(chosen) < params.limit:
                        corrupt[row.id] = problem
                        chosen.append(row.id)
                candidates = [row for row in candidates if row.id not in corrupt]
            if candidates and len(chosen) >= params.limit:
                # The fetch is full before this key's turn (slow jobs are fetched one or two at a
                # time): it keeps its place in line, first at the next fetch. Marked served, every
                # key found would share one time, and their names would decide every turn.
                continue
            allowed = min(len(candidates), params.limit - len(chosen))
            # None too if it is no time (SQLite text edited by hand): written again below.
            stored = next_start = stored_time(lock.next_start_at)
            if candidates:
                head = candidates[0]
                if head.concurrency_limit is not None:
                    allowed = min(allowed, head.concurrency_limit - running.get(lock.flow_key, 0))
                if head.rate_interval_us is not None:
                    interval = timedelta(microseconds=head.rate_interval_us)
                    if next_start is not None and next_start > rate_horizon(now):
                        next_start = None  # no rate's: a clock set back or a hand edit left it
                    start = now - interval if next_start is None else max(next_start, now - interval)
                    allowed = min(allowed, (now - start) // interval + 1)
                    if allowed > 0:
                        next_start = start + interval * allowed
            allowed = max(0, allowed)
            chosen.extend(row.id for row in candidates[:allowed])
            if partition:
                runs.update((row.id, lock.flow_key) for row in candidates[:allowed])
            if next_start == stored and (stored is not None or lock.next_start_at is None):
                served_only.append(lock.flow_key)
            else:
                served.append({"key": lock.flow_key, "served": now, "next_start": next_start})
        if served_only:  # most keys: one statement for all
            connection.execute(self.served_only, {"keys": served_only, "served": now})
        if served:
            connection.execute(self.served, served)
        if not chosen:
            return []
        messages = take(connection, chosen, params)
        for message in messages:
            message.run_key = runs.get(message.id)
            if message.id in corrupt:
                message.corrupt = corrupt[message.id]
        return in_partition_order(messages)
