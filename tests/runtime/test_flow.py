"""Flow control under chaos: real supervisors, real SIGKILLs, real databases."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from jobqueue import JobQueue
from tests.apps import runtime as rt
from tests.runtime.harness import REPORTS, Worker, freeze_host, recorded, start, wait_for

KEYS = 50
PER_KEY = 100


def partition_runs(path: Path) -> list[tuple[str, int, int, int, str, int]]:
    """(event, job id, pid, monotonic ns, key, seq) as rt.ordered recorded them."""
    out = []
    for event, job, pid, at, key, seq in recorded(path):
        out.append((event, int(job), int(pid), int(at), key, int(seq)))
    return out


def test_partitions_run_in_order_one_at_a_time_under_sigkills(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """5,000 jobs over 50 keys, two supervisors of two processes, children SIGKILLed at random:
    within each key the jobs ran in exact enqueue order and never two at once; keys ran in parallel."""
    handles = []
    for k in range(KEYS):
        handles += rt.ordered.bulk([(f"k{k}", seq) for seq in range(PER_KEY)], partition_key=f"k{k}")
    log = tmp_path / "runs.txt"
    args = ("--concurrency", "2", "--release-stuck-timeout", "2", "--release-stuck-interval", "0.5")
    supervisors = [start(workers, tmp_path, *args, name=f"sup{n}") for n in range(2)]
    began = time.monotonic()
    killed = kill_children_until(supervisors, lambda: ends(log) >= KEYS * PER_KEY * 0.9)
    wait_for(lambda: not _remaining(app), 180, "every job to finish")
    elapsed = time.monotonic() - began
    for supervisor in supervisors:
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, supervisor.text()[-3000:]
    assert {h.status() for h in handles} == {"completed"}, "a job was lost or failed"

    spans = spans_of(log, killed)
    for key, runs_ in spans.items():
        runs_.sort()
        seqs = [seq for _, _, seq in runs_]
        assert seqs == sorted(seqs), f"{key} ran out of enqueue order: {seqs}"
        assert sorted(set(seqs)) == list(range(PER_KEY)), f"{key} did not run every job"
        for earlier, later in zip(runs_, runs_[1:], strict=False):
            assert earlier[1] <= later[0], f"{key}: #{earlier[2]} and #{later[2]} ran at the same time"
    everything = sorted((s, e) for runs_ in spans.values() for s, e, _ in runs_)
    parallel = sum(1 for a, b in zip(everything, everything[1:], strict=False) if b[0] < a[1])
    assert parallel > 0, "no two keys ever ran at the same time"
    reruns = sum(len(r) for r in spans.values()) - KEYS * PER_KEY
    REPORTS.append(
        f"partitions [{backend}]: {KEYS * PER_KEY} jobs over {KEYS} keys in {elapsed:.1f} s, "
        f"{len(killed)} children SIGKILLed, {reruns} runs cut short and run again, order kept"
    )


def kill_children_until(supervisors: list, done: Callable[[], bool], kills: int = 12) -> dict[int, int]:
    """SIGKILL a random child every 0.2 to 0.6 s until ``done()`` or ``kills`` kills; return
    {pid: monotonic ns by which it was dead}."""
    rng = random.Random(7)
    killed: dict[int, int] = {}
    while not done() and len(killed) < kills:
        time.sleep(rng.uniform(0.2, 0.6))
        children = [pid for s in supervisors for pid in s.children()]
        if not children:
            continue
        victim = rng.choice(children)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            continue
        while os.path.exists(f"/proc/{victim}") and _state(victim) not in ("Z", "X", None):
            time.sleep(0.001)
        killed[victim] = time.monotonic_ns()
    return killed


def ends(log: Path) -> int:
    return sum(1 for e in partition_runs(log) if e[0] == "end")


def spans_of(log: Path, killed: dict[int, int]) -> dict[str, list[tuple[int, int, int]]]:
    """key -> [(start ns, end ns, seq)] of every run the log shows; a run cut short by a SIGKILL
    ends when its process was dead."""
    spans: dict[str, list[tuple[int, int, int]]] = {}
    open_runs: dict[tuple[int, int], tuple[int, str, int]] = {}
    for event, job, pid, at, key, seq in partition_runs(log):
        if event == "start":
            open_runs[(job, pid)] = (at, key, seq)
        else:
            start_at, _, _ = open_runs.pop((job, pid))
            spans.setdefault(key, []).append((start_at, at, seq))
    for (_, pid), (start_at, key, seq) in open_runs.items():
        assert pid in killed, f"{key}#{seq} started in pid {pid}, never ended, and that process was not killed"
        spans.setdefault(key, []).append((start_at, killed[pid], seq))
    return spans


def most_at_once(runs: list[tuple[int, int, int]]) -> int:
    """The largest number of runs in progress at one moment."""
    events = sorted([(start, 1) for start, _, _ in runs] + [(end, -1) for _, end, _ in runs])
    now = peak = 0
    for _, step in events:  # an end at the same ns as a start sorts first: they did not overlap
        now += step
        peak = max(peak, now)
    return peak


def test_a_partitions_next_job_starts_when_the_one_before_it_ends(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """A job enqueued while its partition's previous one runs wakes an idle process, which finds
    the partition busy: the process that ran the previous one takes it as soon as it ends, not
    at the next poll (here 60 s away)."""
    log = tmp_path / "runs.txt"
    start(workers, tmp_path, "--concurrency", "2", "--max-fetch-interval", "60")
    first = rt.in_turn.apply_async(("p", 0, 1.0), partition_key="p")
    wait_for(lambda: any(e[0] == "start" for e in partition_runs(log)), 30, "the first job to start")
    second = rt.in_turn.apply_async(("p", 1, 0.0), partition_key="p")
    wait_for(lambda: ends(log) >= 2, 20, "the partition's second job to run")
    spans = spans_of(log, {})["p"]
    (_, first_end, _), (second_start, _, _) = sorted(spans, key=lambda s: s[2])
    assert first.status() == second.status() == "completed"
    assert first_end <= second_start, "the partition's two jobs overlapped"
    waited = (second_start - first_end) / 1e9
    assert waited < 5, f"the partition's next job started {waited:.1f} s after the one before it"
    REPORTS.append(f"partition turn [{backend}]: the next job started {waited * 1000:.0f} ms after the previous")


def test_a_host_frozen_past_its_lease_starts_nothing_more_of_its_partition_when_it_wakes(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """A supervisor and its process frozen while they run a partition's run, past its lease:
    another supervisor runs the job again, then the rest in order. Woken, the frozen process
    finishes the job it was in (its outcome dropped: lease lost) and starts nothing of the run it
    held; what it fetches anew afterwards takes its turn like any other process's."""
    log = tmp_path / "runs.txt"
    handles = rt.in_turn.bulk([("p", seq, 0.1) for seq in range(8)], partition_key="p")
    args = ("--concurrency", "1", "--release-stuck-timeout", "2", "--release-stuck-interval", "0.5")
    first = start(workers, tmp_path, *args, name="first")
    wait_for(lambda: len(partition_runs(log)) >= 3, 30, "the run to be under way")
    frozen = freeze_host(first, app.engine)
    before = partition_runs(log)
    at = len(before)
    in_flight = before[-1][1] if before[-1][0] == "start" else None  # frozen between two jobs: none
    second = start(workers, tmp_path, *args, name="second")
    wait_for(lambda: sum(e[0] == "start" for e in partition_runs(log)[at:]) >= 2, 40, "the other to go on")
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not _remaining(app), 60, "every job to finish")
    for supervisor in (first, second):
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, supervisor.text()[-3000:]
    assert {h.status() for h in handles} == {"completed"}
    events = partition_runs(log)
    woken = [e for e in events[at:] if e[2] in frozen]
    if woken and in_flight is not None:
        assert woken[0][:2] == ("end", in_flight), f"the woken process began with {woken[0]}, not its job's end"
        assert "lease lost" in first.text()
    # Apart from the job the frozen process was in, no two of the partition's runs overlapped, and
    # they started in order: nothing of the frozen run was started from the woken process's buffer.
    runs: list[tuple[int, int, int]] = []
    open_runs: dict[tuple[int, int], tuple[int, int]] = {}
    for event, job, pid, when, _, seq in events:
        if event == "start":
            open_runs[(job, pid)] = (when, seq)
        elif not (job == in_flight and pid in frozen):
            began, seq = open_runs.pop((job, pid))
            runs.append((began, when, seq))
    assert most_at_once(runs) == 1, f"the partition's runs overlapped: {events}"
    order = [seq for _, _, seq in sorted(runs)]
    assert order == sorted(order) and order[-1] == 7, f"the partition ran out of order: {events}"


