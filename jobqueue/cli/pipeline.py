"""``jobqueue report`` and ``jobqueue archive export``: the Spark pipeline over the archive."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import click

from jobqueue.cli.output import echo_json, progress_bar
from jobqueue.cli.state import Age, CliState, Group
from jobqueue.errors import JobQueueError

MASTER_HELP = "Spark master URL (default local[*]: this machine's cores)."
MASTER_PREFIXES = ("local", "spark://", "k8s://")  # and "yarn": the masters Spark takes


def _spark(master: str | None) -> tuple[Any, Any]:
    """The jobqueue.spark module and a session, or a one-line error naming the install command."""
    if master is not None and not (master == "yarn" or master.startswith(MASTER_PREFIXES)):
        raise click.BadParameter(
            f"cannot start Spark on {master}: give local[*], local[N], spark://HOST:PORT, yarn or k8s://URL",
            param_hint="--master",
        )
    try:
        import jobqueue.spark as spark
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"starting Spark on {master or 'local[*]'}...", err=True)
    # The command logs at INFO; py4j's INFO lines ("Closing down clientserver connection") are
    # the bridge's own business, not the report's.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return spark, spark.get_session(master)
    except JobQueueError:
        raise
    except Exception as exc:  # the JVM did not start or reach the master; it said why above
        java = getattr(exc, "java_exception", None)  # py4j's error: the Java exception says why
        reason = ((java.toString() if java is not None else str(exc)).strip().splitlines() or [type(exc).__name__])[0]
        raise click.ClickException(f"cannot start Spark on {master or 'local[*]'}: {reason}") from None


@click.command()
@click.option(
    "--since",
    default="24h",
    show_default=True,
    type=Age(everything="all"),
    help="Jobs archived within this age: 90s, 30m, 24h, 7d, 2w; 'all' for the whole archive.",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False, writable=True), help="The HTML file to write.")
@click.option("--master", help=MASTER_HELP)
@click.pass_obj
def report(state: CliState, /, since: timedelta | None, out: str, master: str | None) -> None:
    """Write one self-contained HTML report on the archive: counts, failure rates, queue wait
    and run time percentiles, throughput per minute, with plots."""
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):  # found now, not after Spark has computed the report
        raise click.BadParameter(f"directory {directory} does not exist", param_hint="--out")
    _check_writable(out)
    app = state.app
    app.check_schema(beyond_tables=False)  # a database that cannot be read is said before Spark takes its time to start
    spark, session = _spark(master)
    jobs = spark.write_report(session, app.database_url, out, since=since, table_prefix=app.settings.table_prefix)
    click.echo(f"wrote {out}: {jobs:,} archived job(s)")


def _check_writable(out: str) -> None:
    """Whether ``out`` can be written, tried now (permissions, a read-only or immutable directory,
    /proc): not after Spark has computed the report. Nothing is left behind."""
    existed = os.path.exists(out)
    try:
        with open(out, "a"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write {out}: {exc.strerror or exc}", param_hint="--out") from None
    if not existed:
        os.unlink(out)


@click.group(cls=Group)
def archive() -> None:
    """Export the archive to Parquet (and purge what was exported)."""


@archive.command("export")
@click.option("--to", "path", required=True, help="Directory (or cluster URI) the Parquet files go under.")
@click.option("--older-than", type=Age(), help="Only jobs archived longer ago than this (default: all).")
@click.option("--purge", is_flag=True, help="Then delete the exported rows, once the files are read back and checked.")
@click.option(
    "--batch-size",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Rows deleted per transaction when purging.",
)
@click.option("--master", help=MASTER_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def export(
    state: CliState,
    /,
    path: str,
    older_than: timedelta | None,
    purge: bool,
    batch_size: int,
    master: str | None,
    as_json: bool,
) -> None:
    """Append archived jobs to Parquet, partitioned by date and queue."""
    app = state.app
    app.check_schema(beyond_tables=False)  # a database that cannot be read is said before Spark takes its time to start
    spark, session = _spark(master)
    bars: list[Any] = []  # the purge's progress bar, once the export is verified

    def on_verified(count: int) -> None:
        click.echo(f"exported and verified {count:,} job(s)", err=True)
        if purge:
            bars.append(progress_bar(count, "purging exported jobs"))

    result = spark.export_archive(
        session,
        app.database_url,
        path,
        older_than=older_than,
        purge=purge,
        table_prefix=app.settings.table_prefix,
        batch_size=batch_size,
        progress=lambda count: bars[0].update(count),
        on_verified=on_verified,
    )
    for bar in bars:
        bar.render_finish()
    if as_json:
        echo_json(
            {
                "path": result.path,
                "export_batch": result.batch,
                "archived_before": result.cutoff,
                "exported": result.exported,
                "purged": result.purged,
            }
        )
        return
    click.echo(
        f"exported {result.exported:,} job(s) archived before {result.cutoff:%Y-%m-%d %H:%M:%S} UTC "
        f"to {result.path} (export_batch {result.batch})"
    )
    if purge:
        click.echo(f"purged {result.purged:,} exported job(s) from the archive")
