"""read_archive, the statistics, the HTML report and the Parquet export, against SQL on the same archive."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue import JobQueue
from jobqueue.cli import cli
from jobqueue.clock import utcnow
from tests.conftest import only
from tests.spark import archive_data as data


def utc_minute(value: Any) -> str:
    """A TIMESTAMP as PySpark returns it (naive local time) as its UTC minute."""
    return f"{value.astimezone(timezone.utc):%Y-%m-%d %H:%M}"


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_read_archive_returns_every_row_and_column(spark: Any, app: JobQueue, db_url: str) -> None:
    from jobqueue.spark import ARCHIVE_SCHEMA, read_archive

    rows = data.fill_archive(app, 1200)
    df = read_archive(spark, db_url, partitions=5)
    assert df.schema == ARCHIVE_SCHEMA
    assert df.rdd.getNumPartitions() == 5
    found = {row.id: row for row in df.collect()}
    assert sorted(found) == [row["id"] for row in rows]
    sample = rows[99]  # id 100: headers set, microsecond times
    got = found[100]
    assert got.payload == sample["payload"] and json.loads(got.headers) == sample["headers"]
    assert got.created_at.astimezone(timezone.utc).replace(tzinfo=None) == sample["created_at"]
    assert got.archived_at.astimezone(timezone.utc).replace(tzinfo=None) == sample["archived_at"]
    # since/until bound archived_at: since <= archived_at < until
    cutoff = utcnow() - timedelta(days=1)
    older = read_archive(spark, db_url, until=cutoff)
    assert sorted(r.id for r in older.select("id").collect()) == data.ids_archived_before(app, cutoff)
    newer = read_archive(spark, db_url, since=timedelta(days=1))
    assert newer.count() + older.count() == len(rows)


def test_statistics_equal_sql_group_by(spark: Any, app: JobQueue, db_url: str, backend: str) -> None:
    from jobqueue.spark import archive_stats, read_archive, throughput

    data.fill_archive(app, 3000)
    archive = read_archive(spark, db_url).cache()
    stats = {(r.task_name, r.queue): r.asDict() for r in archive_stats(archive).collect()}
    expected = data.group_counts(app)
    assert set(stats) == set(expected) and len(stats) == 8
    waits = data.durations(app, "created_at", "first_attempt_at")
    runs = data.durations(app, "last_attempt_at", "finished_at")
    for group, want in expected.items():
        got = stats[group]
        for key in ("total", "completed", "failed", "cancelled", "attempts_max"):
            assert got[key] == want[key], (group, key)
        assert got["failure_rate"] == pytest.approx(want["failure_rate"], abs=1e-12)
        assert got["attempts_avg"] == pytest.approx(want["attempts_avg"], abs=1e-9)
        for kind, values in (("wait", waits[group]), ("run", runs[group])):
            for p in (50, 95, 99):
                assert got[f"{kind}_p{p}"] == pytest.approx(data.percentile(values, p / 100), abs=1e-6), (
                    group,
                    kind,
                    p,
                )
    if backend == "postgresql":  # the database's own percentile_cont agrees
        for kind, start, end in (("wait", "created_at", "first_attempt_at"), ("run", "last_attempt_at", "finished_at")):
            for group, values in data.postgresql_percentiles(app, start, end).items():
                assert [stats[group][f"{kind}_p{p}"] for p in (50, 95, 99)] == pytest.approx(values, abs=1e-6)
    minutes = {(utc_minute(r.minute), r.state): r.jobs for r in throughput(archive).collect()}
    assert minutes == data.per_minute(app)
    archive.unpersist()


@only("sqlite", "postgresql")
def test_the_report_is_one_offline_file_with_the_sql_numbers(
    spark: Any, master: str, app: JobQueue, tmp_path: Path
) -> None:
    data.fill_archive(app, 2000)
    out = tmp_path / "report.html"
    result = run_cli("report", "--since", "all", "--out", str(out), "--master", master)
    assert "wrote" in result.stdout and "2,000 archived job(s)" in result.stdout
    text = out.read_text()
    assert "<script" not in text.lower()
    assert not re.findall(r'(?:src|href)\s*=\s*["\'](?!#)', text), "the report must need no other file"
    assert text.count("<svg") == 4
    rows = re.findall(
        r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>([\d,]+)</td><td>([\d,]+)</td><td>([\d,]+)</td>"
        r"<td>([\d,]+)</td><td>([^<]+)</td>",
        text,
    )
    expected = data.group_counts(app)
    assert len(rows) == len(expected) == 8
    for task, queue, total, completed, failed, cancelled, rate in rows:
        want = expected[(task, queue)]
        assert [int(v.replace(",", "")) for v in (total, completed, failed, cancelled)] == [
            want["total"],
            want["completed"],
            want["failed"],
            want["cancelled"],
        ]
        assert rate == f"{want['failure_rate'] * 100:.2f}%"
    # --since keeps the window: nothing was archived in the last second... except nothing
    empty = tmp_path / "empty.html"
    run_cli("report", "--since", "1s", "--out", str(empty), "--master", master)
    assert "No jobs were archived in this window" in empty.read_text()


def test_export_then_purge_keeps_every_purged_row_in_parquet(
    spark: Any, master: str, app: JobQueue, tmp_path: Path
) -> None:
    rows = data.fill_archive(app, 2500)
    target = tmp_path / "archive-parquet"
    cutoff = utcnow() - timedelta(days=1)
    older = data.ids_archived_before(app, cutoff)
    assert 0 < len(older) < len(rows)
    result = run_cli(
        "archive",
        "export",
        "--to",
        str(target),
        "--older-than",
        "1d",
        "--purge",
        "--batch-size",
        "300",
        "--json",
        "--master",
        master,
    )
    report = json.loads(result.stdout)
    assert report["exported"] == report["purged"] == len(older)
    exported = spark.read.parquet(str(target))
    assert sorted(r.id for r in exported.select("id").collect()) == older  # every purged row is in Parquet
    assert data.archive_ids(app) == sorted(set(r["id"] for r in rows) - set(older))  # the rest stays
    partitions = {p.relative_to(target).as_posix() for p in target.glob("date=*/queue=*")}
    assert partitions and all(re.fullmatch(r"date=\d{4}-\d{2}-\d{2}/queue=(default|bulk)", p) for p in partitions)
    by_id = {r["id"]: r for r in rows}
    first = exported.where(exported.id == older[0]).collect()[0]
    want = by_id[older[0]]
    assert first.payload == want["payload"] and first.state == want["state"] and first.queue == want["queue"]
    assert first.finished_at.astimezone(timezone.utc).replace(tzinfo=None) == want["finished_at"]  # to the µs
    assert str(first.date) == f"{want['archived_at']:%Y-%m-%d}"
    # A second export appends the rest as another batch; without --purge the archive keeps them.
    again = json.loads(run_cli("archive", "export", "--to", str(target), "--json", "--master", master).stdout)
    assert again["exported"] == len(rows) - len(older) and again["purged"] == 0
    assert len(data.archive_ids(app)) == len(rows) - len(older)
    batches = {
        r.export_batch: r["count"] for r in spark.read.parquet(str(target)).groupBy("export_batch").count().collect()
    }
    assert batches == {report["export_batch"]: len(older), again["export_batch"]: len(rows) - len(older)}


@only("sqlite")
@pytest.mark.parametrize("master", ["local"], indirect=True)
def test_an_export_to_a_path_it_cannot_write_is_one_line_and_purges_nothing(
    spark: Any, master: str, app: JobQueue, tmp_path: Path
) -> None:
    rows = data.fill_archive(app, 50)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = str(blocker / "archive-parquet")
    result = CliRunner().invoke(cli, ["archive", "export", "--to", target, "--purge", "--master", master])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "\tat " not in result.output, result.output[-3000:]
    assert f"Error: cannot write the export to {target}: " in result.output
    assert "nothing was purged" in result.output
    assert len(data.ids_archived_before(app, utcnow() + timedelta(days=1))) == len(rows)
    # A folder that holds files other than Parquet: the rows are written, but cannot be read back
    # to be checked, which is one line too, naming the batch whose files stay.
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("a,b\n1,2\n")
    result = CliRunner().invoke(cli, ["archive", "export", "--to", str(other), "--purge", "--master", master])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "\tat " not in result.output, result.output[-3000:]
    assert f"Error: cannot read the export back from {other} to check it: " in result.output
    assert re.search(r"nothing was purged; remove the rows with export_batch = '[\w-]+' ", result.output)
    assert len(data.ids_archived_before(app, utcnow() + timedelta(days=1))) == len(rows)


@only("sqlite")
@pytest.mark.parametrize("master", ["local"], indirect=True)
def test_an_export_appends_in_the_types_of_the_files_already_there(
    spark: Any, master: str, app: JobQueue, tmp_path: Path
) -> None:
    """Exports before this release wrote the flow limit and rate as strings; files of one column in
    two types cannot be read together, so an export to such a folder keeps their type."""
    from pyspark.sql import functions as F

    from jobqueue.spark import export_archive, read_archive

    data.fill_archive(app, 40)
    with app.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {app.tables.archive.name} SET concurrency_limit = 3, rate_interval_us = 7"))
    old, new = tmp_path / "old", tmp_path / "new"
    earlier = read_archive(spark, app.database_url).where("id <= 20")
    for name in ("concurrency_limit", "rate_interval_us"):
        earlier = earlier.withColumn(name, F.col(name).cast("string"))
    earlier.withColumn("date", F.lit("2026-01-01")).withColumn("export_batch", F.lit("before")).write.partitionBy(
        "date", "queue"
    ).parquet(str(old))
    with app.engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {app.tables.archive.name} WHERE id <= 20"))
    assert export_archive(spark, app.database_url, str(old)).exported == 20  # read back and checked
    both = spark.read.parquet(str(old))
    assert both.schema["concurrency_limit"].dataType.simpleString() == "string"
    assert {(r.concurrency_limit, r.rate_interval_us) for r in both.collect()} == {("3", "7")}
    assert both.count() == 40
    assert export_archive(spark, app.database_url, str(new)).exported == 20  # a new folder: numbers
    fresh = spark.read.parquet(str(new))
    assert fresh.schema["concurrency_limit"].dataType.simpleString() == "int"
    assert {(r.concurrency_limit, r.rate_interval_us) for r in fresh.collect()} == {(3, 7)}


@pytest.mark.parametrize("master", ["local"], indirect=True)
def test_rows_edited_by_hand_are_read_as_they_are(
    spark: Any, master: str, app: JobQueue, backend: str, tmp_path: Path
) -> None:
    """JSON the database holds as text (SQLite) need not parse: it is handed on as that text."""
    from jobqueue.spark import archive_stats, read_archive
    from jobqueue.spark.report import write_report

    data.fill_archive(app, 200)
    table = app.tables.archive.name
    edits = [
        f"UPDATE {table} SET first_attempt_at = NULL, last_attempt_at = NULL, finished_at = NULL WHERE id = 5",
        f"UPDATE {table} SET state = 'WEIRD', task_name = '<b>odd</b>' WHERE id = 6",
        f"UPDATE {table} SET concurrency_limit = 3, rate_interval_us = 100000 WHERE id = 8",  # a flow-limited job
    ]
    if backend == "sqlite":  # the other databases refuse JSON that does not parse, and times that are not
        edits.append(f"UPDATE {table} SET headers = '{{not json', history = 'null' WHERE id = 10")
        edits.append(f"UPDATE {table} SET finished_at = 'yesterday', created_at = 42 WHERE id = 11")
        edits.append(f"UPDATE {table} SET last_attempt_at = '2026-11-27 10:00:00+02:00' WHERE id = 12")
        edits.append(f"UPDATE {table} SET first_attempt_at = '0001-01-01 00:00:00+05:00' WHERE id = 13")  # UTC: year 0
        # No time to place it in the report's throughput (it failed on it): neither can be read.
        edits.append(f"UPDATE {table} SET finished_at = NULL, archived_at = 'not a time' WHERE id = 14")
        edits.append(f"UPDATE {table} SET finished_at = '0001-01-01 00:00:00' WHERE id = 15")
        edits.append(f"UPDATE {table} SET id = {2**63 - 1} WHERE id = 16")  # no id past it bounds a range
        # Cells not of their column's type (SQLite keeps anything): each read as null, the rest kept.
        edits.append(
            f"UPDATE {table} SET priority = 'high', attempts_count = X'00', deliveries_count = {2**40}, "
            "payload = 'as text', task_name = X'FF41', queue = 12, concurrency_limit = 'two', "
            "error_message = CAST(X'C341' AS TEXT) WHERE id = 17"  # text that is not UTF-8
        )
    # The ends of the times Python holds: the statistics failed on them ("year 0 is out of range"),
    # and the report's chart on the year 9999.
    edge = {"postgresql": "'-infinity'", "mysql": "'9999-12-31 23:59:59'", "sqlite": "'9999-12-31 23:59:59.999999'"}
    edits.append(f"UPDATE {table} SET finished_at = {edge[backend]} WHERE id = 7")
    with app.engine.begin() as conn:
        for edit in edits:
            conn.execute(sa.text(edit))
    rows = {row.id: row for row in read_archive(spark, app.database_url).collect()}
    assert len(rows) == 200 and rows[6].state == "WEIRD" and rows[5].finished_at is None
    assert rows[7].finished_at is None and rows[7].archived_at is not None
    assert (rows[8].concurrency_limit, rows[8].rate_interval_us) == (3, 100_000)  # numbers, not their text
    if backend == "sqlite":
        assert rows[15].finished_at is None and 2**63 - 1 in rows and 16 not in rows
        assert (rows[10].headers, rows[10].history) == ("{not json", "null")
        assert (rows[11].finished_at, rows[11].created_at) == (None, None) and rows[11].archived_at is not None
        assert rows[12].last_attempt_at.astimezone(timezone.utc).replace(tzinfo=None) == datetime(2026, 11, 27, 8, 0)
        assert rows[13].first_attempt_at is None and rows[13].created_at is not None
        assert (rows[14].finished_at, rows[14].archived_at) == (None, None)
        odd = rows[17]
        assert (odd.priority, odd.attempts_count, odd.deliveries_count, odd.concurrency_limit) == (None,) * 4
        assert (odd.payload, odd.task_name, odd.queue, odd.error_message) == (b"as text", "\ufffdA", "12", "\ufffdA")
        assert odd.created_at is not None and odd.state is not None
    totals = archive_stats(read_archive(spark, app.database_url), by=()).collect()[0]
    assert totals.total == 200 and totals.completed + totals.failed + totals.cancelled == 199
    assert totals.first_finished is not None and totals.first_finished.year > 1
    out = tmp_path / "report.html"
    assert write_report(spark, app.database_url, str(out)) == 200
    assert "&lt;b&gt;odd&lt;/b&gt;" in out.read_text()


@only("sqlite")
@pytest.mark.parametrize("master", ["local"], indirect=True)
def test_rows_whose_archive_time_cannot_be_read_are_exported_and_kept_the_rest_purged(
    spark: Any, master: str, app: JobQueue
) -> None:
    """An archived_at edited into text that reads as none (or the year 1): --purge failed with an
    AttributeError (a ValueError), purged nothing, and each run exported the whole archive again."""
    rows = data.fill_archive(app, 60)
    ids = sorted(r["id"] for r in rows)
    a = app.tables.archive
    with app.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {a.name} SET archived_at = '' WHERE id = {ids[0]}"))
        conn.execute(sa.text(f"UPDATE {a.name} SET archived_at = '0001-01-01 00:00:00' WHERE id = {ids[1]}"))
    tmp = Path(app.database_url.removeprefix("sqlite:///")).parent / "edited-export"
    report = json.loads(run_cli("archive", "export", "--to", str(tmp), "--purge", "--json", "--master", master).stdout)
    assert report["exported"] == 60 and report["purged"] == 58, report
    assert data.archive_ids(app) == ids[:2]
