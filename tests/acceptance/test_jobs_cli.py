"""``jobqueue jobs``: the dead-letter queue from the command line, on every backend."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.job import SCHEDULE_TASK
from tests.acceptance.cli import jobqueue
from tests.apps import basic
from tests.conftest import only


def test_list_show_retry_a_failed_job(app: JobQueue, tmp_path: Path) -> None:
    failing = basic.fail_once.delay(str(tmp_path / "marker"))
    done = basic.add.delay(1, 2)
    jobqueue("worker", "--burst", "--concurrency", "1")
    assert failing.status() == "failed"

    listed = json.loads(jobqueue("jobs", "list", "--state", "failed", "--task", "basic.fail_once", "--json").stdout)
    assert [row["id"] for row in listed] == [failing.id]
    assert listed[0]["error_type"] == "RuntimeError"
    table = [line.rstrip() for line in jobqueue("jobs", "list", "--state", "failed").stdout.splitlines()]
    assert len(table) == 2 and table[1].split()[:2] == [str(failing.id), "basic.fail_once"]
    assert table[1].endswith("RuntimeError  first run fails  -")  # nothing holds it back: it has ended
    assert done.status() == "completed"

    shown = jobqueue("jobs", "show", str(failing.id)).stdout
    assert "FAILED" in shown and "RuntimeError: first run fails" in shown
    assert "traceback:" in shown and 'raise RuntimeError("first run fails")' in shown
    assert "marker" in shown  # the arguments
    # Its times are UTC, and say so, as the table's do.
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}Z"
    assert re.search(rf"^created      {stamp}$", shown, re.M), shown
    assert re.search(rf"^finished     {stamp}  \(archived {stamp}\)$", shown, re.M), shown
    detail = json.loads(jobqueue("jobs", "show", str(failing.id), "--json").stdout)
    assert detail["attempts_count"] == 1 and detail["args"] == [str(tmp_path / "marker")]

    out = jobqueue("jobs", "retry", str(failing.id)).stdout
    assert f"retried 1 job(s): {failing.id}" in out
    assert failing.status() == "pending"
    jobqueue("worker", "--burst", "--concurrency", "1")
    assert failing.get(timeout=5) == "second run works"  # the same id ran again
    history = json.loads(jobqueue("jobs", "show", str(failing.id), "--json").stdout)["history"]
    assert history[0]["error_message"] == "first run fails"
    assert history[0]["finished_at"].endswith("+00:00")  # times in --json carry their offset
    assert "history 1: FAILED" in jobqueue("jobs", "show", str(failing.id)).stdout


def test_jobs_show_json_is_strict_json_when_a_job_holds_floats_that_are_no_numbers(app: JobQueue) -> None:
    """It wrote NaN and Infinity, which JSON has not: JavaScript's JSON.parse refuses them."""
    job = basic.add.delay(float("nan"), float("-inf"))

    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    shown = json.loads(jobqueue("jobs", "show", str(job.id), "--json").stdout, parse_constant=refuse)
    assert shown["args"] == ["NaN", "-Infinity"]


