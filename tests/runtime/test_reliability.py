"""What a hostile user throws at the runtime: a dying supervisor, jobs that kill their process or
hold the GIL, outcomes that cannot be stored, bad deferrals, skewed clocks, corrupt rows.

Each test runs the real CLI in subprocesses, with real signals, against real databases.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from tests.acceptance.cli import ROOT
from tests.apps import runtime as rt
from tests.conftest import only
from tests.runtime.harness import REPORTS, Worker, default_signals, freeze, recorded, repeated, runs, start, wait_for


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def archived(app: JobQueue) -> dict[int, tuple[str, str | None, str | None]]:
    a = app.tables.archive
    with app.engine.connect() as conn:
        return {
            row[0]: (row[1], row[2], row[3])
            for row in conn.execute(sa.select(a.c.id, a.c.state, a.c.error_type, a.c.error_message))
        }


def counters(app: JobQueue, table: str = "archive") -> dict[int, tuple[int, int]]:
    t = getattr(app.tables, table)
    with app.engine.connect() as conn:
        return {
            row[0]: (row[1], row[2])
            for row in conn.execute(sa.select(t.c.id, t.c.attempts_count, t.c.deliveries_count))
        }


def children_of(worker: Worker) -> list[int]:
    return wait_for(worker.children, 30, "the worker processes to start")  # type: ignore[return-value]


# -- the supervisor owns its children --------------------------------------------------------------


@only("sqlite")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGQUIT, signal.SIGHUP])
def test_children_stop_within_two_seconds_of_their_supervisors_death(
    app: JobQueue, tmp_path: Path, workers: list[Worker], signum: int
) -> None:
    rt.slow.bulk([(30,)] * 4)
    worker = start(workers, tmp_path, "--concurrency", "2")
    wait_for(lambda: len([e for e in runs(tmp_path / "runs.txt") if e[0] == "start"]) == 2, 30, "two jobs running")
    children = worker.children()
    assert len(children) == 2
    worker.signal(signum)
    died = time.monotonic()
    wait_for(lambda: not any(alive(pid) for pid in children), 2, "the orphaned worker processes to stop")
    REPORTS.append(
        f"orphans[{signal.Signals(signum).name}]: both worker processes gone "
        f"{(time.monotonic() - died) * 1000:.0f} ms after the supervisor died"
    )


def test_the_supervisor_survives_an_error_of_its_own_loop(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """The worker table vanishes under a running supervisor: every heartbeat fails with an error no
    retry fixes (as on a database that turned read-only). The supervisor logs it and carries on."""
    handles = rt.slow.bulk([(1.0,)] * 6)
    # Heartbeats every second (a third of the lease), so the missing table is met at once.
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2", "--release-stuck-timeout", "3")
    wait_for(lambda: len([e for e in runs(tmp_path / "runs.txt") if e[0] == "start"]) >= 1, 30, "a job to start")
    rename = {"mysql": "RENAME TABLE {a} TO {b}"}.get(backend, "ALTER TABLE {a} RENAME TO {b}")
    with app.engine.begin() as conn:
        conn.execute(sa.text(rename.format(a="jobqueue_worker", b="jobqueue_worker_gone")))
    try:
        wait_for(lambda: "it keeps running" in worker.text(), 10, "the supervisor to log its error and go on")
        time.sleep(1.5)  # another heartbeat or two fail meanwhile
        assert worker.process.poll() is None, worker.text()[-3000:]
        assert all(alive(pid) for pid in worker.children())
    finally:
        with app.engine.begin() as conn:
            conn.execute(sa.text(rename.format(a="jobqueue_worker_gone", b="jobqueue_worker")))
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert {h.status() for h in handles} == {"completed"}
    assert not repeated(runs(tmp_path / "runs.txt"), "start")


@pytest.mark.parametrize("how", ["burst", "SIGTERM"])
def test_a_supervisor_whose_upkeep_keeps_failing_still_stops(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker], how: str
) -> None:
    """Every heartbeat fails (the worker table is gone) for as long as the supervisor runs. The
    error ended each turn of its loop before the steps after the upkeep: a --burst worker never
    looked whether its work was done, and a stopping one never killed the jobs that outlived
    --graceful-timeout, so that either waited for ever."""
    quick = rt.slow.bulk([(0.2,)] * 2)
    # A --burst worker has a job that outlives the failures' start; a stopping one, a job that
    # outlives --graceful-timeout.
    running = rt.slow.delay(3 if how == "burst" else 3600)
    args = ["--concurrency", "2", "--release-stuck-timeout", "3", "--graceful-timeout", "2"]
    worker = start(workers, tmp_path, *(["--burst"] if how == "burst" else []), *args)
    wait_for(lambda: all(h.status() == "completed" for h in quick), 30, "the quick jobs to complete")
    rename = {"mysql": "RENAME TABLE {a} TO {b}"}.get(backend, "ALTER TABLE {a} RENAME TO {b}")
    with app.engine.begin() as conn:
        conn.execute(sa.text(rename.format(a="jobqueue_worker", b="jobqueue_worker_gone")))
    try:
        wait_for(lambda: "it keeps running" in worker.text(), 10, "the supervisor to log its error and go on")
        if how == "SIGTERM":
            worker.signal(signal.SIGTERM)
        stopped = time.monotonic()
        code = worker.wait(30)
        assert code is not None, worker.text()[-3000:]
        REPORTS.append(f"failing upkeep[{how}]: stopped {time.monotonic() - stopped:.1f} s after the stop began")
    finally:
        with app.engine.begin() as conn:
            conn.execute(sa.text(rename.format(a="jobqueue_worker_gone", b="jobqueue_worker")))
    assert running.status() == ("completed" if how == "burst" else "pending"), running.status()


def test_a_job_killed_because_the_worker_stopped_is_not_charged_a_delivery(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job that outlives graceful_timeout is killed with its process at every deploy. Each kill
    was charged a delivery, as if the job had killed its process: after max_deliveries deploys it
    was failed as poison (MaxDeliveriesExceeded) without having done anything wrong."""
    job = rt.slow.delay(3600)
    for round_ in range(1, 4):
        worker = start(workers, tmp_path, "--concurrency", "1", "--graceful-timeout", "0.5", "--max-deliveries", "2")
        wait_for(lambda: job.status() == "processing", 30, "the long job to start")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.text()[-3000:]
        assert "exited with signal" not in worker.text(), worker.text()[-3000:]
        assert counters(app, "message")[job.id] == (round_, 0)  # its attempts count; no delivery does
    assert job.status() == "pending"


def timed_runs(path: Path) -> list[tuple[str, int, int, int]]:
    return [(e, int(j), int(p), int(t)) for e, j, p, t in recorded(path)]


