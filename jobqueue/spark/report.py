"""``jobqueue report``: the archive's statistics as one self-contained HTML file.

Tables, and plots as inline SVG drawn by matplotlib: the file opens offline, runs no script and
needs nothing beside it.
"""

from __future__ import annotations

import html
import io
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

try:
    from matplotlib.dates import date2num
    from matplotlib.figure import Figure
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the report draws its plots with matplotlib: pip install "jobqueue[spark]"') from exc
from pyspark.sql import DataFrame, Row, SparkSession

from jobqueue.clock import utcnow
from jobqueue.spark.archive import instant, read_archive
from jobqueue.spark.stats import archive_stats, throughput
from jobqueue.storage.engine import mask_url

STATE_COLOURS = {"COMPLETED": "#2e7d32", "FAILED": "#c62828", "CANCELLED": "#9e9e9e"}
PERCENTILE_COLOURS = ("#90caf9", "#1e88e5", "#0d47a1")
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} .meta{color:#666;margin-top:0}
table{border-collapse:collapse;margin:1em 0;font-size:.82em;width:100%}
th,td{padding:.35em .6em;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
th:first-child,td:first-child,th:nth-child(2),td:nth-child(2){text-align:left}
thead th{background:#f5f5f5} .cards{display:flex;gap:1em;flex-wrap:wrap}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:8em}
.card b{display:block;font-size:1.5em} figure{margin:1.5em 0} figcaption{color:#555}
svg{width:100%;height:auto}
"""


def write_report(
    spark: SparkSession,
    database_url: str,
    out: str,
    *,
    since: datetime | timedelta | None = None,
    until: datetime | timedelta | None = None,
    table_prefix: str = "jobqueue_",
) -> int:
    """Read the archive (``since <= archived_at < until``), write the report to ``out`` and return
    how many jobs it covers."""
    now = utcnow()
    since_at, until_at = instant(since, now), instant(until, now)
    archive = read_archive(spark, database_url, since_at, until_at, table_prefix=table_prefix).cache()
    try:
        text = render_report(archive, database_url=database_url, since=since_at, until=until_at)
        jobs = archive.count()
    finally:
        archive.unpersist()
    with open(out, "w", encoding="utf-8") as file:
        file.write(text)
    return jobs


def render_report(
    archive: DataFrame,
    *,
    title: str = "jobqueue report",
    database_url: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> str:
    """The HTML report of an archive DataFrame (from :func:`jobqueue.spark.read_archive`)."""
    per_group = archive_stats(archive).collect()
    per_task = archive_stats(archive, by=("task_name",)).collect()
    totals = archive_stats(archive, by=()).collect()[0]
    per_minute = throughput(archive).collect()
    parts = [f"<h1>{html.escape(title)}</h1>", f'<p class="meta">{html.escape(_meta(database_url, since, until))}</p>']
    if not totals["total"]:
        parts.append("<p>No jobs were archived in this window.</p>")
        return _page(title, parts)
    parts.append(_cards(totals, per_minute))
    parts.append("<h2>Per task and queue</h2>")
    parts.append(_table(per_group))
    parts.append(_figure(_throughput_plot(per_minute), "Jobs finished over time (UTC), by final state."))
    parts.append(
        _figure(
            _percentile_plot(per_task, "wait", "queue wait, s"),
            "Queue wait (first attempt − enqueue) per task: p50, p95, p99.",
        )
    )
    parts.append(
        _figure(
            _percentile_plot(per_task, "run", "run time, s"), "Run time of the last attempt per task: p50, p95, p99."
        )
    )
    parts.append(_figure(_failure_plot(per_task), "Failure rate per task: failed / (completed + failed)."))
    parts.append(
        "<h2>Definitions</h2><p>Percentiles are exact, interpolated between the nearest values. "
        "Queue wait counts from enqueue (or the retry that reset a job) to its first attempt; "
        "cancelled jobs count in totals but not in the failure rate.</p>"
    )
    return _page(title, parts)


def _meta(database_url: str | None, since: datetime | None, until: datetime | None) -> str:
    where = f"{mask_url(database_url)} · " if database_url else ""
    window = f"archived {_when(since) if since else 'since the beginning'} to {_when(until) if until else 'now'}"
    return f"{where}{window} · generated {_when(utcnow())}"


def _when(value: datetime) -> str:
    value = value.astimezone(timezone.utc) if value.tzinfo else value
    return f"{value:%Y-%m-%d %H:%M:%S} UTC"


def _page(title: str, parts: list[str]) -> str:
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _cards(totals: Row, per_minute: list[Row]) -> str:
    minutes = len({row["minute"] for row in per_minute}) or 1
    rate = totals["failure_rate"]
    cards = [
        ("jobs", f"{totals['total']:,}"),
        ("completed", f"{totals['completed']:,}"),
        ("failed", f"{totals['failed']:,}"),
        ("cancelled", f"{totals['cancelled']:,}"),
        ("failure rate", _percent(rate)),
        ("jobs per active minute", f"{totals['total'] / minutes:,.1f}"),
        ("queue wait p95", _seconds(totals["wait_p95"])),
        ("run time p95", _seconds(totals["run_p95"])),
    ]
    inner = "".join(
        f'<div class="card">{html.escape(label)}<b>{html.escape(value)}</b></div>' for label, value in cards
    )
    return f'<div class="cards">{inner}</div>'


COLUMNS = (
    ("task", "task_name", str),
    ("queue", "queue", str),
    ("jobs", "total", "{:,}".format),
    ("completed", "completed", "{:,}".format),
    ("failed", "failed", "{:,}".format),
    ("cancelled", "cancelled", "{:,}".format),
)


def _table(rows: Sequence[Row]) -> str:
    head = [label for label, _, _ in COLUMNS] + [
        "failure rate",
        "attempts avg / max",
        "wait p50 / p95 / p99",
        "run p50 / p95 / p99",
    ]
    lines = ["<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for row in rows:
        cells = [fmt(row[key]) for _, key, fmt in COLUMNS]
        cells.append(_percent(row["failure_rate"]))
        # No attempt count to average: a group whose counts were all edited by hand into no number.
        average, most = row["attempts_avg"], row["attempts_max"]
        cells.append(f"{'–' if average is None else f'{average:.2f}'} / {'–' if most is None else most}")
        for kind in ("wait", "run"):
            cells.append(" / ".join(_seconds(row[f"{kind}_p{p}"]) for p in (50, 95, 99)))
        lines.append("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.2f}%"


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s" if value < 120 else f"{value / 60:.1f} min"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # no XML declaration or DOCTYPE inside HTML


BIN_MINUTES = (1, 5, 15, 60, 240, 1440)
MAX_BARS = 360


def _throughput_plot(rows: list[Row]) -> str:
    if not rows:
        return "<p>No job has a time it finished or was archived at that could be read.</p>"
    series: dict[str, dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    minutes = [row["minute"].astimezone(timezone.utc).replace(tzinfo=None) for row in rows]  # PySpark: local time
    span = (max(minutes) - min(minutes)).total_seconds() / 60 + 1
    size = next((m for m in BIN_MINUTES if span / m <= MAX_BARS), BIN_MINUTES[-1])  # minutes per bar
    for row, minute in zip(rows, minutes, strict=False):
        start = minute - timedelta(minutes=(minute.hour * 60 + minute.minute) % size)  # sizes divide a day
        series[row["state"]][start] += row["jobs"]
    bins = sorted({start for counts in series.values() for start in counts})
    figure = Figure(figsize=(10, 3.2))
    axes = figure.subplots()
    x = date2num(bins)  # type: ignore[no-untyped-call]
    bottom = [0] * len(bins)
    for state in sorted(series, key=lambda s: list(STATE_COLOURS).index(s) if s in STATE_COLOURS else 9):
        counts = [series[state].get(start, 0) for start in bins]
        axes.bar(
            x,
            counts,
            bottom=bottom,
            width=size / 1440 * 0.9,
            label=state.lower(),
            color=STATE_COLOURS.get(state, "#555"),
            align="edge",
        )
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    axes.set_ylabel("jobs per minute" if size == 1 else f"jobs per {size} minutes")
    axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, ncols=3)
    axes.grid(axis="y", alpha=0.3)
    axes.xaxis_date()
    figure.autofmt_xdate()
    return _svg(figure)


def _percentile_plot(rows: list[Row], kind: str, label: str) -> str:
    tasks = [row["task_name"] for row in rows]
    figure = Figure(figsize=(10, 0.5 + 0.45 * len(tasks) * 1.2))
    axes = figure.subplots()
    height = 0.8 / 3
    for i, p in enumerate((50, 95, 99)):
        values = [row[f"{kind}_p{p}"] or 0.0 for row in rows]
        axes.barh(
            [t + (i - 1) * height for t in range(len(tasks))],
            values,
            height=height,
            label=f"p{p}",
            color=PERCENTILE_COLOURS[i],
        )
    axes.set_yticks(range(len(tasks)), tasks)
    axes.invert_yaxis()
    axes.set_xlabel(label)
    if any((row[f"{kind}_p99"] or 0) > 0 for row in rows):
        axes.set_xscale("symlog", linthresh=0.001)
    axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, ncols=3)
    axes.grid(axis="x", alpha=0.3)
    return _svg(figure)


def _failure_plot(rows: list[Row]) -> str:
    tasks = [row["task_name"] for row in rows]
    figure = Figure(figsize=(10, 0.5 + 0.4 * len(tasks)))
    axes = figure.subplots()
    rates = [(row["failure_rate"] or 0.0) * 100 for row in rows]
    axes.barh(range(len(tasks)), rates, color=STATE_COLOURS["FAILED"], height=0.6)
    for y, rate in enumerate(rates):
        axes.text(rate, y, f" {rate:.1f}%", va="center", fontsize=9)
    axes.set_yticks(range(len(tasks)), tasks)
    axes.invert_yaxis()
    axes.set_xlabel("failed, % of completed + failed")
    axes.set_xlim(0, max(max(rates, default=0) * 1.15, 1))
    axes.grid(axis="x", alpha=0.3)
    return _svg(figure)