def test_ctrl_c_during_a_long_retry_says_how_many_went_back(app: JobQueue) -> None:
    """Interrupted, it printed only "Aborted!": how many jobs were back in the queue was unsaid."""
    import sqlalchemy as sa
    from click.testing import CliRunner

    from jobqueue.cli import bound_cli
    from jobqueue.retry import NoRetryStrategy
    from jobqueue.testing import drain

    @app.task(name="t.fails", retry_strategy=NoRetryStrategy())
    def fails(n: int) -> None:
        raise ValueError(n)

    fails.bulk([(n,) for n in range(450)])
    drain(app)
    batches: list[str] = []

    def ctrl_c(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            batches.append(statement)  # a batch moved back, committed as its transaction ends
        elif len(batches) == 2:
            raise KeyboardInterrupt  # Ctrl-C as the third batch starts

    sa.event.listen(app.engine, "before_cursor_execute", ctrl_c)
    try:
        result = CliRunner().invoke(bound_cli(app), ["jobs", "retry", "--all-failed"])
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", ctrl_c)
    assert result.exit_code == 130, result.output
    assert "interrupted: retried 400 job(s) before it stopped; run the command again to go on" in result.output
    with app.engine.connect() as conn:  # two whole batches back in the queue, the rest still failed
        for table, count in ((app.tables.message, 400), (app.tables.archive, 50)):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == count


def test_retry_all_failed_of_a_task(app: JobQueue) -> None:
    failed = [basic.fail.delay(f"n{i}") for i in range(3)]
    other = basic.fail_once.delay("/nonexistent/dir/marker")  # fails too (cannot create the marker)
    jobqueue("worker", "--burst", "--concurrency", "2")
    result = json.loads(jobqueue("jobs", "retry", "--all-failed", "--task", "basic.fail", "--json").stdout)
    assert sorted(result["retried"]) == sorted(h.id for h in failed) and result["refused"] == {}
    assert {h.status() for h in failed} == {"pending"} and other.status() == "failed"


def test_retry_and_cancel_refusals_exit_non_zero(app: JobQueue) -> None:
    done = basic.add.delay(1, 1)
    jobqueue("worker", "--burst", "--concurrency", "1")
    refused = jobqueue("jobs", "retry", str(done.id), check=False)
    assert refused.returncode == 1 and "only failed or cancelled" in refused.stderr
    missing = jobqueue("jobs", "retry", "987654321", check=False)
    assert missing.returncode == 1 and "not in the archive" in missing.stderr
    usage = jobqueue("jobs", "retry", check=False)
    assert usage.returncode == 2 and "--all-failed" in usage.stderr
    pending = basic.add.delay(2, 2)
    assert jobqueue("jobs", "cancel", str(pending.id)).returncode == 0
    assert pending.status() == "cancelled"
    again = jobqueue("jobs", "cancel", str(pending.id), check=False)
    assert again.returncode == 1 and "not cancelled" in again.stderr


def test_an_id_given_twice_is_retried_or_cancelled_once(app: JobQueue) -> None:
    """The second time round the job was no longer there, and the command exited 1 for it."""
    failed = basic.fail.delay("twice")
    jobqueue("worker", "--burst", "--concurrency", "1")
    retried = json.loads(jobqueue("jobs", "retry", str(failed.id), str(failed.id), "--json").stdout)
    assert retried["retried"] == [failed.id] and retried["refused"] == {}
    pending = basic.add.delay(3, 3)
    assert jobqueue("jobs", "cancel", str(pending.id), str(pending.id)).returncode == 0
    assert failed.status() == "pending" and pending.status() == "cancelled"


def test_cancel_every_pending_job_of_a_queue_or_task(app: JobQueue, db_url: str) -> None:
    """A flood of bad jobs is cancelled in one command, a batch to a transaction; it used to take
    every id, one transaction each (about 84 jobs/s on PostgreSQL)."""
    from jobqueue import schedule_sync
    from tests.apps import periodic as periodic_app

    schedules = periodic_app.app
    schedules.configure(database_url=db_url)
    try:
        schedule_sync.sync(schedules.store, schedules.schedules, set(schedules.registry), utcnow())
    finally:
        schedules.close()
    flood = basic.add.bulk([(i, i) for i in range(1_203)], queue="bulk")
    later = basic.add.apply_async((1, 1), queue="bulk", countdown=3600)  # pending, not yet due
    other_task = basic.notify.apply_async((1,), queue="bulk")
    other_queue = basic.add.delay(2, 2)
    m = app.tables.message
    with app.engine.begin() as conn:  # one retryable, one running: the latter is left alone
        conn.execute(sa.update(m).where(m.c.id == flood[0].id).values(state="RETRYABLE"))
        conn.execute(sa.update(m).where(m.c.id == flood[1].id).values(state="PROCESSING"))
    schedules_before = _schedule_rows(app)
    assert schedules_before

    command = ("jobs", "cancel", "--queue", "bulk", "--task", "basic.add")
    refused = jobqueue(*command, check=False)  # not a terminal: no question can be asked
    assert refused.returncode == 2 and "would cancel 1203 pending or retryable job(s)" in refused.stderr
    assert "of queue 'bulk' and of task 'basic.add'" in refused.stderr and "--yes" in refused.stderr
    dry = json.loads(jobqueue(*command, "--dry-run", "--json").stdout)
    assert (dry["would_cancel"], dry["cancelled"]) == (1_203, 0)
    done = jobqueue(*command, "--yes", "--json")
    assert json.loads(done.stdout)["cancelled"] == 1_203 and "cancelling jobs" in done.stderr
    assert {h.status() for h in flood[2:]} == {"cancelled"} and flood[0].status() == "cancelled"
    assert (flood[1].status(), later.status()) == ("processing", "cancelled")
    assert (other_task.status(), other_queue.status()) == ("pending", "pending")

    # --all: every pending job of every queue and task, never a periodic schedule's message.
    said = jobqueue("jobs", "cancel", "--all", "--yes")
    assert "cancelled 2 job(s)" in said.stdout, said.stdout
    assert (other_task.status(), other_queue.status(), flood[1].status()) == ("cancelled", "cancelled", "processing")
    assert _schedule_rows(app) == schedules_before
    nothing = jobqueue("jobs", "cancel", "--task", "basic.add")
    assert "nothing to cancel: 0 pending or retryable job(s) of task 'basic.add'" in nothing.stdout

    for args, fragment in [
        (("jobs", "cancel"), "give the ids of the jobs to cancel, or --queue and/or --task, or --all"),
        (("jobs", "cancel", "5", "--queue", "bulk"), "give job ids, or --queue/--task/--all, not both"),
        (("jobs", "cancel", "--all", "--task", "basic.add"), "leave out --queue and --task, or --all"),
        (("jobs", "cancel", "5", "--yes"), "--dry-run and --yes go with --queue, --task or --all"),
        (("jobs", "cancel", "--queue", ""), "is empty: give a name, or leave the option out"),
    ]:
        usage = jobqueue(*args, check=False)
        assert usage.returncode == 2 and fragment in usage.stderr, usage.stderr


@only("postgresql", "mysql")
def test_cancel_by_filter_cancels_only_the_jobs_it_counted(app: JobQueue) -> None:
    """A transaction that enqueued jobs before the command started commits while it asks: those
    jobs, whose ids are below the newest job's, are not among the ones it counted, and stay. It
    cancelled them (3 jobs asked about, 8 cancelled)."""
    import pty
    import select

    from tests.acceptance.cli import APP, ROOT

    basic.add.bulk([(i, i) for i in range(3)])
    with app.engine.connect() as conn:
        transaction = conn.begin()
        late = basic.add.bulk([(i, i) for i in range(5)], connection=conn)
        newest = basic.notify.delay(1)  # committed, with the largest id
        pid, fd = pty.fork()
        if pid == 0:  # the command, at a terminal: it asks
            os.chdir(ROOT)
            os.execv(sys.executable, [sys.executable, "-m", "jobqueue", "--app", APP, "jobs", "cancel", "--all"])
        said = b""
        deadline = time.monotonic() + 60
        while b"[y/N]" not in said and time.monotonic() < deadline:
            if select.select([fd], [], [], 1)[0]:
                said += os.read(fd, 1024)
        assert b"Cancel 4 pending or retryable job(s)?" in said, said
        transaction.commit()
    os.write(fd, b"y\n")
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        said += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert b"cancelled 4 job(s)" in said, said
    assert {h.status() for h in late} == {"pending"} and newest.status() == "cancelled"


@only("mysql")
def test_a_command_behind_a_table_lock_says_so_after_the_lock_timeout(app: JobQueue) -> None:
    """LOCK TABLES (or a schema change) holds jobqueue's table: a command waited 60 s, its read
    timeout, and said the connection to the server was lost. It waits 30 s, as on PostgreSQL, and
    says what holds it up."""
    basic.add.delay(1, 1)
    holder = app.engine.raw_connection()
    try:
        cursor = holder.cursor()
        cursor.execute("SET SESSION idle_transaction_timeout = 0")  # jobqueue's 10 s would end it
        cursor.execute(f"LOCK TABLES {app.tables.message.name} WRITE")
        sent = time.monotonic()
        listed = jobqueue("jobs", "list", check=False)
        waited = time.monotonic() - sent
    finally:
        holder.close()
    assert listed.returncode == 1 and "Traceback" not in listed.stderr, listed.stderr[-2000:]
    assert "Lock wait timeout exceeded" in listed.stderr and "another session held a lock" in listed.stderr
    assert "SHOW PROCESSLIST" in listed.stderr and "Lost connection" not in listed.stderr
    assert 25 < waited < 50, waited


def _schedule_rows(app: JobQueue) -> list[tuple[int, str]]:
    m = app.tables.message
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(m.c.id, m.c.state).where(m.c.task_name == SCHEDULE_TASK).order_by(m.c.id))
        return [tuple(row) for row in rows]


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "purge", "--state", "completed", "--older-than", "0s", "--yes", "--task", ""],
        ["jobs", "retry", "--all-failed", "--task", " "],
        ["jobs", "list", "--queue", ""],
    ],
)
def test_an_empty_name_to_filter_by_is_refused(app: JobQueue, command: list[str]) -> None:
    """`--task "$T"` with T unset filtered nothing: a purge took every task's jobs."""
    done = basic.add.delay(1, 1)
    failed = basic.fail.delay("empty")
    jobqueue("worker", "--burst", "--concurrency", "1")
    refused = jobqueue(*command, check=False)
    assert refused.returncode == 2 and "is empty: give a name, or leave the option out" in refused.stderr
    assert (done.status(), failed.status()) == ("completed", "failed")