def test_chaos_sigkill_the_supervisor_itself(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """Kill whole supervisors, not only children, and start new ones at once: nothing is lost, no
    job ever runs in two processes at the same time, and no process of a killed tree lives on."""
    handles = rt.timed.bulk([(0.02,)] * 600)
    log = tmp_path / "runs.txt"
    args = ("--concurrency", "2", "--release-stuck-timeout", "2", "--release-stuck-interval", "0.5")
    dead_by: dict[int, float] = {}  # pid of a killed tree's process -> monotonic ns it was seen dead
    killed = 0
    for round_ in range(2):
        worker = start(workers, tmp_path, *args, name=f"tree{round_}")
        done = len({j for e, j, _, _ in timed_runs(log) if e == "end"})
        wait_for(
            lambda: len({j for e, j, _, _ in timed_runs(log) if e == "end"}) >= done + 100,  # noqa: B023 (called at once)
            60,
            "a hundred more jobs to complete",
        )
        tree = worker.children()
        worker.signal(signal.SIGKILL)
        killed += 1
        worker.process.wait(10)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in tree if pid not in dead_by):
            assert time.monotonic() < deadline, "a process of the killed supervisor lived on for 5 s"
            for pid in tree:
                if pid not in dead_by and not alive(pid):
                    dead_by[pid] = time.monotonic_ns()
            time.sleep(0.01)
        now = time.monotonic_ns()
        for pid in tree:
            dead_by.setdefault(pid, now)
    last = start(workers, tmp_path, "--burst", *args, name="last")
    assert last.wait(120) == 0, last.text()[-3000:]
    assert {h.status() for h in handles} == {"completed"}, "a job was lost"
    events = timed_runs(log)
    starts: dict[tuple[int, int], int] = {}
    spans: dict[int, list[tuple[int, float, int]]] = {}
    for event, job, pid, at in events:
        if event == "start":
            starts[(job, pid)] = at
        else:
            spans.setdefault(job, []).append((starts.pop((job, pid)), at, pid))
    for (job, pid), began in starts.items():  # cut short: by its process's death
        assert pid in dead_by, f"job {job} started in pid {pid} and never ended, yet that process was not killed"
        spans.setdefault(job, []).append((began, dead_by[pid], pid))
    overlapping = [
        job
        for job, runs_ in spans.items()
        if any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(runs_) for b in runs_[i + 1 :])
    ]
    assert not overlapping, f"jobs ran in two processes at once: {overlapping[:10]}"
    twice = sum(1 for runs_ in spans.values() if len(runs_) > 1)
    REPORTS.append(
        f"supervisor chaos[{backend}]: 600 jobs, {killed} supervisors SIGKILLed, 0 lost, "
        f"{twice} ran again (never two at once), every orphan gone within 5 s"
    )


# -- a poison job costs its neighbours nothing ------------------------------------------------------


