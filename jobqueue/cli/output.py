"""Output for people (tables that fit the terminal) and for scripts (``--json``)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import click


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], empty: str = "(none)") -> str:
    """Render ``rows`` as an aligned table; on a terminal, no wider than it (long cells are cut)."""
    if not rows:
        return empty
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    # Piped into grep or a file, keep whole cells; on a terminal, fit its width.
    room = shutil.get_terminal_size().columns if sys.stdout.isatty() else 10**6
    while sum(widths) + 2 * (len(widths) - 1) > room and max(widths) > 12:
        widest = widths.index(max(widths))
        widths[widest] -= 1

    def fmt(values: Sequence[str]) -> str:
        parts = [value if len(value) <= w else value[: w - 1] + "~" for value, w in zip(values, widths, strict=False)]
        return "  ".join(part.ljust(w) for part, w in zip(parts, widths, strict=False)).rstrip()

    lines = [fmt([c.upper() for c in columns]), fmt(["-" * w for w in widths])]
    lines.extend(fmt(line) for line in cells)
    return "\n".join(lines)


def _default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, default=_default, indent=2, ensure_ascii=False))


def progress_bar(total: int, label: str) -> Any:
    """A progress bar on stderr, so --json output on stdout stays clean."""
    return click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True)