def test_purge_with_progress(app: JobQueue) -> None:
    basic.add.bulk([(i, i) for i in range(25)])
    keep = basic.fail.delay("kept")
    jobqueue("worker", "--burst", "--concurrency", "2")
    purge = ("jobs", "purge", "--state", "completed", "--older-than", "0s")
    refused = jobqueue(*purge, check=False)  # not a terminal: no question can be asked
    assert refused.returncode == 2 and "would delete 25 completed job(s)" in refused.stderr
    assert "--yes" in refused.stderr
    dry = json.loads(jobqueue(*purge, "--dry-run", "--json").stdout)
    assert (dry["would_purge"], dry["purged"]) == (25, 0)
    assert dry["archived_before"].endswith("+00:00")  # ISO 8601 UTC with its offset
    result = jobqueue(*purge, "--batch-size", "10", "--yes", "--json")
    assert json.loads(result.stdout)["purged"] == 25
    assert "purging completed jobs" in result.stderr  # the progress bar, on stderr
    assert keep.status() == "failed"
    assert json.loads(jobqueue("jobs", "list", "--json").stdout)[0]["id"] == keep.id


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("jobs", "purge", "--state", "completed", "--older-than", "7x"), "90s, 30m, 24h, 7d or 2w"),
        (("jobs", "purge", "--state", "pending", "--older-than", "1d"), "Invalid value for '--state'"),
        (("jobs", "purge", "--state", "failed", "--older-than", "1000000d"), "give at most 1000 years (365000d)"),
        (("jobs", "purge", "--state", "failed", "--older-than", "99999999999d"), "give at most 1000 years"),
        (("jobs", "show", "987654321"), "not found"),
        # over the largest id a database holds (SQLite's driver cannot even send it)
        (("jobs", "show", str(2**63)), "is not in the range"),
        (("jobs", "cancel", str(2**63)), "is not in the range"),
        (("jobs", "retry", "1", str(2**64)), "is not in the range"),
        (("jobs", "retry", "--", "-3"), "is not in the range 1<=x<=9223372036854775807"),
        # bytes that are not UTF-8 (a Latin-1 terminal): Python passes them on as surrogates
        (("jobs", "list", "--task", "\udcff"), "'--task': holds the byte(s) ff, which are not UTF-8"),
        (("jobs", "list", "--queue", "a\udcff\udcfeb"), "'--queue': holds the byte(s) ff fe, which are not UTF-8"),
        (("jobs", "purge", "--state", "failed", "--older-than", "1d", "--task", "\udcff", "--dry-run"), "not UTF-8"),
        (("jobs", "retry", "--all-failed", "--task", "\udcff"), "give it as UTF-8 text"),
        (("enqueue", "\udcff", "--args", "[]"), "'TASK': holds the byte(s) ff"),
        # it was "an unpaired surrogate such as '\ud800'" and "got 'k\udcff'"
        (("enqueue", "basic.add", "--args", '[1, "\udcff"]'), "'--args': holds the byte(s) ff, which are not UTF-8"),
        (("enqueue", "basic.add", "--args", "[1, 2]", "--unique-key", "k\udcff"), "'--unique-key': holds the byte"),
    ],
)
def test_bad_input(app: JobQueue, args: tuple[str, ...], fragment: str) -> None:
    result = jobqueue(*args, check=False)
    assert result.returncode != 0 and fragment in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        # an age that cannot be read is a mistake in the command line, as a bad --state is
        (("jobs", "purge", "--state", "completed", "--older-than", "7x"), "Invalid value for '--older-than'"),
        (("archive", "export", "--to", "/nonexistent", "--older-than", "5q"), "Invalid value for '--older-than'"),
        (("report", "--since", "zz", "--out", "/nonexistent/r.html"), "Invalid value for '--since'"),
        (("jobs", "show", "abc"), "'abc' is not a valid job id"),  # click said "integer range"
        # --task without --all-failed was told "give job ids, or --all-failed, not both"
        (("jobs", "retry", "--task", "send"), "--task goes with --all-failed: jobs retry --all-failed --task send"),
        (("jobs", "retry"), "give the ids of the jobs to retry, or --all-failed"),
        (("jobs", "retry", "3", "--all-failed"), "give job ids or --all-failed, not both"),
    ],
)
def test_a_mistaken_command_line_exits_2_naming_the_option(app: JobQueue, args: tuple[str, ...], fragment: str) -> None:
    result = jobqueue(*args, check=False)
    assert (result.returncode, "Traceback" in result.stderr) == (2, False), result.stderr
    assert fragment in result.stderr


