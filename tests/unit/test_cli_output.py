"""Tables of the CLI written off a terminal: line by line, the same text rich would lay out."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone

import pytest
from rich.console import Console

from jobqueue.cli import output

COLUMNS = ["id", "task", "state", "created", "error", "runtime", "flag", "nothing"]
ROWS = [
    {
        "id": 1,
        "task": "basic.add",
        "state": "FAILED",
        "created": datetime(2026, 1, 1, tzinfo=timezone.utc),
        "error": "boom\x1b[2J",
        "runtime": 1.5,
        "flag": True,
        "nothing": None,
    },
    {
        "id": 12345,
        "task": "日本語のタスク",
        "state": "PENDING",
        "created": None,
        "error": None,
        "runtime": 12345.25,
        "flag": False,
        "nothing": None,
    },
]


def laid_out_by_rich(rows: list[dict], columns: list[str]) -> str:
    buffer = io.StringIO()
    Console(file=buffer, markup=False, width=10_000, highlight=False, soft_wrap=True).print(
        output.render_table(rows, columns)
    )
    return buffer.getvalue()


def test_a_piped_table_is_what_rich_lays_out_wide_characters_and_escapes_included() -> None:
    """rich measured the whole table before writing a line: minutes for a list of 100,000 jobs."""
    lines = output.plain_table(ROWS, COLUMNS)
    assert lines is not None
    plain = "".join(line + "\n" for line in lines)
    assert plain == laid_out_by_rich(ROWS, COLUMNS)
    assert "boom\\x1b[2J" in plain and "\x1b" not in plain


def test_print_table_off_a_terminal_writes_the_plain_lines(capsys) -> None:
    output.print_table(ROWS, COLUMNS)
    assert capsys.readouterr().out == laid_out_by_rich(ROWS, COLUMNS)


def test_cells_rich_lays_out_over_lines_are_left_to_rich(capsys) -> None:
    """A driver's error of two lines in a cell (and a tab) was written raw inside its row."""
    rows = [{**ROWS[0], "error": "could not connect\nis the server running?"}, {**ROWS[1], "task": "a\tb"}]
    assert output.plain_table(rows, COLUMNS) is None
    output.print_table(rows, COLUMNS)
    assert capsys.readouterr().out == laid_out_by_rich(rows, COLUMNS)


def test_json_output_writes_a_lone_surrogate_as_its_escape(capsys: pytest.CaptureFixture[str]) -> None:
    """A value pickle kept (a file name read with surrogateescape) made `jobs show --json` fail
    with UnicodeEncodeError: UTF-8 has no lone surrogate."""
    from jobqueue.cli.output import echo_json

    echo_json({"args": ["report-\ud800.csv", "caf\udcc3"], "ok": "héllo \u202e"})
    out = capsys.readouterr().out
    out.encode("utf-8")  # writable as UTF-8
    assert "\\ud800" in out and "héllo" in out
    assert json.loads(out) == {"args": ["report-\ud800.csv", "caf\udcc3"], "ok": "héllo \u202e"}