def test_a_concurrency_limit_is_never_exceeded_under_sigkills_and_no_slot_leaks(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """concurrency_limit=2 on one key, two supervisors of two processes, children SIGKILLed at
    random: never three at once, every job done, and the limit is reached again afterwards."""
    jobs = 300
    handles = rt.limited.bulk([(seq,) for seq in range(jobs)])
    log = tmp_path / "runs.txt"
    args = ("--concurrency", "2", "--release-stuck-timeout", "2", "--release-stuck-interval", "0.5")
    supervisors = [start(workers, tmp_path, *args, name=f"sup{n}") for n in range(2)]
    began = time.monotonic()
    killed = kill_children_until(supervisors, lambda: ends(log) >= jobs * 0.9, kills=8)
    wait_for(lambda: not _remaining(app), 180, "every job to finish")
    elapsed = time.monotonic() - began
    # Afterwards: slow jobs reach the limit again (no slot was leaked by the kills), and no more.
    after = rt.limited.bulk([(jobs + n, 0.4) for n in range(6)])
    wait_for(lambda: not _remaining(app), 60, "the later jobs to finish")
    for supervisor in supervisors:
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, supervisor.text()[-3000:]
    assert {h.status() for h in handles + after} == {"completed"}, "a job was lost or failed"
    runs = spans_of(log, killed)["partner"]
    assert most_at_once(runs) == 2, f"{most_at_once(runs)} ran at once under concurrency_limit=2"
    late = [r for r in runs if r[2] >= jobs]
    assert most_at_once(late) == 2, "the limit was not reached again after the kills: a slot leaked"
    REPORTS.append(
        f"concurrency limit [{backend}]: {jobs} jobs in {elapsed:.1f} s under concurrency_limit=2, "
        f"{len(killed)} children SIGKILLed, at most 2 at once, the limit reached again afterwards"
    )


def test_a_rate_limit_holds_across_two_supervisors(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """rate_limit="20/s" with two supervisors of two processes: 200 starts in 10 s, within 10%."""
    rt.rated.bulk([(seq,) for seq in range(400)])
    log = tmp_path / "runs.txt"
    supervisors = [start(workers, tmp_path, "--concurrency", "2", name=f"sup{n}") for n in range(2)]
    wait_for(lambda: ends(log) >= 260, 60, "13 s of starts")
    for supervisor in supervisors:
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, supervisor.text()[-3000:]
    starts = sorted(
        at for event, *_, at, _, _ in [(e[0], e[3], e[4], e[5]) for e in partition_runs(log)] if event == "start"
    )
    first = starts[0]
    in_ten = sum(1 for at in starts if at - first < 10_000_000_000)
    assert 180 <= in_ten <= 220, f"{in_ten} starts in 10 s under rate_limit='20/s'"
    REPORTS.append(f"rate limit [{backend}]: {in_ten} starts in 10 s under rate_limit='20/s', 2 supervisors")


def test_a_burst_ends_while_a_partition_waits_behind_a_retrying_job(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """The partition's head fails and retries in a minute: the jobs behind it are not due, and
    --burst exits instead of waiting for them."""
    head = rt.fail_after.apply_async((0,), partition_key="acct")
    behind = rt.ordered.apply_async(("acct", 1), partition_key="acct")
    other = rt.ordered.apply_async(("other", 1), partition_key="other")
    worker = start(workers, tmp_path, "--burst", "--concurrency", "1")
    assert worker.wait(30) == 0, worker.text()[-3000:]
    assert (head.status(), behind.status(), other.status()) == ("retryable", "pending", "completed")


def test_a_burst_runs_the_jobs_of_keys_whose_flow_rows_were_deleted(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """Every flow row deleted by hand: no fetch found those keys' jobs, and --burst waited for them
    forever. The worker adds the rows back, runs the jobs within their keys' limits (a partition's
    in order) and ends."""
    limited = [rt.limited.delay(n) for n in range(3)]
    rated = [rt.rated.delay(n) for n in range(3)]
    ordered = [rt.ordered.apply_async(("acct", n), partition_key="acct") for n in range(3)]
    tenants = [rt.tenant.delay(f"t{n}", 0) for n in range(3)]
    with app.engine.begin() as conn:
        conn.execute(sa.delete(app.tables.flow))
    worker = start(workers, tmp_path, "--burst", "--concurrency", "2")
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert {h.status() for h in limited + rated + ordered + tenants} == {"completed"}
    assert "had jobs but no row in the flow table" in worker.text()
    runs = partition_runs(tmp_path / "runs.txt")
    assert [seq for event, _, _, _, key, seq in runs if event == "start" and key == "acct"] == [0, 1, 2]


def test_a_flooded_key_does_not_starve_the_others(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """One key with 10,000 ready jobs and ten keys with ten each: the small keys finish long before."""
    big = rt.tenant.bulk([("big", seq) for seq in range(10_000)])
    small = rt.tenant.bulk([(f"small-{k}", seq) for k in range(10) for seq in range(10)])
    start(workers, tmp_path, "--concurrency", "2", "--burst")
    wait_for(lambda: not _remaining(app), 300, "every job to finish")
    a = app.tables.archive
    with app.engine.connect() as conn:
        finished: dict[bool, datetime] = dict(
            conn.execute(
                sa.select(a.c.flow_key == "big", sa.func.max(a.c.finished_at)).group_by(a.c.flow_key == "big")
            ).all()
        )
        first = conn.execute(sa.select(sa.func.min(a.c.last_attempt_at))).scalar_one()
    assert len(big) + len(small) == 10_100
    small_done = (finished[False] - first).total_seconds()
    big_done = (finished[True] - first).total_seconds()
    assert small_done < big_done * 0.2, f"small keys done after {small_done:.2f} s, the big one after {big_done:.2f} s"
    REPORTS.append(
        f"fairness [{backend}]: ten small keys done {small_done:.2f} s in, the 10,000-job key {big_done:.2f} s"
    )


def _remaining(app: JobQueue) -> int:
    m = app.tables.message
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(m)).scalar_one())


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