def test_show_prints_arguments_whose_dicts_have_keys_json_cannot_write(app: JobQueue) -> None:
    """The serializer keeps dict keys that are tuples or dates; a job given one is shown like any
    other, its keys written as text, in the table and in --json."""
    handle = basic.fail.delay({(1, 2): "pair", datetime(2030, 1, 2): "day", 3: "three"})
    jobqueue("worker", "--burst", "--concurrency", "1")
    shown = jobqueue("jobs", "show", str(handle.id), check=False)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-2000:]
    assert '"(1, 2)": "pair"' in shown.stdout and '"2030-01-02 00:00:00": "day"' in shown.stdout
    detail = json.loads(jobqueue("jobs", "show", str(handle.id), "--json").stdout)
    assert detail["args"] == [{"(1, 2)": "pair", "2030-01-02 00:00:00": "day", "3": "three"}]


def test_show_cuts_a_huge_argument_in_its_text_and_keeps_it_whole_in_json(app: JobQueue) -> None:
    """A job given a megabyte of arguments printed all of it, flooding the terminal."""
    handle = basic.fail.delay("x" * 900_000)
    shown = jobqueue("jobs", "show", str(handle.id))
    said = shown.stdout
    assert len(said) < 10_000 and "(898,004 more characters: --json shows all)" in said, len(said)
    detail = json.loads(jobqueue("jobs", "show", str(handle.id), "--json").stdout)
    assert detail["args"] == ["x" * 900_000]