def test_a_job_that_kills_its_process_takes_no_finished_job_with_it(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    rt.noop.bulk([()] * 30)  # warm-up: the process learns that jobs are quick and fetches big batches
    innocent = rt.short.bulk([(0,)] * 30)
    poison = rt.crash.delay()  # max_deliveries=2: it kills the process twice, then is failed unrun
    # A long flush interval: the 30 outcomes are still unwritten each time the process dies.
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--flush-interval", "30")
    assert worker.wait(90) == 0, worker.text()[-3000:]
    states = archived(app)
    assert {states[h.id][0] for h in innocent} == {"COMPLETED"}, "innocent jobs were failed with the poison"
    assert states[poison.id][:2] == ("FAILED", "jobqueue.errors.MaxDeliveriesExceeded")
    count = counters(app)
    assert {count[h.id][1] for h in innocent} == {1}  # re-run, but never charged a delivery
    assert count[poison.id] == (2, 3)
    # Run again once at most: before the poison's second delivery runs, what the process finished
    # is written, so its second kill takes nothing with it.
    ran = collections.Counter(job_id for event, job_id, _ in runs(tmp_path / "runs.txt") if event == "run")
    assert max(ran[h.id] for h in innocent) <= 2, ran
    assert {count[h.id][0] for h in innocent} <= {1, 2}
    log = worker.text()
    assert "next start in" not in log, "poison deaths must not slow down the respawn of its slot"


def test_a_job_failed_unrun_before_its_process_died_counts_no_attempt(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A message over max_deliveries is failed without running. If the process dies before that
    failure is written (here the next job kills it), the job never ran: it goes back uncounted, as
    a buffered one would, and its archive row shows no attempt."""
    refused = rt.short.delay(0)
    with app.engine.begin() as conn:  # as if ten earlier deliveries had each died with their process
        m = app.tables.message
        conn.execute(sa.update(m).where(m.c.id == refused.id).values(deliveries_count=10))
    poison = rt.crash.delay()  # fetched in the same batch, started right after the refusal
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--flush-interval", "30")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    states = archived(app)
    assert states[refused.id][:2] == ("FAILED", "jobqueue.errors.MaxDeliveriesExceeded")
    assert states[poison.id][:2] == ("FAILED", "jobqueue.errors.MaxDeliveriesExceeded")
    assert not [r for r in runs(tmp_path / "runs.txt") if r[1] == refused.id], "the refused job ran"
    assert counters(app)[refused.id][0] == 0, "an attempt was counted for a job that never ran"


def test_respawn_does_not_back_off_for_deaths_caused_by_jobs(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    poison = [rt.crash.delay() for _ in range(5)]  # ten deaths in a row, each right after a start
    began = time.monotonic()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    elapsed = time.monotonic() - began
    assert {h.status() for h in poison} == {"failed"}
    assert worker.text().count("exited with code 1") == 10
    assert "next start in" not in worker.text()
    assert elapsed < 20, f"ten job deaths took {elapsed:.1f} s: the slot backed off"


# -- anything a job does ends that job only ---------------------------------------------------------


def test_jobs_that_raise_anything_or_return_the_unstorable_end_alone(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    rt.noop.bulk([()] * 30)  # warm-up: the bad jobs then share batches and flushes with good ones
    bad = {
        "bad_str": rt.bad_str.delay(),
        "exit_in_str": rt.exit_in_str.delay(),
        "cyclic": rt.unstorable.delay("cyclic"),
        "deep": rt.unstorable.delay("deep"),
        "bigint": rt.unstorable.delay("bigint"),
        "bad_nack": rt.bad_nack.delay(),
        "exits": rt.exits.delay(),
        "interrupt": rt.interrupt.delay(),
        "halts": rt.halts.delay(),
        "nul": rt.nul.delay(),
        "checkpoint": rt.big_state.delay("checkpoint"),
        "defer": rt.big_state.delay("defer"),
    }
    good = rt.short.bulk([(0,)] * 20)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--flush-interval", "5")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    log = worker.text()
    assert "exited with" not in log and "crashed" not in log, log[-3000:]
    states = archived(app)
    assert {states[h.id][0] for h in good} == {"COMPLETED"}
    got = {name: states[h.id] for name, h in bad.items()}
    assert {state for state, _, _ in got.values()} == {"FAILED"}, got
    assert got["bad_str"][1] == "tests.apps.runtime.BadStr" and "raised" in (got["bad_str"][2] or "")
    assert got["exit_in_str"][1] == "tests.apps.runtime.ExitInStr" and "raised" in (got["exit_in_str"][2] or "")
    assert "could not decide" not in log, log[-3000:]
    for name in ("cyclic", "deep", "bigint"):
        assert got[name][1] == "jobqueue.errors.SerializationError", got[name]
    assert got["cyclic"][2] and "cyclic" in got["cyclic"][2]
    assert got["bigint"][2] and "4,300 digits" in got["bigint"][2]
    assert got["bad_nack"][1] == "TypeError" and "delay_seconds" in (got["bad_nack"][2] or "")
    assert got["exits"][1:] == ("SystemExit", "3")
    assert got["interrupt"][1] == "KeyboardInterrupt"
    assert got["halts"][1:] == ("tests.apps.runtime.Halt", "a BaseException of its own")
    assert got["nul"][1] == "ValueError" and got["nul"][2] == "a NUL \\x00 inside"
    for name in ("checkpoint", "defer"):
        assert got[name][1] == "jobqueue.errors.SerializationError" and "max_payload_bytes" in (got[name][2] or "")


@pytest.mark.parametrize("logging_by", ["jobqueue", "application"])
def test_a_job_that_closes_stdout_and_stderr_ends_alone_and_the_log_goes_on(
    app: JobQueue, tmp_path: Path, workers: list[Worker], logging_by: str
) -> None:
    """The command's log lines go to its own copy of stderr: a job closing sys.stderr (or
    sys.stdout) neither silences the worker nor makes its next log line end the process. Where
    the application's handlers write to the closed stream, their lines are lost, not the process."""
    closing = [rt.close_stdio.delay(False), rt.close_stdio.delay(True)]
    after = rt.short.bulk([(0,)] * 3)
    own = logging_by == "application"
    target = "tests.apps.own_logging:app" if own else "tests.apps.runtime:app"
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", app=target)
    assert worker.wait(60) == 0, worker.text()[-3000:]
    log = worker.text()
    assert "exited with" not in log and "crashed" not in log, log[-3000:]
    states = archived(app)
    assert states[closing[0].id] == ("COMPLETED", None, None)
    assert states[closing[1].id] == ("FAILED", "RuntimeError", "failed with stdout and stderr closed")
    assert {states[h.id][0] for h in after} == {"COMPLETED"}
    assert not repeated(runs(tmp_path / "runs.txt"), "run"), "a job ran twice: its process died"
    for handle in [] if own else [*closing, *after]:
        assert f"job {handle.id} " in log, f"no log line for job {handle.id}:\n{log[-3000:]}"


@pytest.mark.parametrize(("how", "status"), [("return", 0), ("exit", 3), ("raise", 1)])
def test_a_child_a_job_forks_ends_where_it_leaves_the_job(
    app: JobQueue, tmp_path: Path, workers: list[Worker], how: str, status: int
) -> None:
    """A job forks and its child leaves the job function (returns, sys.exit, raises) instead of
    calling os._exit: the child is a copy of the worker process, and must exit there rather than
    go on with the worker's loop, running the buffered jobs again with nobody renewing their leases."""
    rt.noop.bulk([()] * 30)  # warm-up: the process then fetches the forking job with others behind it
    job = rt.forks.delay(how)
    behind = rt.short.bulk([(0,)] * 10)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert job.get(timeout=5) == status
    assert {h.status() for h in behind} == {"completed"}
    assert not repeated(runs(tmp_path / "runs.txt"), "run"), "the forked child ran jobs again"
    log = worker.text()
    assert "lease lost" not in log and "exited with" not in log, log[-3000:]


def test_processes_a_job_forks_stop_on_sigterm_and_open_their_own_connections(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job's forked processes are not worker processes: SIGTERM ends them (the worker's own
    handler only notes it, so a multiprocessing pool's exit waited for ever), and they enqueue
    through connections of their own, not the worker's pooled ones that they inherited and would
    share with each other and with the worker (replies read by the wrong process, a hang)."""
    rt.noop.delay()  # the worker's pool holds a connection when the job forks
    stopped = rt.terminates.delay()
    fans = [rt.fork_pool.delay(4, 30) for _ in range(2)]
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert stopped.get(timeout=5) == -signal.SIGTERM
    assert [h.get(timeout=5) for h in fans] == [120, 120]
    assert archived(app) and {state for state, _, _ in archived(app).values()} == {"COMPLETED"}
    assert len(archived(app)) == 1 + 1 + 2 + 240 + 2 * 2


@only("sqlite")
def test_programs_a_job_starts_get_the_signals_a_shell_would_give_them(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job runs a tool and interrupts it with SIGINT. Worker processes leave Ctrl-C to their
    supervisor, and used to ignore SIGINT for it: an ignored signal stays ignored across exec, so
    the tool could not be interrupted. It now sees the signals it would see started as the worker
    was: none ignored, none blocked."""
    job = rt.starts_programs.delay()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    started_alike = rt.signal_status(preexec_fn=default_signals)  # as the harness starts a worker
    assert job.get(timeout=5) == {**started_alike, "interrupted": -signal.SIGINT}


@only("sqlite")
def test_sigint_to_a_worker_process_changes_nothing(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    """SIGINT sent to a worker process alone neither stops it nor cuts its job's sleep short (the
    supervisor decides what Ctrl-C means), and the process goes on to the next job."""
    first = rt.sleeps.delay(1.0)
    worker = start(workers, tmp_path, "--concurrency", "1")
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    [child] = worker.children()
    for _ in range(5):
        os.kill(child, signal.SIGINT)
        time.sleep(0.05)
    assert first.get(timeout=10) >= 1.0
    assert rt.short.delay(0).get(timeout=10) == child
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]
    assert "KeyboardInterrupt" not in worker.text()


@only("sqlite")
def test_ctrl_c_stops_warmly_and_reaches_the_programs_jobs_started(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """Ctrl-C at the worker's terminal (SIGINT to its whole process group): the running job
    sleeps its whole time and completes, as on SIGTERM; a program a job started in that group is
    interrupted, as it would be started from the shell."""
    job = rt.sleeps.delay(1.0)
    tool = rt.runs_program.delay(10)
    worker = start(workers, tmp_path, "--concurrency", "2", group=True)
    wait_for(lambda: len(runs(tmp_path / "runs.txt")) == 2, 30, "both jobs to start")
    # The job records its start before it starts the program: under load a Ctrl-C sent in between
    # reached no program, which then slept its 10 s and exited 0.
    wait_for(lambda: _programs_in_group(worker.pid, "sleep"), 30, "the job's program to start")
    os.killpg(worker.pid, signal.SIGINT)
    assert worker.wait(30) == 0, worker.text()[-3000:]
    assert job.get(timeout=5) >= 1.0
    assert tool.get(timeout=5) == -signal.SIGINT


def _programs_in_group(group: int, name: str) -> list[int]:
    """The processes of process group ``group`` running the program ``name``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")
        except OSError:  # it ended meanwhile
            continue
        command = fields[0].partition("(")[2]
        if command == name and int(fields[2].split()[2]) == group:
            found.append(int(entry))
    return found


@only("sqlite")
def test_a_jobs_working_directory_and_umask_do_not_outlive_it(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job changes its process's working directory and umask: the next job in that process
    starts where the process started, with its umask, instead of where the job left them."""
    before = rt.where.delay()
    rt.moves.delay(str(tmp_path), 0o077)
    after = rt.where.delay()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    cwd, umask, pid = before.get(timeout=5)
    assert cwd == str(ROOT) and umask != 0o077
    assert after.get(timeout=5) == [cwd, umask, pid]  # the same process


def test_a_job_that_takes_over_sigterm_does_not_keep_its_process_from_a_warm_stop(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job makes its process ignore SIGTERM and leaves it so; the next job is running when the
    worker is asked to stop. The worker process heard the request (its own handler was put back
    after the first job, with a warning): it finishes the running job and stops, well before the
    graceful timeout would have it killed."""
    rt.takes_sigterm.delay()
    job = rt.slow.delay(2.0)
    worker = start(workers, tmp_path, "--concurrency", "1", "--graceful-timeout", "60")
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the second job to start")
    began = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0, worker.text()[-3000:]
    assert time.monotonic() - began < 15
    assert job.status() == "completed"
    assert "replaced the process's SIGTERM handler" in worker.text()


def test_times_near_the_year_9999_are_kept_or_refused_with_the_reason(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """Every way a job is given a time at the far end of what a date holds: a strategy whose
    retry falls past the year 9999 fails the job, keeping its own error and saying why and how to
    fix it; times just before it (an eta, a nack's delay, a lease extension) are stored as given on
    every database and nothing else in the worker minds them."""
    last = datetime(9999, 12, 31, 23, 59, 59, 999999)
    seconds_left = (datetime(9999, 12, 31) - utcnow()).total_seconds()
    retried = rt.far_retry.delay()
    far = rt.noop.apply_at(last)
    nacked = rt.far_nack.delay(seconds_left)
    extended = rt.far_extend.delay(seconds_left - 86400 * 365)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    state, error_type, message = archived(app)[retried.id]
    assert state == "FAILED" and error_type == "RuntimeError", message
    assert "the job's own error" in (message or "") and "past the year 9999" in (message or "")
    assert "shorter delays" in (message or "") and "max_attempts" in (message or ""), message
    assert extended.get(timeout=5) == "extended"
    m = app.tables.message
    with app.engine.connect() as conn:
        rows = dict(conn.execute(sa.select(m.c.id, m.c.next_attempt_at).where(m.c.id.in_([far.id, nacked.id]))).all())
    assert rows[far.id] == last and rows[nacked.id] >= datetime(9999, 12, 30)
    assert far.status() == "pending" and nacked.status() == "retryable"
    assert "could not decide" not in worker.text(), worker.text()[-3000:]


def test_a_process_a_job_left_without_file_descriptors_is_replaced(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job leaks every file descriptor its process may open: the jobs after it, which need a few,
    run in a fresh process instead of failing one after another in the exhausted one."""
    leaking = rt.leak_fds.delay()
    after = rt.opens.bulk([(20,)] * 3)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert leaking.get(timeout=5) > 0
    assert [h.get(timeout=5) for h in after] == [20, 20, 20]
    assert "recycled" in worker.text() and "file descriptors" in worker.text()


@pytest.mark.parametrize("until", ["tomorrow", "1e12", "nan"])
def test_a_defer_that_cannot_be_honoured_fails_the_job(
    app: JobQueue, tmp_path: Path, workers: list[Worker], until: str
) -> None:
    job = rt.bad_defer.delay(until)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    state, error_type, message = archived(app)[job.id]
    assert state == "FAILED" and error_type in ("TypeError", "ValueError") and "defer(until=" in (message or "")
    assert len(runs(tmp_path / "runs.txt")) == 2  # its two attempts, not thousands of re-runs


# -- the buffer behind a job that holds the GIL ----------------------------------------------------


def test_buffered_jobs_reach_an_idle_process_while_a_job_holds_the_gil(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    rt.noop.bulk([()] * 60)  # first (priority 10): both processes learn that jobs are quick
    hog = rt.regex.apply_async((26,), priority=5)  # next: about 3.6 s in the regex engine, the GIL held
    quick = rt.short.bulk([(0,)] * 200)  # behind it, in the same batch of whoever fetches it
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    a = app.tables.archive
    with app.engine.connect() as conn:
        finished = {row[0]: row[1] for row in conn.execute(sa.select(a.c.id, a.c.finished_at))}
        started = conn.execute(sa.select(a.c.last_attempt_at).where(a.c.id == hog.id)).scalar_one()
    hog_end = finished[hog.id]
    last_quick = max(finished[h.id] for h in quick)
    behind = (last_quick - started).total_seconds()
    hog_seconds = (hog_end - started).total_seconds()
    assert hog_seconds > 1.0, f"the GIL-holding job ran only {hog_seconds:.1f} s: too short to show anything"
    assert behind < hog_seconds / 2, (
        f"the quick jobs finished {behind:.1f} s after the GIL-holding job started (it ran {hog_seconds:.1f} s)"
    )
    REPORTS.append(
        f"GIL hog: 200 quick jobs done {behind:.2f} s after a job holding the GIL for {hog_seconds:.1f} s started"
    )


# -- the lease clock is the database server's -------------------------------------------------------


def test_the_skewed_app_runs_jobqueue_on_a_clock_ahead_by_the_skew() -> None:
    """What the clock-skew tests stand on: a worker of tests.apps.skewed reads a shifted clock."""
    probe = "from jobqueue.clock import utcnow; import tests.apps.skewed; print(utcnow().isoformat())"
    env = dict(os.environ, JOBQUEUE_TEST_SKEW_SECONDS="3600")
    before = utcnow()
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    ahead = datetime.fromisoformat(out.stdout.strip()) - before
    assert timedelta(minutes=59) < ahead < timedelta(minutes=61), ahead


@only("postgresql", "mysql")
def test_a_host_whose_clock_runs_20_s_ahead_releases_no_live_lease(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    slow = rt.slow.bulk([(4.0,)] * 2)
    honest = start(workers, tmp_path, "--burst", "--concurrency", "2", "--release-stuck-timeout", "3")
    wait_for(lambda: len([e for e in runs(tmp_path / "runs.txt") if e[0] == "start"]) == 2, 30, "both jobs running")
    # Another host whose clock is 20 s ahead, looking for expired leases every 0.2 s.
    ahead = start(
        workers,
        tmp_path,
        "--concurrency",
        "1",
        "--release-stuck-interval",
        "0.2",
        name="ahead",
        app="tests.apps.skewed:app",
        env={"JOBQUEUE_TEST_SKEW_SECONDS": "20"},
    )
    assert honest.wait(30) == 0, honest.text()[-3000:]
    ahead.signal(signal.SIGTERM)
    assert ahead.wait(30) == 0, ahead.text()[-3000:]
    assert {h.status() for h in slow} == {"completed"}
    assert not repeated(runs(tmp_path / "runs.txt"), "start"), "a live lease was released: a job ran twice"
    assert "lease lost" not in honest.text() and "released" not in ahead.text()


@only("postgresql", "mysql")
def test_a_job_killed_for_its_timeout_on_a_host_an_hour_ahead_is_timed_on_that_hosts_clock(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """The supervisor records the kill: the attempt's start and end are both this host's times, as
    for any other outcome, not the server's acquisition time against this host's end (an hour)."""
    job = rt.hang.delay()  # timeout=1, two attempts
    worker = start(
        workers,
        tmp_path,
        "--burst",
        "--concurrency",
        "1",
        app="tests.apps.skewed:app",
        env={"JOBQUEUE_TEST_SKEW_SECONDS": "3600"},
    )
    assert worker.wait(60) == 0, worker.text()[-3000:]
    a = app.tables.archive
    with app.engine.connect() as conn:
        state, started, ended = conn.execute(
            sa.select(a.c.state, a.c.last_attempt_at, a.c.finished_at).where(a.c.id == job.id)
        ).one()
    assert state == "FAILED"
    assert timedelta(0) < ended - started < timedelta(seconds=30), (started, ended)


@only("postgresql", "mysql")
def test_a_worker_whose_clock_runs_an_hour_behind_runs_the_jobs_due_now(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """By its own clock nothing enqueued now is due for an hour: a --burst worker would stop at
    once, a long-running one sit idle. It counts due times on the server's clock instead."""
    jobs = rt.short.bulk([(0.0,)] * 3)
    worker = start(
        workers,
        tmp_path,
        "--burst",
        "--concurrency",
        "2",
        app="tests.apps.skewed:app",
        env={"JOBQUEUE_TEST_SKEW_SECONDS": "-3600"},
    )
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert {h.status() for h in jobs} == {"completed"}
    assert "this host's clock is 3600.0 s behind the database server's" in worker.text()


@only("postgresql", "mysql")
def test_a_worker_whose_clock_runs_an_hour_ahead_starts_no_job_before_its_time(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job due in 3 s by the server's clock is an hour overdue by the worker's: it still waits."""
    worker = start(
        workers,
        tmp_path,
        "--concurrency",
        "2",
        app="tests.apps.skewed:app",
        env={"JOBQUEUE_TEST_SKEW_SECONDS": "3600"},
    )
    wait_for(lambda: "s ahead of the database server's" in worker.text(), 30, "the worker to measure its clock")
    sent = time.monotonic()
    job = rt.short.apply_async(countdown=3)
    job.get(timeout=30)
    assert time.monotonic() - sent > 2.5, "the job ran before it was due"
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]


@only("postgresql", "mysql")
@pytest.mark.parametrize("step", ["90", "-90"])
def test_a_host_clock_set_while_a_worker_runs_starts_no_job_early_or_late(
    app: JobQueue, tmp_path: Path, workers: list[Worker], step: str
) -> None:
    """The host's clock is set 90 s forward or back (NTP stepping it, `date -s`) between two readings
    of the server's: a job due in 4 s still starts in about 4 s. It started at once, 86 s early, or
    waited for the next reading (here 30 s off), up to 90 s late by the server's clock."""
    jump = tmp_path / "jump.txt"
    env = {"JOBQUEUE_TEST_JUMP_FILE": str(jump), "JOBQUEUE_TEST_JUMP_WALL": "1"}
    options = ("--concurrency", "1", "--release-stuck-interval", "30")
    worker = start(workers, tmp_path, *options, app="tests.apps.clock_jump:app", env=env)
    rt.short.delay(0.0).get(timeout=30)  # up, the server's clock read
    jump.write_text(step)
    time.sleep(0.5)  # every process of the worker on the new clock
    job = rt.short.apply_async((0.0,), countdown=4)
    sent = time.monotonic()
    job.get(timeout=30)
    assert 3.0 < time.monotonic() - sent < 7.0, worker.text()[-3000:]
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]


@only("sqlite")
def test_a_clock_set_forward_mid_job_releases_no_live_lease(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """On SQLite the lease clock is this host's. Set forward by two minutes while a job runs (a
    clock set by hand, a machine resumed from suspend), every lease looks long expired; two
    workers look for expired leases every 0.2 s. They renew every lease first and release none
    for a lease's length: the job runs once, on its first worker."""
    jump = tmp_path / "jump.txt"
    options = ("--concurrency", "1", "--release-stuck-timeout", "6", "--release-stuck-interval", "0.2")
    env = {"JOBQUEUE_TEST_JUMP_FILE": str(jump)}
    job = rt.slow.delay(4.0)
    first = start(workers, tmp_path, *options, name="first", app="tests.apps.clock_jump:app", env=env)
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    second = start(workers, tmp_path, *options, name="second", app="tests.apps.clock_jump:app", env=env)
    time.sleep(1.0)  # the second worker up, looking for expired leases
    jump.write_text("120")
    assert job.get(timeout=30) == first.children()[0]
    time.sleep(1.0)  # time for a wrongly released job to start again
    assert not repeated(runs(tmp_path / "runs.txt"), "start"), "a live lease was released: the job ran twice"
    for worker in (first, second):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.text()[-3000:]
    assert "went 120 s further than the time that passed" in first.text() + second.text()
    assert "released" not in first.text() + second.text()


# -- corrupt rows ------------------------------------------------------------------------------------


@only("sqlite")
def test_rows_that_cannot_be_read_fail_alone_and_the_pool_goes_on(
    app: JobQueue, db_url: str, tmp_path: Path, workers: list[Worker]
) -> None:
    good = rt.short.bulk([(0,)] * 6)
    bad = rt.short.bulk([(0,)] * 3)
    path = sa.make_url(db_url).database or ""
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE jobqueue_message SET headers = '{not json' WHERE id = ?", (bad[0].id,))
        raw.execute("UPDATE jobqueue_message SET created_at = 'yesterday-ish' WHERE id = ?", (bad[1].id,))
        raw.execute("UPDATE jobqueue_message SET options = x'00ff' WHERE id = ?", (bad[2].id,))
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(40) == 0, worker.text()[-3000:]
    assert "exited with" not in worker.text()
    states = archived(app)
    assert {states[h.id][0] for h in good} == {"COMPLETED"}
    for handle, column in zip(bad, ("headers", "created_at", "options"), strict=True):
        state, error_type, message = states[handle.id]
        assert (state, error_type) == ("FAILED", "jobqueue.errors.CorruptMessage"), states[handle.id]
        assert column in (message or "")
    assert "yesterday-ish" in (states[bad[1].id][2] or "")  # the unreadable text is kept in the error


# -- the respawned and the restarted ------------------------------------------------------------------


@only("sqlite")
def test_a_worker_started_before_its_database_exists_waits_for_it(tmp_path: Path, workers: list[Worker]) -> None:
    """An SQLite file on a mount that is not there yet: the worker waits, logging, instead of exiting."""
    folder = tmp_path / "not-mounted-yet"
    url = f"sqlite:///{folder}/jobs.sqlite3"
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", env={"JOBQUEUE_DATABASE_URL": url})
    wait_for(lambda: "unavailable" in worker.text(), 30, "the worker to report that the database is unavailable")
    time.sleep(1)
    assert worker.process.poll() is None, worker.text()
    folder.mkdir()
    queue = JobQueue(url)
    queue.init_schema()
    queue.close()
    rt.app.configure(database_url=url)
    job = rt.noop.delay()
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert job.status() == "completed"
    assert "available again" in worker.text()


@only("postgresql", "mysql")
def test_a_worker_started_while_the_server_is_down_waits_for_it(
    backend: str, tmp_path: Path, workers: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.servers import private_server

    with private_server(backend) as server:
        rt.app.configure(database_url=server.url)
        rt.app.init_schema()
        job = rt.noop.delay()
        rt.app.close()
        server.stop()
        worker = start(workers, tmp_path, "--burst", "--concurrency", "1", env={"JOBQUEUE_DATABASE_URL": server.url})
        wait_for(lambda: "unavailable" in worker.text(), 30, "the worker to report the outage")
        time.sleep(1)
        assert worker.process.poll() is None, worker.text()
        server.start()
        assert worker.wait(90) == 0, worker.text()[-3000:]
        assert job.status() == "completed"
        rt.app.close()


@only("postgresql", "mysql")
@pytest.mark.parametrize("refusal", ["database", "user"])
def test_a_worker_whose_login_is_refused_at_start_exits_naming_the_fix(
    backend: str, db_url: str, refusal: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """A database or user that does not exist, or a wrong password, is no outage to wait out: no
    start gets past it, so the worker says what to fix and exits (a server that does not answer is
    waited for, above)."""
    url = sa.make_url(db_url)
    if refusal == "database":
        url, fix = url.set(database=f"{url.database}_not_created"), "CREATE DATABASE"
    elif backend == "postgresql":
        url, fix = url.set(username="jobqueue_no_such_role"), "CREATE ROLE"
    else:
        url, fix = url.set(password="not-the-password"), "fix the user name and password"
    url_text = url.render_as_string(hide_password=False)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", env={"JOBQUEUE_DATABASE_URL": url_text})
    assert worker.wait(30) == 1, worker.text()[-3000:]
    assert "refuses this login" in worker.text() and fix in worker.text(), worker.text()[-3000:]
    assert "not-the-password" not in worker.text()


@only("mysql")
def test_a_look_for_due_jobs_that_the_database_refuses_is_said_and_not_waited_on(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """An index dropped by hand under a running worker: the supervisor's look for due jobs failed at
    every poll, logged at DEBUG only, and its idle processes, waiting for its news, never fetched:
    the worker sat idle with a job ready, and status counted it as live."""
    worker = start(workers, tmp_path, "--concurrency", "1")
    wait_for(lambda: "started worker process 0" in worker.text(), 30, "the worker process to start")
    time.sleep(1)  # idle by now
    with app.engine.begin() as conn:
        conn.execute(sa.text("DROP INDEX ix_jobqueue_message_partition ON jobqueue_message"))
    try:
        rt.short.delay()
        wait_for(lambda: "looking whether jobs are due failed" in worker.text(), 15, "the failed look to be said")
        # The process woke to fetch itself, met the same refusal, and said so.
        wait_for(lambda: "crashed" in worker.text(), 15, "the worker process to meet the error")
        assert "ix_jobqueue_message_partition" in worker.text()
        worker.signal(signal.SIGTERM)
        worker.wait(30)
    finally:
        app.init_schema()  # the index again, for the tests after this one (a worker refuses tables without it)


def mysql_login(server_url: str, user: str, password: str) -> tuple[sa.Engine, sa.URL]:
    """Add a login with ``password`` and every right on the database of a private MySQL server;
    the server's root engine and URL."""
    admin = sa.create_engine(server_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    url = sa.make_url(server_url)
    with admin.connect() as conn:
        conn.execute(sa.text("FLUSH PRIVILEGES"))  # the server starts without logins: now with them
        conn.execute(sa.text(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'"))
        conn.execute(sa.text(f"GRANT ALL ON `{url.database}`.* TO '{user}'@'127.0.0.1'"))
    return admin, url


@only("mysql")
def test_a_login_refused_while_the_worker_runs_is_an_outage_that_loses_nothing(
    tmp_path: Path, workers: list[Worker]
) -> None:
    """A password changed under running workers (and their sessions ended): their outcomes wait,
    with a warning that says what the server refuses and its fix, and are written once it lets
    them in again; no job fails or runs twice. (On a server of its own, whose root may add users.)"""
    from tests.servers import private_server

    with private_server("mysql") as server:
        admin, url = mysql_login(server.url, "jq_login", "first-pw")
        own = url.set(username="jq_login", password="first-pw").render_as_string(hide_password=False)
        rt.app.configure(database_url=own)
        rt.app.init_schema()
        jobs = rt.short.bulk([(0.02,)] * 300)
        worker = start(workers, tmp_path, "--burst", "--concurrency", "2", env={"JOBQUEUE_DATABASE_URL": own})
        wait_for(lambda: "completed in" in worker.text(), 30, "the first job to complete")
        with admin.connect() as conn:
            conn.execute(sa.text("ALTER USER 'jq_login'@'127.0.0.1' IDENTIFIED BY 'second-pw'"))
            for (pid,) in conn.execute(
                sa.text("SELECT id FROM information_schema.PROCESSLIST WHERE user = 'jq_login'")
            ).all():
                with contextlib.suppress(sa.exc.DBAPIError):
                    conn.execute(sa.text(f"KILL {int(pid)}"))
            wait_for(lambda: "refuses this login" in worker.text(), 30, "the worker to report the refused login")
            assert worker.process.poll() is None, worker.text()[-3000:]
            conn.execute(sa.text("ALTER USER 'jq_login'@'127.0.0.1' IDENTIFIED BY 'first-pw'"))
        admin.dispose()
        assert worker.wait(90) == 0, worker.text()[-3000:]
        assert "fix the user name and password" in worker.text()
        assert "first-pw" not in worker.text() and "second-pw" not in worker.text()
        rt.app.engine.dispose()  # its pooled session was ended with the workers' ones
        states = archived(rt.app)
        assert {states[h.id][0] for h in jobs} == {"COMPLETED"}, states
        assert set(counters(rt.app).values()) == {(1, 1)}
        rt.app.close()


@only("postgresql", "mysql")
def test_a_worker_whose_login_may_not_delete_exits_naming_the_grant_and_runs_nothing(
    backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """A login that may read, insert and update but not delete: the worker started, ran each job,
    failed to archive it (DELETE denied), and ran it again at every retry. It now refuses to start,
    naming the right, the tables and the grant. (On a server of its own, whose admin adds logins.)"""
    from tests.servers import private_server

    with private_server(backend) as server:
        rt.app.configure(database_url=server.url)
        rt.app.init_schema()
        job = rt.slow.delay(0)
        rt.app.close()
        admin = sa.create_engine(server.url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.execute(sa.text("CREATE ROLE jq_nodelete LOGIN"))
                conn.execute(sa.text("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO jq_nodelete"))
                conn.execute(sa.text("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO jq_nodelete"))
            else:
                database = sa.make_url(server.url).database
                conn.execute(sa.text("FLUSH PRIVILEGES"))  # the server starts without logins: now with them
                conn.execute(sa.text("CREATE USER 'jq_nodelete'@'127.0.0.1' IDENTIFIED BY 'pw'"))
                conn.execute(sa.text(f"GRANT SELECT, INSERT, UPDATE ON `{database}`.* TO 'jq_nodelete'@'127.0.0.1'"))
        admin.dispose()
        own = sa.make_url(server.url).set(username="jq_nodelete", password="pw" if backend == "mysql" else None)
        env = {"JOBQUEUE_DATABASE_URL": own.render_as_string(hide_password=False)}
        worker = start(workers, tmp_path, "--burst", "--concurrency", "1", env=env)
        assert worker.wait(30) == 1, worker.text()[-3000:]
        said = worker.text()
        assert "the database login 'jq_nodelete' may not DELETE on " in said and "jobqueue_message" in said, said
        assert "GRANT SELECT, INSERT, UPDATE, DELETE" in said and "Traceback" not in said, said
        assert not runs(tmp_path / "runs.txt") and job.status() == "pending", runs(tmp_path / "runs.txt")
        rt.app.close()


@only("mysql")
def test_a_password_given_as_a_query_parameter_logs_in_and_is_never_shown() -> None:
    """The engine's URL kept ?passwd=: repr(app.engine) and str(app.engine.url) showed it. It now
    goes to the driver as a connection argument, for every engine jobqueue opens on that URL (the
    one-statement enqueue has one of its own)."""
    from tests.servers import private_server

    with private_server("mysql") as server:
        admin, url = mysql_login(server.url, "jq_query", "query-pw-7")
        admin.dispose()
        own = url.set(username="jq_query", password=None).update_query_dict({"passwd": "query-pw-7"})
        app = JobQueue(own.render_as_string(hide_password=False))

        @app.task(name="q.add")
        def add(x: int, y: int) -> int:
            return x + y

        app.init_schema()
        handle = add.delay(1, 2)  # through the enqueue's engine of its own
        add.bulk([(3, 4)])
        assert handle.status() == "pending"
        for shown in (repr(app.engine), str(app.engine.url), repr(app)):
            assert "query-pw-7" not in shown, shown
        app.close()


def kill_connections(conn: sa.Connection, backend: str, database: str | None) -> int:
    """End every session on ``database`` but ``conn``'s own, as a server restart or a pooler's
    would; how many there were."""
    if backend == "postgresql":
        query = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = :db "
            "AND pid <> pg_backend_pid()"
        )
        return int(conn.execute(sa.text(query), {"db": database}).scalar() or 0)
    killed = 0
    own = conn.execute(sa.text("SELECT CONNECTION_ID()")).scalar()
    for (pid,) in conn.execute(
        sa.text("SELECT id FROM information_schema.PROCESSLIST WHERE db = :db AND id <> :own"),
        {"db": database, "own": own},
    ).all():
        try:
            conn.execute(sa.text(f"KILL {int(pid)}"))
            killed += 1
        except sa.exc.DBAPIError:
            pass
    return killed


@only("postgresql", "mysql")
def test_a_jobs_checkpoints_and_extends_wait_out_dropped_connections(
    app: JobQueue, backend: str, db_url: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """A connection dropped under a running job (a server or pooler restart) made its next
    checkpoint() or extend() raise the driver's error into the job, which then failed for good."""
    job = rt.checkpoints_as_it_goes.delay(40)
    admin = sa.create_engine(db_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    database = sa.make_url(db_url).database
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")

    def steps() -> int:
        return sum(event.startswith("step-") for event, _, _ in runs(tmp_path / "runs.txt"))

    killed = 0
    with admin.connect() as conn:
        for seen in (3, 12, 24):
            wait_for(lambda: steps() >= seen, 60, f"{seen} steps of the job")  # noqa: B023  # called at once
            killed += kill_connections(conn, backend, database)
    admin.dispose()
    assert worker.wait(90) == 0, worker.text()[-3000:]
    app.close()  # this test's own pooled connections were killed too
    assert job.get(timeout=10) == 40, worker.text()[-3000:]
    assert killed >= 3


@only("postgresql", "mysql")
def test_connections_killed_in_the_first_second_do_not_stop_the_worker(
    app: JobQueue, backend: str, db_url: str, tmp_path: Path, workers: list[Worker]
) -> None:
    jobs = rt.short.bulk([(0,)] * 20)
    admin = sa.create_engine(db_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    database = sa.make_url(db_url).database
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    killed = 0
    deadline = time.monotonic() + 1.5
    with admin.connect() as conn:
        while time.monotonic() < deadline:
            killed += kill_connections(conn, backend, database)
            time.sleep(0.05)
    admin.dispose()
    assert worker.wait(90) == 0, worker.text()[-3000:]
    app.close()  # this test's own pooled connections were killed too
    assert {h.status() for h in jobs} == {"completed"}
    REPORTS.append(f"early kills[{backend}]: {killed} connections killed in the worker's first 1.5 s; all jobs ran")


# -- what the logs say about a stale delivery ---------------------------------------------------------


def test_a_stale_delivery_says_its_lease_was_lost_not_that_the_job_failed(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    job = rt.fail_after.delay(2.0)
    stale = start(
        workers,
        tmp_path,
        "--concurrency",
        "1",
        "--release-stuck-timeout",
        "1",
        "--release-stuck-interval",
        "0.2",
        name="stale",
    )
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    for pid in stale.children():
        os.kill(pid, signal.SIGSTOP)  # inside the job's sleep: no transaction open
    freeze(stale, app.engine)  # the whole tree stops: nobody renews the lease
    other = start(
        workers,
        tmp_path,
        "--concurrency",
        "1",
        "--release-stuck-timeout",
        "1",
        "--release-stuck-interval",
        "0.2",
        name="other",
    )
    wait_for(lambda: len(runs(tmp_path / "runs.txt")) == 2, 30, "the other worker to take the job over")
    os.kill(stale.pid, signal.SIGCONT)
    for pid in stale.children():
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: "lease lost" in stale.text(), 30, "the stale delivery to report its lost lease")
    assert "failed on attempt" not in stale.text(), stale.text()[-2000:]
    del job, other


# -- a frozen process does not keep its locks -----------------------------------------------------------

HOLDER = """
import os, signal, sys
import sqlalchemy as sa
from jobqueue import JobQueue
app = JobQueue(sys.argv[1])
with app.engine.connect() as conn:
    conn.begin()
    conn.execute(sa.text("SELECT id FROM jobqueue_message WHERE id = :id FOR UPDATE"), {"id": int(sys.argv[2])})
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""


@only("postgresql", "mysql")
def test_a_process_frozen_inside_a_transaction_loses_its_locks(
    app: JobQueue, db_url: str, tmp_path: Path, workers: list[Worker]
) -> None:
    job = rt.noop.delay()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, db_url, str(job.id)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        began = time.monotonic()
        worker = start(workers, tmp_path, "--concurrency", "1", "--max-fetch-interval", "0.5")
        wait_for(lambda: job.status() == "completed", 40, "the locked job to run once the frozen session ended")
        REPORTS.append(f"frozen lock holder: its job ran {time.monotonic() - began:.1f} s later")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        holder.kill()
        holder.wait(10)


@only("sqlite")
def test_a_process_topping_up_its_buffer_keeps_fetching(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    """With room for three batches, a busy process tops up its buffer before it runs dry, over and
    over; the list of buffered batches it shares with its supervisor must not fill up and stop it."""
    jobs = rt.noop.bulk([()] * 3000)
    worker = start(
        workers, tmp_path, "--burst", "--concurrency", "1", "--fetch-batch-size", "10", "--overfetch-factor", "3"
    )
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert {h.status() for h in jobs[-5:]} == {"completed"}


@only("postgresql", "mysql")
def test_a_login_limited_to_fewer_connections_than_a_worker_holds_is_said_at_start_with_the_limit(
    backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """The processes beyond the limit waited without a word (PostgreSQL), or crashed at start again
    and again, a traceback each, thousands of lines a minute (MariaDB). The worker now says so as
    it starts (a warning: behind a pooler the limit bounds its server connections, not these), and
    the processes beyond it wait as for a server that is down. (On a server of its own.)"""
    from tests.servers import private_server

    with private_server(backend) as server:
        rt.app.configure(database_url=server.url)
        rt.app.init_schema()
        job = rt.noop.delay()
        rt.app.close()
        admin = sa.create_engine(server.url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.execute(sa.text("CREATE ROLE jq_few LOGIN CONNECTION LIMIT 4"))
                conn.execute(sa.text("GRANT ALL ON ALL TABLES IN SCHEMA public TO jq_few"))
                conn.execute(sa.text("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO jq_few"))
                fix = 'ALTER ROLE "jq_few" CONNECTION LIMIT 6'
            else:
                conn.execute(sa.text("FLUSH PRIVILEGES"))  # the server starts without logins: now with them
                conn.execute(sa.text("CREATE USER 'jq_few'@'127.0.0.1' IDENTIFIED BY 'pw' WITH MAX_USER_CONNECTIONS 4"))
                conn.execute(sa.text(f"GRANT ALL ON `{sa.make_url(server.url).database}`.* TO 'jq_few'@'127.0.0.1'"))
                fix = "ALTER USER 'jq_few'@'127.0.0.1' WITH MAX_USER_CONNECTIONS 5"
        admin.dispose()
        own = sa.make_url(server.url).set(username="jq_few", password="pw" if backend == "mysql" else None)
        env = {"JOBQUEUE_DATABASE_URL": own.render_as_string(hide_password=False)}
        over = start(workers, tmp_path, "--concurrency", "2", "--release-stuck-timeout", "3", env=env, name="over")
        wait_for(lambda: "may hold at most 4 connection(s) at once" in over.text(), 30, "the warning")
        time.sleep(5)  # the processes beyond the limit try; the supervisor renews leases all along
        over.kill()
        said = over.text()
        assert "and a worker of 2 process(es)" in said and fix in said, said[-3000:]
        assert "Traceback" not in said, said[-3000:]  # MariaDB's refusals crashed each process, a traceback each
        # The supervisor's own connection is opened before its processes start: they took every
        # connection left, and it renewed no lease, which stopped the whole worker.
        assert "database (supervisor) unavailable" not in said, said[-3000:]
        assert "renewed no lease" not in said, said[-3000:]
        within = start(workers, tmp_path, "--burst", "--concurrency", "1", env=env, name="within")
        assert within.wait(60) == 0, within.text()[-3000:]
        assert job.status() == "completed"
        rt.app.close()


@only("postgresql")
def test_a_worker_whose_login_may_not_use_the_id_sequences_exits_naming_the_grant(
    tmp_path: Path, workers: list[Worker]
) -> None:
    """Rights on every table but not on their sequences: enqueue was told to grant what the login
    had (SELECT, INSERT, UPDATE, DELETE), and the worker started, to fail where it adds a job (a
    periodic task's next run, a topic's deliveries)."""
    from tests.servers import private_server

    with private_server("postgresql") as server:
        rt.app.configure(database_url=server.url)
        rt.app.init_schema()
        rt.app.close()
        admin = sa.create_engine(server.url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE ROLE jq_noseq LOGIN"))
            conn.execute(sa.text("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO jq_noseq"))
        admin.dispose()
        own = sa.make_url(server.url).set(username="jq_noseq").render_as_string(hide_password=False)
        worker = start(workers, tmp_path, "--burst", "--concurrency", "1", env={"JOBQUEUE_DATABASE_URL": own})
        assert worker.wait(30) == 1, worker.text()[-3000:]
        said = worker.text()
        assert "may not use the sequence(s) public.jobqueue_message_id_seq" in said, said[-3000:]
        assert "GRANT USAGE ON SEQUENCE" in said and "Traceback" not in said, said[-3000:]
        enqueued = subprocess.run(
            [
                sys.executable,
                "-m",
                "jobqueue",
                "--app",
                "tests.apps.runtime:app",
                "--database-url",
                own,
                "enqueue",
                "rt.noop",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert enqueued.returncode == 1 and "GRANT the database user USAGE on the jobqueue tables' sequences" in (
            enqueued.stderr
        ), enqueued.stderr
        # UPDATE lets a login draw from a sequence as well as USAGE does (a common grant).
        admin = sa.create_engine(server.url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("GRANT SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO jq_noseq"))
        admin.dispose()
        granted = start(
            workers, tmp_path, "--burst", "--concurrency", "1", env={"JOBQUEUE_DATABASE_URL": own}, name="ok"
        )
        assert granted.wait(60) == 0, granted.text()[-3000:]
        rt.app.close()
