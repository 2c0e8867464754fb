"""Worker runtime under real processes: SIGKILL chaos, SIGTERM, poison, time limits, recycling, leases.

Every test runs the real CLI in a subprocess against SQLite, PostgreSQL and MariaDB.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from jobqueue import JobFailed, JobQueue, Task
from tests.apps import runtime as rt
from tests.conftest import only
from tests.runtime.harness import REPORTS, Worker, freeze, repeated, runs, start, wait_for


def table_rows(app: JobQueue, table: str, *columns: str) -> list[tuple]:
    t = getattr(app.tables, table)
    with app.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(*[t.c[c] for c in columns]).order_by(t.c.id))]


def archived_states(app: JobQueue) -> dict[int, str]:
    return dict(table_rows(app, "archive", "id", "state"))


def test_chaos_sigkill_a_random_child_every_half_second(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    handles = rt.short.bulk([()] * 2000)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    kills = 0
    stop = threading.Event()

    def killer() -> None:
        nonlocal kills
        while not stop.wait(0.5):
            children = worker.children()
            if children:
                try:
                    signal_pid = random.choice(children)
                    import os

                    os.kill(signal_pid, signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        code = worker.wait(240)
    finally:
        stop.set()
        thread.join()
    assert code == 0, worker.text()[-3000:]
    states = archived_states(app)
    assert len(states) == 2000 and set(states.values()) == {"COMPLETED"}
    assert table_rows(app, "message", "id") == []
    assert {h.id for h in handles} == set(states)
    twice = repeated(runs(tmp_path / "runs.txt"), "run")
    assert kills >= 3, "the run ended before the chaos had any effect"
    REPORTS.append(
        f"chaos[{backend}]: 2000 jobs, {kills} SIGKILLs, {len(twice)} jobs ran more than once "
        f"({sum(twice.values()) - len(twice)} extra runs), 0 lost"
    )


def test_chaos_sigstop_and_sigcont_the_supervisor_and_its_children(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """Freeze the supervisor or a child for up to 0.3 s at a time, again and again, well inside the
    lease, while they fetch, run and flush: nothing is lost and, since no lease runs out and no
    process dies, no job runs twice (a frozen child's buffer is taken back, uncounted)."""
    handles = rt.short.bulk([(0.005,)] * 1000)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2", "--release-stuck-timeout", "5")
    freezes = 0
    stop = threading.Event()

    def freezer() -> None:
        nonlocal freezes
        while not stop.wait(random.uniform(0.02, 0.1)):
            pid = random.choice([worker.pid, *worker.children()])
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(random.uniform(0.01, 0.3))
                os.kill(pid, signal.SIGCONT)
                freezes += 1
            except ProcessLookupError:
                pass

    thread = threading.Thread(target=freezer)
    thread.start()
    try:
        code = worker.wait(240)
    finally:
        stop.set()
        thread.join()
        for pid in [worker.pid, *worker.children()]:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert code == 0, worker.text()[-3000:]
    states = archived_states(app)
    assert {h.id for h in handles} == set(states) and set(states.values()) == {"COMPLETED"}
    assert not repeated(runs(tmp_path / "runs.txt"), "run")
    assert "exited with" not in worker.text() and "lease lost" not in worker.text()
    assert freezes >= 10, "the run ended before the chaos had any effect"
    REPORTS.append(f"freeze chaos[{backend}]: 1000 jobs, {freezes} SIGSTOP/SIGCONT, 0 lost, 0 ran twice")


def test_sigterm_lets_running_jobs_finish_and_hands_back_the_rest(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    rt.noop.bulk([()] * 30)  # warm-up: the processes learn that jobs are quick and fetch big batches
    slow = rt.slow.bulk([(1.5,)] * 8)  # two run when the signal comes, the rest wait in buffers or the queue
    worker = start(workers, tmp_path, "--concurrency", "2")
    wait_for(
        lambda: len([e for e in runs(tmp_path / "runs.txt") if e[0] == "start"]) >= 2, 30, "two slow jobs to start"
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0, worker.text()[-3000:]
    events = runs(tmp_path / "runs.txt")
    started = {job for event, job, _ in events if event == "start"}
    ended = {job for event, job, _ in events if event == "end"}
    assert started == ended, "a job that started was cut off"
    states = archived_states(app)
    assert all(states[job] == "COMPLETED" for job in started)
    assert "FAILED" not in states.values()
    rest = {row[0]: row[1:] for row in table_rows(app, "message", "id", "state", "attempts_count", "deliveries_count")}
    assert set(rest) == {h.id for h in slow} - started
    assert all(value == ("PENDING", 0, 0) for value in rest.values()), rest  # handed back uncounted

    again = start(workers, tmp_path, "--burst", "--concurrency", "2", name="again")
    assert again.wait(60) == 0
    assert {h.status() for h in slow} == {"completed"}
    assert not repeated(runs(tmp_path / "runs.txt"), "start"), "a job ran twice"


# os._exit(0) too: a process that ends mid-job died, whatever its status. And os.closerange(3, ...),
# which took the process's pipes and database files: on SQLite the process hung, then died with the
# job taken for finished, never charged a delivery, so it ran again and hung the next, for ever. Now
# the process exits at once (status 3), the job charged.
@pytest.mark.parametrize("code", [1, 0, 3], ids=["exit-1", "exit-0", "closerange"])
def test_a_job_that_kills_its_process_is_failed_after_max_deliveries(
    app: JobQueue, tmp_path: Path, workers: list[Worker], code: int
) -> None:
    poison = rt.close_descriptors.delay() if code == 3 else rt.crash.delay(code)
    others = rt.short.bulk([()] * 50)
    began = time.monotonic()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="max_deliveries=2") as info:
        poison.get(timeout=5)
    assert info.value.error_type == "jobqueue.errors.MaxDeliveriesExceeded"
    assert time.monotonic() - began < 30
    assert {h.status() for h in others} == {"completed"}
    assert len([e for e in runs(tmp_path / "runs.txt") if e[0] == "start"]) == 2  # ran twice, then refused
    log = worker.text()
    assert log.count(f"exited with code {code} while running job {poison.id}") == 2
    assert log.count("started worker process") == 4  # the pool kept its size: two replacements


def test_a_job_that_leaves_its_process_no_memory_is_failed_after_max_deliveries(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job that kept all the memory it could take: its process could not write its outcome, took
    the MemoryError for the database refusing every write and retried for ever, holding the job
    and saying nothing (SQLite: failed it as OutcomeRefused). The process now exits, blaming that
    job as one that killed its process: charged a delivery each time, it fails after max_deliveries."""
    hog = rt.fills_memory.delay()
    others = rt.short.bulk([()] * 20)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(90) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="max_deliveries=2") as info:
        hog.get(timeout=5)
    assert info.value.error_type == "jobqueue.errors.MaxDeliveriesExceeded"
    assert {h.status() for h in others} == {"completed"}
    log = worker.text()
    assert log.count(f"ran out of memory after job {hog.id}; it exits") == 2, log[-3000:]
    assert log.count(f"exited with code 4 while running job {hog.id}") == 2, log[-3000:]
    assert "crashed" not in log, log[-3000:]


def test_a_task_left_on_the_loop_that_will_not_end_does_not_keep_a_recycled_process(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """An async job left a task whose cleanup waits for ever once cancelled: the process recycled
    after it waited for that task for ever, the slot lost without a word (with --concurrency 1
    nothing more ran)."""
    rt.leaves_a_stubborn_task.delay()
    others = rt.short.bulk([()] * 3)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--max-tasks-per-child", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert {h.status() for h in others} == {"completed"}
    log = worker.text()
    assert "1 task(s) a job left on its event loop did not end within 5.0 s of being cancelled" in log, log[-3000:]
    assert "leaves_a_stubborn_task.<locals>.flusher" in log


def test_a_soft_limit_that_lands_in_a_checkpoint_is_raised_in_the_jobs_own_code(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """Raised inside SQLAlchemy as a connection went back to its pool, the soft limit was logged
    and swallowed there, and the job ran on to its hard limit (or for ever without one); raised in a
    checkpoint's statement, it was recorded as a StatementError."""
    rt.checkpoints_past_its_soft_limit.bulk([()] * 30)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(120) == 0, worker.text()[-3000:]
    errors = [error for (error,) in table_rows(app, "archive", "error_type")]
    assert errors == ["jobqueue.errors.SoftTimeLimitExceeded"] * 30, worker.text()[-3000:]


def test_a_timer_a_job_leaves_is_cancelled_before_the_next_job(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job's signal.alarm(1), still pending as it returned, ended its process during a later
    job, which was charged a delivery for it."""
    left = rt.leaves_an_alarm.delay()
    others = [rt.short.delay(0.4) for _ in range(4)]
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert left.status() == "completed" and {h.status() for h in others} == {"completed"}
    log = worker.text()
    assert "exited with signal" not in log, log[-3000:]
    assert f"job {left.id} rt.leaves_an_alarm left a timer (signal.alarm or setitimer) due in " in log, log[-3000:]


def test_a_job_that_replaces_the_soft_limits_handler_is_said_to_run_without_it(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    job = rt.sets_its_own_alarm.delay()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert job.get(timeout=5) == "done"
    assert "task rt.sets_its_own_alarm: a job set a timer or SIGALRM handler of its own" in worker.text()


def test_a_job_that_lowers_the_limit_of_open_files_gets_its_process_recycled(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job set RLIMIT_NOFILE just above what the process had open: every later job of the
    process failed with "Too many open files", the process never recycled."""
    rt.lowers_files_limit.delay()
    others = rt.opens.bulk([(2,)] * 10)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    states = [h.status() for h in others]
    assert states.count("completed") >= 9, (states, worker.text()[-3000:])  # the first may have met the limit
    assert "recycled: a job lowered its limit of open files from " in worker.text(), worker.text()[-3000:]


@pytest.mark.parametrize("hang", [rt.hang, rt.async_hang], ids=["sync", "async"])
def test_hard_timeout_kills_and_retries_then_fails(
    app: JobQueue, tmp_path: Path, workers: list[Worker], hang: Task
) -> None:
    job = hang.delay()  # an async task awaiting asyncio.sleep(60) is killed as a sleeping sync one
    others = rt.short.bulk([()] * 10)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="timeout of 1 s") as info:
        job.get(timeout=5)
    assert info.value.error_type == "jobqueue.errors.TimeLimitExceeded"
    assert table_rows(app, "archive", "attempts_count")[0] == (2,)  # killed, retried once, killed, failed
    assert {h.status() for h in others} == {"completed"}
    log = worker.text()
    assert "killed after its timeout of 1 s; retry at" in log and "killed after its timeout of 1 s; failed" in log


def running(pid: int) -> bool:
    """Whether a process is alive (a zombie is not: nobody may reap an orphan in a container)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def test_a_job_killed_for_its_timeout_takes_the_programs_it_started_along(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """They ran on, orphaned, with no job waiting for them; one started in a session of its own
    was meant to outlive the job, and does."""
    job = rt.hang_with_programs.delay()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="timeout of 1 s; its worker process was killed, with the programs it started"):
        job.get(timeout=5)
    events = {event.split("-")[0]: int(event.split("-")[1]) for event, _, _ in runs(tmp_path / "runs.txt")}
    try:
        wait_for(lambda: not running(events["program"]), 5, "the job's program to be killed")
        assert running(events["apart"])
    finally:
        os.kill(events["apart"], signal.SIGKILL)


@only("sqlite")
def test_a_job_killed_while_its_programs_start_more_takes_them_all_along(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A program started between the supervisor's look for the job's programs and its kill ran on:
    with a shell starting programs every few milliseconds, some always did."""
    seconds = f"{random.randint(400, 499)}.{random.randint(100, 999)}"  # tells its programs from others
    job = rt.keeps_starting_programs.delay(seconds)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    with pytest.raises(JobFailed, match="timeout of 1 s"):
        job.get(timeout=5)
    marker = f"sleep\0{seconds}\0".encode()

    def left() -> list[int]:
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if cmdline.read() == marker and running(int(entry)):
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
        return found

    survivors = left()
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"{len(survivors)} program(s) of the killed job ran on"


@only("sqlite")
def test_a_host_name_that_is_not_utf8_is_kept_escaped(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    """Linux takes any bytes for a host name. One that is not UTF-8 made every worker process crash
    as it registered itself (no driver writes lone surrogates), and restart for ever."""
    rename = "import os, socket, sys; socket.sethostname(b'bad\\xfehost'); os.execv(sys.argv[1], sys.argv[1:])"
    namespace = ("unshare", "--uts", sys.executable, "-c", rename)
    if subprocess.run([*namespace, "/bin/true"], capture_output=True).returncode != 0:
        pytest.skip("this machine does not let the tests start a host name namespace (unshare)")
    job = rt.short.delay()
    worker = start(workers, tmp_path, "--concurrency", "1", wrapper=namespace)
    job.get(timeout=30)
    assert table_rows(app, "worker", "hostname") == [("bad\\xfehost",)], worker.text()[-3000:]


def test_a_supervisor_registers_again_the_rows_deleted_while_it_lived(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """Deleted as stale (a supervisor frozen or cut off from the database for minutes, a
    `workers --prune`), a live worker's rows never came back: it was missing from `jobqueue
    workers` for good, and a container's `health --this-host` probe failed for ever."""
    # Processes slow to start (heartbeats every second meanwhile) are not yet in the registry:
    # they were taken for rows deleted, registered by the supervisor, and warned about.
    slow = {"JOBQUEUE_TEST_SLOW_START": "2"}
    worker = start(workers, tmp_path, "--concurrency", "2", "--release-stuck-timeout", "3", env=slow)
    registered = lambda: sorted(pid for (pid,) in table_rows(app, "worker", "pid"))  # noqa: E731
    wait_for(lambda: len(registered()) == 2, 30, "the worker processes to register")
    assert "gone from the worker registry" not in worker.text(), worker.text()[-3000:]
    before = registered()
    with app.engine.begin() as conn:
        conn.execute(sa.delete(app.tables.worker))
    wait_for(lambda: registered() == before, 15, "the rows to be registered again")
    assert "2 worker process row(s) of this supervisor were gone from the worker registry" in worker.text()
    job = rt.short.delay()
    job.get(timeout=30)  # and it runs jobs as before


def children_named(parent: int, name: str) -> list[tuple[int, bytes]]:
    """The children of ``parent`` running ``name``, each with its state (b"Z": ended, not waited for)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                data = stat.read()
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            continue
        command, rest = data.split(b" (", 1)[1].rsplit(b")", 1)
        state, ppid = rest.split()[:2]
        if int(ppid) == parent and command == name.encode():
            found.append((int(entry), state))
    return found


@only("sqlite")
def test_a_supervisor_that_is_a_containers_first_process_waits_for_ended_orphans(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """The first process of a container (PID 1) is made the parent of every orphan in it. Ended,
    an orphan stays a zombie, holding a process slot, until its parent waits for it: the
    supervisor did not, and a container's zombies grew with every job that left a program behind.
    A container's first process also hears only the signals it handles: SIGTERM still stops it."""
    namespace = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
    if subprocess.run([*namespace, "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine does not let the tests start a process namespace (unshare)")
    job = rt.leaves_orphans.delay(5, 1.0)
    worker = start(workers, tmp_path, "--concurrency", "1", wrapper=namespace)
    wait_for(worker.children, 10, "the supervisor to start")
    supervisor = worker.children()[0]  # unshare's only child
    assert job.get(timeout=30) is None
    assert len(children_named(supervisor, "sleep")) == 5, "the shells' programs were not handed to the supervisor"
    wait_for(lambda: not children_named(supervisor, "sleep"), 10, "the ended orphans to be waited for")
    os.kill(supervisor, signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]
    assert "jobqueue worker" in worker.text() and "stopped" in worker.text()


def test_soft_timeout_raises_inside_the_job(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    job = rt.soft.delay()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0
    result = job.get(timeout=5)
    assert result.startswith("caught after 0.")


def test_max_tasks_per_child_recycles_processes(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    handles = rt.short.bulk([()] * 20)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--max-tasks-per-child", "5")
    assert worker.wait(60) == 0
    pids = [h.get(timeout=5) for h in handles]
    assert len(set(pids)) == 4
    assert all(pids.count(p) == 5 for p in set(pids))


def test_a_thread_a_job_leaves_running_does_not_keep_its_process(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job starts a thread that is not a daemon and never ends. On its way out the process waited
    for it: recycled, it never ended, nor was it replaced, and the jobs behind it waited for ever
    (a stopping worker waited out graceful_timeout, then killed it)."""
    rt.leaves_a_thread.delay()
    handles = rt.short.bulk([()] * 6)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--max-tasks-per-child", "1")
    assert worker.wait(20) == 0, worker.text()[-3000:]
    assert {h.status() for h in handles} == {"completed"}
    assert "exits with 1 thread(s) a job started still running (left-by-a-job)" in worker.text()
    assert "graceful_timeout" not in worker.text()


@only("sqlite")
def test_the_event_loops_own_threads_are_not_taken_for_threads_a_job_left(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """asyncio.to_thread runs on the event loop's default executor: its thread was named as one a
    job left running, each time a process ended."""
    handle = rt.async_in_a_thread.delay()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--max-tasks-per-child", "1")
    assert worker.wait(30) == 0, worker.text()[-3000:]
    assert isinstance(handle.get(timeout=5), int)
    assert "thread(s) a job started still running" not in worker.text(), worker.text()[-3000:]


def test_max_memory_per_child_recycles_between_jobs(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    handles = rt.grow.bulk([(40,)] * 3)  # each job keeps 40 MiB alive in its process
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1", "--max-memory-per-child", "100000")
    assert worker.wait(60) == 0
    pids = [h.get(timeout=5) for h in handles]
    assert len(set(pids)) >= 2 and "max_memory_per_child" in worker.text()


def test_a_slow_job_does_not_hoard_its_batch(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    rt.noop.bulk([()] * 30)
    slow = rt.slow.bulk([(1.0,)] * 8)
    began = time.monotonic()
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(60) == 0
    elapsed = time.monotonic() - began
    pids = {pid for event, _, pid in runs(tmp_path / "runs.txt") if event == "start"}
    assert len(pids) == 2, "one process ran every slow job while the other idled"
    assert {h.status() for h in slow} == {"completed"}
    assert not repeated(runs(tmp_path / "runs.txt"), "start")
    REPORTS.append(f"prefetch: 8 one-second jobs after quick ones took {elapsed:.1f} s on 2 processes")


def test_a_frozen_supervisors_child_keeps_its_running_job_and_starts_no_aged_lease(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """The supervisor alone is frozen (SIGSTOP) while its child runs a job longer than the lease,
    with quick jobs buffered behind it (a frozen supervisor cannot take that buffer back). The
    child renews its running job's lease itself, so no other worker runs that job meanwhile; the
    buffered jobs' leases age unrenewed and run out, another worker runs them, and the child hands
    them back instead of starting them. Every job runs exactly once."""
    lease = ("--release-stuck-timeout", "6", "--release-stuck-interval", "0.2", "--max-fetch-interval", "0.2")
    rt.short.bulk([(0.01,)] * 50)  # quick jobs: the child fetches them in batches of about ten
    first = start(workers, tmp_path, "--concurrency", "1", *lease, name="first")
    wait_for(lambda: len(runs(tmp_path / "runs.txt")) >= 10, 30, "the first jobs to run")
    freeze(first, app.engine)  # the supervisor renews nothing from now on; its child runs on
    try:
        # Committed together, so that the child's next fetch takes quick jobs with the long one
        # (enqueued one after the other, a loaded machine let it fetch the long one alone).
        with app.engine.begin() as conn:
            long = rt.slow.apply_async((8.0,), connection=conn)
            behind = rt.short.bulk([(0.01,)] * 20, connection=conn)
        (child,) = first.children()
        wait_for(lambda: ("start", long.id, child) in runs(tmp_path / "runs.txt"), 30, "the long job to start")
        # The jobs fetched with it wait in the child's buffer, their leases running out in 6 s.
        second = start(workers, tmp_path, "--concurrency", "1", *lease, name="second")
        wait_for(lambda: len(table_rows(app, "archive", "id")) == 71, 60, "every job to be archived", interval=0.2)
    finally:
        first.signal(signal.SIGCONT)
    events = runs(tmp_path / "runs.txt")
    assert not repeated(events, "run") and not repeated(events, "start"), "a job ran twice"
    assert [pid for event, job_id, pid in events if job_id == long.id] == [child, child]  # start, end: once
    assert long.get(timeout=5) == child
    assert {h.status() for h in behind} == {"completed"}
    ran_behind = {pid for event, job_id, pid in events if job_id in {h.id for h in behind}}
    assert second.children()[0] in ran_behind  # their leases ran out; the second worker took them
    log = first.text()
    assert f"job {long.id} rt.slow: its lease renewed by the worker process itself" in log
    if "whose lease expired" in second.text():  # the child took quick jobs with the long one
        assert "returned to the queue unstarted" in log, log[-3000:]
    # (On a loaded machine its fetch may take the long job alone: the second worker then finds
    # the quick ones ready, unleased, and nothing is handed back.)
    assert "takes no new job until it does" in log
    for worker in (first, second):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert {state for _, state in archived_states(app).items()} == {"COMPLETED"}
    assert len(archived_states(app)) == 71


def test_a_child_frozen_past_its_lease_finishes_and_is_fenced_out(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """The running child itself is frozen (SIGSTOP), then its supervisor, past the lease; another
    worker runs the job again and archives it. Continued, the frozen child finishes its run and
    tries to write its outcome: fencing refuses it, and the archive keeps the second delivery's."""
    job = rt.slow.delay(1.5)
    lease = ("--release-stuck-timeout", "1", "--release-stuck-interval", "0.2", "--max-fetch-interval", "0.2")
    first = start(workers, tmp_path, "--concurrency", "1", *lease, name="first")
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    (child,) = first.children()
    os.kill(child, signal.SIGSTOP)  # inside the job's sleep: no transaction open
    freeze(first, app.engine)
    try:
        second = start(workers, tmp_path, "--concurrency", "1", "--burst", *lease, name="second")
        assert second.wait(60) == 0, second.text()[-3000:]
    finally:
        first.signal(signal.SIGCONT)
        os.kill(child, signal.SIGCONT)
    starts = [pid for event, _, pid in runs(tmp_path / "runs.txt") if event == "start"]
    assert starts[0] == child and len(starts) == 2
    assert job.get(timeout=5) == starts[1]
    wait_for(lambda: ("end", job.id, child) in runs(tmp_path / "runs.txt"), 10, "the frozen child to finish its run")
    wait_for(lambda: "lease lost" in first.text(), 10, "the frozen child's outcome to be fenced out")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    assert job.get(timeout=5) == starts[1]
    assert table_rows(app, "archive", "id", "state", "attempts_count") == [(job.id, "COMPLETED", 2)]


def test_second_signal_stops_at_once_and_returns_the_messages(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    jobs = rt.slow.bulk([(30.0,)] * 2)
    worker = start(workers, tmp_path, "--concurrency", "2")
    wait_for(lambda: len(runs(tmp_path / "runs.txt")) >= 2, 30, "both jobs to start")
    began = time.monotonic()
    worker.signal(signal.SIGINT)
    time.sleep(0.6)  # as a person presses Ctrl-C twice: two signals at once are one request
    worker.signal(signal.SIGINT)
    assert worker.wait(10) == 1
    assert time.monotonic() - began < 5
    rows = table_rows(app, "message", "id", "state", "attempts_count", "deliveries_count")
    assert sorted(r[0] for r in rows) == sorted(h.id for h in jobs)
    # Cut off: the attempt counts, the delivery does not (the kill was the supervisor's).
    assert all(r[1:] == ("PENDING", 1, 0) for r in rows)


def test_signals_that_would_end_the_supervisor_silently_are_noted_and_ignored(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """SIGUSR1 (logrotate's), SIGUSR2 and SIGALRM ended the supervisor without a word, its
    processes with it, and their jobs waited for their leases to expire."""
    job = rt.slow.delay(1.0)
    worker = start(workers, tmp_path, "--concurrency", "1")
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        worker.signal(signum)
        name = signal.Signals(signum).name
        wait_for(lambda: f"ignored signal {name}" in worker.text(), 10, f"{name} to be noted")  # noqa: B023
    wait_for(lambda: job.status() == "completed", 30, "the job to complete")
    assert worker.process.poll() is None
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]


def test_sigusr1_and_sigusr2_to_the_whole_group_end_no_job(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """`systemctl kill -s USR1` signals every process of the service: the supervisor noted and
    ignored it, but its worker processes died of it, killing their running jobs (charged a delivery)."""
    job = rt.slow.delay(1.5)
    worker = start(workers, tmp_path, "--concurrency", "2", group=True)
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        os.killpg(worker.pid, signum)
    wait_for(lambda: job.status() == "completed", 30, "the job to complete")
    assert "exited with signal" not in worker.text(), worker.text()[-3000:]
    assert table_rows(app, "archive", "deliveries_count") == [(1,)]
    assert [e[0] for e in runs(tmp_path / "runs.txt")] == ["start", "end"]
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]


def test_a_stop_taken_by_a_jobs_own_sigterm_handler_is_asked_again(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job with a SIGTERM handler of its own took the stop request; the process put its own
    handler back after the job, but never heard the request, idled, and was killed once
    graceful_timeout had passed."""
    rt.handles_sigterm.delay(1.0)
    worker = start(workers, tmp_path, "--concurrency", "1", "--graceful-timeout", "30")
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    began = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0, worker.text()[-3000:]
    assert time.monotonic() - began < 10 and "graceful_timeout passed" not in worker.text(), worker.text()[-3000:]


def test_a_job_that_clears_the_signal_wakeup_descriptor_does_not_slow_the_stop(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """asyncio.run() after loop.add_signal_handler() clears it as it ends: the idle process then
    slept through the stop request till its next poll."""
    job = rt.clears_wakeup.delay()
    worker = start(workers, tmp_path, "--concurrency", "1", "--max-fetch-interval", "30", "--idle-poll-interval", "30")
    wait_for(lambda: job.status() == "completed", 30, "the job to complete")
    time.sleep(0.5)  # idle
    began = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(40) == 0, worker.text()[-3000:]
    assert time.monotonic() - began < 3, f"the stop took {time.monotonic() - began:.1f} s"


def test_two_signals_at_once_are_one_request_to_stop(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    """`timeout` and some process managers signal the supervisor and then its process group: the
    two signals came at once, and the second made the stop a cold one, killing the running job."""
    job = rt.slow.delay(1.0)
    worker = start(workers, tmp_path, "--concurrency", "1")
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    worker.signal(signal.SIGTERM)
    time.sleep(0.03)  # handled apart (two signals pending at once are one to the kernel already)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]
    assert job.status() == "completed"


@only("sqlite")
def test_a_signal_while_the_pool_is_being_forked_stops_the_forking(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """As when --concurrency was given a zero too many: Ctrl-C stops it, rather than every
    process being forked first."""
    worker = start(workers, tmp_path, "--concurrency", "500")
    wait_for(lambda: "started worker process 3 " in worker.text(), 60, "a few worker processes to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.text()[-3000:]
    assert "started worker process 499 " not in worker.text()


def test_jobs_running_past_graceful_timeout_are_returned(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    job = rt.slow.delay(30.0)
    worker = start(workers, tmp_path, "--concurrency", "1", "--graceful-timeout", "1")
    wait_for(lambda: runs(tmp_path / "runs.txt"), 30, "the job to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert "graceful_timeout passed" in worker.text()
    assert job.status() == "pending"


def test_a_checkpointed_job_killed_mid_way_resumes_from_its_state(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    job = rt.resumable.delay(6, 2)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert job.get(timeout=5) == [0, 1, 2, 3, 4, 5]
    steps = [(event, pid) for event, _, pid in runs(tmp_path / "runs.txt")]
    assert [event for event, _ in steps] == [f"step{i}" for i in range(6)]  # no step ran twice
    first, second = steps[0][1], steps[3][1]
    assert first != second and {pid for _, pid in steps[:3]} == {first} and {pid for _, pid in steps[3:]} == {second}
    assert table_rows(app, "archive", "attempts_count", "deliveries_count") == [(2, 2)]


def test_bystanders_in_a_crashed_buffer_are_not_counted(app: JobQueue, tmp_path: Path, workers: list[Worker]) -> None:
    rt.noop.bulk([()] * 30)  # warm-up: the process then fetches the crash job with the others behind it
    poison = rt.crash.delay()
    bystanders = rt.short.bulk([()] * 20)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert poison.status() == "failed"
    by_id = {
        job_id: (attempts, deliveries)
        for job_id, attempts, deliveries in table_rows(app, "archive", "id", "attempts_count", "deliveries_count")
    }
    # Only the delivery that ran them counts. (On failure, the worker's log and the jobs' own log
    # say in what order things ran: a bystander counted twice ran before a process died.)
    seen = f"{by_id}\nruns: {runs(tmp_path / 'runs.txt')}\n{worker.text()[-6000:]}"
    assert {by_id[h.id] for h in bystanders} == {(1, 1)}, seen
    assert by_id[poison.id] == (2, 3), seen  # two deliveries killed their process; the third refused it


def test_an_idle_worker_starts_new_work_at_once_not_at_its_next_poll(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """Notifications (PostgreSQL) or the supervisor's cheap check (SQLite, MariaDB) wake idle processes,
    also after one of them ran a long job; the fallback poll is 30 s here, so only a wake-up passes."""
    start(workers, tmp_path, "--concurrency", "2", "--max-fetch-interval", "30")
    wait_for(lambda: len(table_rows(app, "worker", "id")) == 2, 30, "two worker processes")

    def completes_promptly(handle) -> float:
        began = time.monotonic()
        wait_for(lambda: handle.status() == "completed", 2, f"job {handle.id} to complete without polling")
        return time.monotonic() - began

    completes_promptly(rt.short.delay(0))  # both processes have fetched once and idle now
    waits = [completes_promptly(rt.short.delay(0)) for _ in range(5)]
    slow = rt.slow.delay(4.0)  # one process busy for 4 s: the other takes new work meanwhile
    wait_for(lambda: runs(tmp_path / "runs.txt")[-1][0] == "start", 5, "the slow job to start")
    waits += [completes_promptly(rt.short.delay(0)) for _ in range(3)]
    wait_for(lambda: slow.status() == "completed", 10, "the slow job")
    waits += [completes_promptly(rt.short.delay(0)) for _ in range(3)]  # both idle again, both hear
    assert not repeated(runs(tmp_path / "runs.txt"), "run")
    REPORTS.append(
        f"wake-up: idle worker completed each new job in at most {max(waits) * 1000:.0f} ms "
        f"(median {sorted(waits)[len(waits) // 2] * 1000:.0f} ms, polling every 30 s; "
        f"each: {' '.join(f'{w * 1000:.0f}' for w in waits)})"
    )


@only("postgresql")
def test_a_new_job_wakes_one_idle_process_and_an_idle_pool_sends_nothing(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """The supervisor LISTENs for the whole pool: idle processes run no statement, and a new job
    wakes one of them, not every one (seen from the server: which connections ran anything)."""
    start(
        workers,
        tmp_path,
        "--concurrency",
        "4",
        "--max-fetch-interval",
        "30",
        "--release-stuck-interval",
        "60",
        "--release-stuck-timeout",
        "120",
    )
    wait_for(lambda: len(table_rows(app, "worker", "id")) == 4, 30, "four worker processes")
    # The test's own connections (enqueue, waiting for results) are told apart by their name.
    named = sa.make_url(app.database_url).update_query_dict({"application_name": "the-test"})
    app.configure(database_url=named.render_as_string(hide_password=False))
    rt.short.delay(0).get(timeout=10)  # every process has fetched once, and idles now
    time.sleep(1.0)

    def busy_since(moment: Any) -> int:
        """The worker's connections that ran a statement after ``moment``."""
        with app.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name <> 'the-test' AND backend_type = 'client backend' AND state_change > :t"
                    ),
                    {"t": moment},
                ).scalar_one()
            )

    def server_now() -> Any:
        with app.engine.connect() as conn:
            return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()

    idle_from = server_now()
    time.sleep(3.0)
    assert busy_since(idle_from) == 0, "an idle pool ran statements"
    woken = []
    for _ in range(5):
        began = server_now()
        rt.short.delay(0).get(timeout=10)
        time.sleep(0.3)  # anything else woken would have acquired by now
        woken.append(busy_since(began))
    # The one woken process acquires and writes its outcome on one connection, and may look at
    # its flow-controlled jobs on another.
    assert max(woken) <= 2, f"connections that ran statements per new job: {woken}"


@only("sqlite")
def test_sqlite_worker_processes_leave_the_journal_to_their_supervisor(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    handles = rt.journal.bulk([()] * 4)
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(60) == 0
    # Their commits leave writing the journal back to the supervisor (which does it every second)
    # but past 10,000 pages, where SQLite's default is 1,000.
    assert {h.get(timeout=5)[0] for h in handles} == {10_000}