def test_list_and_show_write_a_jobs_control_characters_as_escapes(app: JobQueue) -> None:
    """A job's error (here its argument too) may carry terminal escape sequences: the commands show
    them as text, so a job cannot retitle, recolour or rewrite the operator's terminal."""
    hostile = "\x1b]0;retitled\x07 \x1b[2J\x1b[31mred\x1b[0m\rover\x9b1m"
    handle = basic.fail.delay(hostile)
    jobqueue("worker", "--burst", "--concurrency", "1")
    for command in (("jobs", "list"), ("jobs", "show", str(handle.id))):
        out = jobqueue(*command).stdout
        assert not any(c in out for c in "\x1b\x07\r\x9b"), (command, out)
        assert "\\x1b]0;retitled\\x07" in out and "\\x1b[31mred" in out and "\\x0dover" in out, (command, out)
    assert json.loads(jobqueue("jobs", "show", str(handle.id), "--json").stdout)["error_message"] == hostile


def test_show_names_the_job_a_partitioned_job_waits_for(app: JobQueue) -> None:
    first = basic.add.apply_async(args=(1, 2), partition_key="acct-7")
    second = basic.add.apply_async(args=(3, 4), partition_key="acct-7")
    shown = jobqueue("jobs", "show", str(second.id)).stdout
    assert f"waiting      behind job {first.id} (ready), the oldest unfinished job of partition key 'acct-7'" in shown
    assert json.loads(jobqueue("jobs", "show", str(second.id), "--json").stdout)["waiting_for"] == first.id
    assert json.loads(jobqueue("jobs", "show", str(first.id), "--json").stdout)["waiting_for"] is None
    jobqueue("worker", "--burst", "--concurrency", "1")
    assert (first.get(timeout=5), second.get(timeout=5)) == (3, 7)


def test_a_retried_dead_letter_is_shown_waiting_for_the_running_job_of_its_key(app: JobQueue) -> None:
    """Retried while a later job of its partition key runs, it waits for that one, and says so."""
    dead = basic.fail.apply_async(args=("boom",), partition_key="acct-7")
    jobqueue("worker", "--burst", "--concurrency", "1")
    later = [basic.add.apply_async(args=(n, 0), partition_key="acct-7") for n in (1, 2)]
    (running,) = app.store.acquire("w" * 32, None, 1, 30.0, flow=True, token=5)
    assert running.id == later[0].id
    jobqueue("jobs", "retry", str(dead.id))
    shown = jobqueue("jobs", "show", str(dead.id)).stdout
    assert f"behind job {running.id} (running), the running job of partition key 'acct-7'" in shown
    listed = {row["id"]: row["waiting"] for row in json.loads(jobqueue("jobs", "list", "--json").stdout)}
    assert listed[later[1].id].startswith(f"behind job {running.id} (running)")
    held = json.loads(jobqueue("status", "--json").stdout)["held_keys"]
    reasons = [(k["key"], k["waiting"], k["reason"]) for k in held]
    assert reasons == [("acct-7", 2, f"behind job {running.id} (running)")]


def test_show_says_what_limits_a_keyed_job_and_shows_a_plain_pending_one(app: JobQueue) -> None:
    plain = basic.add.delay(1, 2)
    assert "next try" in jobqueue("jobs", "show", str(plain.id)).stdout  # pending: nothing finished yet
    first, second = basic.partner_call.delay(1), basic.partner_call.delay(2)
    taken = app.store.acquire("w" * 32, None, 10, 30.0, flow=True, token=5)
    assert sorted(m.id for m in taken) == [plain.id, first.id]  # the second waits for the one slot
    shown = jobqueue("jobs", "show", str(second.id)).stdout
    assert "flow key     'partner': 1 running of at most 1" in shown
    assert "waiting      key 'partner' is at its concurrency limit (1 of 1 running)" in shown
    flow = json.loads(jobqueue("jobs", "show", str(second.id), "--json").stdout)["flow"]
    assert (flow["key"], flow["running"], flow["limit"]) == ("partner", 1, 1)


def test_list_and_status_say_which_keys_hold_jobs_back_and_why(app: JobQueue) -> None:
    first = basic.add.apply_async(args=(1, 2), partition_key="acct-7")
    calls = [basic.partner_call.delay(n) for n in range(3)]
    notes = [basic.notify.delay(n) for n in range(3)]
    taken = app.store.acquire("w" * 32, None, 10, 30.0, flow=True, token=5)
    # The partition's job, one call (limit 1) and two notes (2/m, with a start's slack).
    assert sorted(m.id for m in taken) == sorted([first.id, calls[0].id, notes[0].id, notes[1].id])
    second = basic.add.apply_async(args=(3, 4), partition_key="acct-7")  # behind the running one
    listed = {row["id"]: row["waiting"] for row in json.loads(jobqueue("jobs", "list", "--json").stdout)}
    assert listed[second.id] == f"behind job {first.id} (running), the oldest unfinished job of partition key 'acct-7'"
    assert listed[calls[1].id] == listed[calls[2].id] == "key 'partner' is at its concurrency limit (1 of 1 running)"
    assert listed[notes[2].id].startswith("key 'task:basic.notify' is held by its rate until ")
    assert listed[first.id] is None and listed[notes[0].id] is None
    assert "at its concurrency limit" in jobqueue("jobs", "list").stdout
    held = json.loads(jobqueue("status", "--json").stdout)["held_keys"]
    assert [(k["kind"], k["key"], k["waiting"]) for k in held] == [
        ("flow", "partner", 2),
        ("partition", "acct-7", 1),
        ("flow", "task:basic.notify", 1),
    ]
    assert held[1]["reason"] == f"behind job {first.id} (running)"
    text = jobqueue("status").stdout
    assert "jobs held back by their keys" in text and "held by its rate until" in text


