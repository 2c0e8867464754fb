"""Output for people (rich tables that fit the terminal, coloured by state) and for scripts (``--json``).

Colour follows the terminal: none when piped or when ``NO_COLOR`` is set. Piped output keeps every
cell whole, so ``grep`` sees what a wide terminal would.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Sequence
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobqueue import bidi

# Styles by the state a cell names, and for counts of a state that need attention.
STATE_STYLES = {
    "ready": "cyan",
    "pending": "cyan",
    "scheduled": "blue",
    "processing": "bold blue",
    "busy": "bold blue",
    "retrying": "yellow",
    "retryable": "yellow",
    "completed": "green",
    "idle": "green",
    "live": "green",
    "failed": "bold red",
    "stale": "bold red",
    "cancelled": "dim",
}
STATE_COLUMNS = frozenset({"state", "status"})
# Shorter headers for long field names (``--json`` keeps the names).
HEADERS = {
    "task_name": "task",
    "attempts_count": "attempts",
    "running_job_id": "job",
    "running_seconds": "busy_s",
    "heartbeat_age_seconds": "heartbeat_s",
    "oldest_ready_seconds": "oldest_ready_s",
    "oldest_unfinished_seconds": "oldest_unfinished_s",
    "jobs_done": "done",
}
TIMESTAMP_WIDTH = len("2026-11-23 10:04:05Z")


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    # The command's colour setting (click's, which `manage.py jobqueue --no-color/--force-color` set)
    # outranks rich's guess from the terminal and NO_COLOR.
    ctx = click.get_current_context(silent=True)
    color = ctx.color if ctx is not None else None
    # Off a terminal rich would assume 80 columns and cut cells; keep them whole instead.
    # No markup: what is printed holds text from jobs and the database ("[/x]" would be an error).
    return Console(
        file=stream,
        markup=False,
        width=None if tty else PIPED_WIDTH,
        highlight=False,
        soft_wrap=not tty,
        no_color=True if color is False else None,
        force_terminal=True if color else None,
    )


PIPED_WIDTH = 10_000  # off a terminal rich would assume 80 columns: lines this wide, cells whole


def timestamp(value: datetime) -> str:
    """A stored time (UTC) for people: to the second, marked as UTC."""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M:%SZ")


# Characters a terminal acts on (escape sequences, bell, carriage return, C1 controls), tab and
# newline excepted. Text a job wrote (its error, its arguments) is shown with each written as an
# escape such as \x1b, so that a job cannot retitle, recolour or rewrite the operator's terminal.
_CONTROLS = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)] if chr(code) not in "\t\n"}
# Bidirectional controls, which make a terminal that honours them show the text after them in
# another order (an error that reads as something else): written as escapes such as \u202e.
_CONTROLS.update(bidi.ESCAPES)


def printable(text: str) -> str:
    """``text`` with the control characters a terminal would act on written as escapes."""
    return text.translate(_CONTROLS)


def shown_key(key: str) -> str:
    """A key as a table shows it: as it is when that is unambiguous, else quoted with escapes
    (``'acme '``, ``'line\\nbreak'``), so that two keys never look alike in a table (a trailing
    space or a no-break space would not show) and one never breaks or recolours its row."""
    plain = key.isprintable() and key == key.strip() and not key.startswith(("'", '"'))
    return key if plain else repr(key)


def _plain(value: Any) -> str:
    """What a table cell shows of ``value``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, float):
        return f"{value:,.1f}"
    return printable(str(value))


def _cell(column: str, value: Any) -> Text:
    if value is None:
        return Text("-", style="dim")
    text = _plain(value)
    if isinstance(value, (bool, datetime, float)):
        return Text(text)
    if column in STATE_COLUMNS:
        return Text(text, style=STATE_STYLES.get(text.lower(), ""))
    if column in STATE_STYLES and isinstance(value, int) and value and column in ("failed", "retrying", "stale"):
        return Text(text, style=STATE_STYLES[column])
    return Text(text)


def _fits(rows: Sequence[dict[str, Any]], columns: Sequence[str], room: int) -> bool:
    """Whether a table fits ``room`` columns with every column at least its header's width (text
    columns may wrap down to that, times and numbers never)."""
    needed = 2 * (len(columns) - 1)
    for column in columns:
        cells = [_cell(column, row.get(column)).cell_len for row in rows]
        header = len(_header(column))
        natural = max(header, *cells)
        kind = next((row.get(column) for row in rows if row.get(column) is not None), None)
        wraps = not isinstance(kind, (datetime, int, float))
        needed += min(natural, max(header, 12)) if wraps else natural
    return needed <= room


