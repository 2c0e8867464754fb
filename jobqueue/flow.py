"""A task's flow control: its concurrency key, concurrency limit and rate limit.

A job whose task has any of them carries a **flow key**: the task's ``concurrency_key`` (a string,
or a function of the call's arguments returning one), or ``task:<name>`` when the task has limits
but no key. Jobs of one flow key are acquired by themselves, key by key and in turn:

- ``concurrency_limit=N``: a job starts only while fewer than N jobs of its key are running, on any
  host. A running job is a row in PROCESSING state, so every outcome, every lease that expires and
  every worker process that dies frees its slot: nothing is counted that a crash could leak.
- ``rate_limit="20/s"`` (also ``/m``, ``/h``): starts of the key are spaced ``1/rate`` apart across
  all hosts; the jobs waiting for their turn stay in the table, unacquired.
- A key alone (no limit) still takes turns with the other keys: one tenant's flood does not delay
  another's jobs.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobqueue.errors import ConfigurationError

TASK_KEY_PREFIX = "task:"
FLOW_KEY_LENGTH = 255  # the flow key column's size
# A job with a partition key and no concurrency key has the flow key ``partition:<key>``: keys take
# turns, and a partition's jobs are acquired as a run from its oldest, whatever its queue's length.
PARTITION_KEY_PREFIX = "partition:"
HASHED_PARTITION_LENGTH = 64  # a partition key too long for a flow key is stored as its SHA-256, in hex
NO_FLOW: dict[str, Any] = {"flow_key": None, "concurrency_limit": None, "rate_interval_us": None}

# The slowest rate a task may have, one start a day: the database remembers a quiet key's last
# start that long (past that, a new job may start at once whatever the rate).
RATE_MEMORY_SECONDS = 86_400
# Each job carries its key's limit in an INTEGER column: PostgreSQL and MySQL hold no more.
MAX_CONCURRENCY_LIMIT = 2_147_483_647

# Units in any case ("20/S" as "20/s"); digits and spaces ASCII only: a full-width "２０" is refused.
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$", re.IGNORECASE | re.ASCII)
_UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def rate_horizon(now: datetime) -> datetime:
    """The furthest ahead of ``now`` a rate's next start can be: one interval, a day at the slowest.
    A next start further ahead was left by a database clock that was set back, or by a row edited
    by hand; it is ignored, as if the key had been quiet, rather than hold the key's jobs till then."""
    return now + timedelta(seconds=RATE_MEMORY_SECONDS)


def rate_interval_us(rate: Any) -> int:
    """Microseconds between two starts for a rate such as "20/s", "100/m" or "1000/h"."""
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None:
        raise ConfigurationError(
            f"rate_limit must read like '20/s', '100/m' or '1000/h' (starts per second, minute or hour), got {rate!r}"
        )
    count = float(match.group(1))
    seconds = _UNIT_SECONDS[match.group(2).lower()] / count if count > 0 else math.inf
    if seconds > RATE_MEMORY_SECONDS:
        raise ConfigurationError(
            f"rate_limit must allow at least one start a day (such as '1/h'), got {rate!r}; for rarer runs "
            "schedule a periodic task instead"
        )
    return max(1, round(seconds * 1_000_000))


