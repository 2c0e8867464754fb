"""Ages and durations written the way people type them: ``90s``, ``30m``, ``24h``, ``7d``, ``2w``."""

from __future__ import annotations

import re
from datetime import timedelta

from jobqueue.errors import ConfigurationError

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.I)
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_AGE_SECONDS = 1000 * 365.25 * 86400


def parse_age(text: str) -> timedelta:
    """Parse ``7d`` into ``timedelta(days=7)``; raise ConfigurationError naming the accepted forms."""
    match = _AGE.match(text or "")
    if not match:
        raise ConfigurationError(
            f"cannot read {text!r} as an age: write a number and a unit, for example 90s, 30m, 24h, 7d or 2w"
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if seconds > MAX_AGE_SECONDS:  # further back than any date the tables can hold from now
        raise ConfigurationError(f"age {text.strip()!r} is too long: give at most 1000 years (365000d)")
    return timedelta(seconds=seconds)