def test_rows_edited_by_hand_are_listed_and_shown_with_their_bad_values_named(app: JobQueue, backend: str) -> None:
    """One row that cannot be read as stored (a history that is not a list; on SQLite, where a
    column takes any text, a time that is not one) must not break the listing or the others."""
    import sqlalchemy as sa

    good = basic.add.delay(1, 1)
    edited = basic.add.delay(2, 2)
    m = app.tables.message
    values: dict[str, object] = {"history": 5}
    if backend == "sqlite":
        values["created_at"] = sa.literal_column("'garbage'")
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == edited.id).values(**values))
    listed = {row["id"]: row for row in json.loads(jobqueue("jobs", "list", "--json").stdout)}
    assert set(listed) == {good.id, edited.id}
    assert listed[good.id]["created_at"].endswith("+00:00")
    if backend == "sqlite":
        assert listed[edited.id]["created_at"] == "<unreadable: 'garbage'>"
        assert "<unreadable: 'garbage'>" in jobqueue("jobs", "list").stdout
    shown = jobqueue("jobs", "show", str(edited.id)).stdout
    assert "history      <unreadable: 5>" in shown and "args         [2, 2]" in shown
    assert json.loads(jobqueue("jobs", "show", str(good.id), "--json").stdout)["args"] == [1, 1]


def test_a_job_whose_state_was_edited_to_an_unknown_one_is_listed_and_counted_apart(app: JobQueue) -> None:
    """No worker runs a job in a state jobqueue does not know: it must not vanish from the
    listing, nor be counted as ready in the status."""
    import sqlalchemy as sa

    good = basic.add.delay(1, 1)
    edited = basic.add.delay(2, 2)
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == edited.id).values(state="BOGUS"))
    listed = {row["id"]: row["state"] for row in json.loads(jobqueue("jobs", "list", "--json").stdout)}
    assert listed == {good.id: "pending", edited.id: "<unknown state: 'BOGUS'>"}
    assert [row["id"] for row in json.loads(jobqueue("jobs", "list", "--state", "pending", "--json").stdout)] == [
        good.id
    ]
    # Asked for by themselves, however many newer jobs there are, in either table.
    basic.add.bulk([(n, n) for n in range(60)])
    weird = edited.id + 10_000  # newer than any job of the test (ids run high on a shared database)
    with app.engine.begin() as conn:
        conn.execute(
            sa.insert(app.tables.archive).values(
                id=weird,
                task_name="tests.apps.basic.add",
                queue="default",
                state="WEIRD",
                payload=b"[[1, 1], {}]",
                created_at=utcnow(),
                archived_at=utcnow(),
            )
        )
    only = json.loads(jobqueue("jobs", "list", "--state", "unknown", "--limit", "5", "--json").stdout)
    assert [(row["id"], row["state"]) for row in only] == [
        (weird, "<unknown state: 'WEIRD'>"),
        (edited.id, "<unknown state: 'BOGUS'>"),
    ]
    both = json.loads(jobqueue("jobs", "list", "--state", "unknown", "--state", "completed", "--json").stdout)
    assert [row["id"] for row in both] == [weird, edited.id]
    (queue,) = json.loads(jobqueue("status", "--json").stdout)["queues"]
    assert (queue["ready"], queue["unknown_state"]) == (61, 1)
    status = jobqueue("status").stdout
    assert "1 job(s) in a state jobqueue does not know" in status and "jobs list --state unknown" in status


def test_a_state_is_known_by_the_databases_own_comparison(app: JobQueue, backend: str) -> None:
    """MySQL and MariaDB compare states ignoring case, so workers run a job edited to 'pending':
    it is listed as pending there, and as unknown where the comparison is exact."""
    import sqlalchemy as sa

    edited = basic.add.delay(2, 2)
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == edited.id).values(state="pending"))
    (row,) = json.loads(jobqueue("jobs", "list", "--json").stdout)
    assert row["state"] == ("pending" if backend == "mysql" else "<unknown state: 'pending'>")


