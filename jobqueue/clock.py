"""Time helpers. Every stored timestamp is naive UTC; callers pass ``now`` so tests can pin it."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1)


def utcnow() -> datetime:
    """Return the current time as a naive UTC datetime (what the tables store)."""
    # The epoch plus the seconds since: twice as fast as datetime.now(timezone.utc) made naive,
    # whose replace(tzinfo=None) alone costs a microsecond; a worker stamps every job twice.
    return _EPOCH + timedelta(0, time.time())


def to_naive_utc(when: datetime) -> datetime:
    """Convert ``when`` to naive UTC; a naive value is taken to be UTC already."""
    if when.tzinfo is None:
        return when
    return when.astimezone(timezone.utc).replace(tzinfo=None)