def _header(column: str) -> str:
    return HEADERS.get(column, column).upper()


def _sample(rows: Sequence[dict[str, Any]], column: str) -> Any:
    """The first value of ``column`` that is not None: what the column holds."""
    return next((row.get(column) for row in rows if row.get(column) is not None), None)


def _is_number(sample: Any) -> bool:
    """Whether a column whose first value is ``sample`` holds numbers (right-aligned)."""
    return isinstance(sample, (int, float)) and not isinstance(sample, bool)


def _width(text: str) -> int:
    """The columns ``text`` takes on a terminal (wide characters take two)."""
    return len(text) if text.isascii() else cell_len(text)


def plain_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Iterator[str] | None:
    """The lines of :func:`render_table` off a terminal (no colour, no wrapping), made as they
    are written: rich measures a whole table first, minutes for the 100,000 rows of a long list.
    None for a table whose cells rich lays out otherwise (a line break or tab in a cell, lines
    wider than it folds at): rich writes those."""
    samples = [_sample(rows, column) for column in columns]
    numeric = [_is_number(sample) for sample in samples]
    headers = [_header(column) for column in columns]
    widths = [
        max(_width(header), TIMESTAMP_WIDTH) if isinstance(sample, datetime) else _width(header)
        for header, sample in zip(headers, samples, strict=True)
    ]
    cells = []
    for row in rows:
        line = [_plain(row.get(column)) for column in columns]
        for i, text in enumerate(line):
            if "\n" in text or "\t" in text:
                return None
            widths[i] = max(widths[i], _width(text))
        cells.append(line)
    if sum(widths) + 2 * (len(widths) - 1) > PIPED_WIDTH:
        return None
    return _aligned_lines(headers, cells, widths, numeric)


def _aligned_lines(headers: list[str], cells: list[list[str]], widths: list[int], numeric: list[bool]) -> Iterator[str]:
    """Each row's cells padded to their column's width, numbers on the right, two spaces apart."""

    def aligned(line: list[str]) -> str:
        padded = []
        for text, width, right in zip(line, widths, numeric, strict=True):
            gap = " " * (width - _width(text))
            padded.append(gap + text if right else text + gap)
        return "  ".join(padded)

    yield aligned(headers)
    for line in cells:
        yield aligned(line)


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for column in columns:
        sample = _sample(rows, column)
        if isinstance(sample, datetime):
            table.add_column(_header(column), no_wrap=True, min_width=TIMESTAMP_WIDTH)
        elif _is_number(sample):
            table.add_column(_header(column), justify="right", no_wrap=True)
        else:
            table.add_column(_header(column), overflow="fold", min_width=min(len(_header(column)), 12))
    for row in rows:
        table.add_row(*[_cell(column, row.get(column)) for column in columns])
    return table


def render_records(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Table:
    """One block per row, a line per column: what a terminal too narrow for the table gets."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for number, row in enumerate(rows):
        if number:
            grid.add_row("", "")
        for column in columns:
            grid.add_row(_header(column), _cell(column, row.get(column)))
    return grid


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], empty: str = "(none)") -> None:
    """Print ``rows`` as a table that fits the terminal (text wraps; times and numbers are kept
    whole); a terminal too narrow for that gets one block of lines per row."""
    out = console()
    if not rows:
        out.print(empty)
        return
    lines = None if out.is_terminal else plain_table(rows, columns)
    if lines is not None:
        for line in lines:
            out.file.write(line + "\n")
        return
    if not _fits(rows, columns, out.width):
        out.print(render_records(rows, columns))
        return
    out.print(render_table(rows, columns))


def utc_iso(value: datetime) -> str:
    """ISO 8601 with the offset; stored times carry no zone and are UTC."""
    return (value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)).isoformat()


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return utc_iso(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def echo_json(data: Any) -> None:
    """``data`` as strict JSON: a float that is no number (NaN, infinities, which a job's arguments or
    result may hold) is written as its name in a string, as JSON has no such numbers."""
    try:
        text = json.dumps(data, default=_default, indent=2, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), default=_default, indent=2, ensure_ascii=False, allow_nan=False)
    # A lone surrogate (kept by pickle) is written as its JSON escape: UTF-8 has no such character.
    click.echo(text if text.isascii() else text.translate(bidi.SURROGATE_ESCAPES))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def progress_bar(total: int, label: str) -> Any:
    """A progress bar on stderr, so --json output on stdout stays clean."""
    return click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True)