def test_control_characters_in_a_job_are_shown_escaped_never_sent_to_the_terminal(app: JobQueue) -> None:
    """A job's error message and keys can hold text from anywhere: escape sequences in them must not
    clear the operator's screen, retitle the terminal, or hide text behind a carriage return."""
    hostile = "\x1b[2J\x1b]0;retitled\x07\rhidden\x9b31m"
    failed = basic.fail.apply_async((hostile,), unique_key="key\x1b[8m")
    jobqueue("worker", "--burst", "--concurrency", "1")
    assert failed.status() == "failed"
    for command in (("jobs", "list"), ("jobs", "show", str(failed.id))):
        shown = jobqueue(*command).stdout
        assert not [c for c in shown if (c < " " and c != "\n") or "\x7f" <= c <= "\x9f"], command
        assert "\\x1b]0;retitled\\x07\\x0dhidden\\x9b31m" in shown, shown
    assert "unique_key   key\\x1b[8m" in jobqueue("jobs", "show", str(failed.id)).stdout
    assert json.loads(jobqueue("jobs", "show", str(failed.id), "--json").stdout)["error_message"] == hostile


@pytest.mark.parametrize("edited", ["[/x]", "[red]X", "\x1b]0;hi\x07"])
def test_status_counts_archived_jobs_in_an_unknown_state_apart(app: JobQueue, edited: str) -> None:
    """An archive row whose state was edited by hand is counted as unknown, never printed as its
    text: that could be markup or an escape sequence."""
    import sqlalchemy as sa

    handle = basic.add.delay(1, 1)
    kept = basic.add.delay(2, 2)
    jobqueue("worker", "--burst", "--concurrency", "1")
    a = app.tables.archive
    with app.engine.begin() as conn:
        conn.execute(sa.update(a).where(a.c.id == handle.id).values(state=edited))
    assert kept.status() == "completed"
    shown = jobqueue("status", check=False)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-2000:]
    assert "archive: completed 1, unknown_state 1" in shown.stdout
    assert json.loads(jobqueue("status", "--json").stdout)["archive"] == {
        "cancelled": 0,
        "completed": 1,
        "failed": 0,
        "unknown_state": 1,
    }


def test_retrying_a_job_whose_row_was_edited_by_hand_says_which_value_to_correct(app: JobQueue, backend: str) -> None:
    """A history that is no list (or, on SQLite, a time that is no time) cannot go back to the
    queue as it is: the retry is refused with the value named, and the job stays archived."""
    import sqlalchemy as sa

    a = app.tables.archive
    edits: list[tuple[dict[str, object], str]] = [
        ({"history": 5}, "its history is <unreadable: 5>, not a list of earlier outcomes; set it to NULL"),
        ({"history": "text"}, "its history is <unreadable: 'text'>"),
    ]
    if backend == "sqlite":
        edits.append(({"archived_at": sa.literal_column("'garbage'")}, "its archived_at cannot be read as stored"))
    for values, reason in edits:
        handle = basic.fail.delay("x")
        jobqueue("worker", "--burst", "--concurrency", "1")
        with app.engine.begin() as conn:
            conn.execute(sa.update(a).where(a.c.id == handle.id).values(**values))
        refused = jobqueue("jobs", "retry", str(handle.id), check=False)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert f"job {handle.id} not retried: {reason}" in refused.stderr
        assert handle.status() == "failed"
        with app.engine.begin() as conn:  # the fix the message names
            conn.execute(sa.update(a).where(a.c.id == handle.id).values(history=None, archived_at=utcnow()))
        jobqueue("jobs", "retry", str(handle.id))
        assert handle.status() == "pending"
        jobqueue("jobs", "cancel", str(handle.id))


@only("sqlite")  # the other databases refuse such values
def test_cancelling_a_job_with_values_that_cannot_be_read_archives_them_as_stored(app: JobQueue) -> None:
    import sqlalchemy as sa

    handle = basic.add.apply_async((1, 1), countdown=3600)
    m, a = app.tables.message, app.tables.archive
    with app.engine.begin() as conn:
        conn.execute(
            sa.update(m)
            .where(m.c.id == handle.id)
            .values(headers=sa.literal_column("'{not json'"), created_at=sa.literal_column("'garbage'"))
        )
    cancelled = jobqueue("jobs", "cancel", str(handle.id), check=False)
    assert cancelled.returncode == 0 and "Traceback" not in cancelled.stderr, cancelled.stderr[-2000:]
    assert handle.status() == "cancelled"
    with app.engine.connect() as conn:
        stored = conn.execute(sa.text(f"SELECT headers, created_at FROM {a.name} WHERE id = {handle.id}")).one()
    assert tuple(stored) == ("{not json", "garbage")
    shown = jobqueue("jobs", "show", str(handle.id)).stdout
    assert "CANCELLED" in shown and "created      <unreadable: 'garbage'>" in shown


def test_show_says_a_job_is_in_a_state_jobqueue_does_not_know(app: JobQueue) -> None:
    import sqlalchemy as sa

    edited = basic.add.delay(2, 2)
    m = app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(m).where(m.c.id == edited.id).values(state="BOGUS"))
    shown = jobqueue("jobs", "show", str(edited.id)).stdout
    assert f"job {edited.id}  basic.add  <unknown state: 'BOGUS'>  (active)" in shown
    assert "no worker runs it; set it to PENDING to run it" in shown
    assert json.loads(jobqueue("jobs", "show", str(edited.id), "--json").stdout)["state"] == "<unknown state: 'BOGUS'>"


