"""How values read on the pages: ages, timestamps, JSON, missing values, the throughput chart."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobqueue.bidi import bidi_escaped
from jobqueue.storage.history import MinuteCount

MISSING = "-"


def shown(value: Any) -> Any:
    """The value, or "-" for None: a column the storage layer does not report yet reads as unknown."""
    return MISSING if value is None else value


def cell(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]`` as shown, "-" when the row has no such key."""
    return shown(row.get(key))


def age(seconds: float | None) -> str:
    """A duration for people: "42 s", "3 min 5 s", "2 h 10 min", "3 d 4 h"; "-" for None."""
    if seconds is None:
        return MISSING
    seconds = max(seconds, 0.0)  # a clock a little ahead of the database's
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{whole} s"
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if whole >= size:
            rest = (whole % size) // smaller_size
            return f"{whole // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    raise AssertionError("unreachable")  # pragma: no cover


def timestamp(value: datetime | str | None) -> str:
    """A stored (naive UTC) timestamp, to the second, marked UTC; a value that is no time (a row
    edited by hand, read as ``<unreadable: ...>``) is shown as it is."""
    if value is None:
        return MISSING
    if not isinstance(value, datetime):
        return str(value)
    return f"{value:%Y-%m-%d %H:%M:%S} UTC"


def pretty_json(value: Any) -> str:
    """Arguments and results as indented JSON (what they were enqueued as, give or take tuples).

    Bidirectional controls are written as their JSON escapes (the same strings): in a ``<pre>`` one
    would reorder the rest of its line, keys and quotes included.
    """
    if isinstance(value, str) and value.startswith("<cannot decode"):
        return bidi_escaped(value)
    return bidi_escaped(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def preformatted(value: Any) -> str:
    """Text for a ``<pre>`` (a traceback), its bidirectional controls written as escapes: there an
    isolate would not end a control's reach over the rest of its line."""
    return bidi_escaped(str(value))


@dataclass(frozen=True)
class Bar:
    """One minute of the throughput chart, in SVG units (the chart is 100 high; y grows downward)."""

    x: float
    width: float
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float
    title: str


CHART_WIDTH = 600
CHART_HEIGHT = 100


def chart(minutes: Sequence[MinuteCount]) -> tuple[list[Bar], int]:
    """Stacked bars (completed below, failed on top) scaled to the busiest minute, and that maximum."""
    peak = max((m.completed + m.failed for m in minutes), default=0)
    scale = CHART_HEIGHT / peak if peak else 0.0
    width = CHART_WIDTH / max(len(minutes), 1)
    bars = []
    for i, m in enumerate(minutes):
        completed_height = m.completed * scale
        failed_height = m.failed * scale
        bars.append(
            Bar(
                x=i * width,
                width=width * 0.8,  # a gap between minutes
                completed_y=CHART_HEIGHT - completed_height,
                completed_height=completed_height,
                failed_y=CHART_HEIGHT - completed_height - failed_height,
                failed_height=failed_height,
                title=f"{m.minute:%H:%M} UTC: {m.completed} completed, {m.failed} failed",
            )
        )
    return bars, peak


FILTERS = {
    "age": age,
    "timestamp": timestamp,
    "shown": shown,
    "pretty_json": pretty_json,
    "preformatted": preformatted,
}
