"""Time helpers. Every stored timestamp is naive UTC; callers pass ``now`` so tests can pin it.

``utcnow()`` is the database server's time as this host best knows it: the host's clock, corrected
by how far it is off the server's when that is a second or more. Every host of a deployment then
stamps and compares due times (``eta``, ``countdown``, retry delays, schedules, rate limits) on one
clock, the server's, which also stamps leases: a host whose clock runs behind still runs the jobs
due now, and one that runs ahead starts no job before its time. The offset is measured by reading
the server's clock: by the supervisor every ``release_stuck_interval`` (its worker processes take
the supervisor's figure), elsewhere at most once a minute before an enqueue. SQLite's server is
the host itself: nothing to measure.

Between two readings the server's time is counted on the clock of time since boot, which nothing
sets: a host clock set forward or back meanwhile (by hand, or by NTP stepping it) moves no due time,
where the host clock alone would start jobs early by the step, or late.

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


STEP_SECONDS = 1.0  # a host clock set this far since the last reading is said so in the log

# Time since boot, suspended time included (a machine resumed keeps its place): no one sets it.
_SINCE_BOOT = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
_clock_gettime = time.clock_gettime

_offset = 0.0  # seconds added to this host's clock at the last reading (0.0 when within a second)
# The server's time, in seconds since _EPOCH, less the time since boot; None before any reading
# (and on SQLite): then the host's clock is taken as it is. (Module globals: utcnow() reads them fastest.)
_base: float | None = None
_next_check = 0.0  # time.monotonic() of the next measurement before an enqueue; inf: kept elsewhere


def utcnow() -> datetime:
    """The current time as a naive UTC datetime (what the tables store), on the server's clock."""
    base = _base
    if base is None or time.time is not _REAL_TIME[0]:  # no reading, or a test's clock: its time as is
        return _EPOCH + timedelta(0, time.time())
    # The epoch plus the seconds since: twice as fast as datetime.now(timezone.utc) made naive,
    # whose replace(tzinfo=None) alone costs a microsecond; a worker stamps every job twice.
    return _EPOCH + timedelta(0, _clock_gettime(_SINCE_BOOT) + base)


def host_now() -> datetime:
    """This host's clock, uncorrected (what the correction is measured against)."""
    return _EPOCH + timedelta(0, time.time())


def correction() -> float:
    """Seconds added to this host's clock to read the database server's at the last reading (0.0
    when within a second)."""
    return _offset


def shared() -> float | None:
    """What :func:`follow` takes in another process of this host: the server's time less the time
    since boot, or None when this host's clock is taken as it is."""
    return _base


def follow(base: float | None) -> None:
    """Take the reading of another process of this host (a worker process takes its supervisor's)."""
    global _base
    _base = base


def _anchor(offset: float) -> float:
    """The base that makes utcnow() this host's clock plus ``offset`` now."""
    return time.time() + offset - _clock_gettime(_SINCE_BOOT)


def _followed_step() -> float:
    """Seconds this host's clock was set forward (negative: back) since the last reading, which
    utcnow() did not follow; 0.0 before any reading."""
    if _base is None:
        return 0.0
    return _offset - (_clock_gettime(_SINCE_BOOT) + _base - time.time())


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
    global _offset, _base
    if time.time is not _REAL_TIME[0]:
        return None
    round_trip = (received - sent).total_seconds()
    if not 0 <= round_trip <= MAX_ROUND_TRIP_SECONDS:
        return None
    offset = (server - (sent + (received - sent) / 2)).total_seconds()
    step = _followed_step()
    if abs(step) >= TRACK_SECONDS:  # the host's clock was set since the last reading: the correction kept up
        _offset -= step
        if abs(step) >= STEP_SECONDS:
            logger.warning(
                "this host's clock was set %.1f s %s since jobqueue last read the database server's; due "
                "times stayed on the server's clock",
                abs(step),
                "forward" if step > 0 else "back",
            )
    current = _offset
    if current:
        wanted = 0.0 if abs(offset) < KEEP_UNTIL_SECONDS else offset
    else:
        wanted = offset if abs(offset) >= CORRECT_FROM_SECONDS else 0.0
    if wanted == current or (wanted and abs(wanted - current) < TRACK_SECONDS):
        _base = _anchor(current)
        return 0.0
    _offset = wanted
    _base = _anchor(wanted)
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