def test_a_refused_retry_writes_the_stored_state_with_its_control_characters_escaped(app: JobQueue) -> None:
    import sqlalchemy as sa

    handle = basic.add.delay(1, 1)
    jobqueue("worker", "--burst", "--concurrency", "1")
    a = app.tables.archive
    with app.engine.begin() as conn:
        conn.execute(sa.update(a).where(a.c.id == handle.id).values(state="\x1b]0;x\x07"))
    refused = jobqueue("jobs", "retry", str(handle.id), check=False)
    assert refused.returncode == 1 and "\x1b" not in refused.stderr and "\x07" not in refused.stderr
    assert "not retried: \\x1b]0;x\\x07; only failed or cancelled jobs are retried" in refused.stderr


def test_a_huge_error_is_cut_by_the_database_and_listed_as_before(app: JobQueue) -> None:
    """``jobs list`` (and the dashboard's failed jobs, from the same query) shows an error of over
    200 characters as its first 199 and "~". The database cuts it: an error of 5 MB (edited in by
    hand; a worker keeps 10 KB) is not fetched whole to show 200 characters."""
    import sqlalchemy as sa

    from jobqueue.storage import deadletter

    start = "ü€😀" * 70  # 210 characters of 2, 3 and 4 bytes: a cut by bytes would not match
    huge = start + "x" * 5_000_000
    failed = basic.fail.delay("boom")
    jobqueue("worker", "--burst", "--concurrency", "1")
    waiting, exact, one_more = (basic.add.apply_async((n, 0), countdown=3600) for n in range(3))
    a, m = app.tables.archive, app.tables.message
    with app.engine.begin() as conn:
        conn.execute(sa.update(a).where(a.c.id == failed.id).values(error_message=huge))
        for handle, error in ((waiting, huge), (exact, "y" * 199 + "😀"), (one_more, "y" * 200 + "😀")):
            conn.execute(sa.update(m).where(m.c.id == handle.id).values(last_error_message=error))
    cut = start[:199] + "~"
    listed = {row["id"]: row["error"] for row in json.loads(jobqueue("jobs", "list", "--json").stdout)}
    assert listed == {failed.id: cut, waiting.id: cut, exact.id: "y" * 199 + "😀", one_more.id: "y" * 199 + "~"}
    table = jobqueue("jobs", "list").stdout
    assert cut in table and "y" * 199 + "😀" in table and len(table) < 10_000

    # What the database sent: the statements the listing ran, run again as they were sent.
    sent: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        sent.append((statement, parameters))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        assert {row["id"]: row["error"] for row in deadletter.list_jobs(app.store)} == listed
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)
    selects = [(statement, parameters) for statement, parameters in sent if "error" in statement]
    assert len(selects) == 2, sent  # the message table's, the archive's
    with app.engine.connect() as conn:
        for statement, parameters in selects:
            for row in conn.exec_driver_sql(statement, parameters):  # type: ignore[arg-type]
                assert max(len(value) for value in row if isinstance(value, (str, bytes))) <= 201 * 4, statement


def test_status_shows_keys_that_differ_only_in_spaces_or_controls_apart_each_on_one_line(app: JobQueue) -> None:
    """Keys are compared exactly, so the table must tell them apart: a trailing space, a no-break
    space or a line break is shown quoted and escaped, and a plain key as it is."""
    keys = ["acme", "acme ", "acme\u00a0", "line\nbreak", "'acme '", "acmé"]
    for key in keys:
        for n in range(2):
            basic.add.apply_async(args=(n, 0), partition_key=key)
    held = json.loads(jobqueue("status", "--json").stdout)["held_keys"]
    assert sorted(row["key"] for row in held) == sorted(keys)  # JSON keeps them exact
    lines = jobqueue("status").stdout.splitlines()
    table = lines[lines.index("jobs held back by their keys (the most waiting first):") + 2 :]
    table = table[: table.index("")]
    assert len(table) == len(keys)  # one line each: no key breaks its row
    shown = sorted(line[len("partition  ") :].split("  ")[0] for line in table)
    assert shown == sorted(["acme", "'acme '", "'acme\\xa0'", "'line\\nbreak'", "\"'acme '\"", "acmé"])


def test_retrying_a_job_whose_task_the_app_lacks_warns_that_its_workers_fail_it_again(app: JobQueue) -> None:
    """It said "retried 1 job(s)" and nothing more: the app's workers then failed it at once, as
    an unknown task."""

    @app.task(name="gone.task")
    def gone() -> None:
        pass

    removed, kept = gone.delay(), basic.add.delay(1, 2)
    jobqueue("jobs", "cancel", str(removed.id), str(kept.id))
    done = jobqueue("jobs", "retry", str(removed.id), str(kept.id))
    assert done.stdout.startswith("retried 2 job(s)"), done.stdout
    warning = "warning: task 'gone.task' is not registered in this app: its workers fail job(s) "
    assert f"{warning}{removed.id} again at once" in done.stderr, done.stderr
    assert "basic.add" not in done.stderr
