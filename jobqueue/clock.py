"""Time helpers. Every stored timestamp is naive UTC; callers pass ``now`` so tests can pin it."""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    """Return the current time as a naive UTC datetime (what the tables store)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def to_naive_utc(when: datetime) -> datetime:
    """Convert ``when`` to naive UTC; a naive value is taken to be UTC already."""
    if when.tzinfo is None:
        return when
    return when.astimezone(timezone.utc).replace(tzinfo=None)