@dataclass(frozen=True)
class Flow:
    """The flow options of one task, checked."""

    task_name: str
    key: str | Callable[..., Any] | None = None
    limit: int | None = None
    interval_us: int | None = None

    @classmethod
    def of(cls, task_name: str, key: Any, limit: Any, rate: Any) -> Flow:
        if key is not None and not callable(key):
            check_flow_key("concurrency_key", key)
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_CONCURRENCY_LIMIT
        ):
            raise ConfigurationError(
                f"concurrency_limit must be an integer from 1 to {MAX_CONCURRENCY_LIMIT} or None, got {limit!r}"
            )
        interval = None if rate is None else rate_interval_us(rate)
        limited = limit is not None or interval is not None
        if limited and not isinstance(key, str) and len(TASK_KEY_PREFIX + task_name) > FLOW_KEY_LENGTH:
            raise ConfigurationError(
                f"task {task_name[:40]}...: its limits, without a concurrency_key, are kept under the key "
                f"{TASK_KEY_PREFIX!r} + its name, which must fit in {FLOW_KEY_LENGTH} characters; give the "
                f"task a name of at most {FLOW_KEY_LENGTH - len(TASK_KEY_PREFIX)} characters, or a concurrency_key"
            )
        return cls(task_name, key, limit, interval)

    @property
    def enabled(self) -> bool:
        return self.key is not None or self.limit is not None or self.interval_us is not None

    @property
    def per_call(self) -> bool:
        """Whether the key depends on the call's arguments."""
        return callable(self.key)

    def key_for(self, args: Any, kwargs: dict[str, Any]) -> str | None:
        """The flow key of a call (None: the job is not flow-controlled)."""
        key = self.key
        if callable(key):
            try:
                key = key(*args, **kwargs)
            except Exception as exc:
                raise ConfigurationError(
                    f"concurrency_key of task {self.task_name} failed on these arguments: {exc!r}"
                ) from exc
            if isinstance(key, int) and not isinstance(key, bool):
                key = str(key)  # a tenant id, say
            if key is not None:
                check_flow_key(f"concurrency_key of task {self.task_name}", key)
        if key is None and (self.limit is not None or self.interval_us is not None):
            return TASK_KEY_PREFIX + self.task_name
        return key

    def columns(self, key: str | None, partition_key: str | None = None) -> dict[str, Any]:
        """The message columns of a job with flow key ``key`` (and partition key ``partition_key``)."""
        if key is None:
            return NO_FLOW if partition_key is None else partition_flow(partition_key)
        return {"flow_key": key, "concurrency_limit": self.limit, "rate_interval_us": self.interval_us}


def partition_flow(partition_key: str) -> dict[str, Any]:
    """The flow columns of a job that has a partition key and no concurrency key."""
    key = PARTITION_KEY_PREFIX + partition_key
    if len(key) > FLOW_KEY_LENGTH:  # the partition's rows are found by their partition key
        key = PARTITION_KEY_PREFIX + hashlib.sha256(partition_key.encode()).hexdigest()
    return {"flow_key": key, "concurrency_limit": None, "rate_interval_us": None}


# How much of a refused value an error message quotes: a key of a million characters is named by
# its length and its beginning, not copied whole into the message (and every log line of it).
SHOWN_MOST = 80


def shown(value: Any) -> str:
    """``value`` as an error message quotes it: its repr, or the beginning of a long one and its length."""
    if isinstance(value, str) and len(value) > SHOWN_MOST:
        return f"a string of {len(value)} characters, {value[: SHOWN_MOST // 2]!r}..."
    try:
        text = repr(value)
    except Exception:  # an object whose repr fails is still refused, by its type
        return f"a {type(value).__name__}"
    return text if len(text) <= SHOWN_MOST else f"a {type(value).__name__}, {text[: SHOWN_MOST // 2]}..."


def check_encodable(label: str, key: str) -> None:
    """Refuse text no database can store: an unpaired surrogate has no UTF-8 form."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"{label} is not valid Unicode (it holds an unpaired surrogate), got {shown(key)}"
        ) from None


def check_flow_key(label: str, key: Any) -> None:
    if not isinstance(key, str) or not 0 < len(key) <= FLOW_KEY_LENGTH or "\x00" in key:
        raise ConfigurationError(
            f"{label} must be a string of 1 to 255 characters without NUL, or a function of the "
            f"task's arguments returning one, got {shown(key)}"
        )
    check_encodable(label, key)
    if looks_like_partition(key):
        raise ConfigurationError(
            f"{label} must not begin with {PARTITION_KEY_PREFIX!r}, in any case or with accents "
            f"(partition keys use it), got {shown(key)}"
        )


def looks_like_partition(key: str) -> bool:
    """Whether a database that compares text regardless of case or accents (SQLite's LIKE,
    MariaDB's default collation) could read ``key`` as a partition's flow key."""
    head = unicodedata.normalize("NFKD", key[: 4 * len(PARTITION_KEY_PREFIX)])
    bare = "".join(c for c in head if not unicodedata.combining(c))
    return bare.casefold().startswith(PARTITION_KEY_PREFIX)
