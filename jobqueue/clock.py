"""Time helpers. Every stored timestamp is naive UTC; callers pass ``now`` so tests can pin it.

``utcnow()`` is the database server's time as this host best knows it: the host's clock, corrected
by how far it is off the server's when that is a second or more. Every host of a deployment then
stamps and compares due times (``eta``, ``countdown``, retry delays, schedules, rate limits) on one
clock, the server's, which also stamps leases: a host whose clock runs behind still runs the jobs
due now, and one that runs ahead starts no job before its time. The offset is measured by reading
the server's clock: by the supervisor every ``release_stuck_interval`` (its worker processes take
the supervisor's figure), elsewhere at most once a minute before an enqueue. SQLite's server is
the host itself: nothing to measure.

A clock replaced by a test (freezegun) is taken as it is: frozen time is the test's truth.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

logger = logging.getLogger("jobqueue")

_EPOCH = datetime(1970, 1, 1)
# The interpreter's own clock, kept in a tuple: freezegun replaces module attributes that hold it,
# not a tuple's items, so this tells when the clock is a test's.
_REAL_TIME = (time.time,)

CORRECT_FROM_SECONDS = 1.0  # a host this close to the server's clock is left as it is
KEEP_UNTIL_SECONDS = 0.5  # a correction in place stays until the host is this close
TRACK_SECONDS = 0.1  # a correction in place follows the measured offset in steps of this
MAX_ROUND_TRIP_SECONDS = 0.5  # a slower reading of the server's clock says too little to correct by
CHECK_EVERY_SECONDS = 60.0  # outside a worker: how often an enqueueing process measures again
RETRY_SECONDS = 5.0  # after a reading too slow to use, or none taken (no connection free)


_offset = 0.0  # seconds added to this host's clock (a module global: utcnow() reads it fastest)
_next_check = 0.0  # time.monotonic() of the next measurement before an enqueue; inf: kept elsewhere


def utcnow() -> datetime:
    """The current time as a naive UTC datetime (what the tables store), on the server's clock."""
    if _offset and time.time is not _REAL_TIME[0]:  # a test's clock: its time, uncorrected
        return _EPOCH + timedelta(0, time.time())
    # The epoch plus the seconds since: twice as fast as datetime.now(timezone.utc) made naive,
    # whose replace(tzinfo=None) alone costs a microsecond; a worker stamps every job twice.
    return _EPOCH + timedelta(0, time.time() + _offset)


def host_now() -> datetime:
    """This host's clock, uncorrected (what the correction is measured against)."""
    return _EPOCH + timedelta(0, time.time())


def correction() -> float:
    """Seconds added to this host's clock to read the database server's (0.0 when within a second)."""
    return _offset


def set_correction(seconds: float) -> None:
    """Take a correction measured elsewhere (a worker process takes its supervisor's)."""
    global _offset
    _offset = seconds


def kept_elsewhere(kept: bool = True) -> None:
    """The offset is measured by the worker's supervisor (this process, or its parent): no
    measurement before an enqueue here; ``kept=False`` when the supervisor stops."""
    global _next_check
    _next_check = math.inf if kept else 0.0


def refresh(measure: Callable[[], float | None]) -> None:
    """Measure the offset with ``measure`` (a store's, which returns what ``observe`` said) if it
    is time to: before an enqueue stamps a due time. Never raises: a server that cannot be read now
    leaves the correction as it was."""
    global _next_check
    if time.time is not _REAL_TIME[0]:  # a test's clock (whose monotonic clock may be frozen too)
        return
    now = time.monotonic()
    if now < _next_check:
        return
    _next_check = now + RETRY_SECONDS
    try:
        measured = measure()
    except Exception as exc:  # measuring must never fail the enqueue it precedes
        # Not again for a minute: while the database is down, each enqueue would otherwise wait
        # for a connection twice, once here.
        logger.debug("could not read the database server's clock: %s", exc)
        _next_check = now + CHECK_EVERY_SECONDS
        return
    if measured is not None:
        _next_check = now + CHECK_EVERY_SECONDS


def observe(server: datetime, sent: datetime, received: datetime) -> float | None:
    """Correct this host's clock from a reading of the server's, ``server``, taken between the host
    readings (``host_now()``) ``sent`` and ``received``. Returns the change in seconds, 0.0 for none,
    or None if the reading could not be used (too slow, or the clock is a test's)."""
    global _offset
    if time.time is not _REAL_TIME[0]:
        return None
    round_trip = (received - sent).total_seconds()
    if not 0 <= round_trip <= MAX_ROUND_TRIP_SECONDS:
        return None
    offset = (server - (sent + (received - sent) / 2)).total_seconds()
    current = _offset
    if current:
        wanted = 0.0 if abs(offset) < KEEP_UNTIL_SECONDS else offset
    else:
        wanted = offset if abs(offset) >= CORRECT_FROM_SECONDS else 0.0
    if wanted == current or (wanted and abs(wanted - current) < TRACK_SECONDS):
        return 0.0
    _offset = wanted
    if abs(wanted - current) >= CORRECT_FROM_SECONDS:
        if wanted:
            logger.warning(
                "this host's clock is %.1f s %s the database server's; jobqueue counts due times on the "
                "server's clock (set this host's clock right with NTP)",
                abs(offset),
                "behind" if offset > 0 else "ahead of",
            )
        else:
            logger.warning("this host's clock agrees with the database server's again")
    return wanted - current


def to_naive_utc(when: datetime) -> datetime:
    """Convert ``when`` to naive UTC; a naive value is taken to be UTC already."""
    if when.tzinfo is None:
        return when
    return when.astimezone(timezone.utc).replace(tzinfo=None)
