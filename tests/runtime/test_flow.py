"""Flow control under chaos: real supervisors, real SIGKILLs, real databases."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import sqlalchemy as sa

from jobqueue import JobQueue
from tests.apps import runtime as rt
from tests.runtime.harness import REPORTS, Worker, start, wait_for

KEYS = 50
PER_KEY = 100


def partition_runs(path: Path) -> list[tuple[str, int, int, int, str, int]]:
    """(event, job id, pid, monotonic ns, key, seq) as rt.ordered recorded them."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        event, job, pid, at, key, seq = line.split()
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
    rng = random.Random(7)
    killed: dict[int, int] = {}  # pid -> monotonic ns by which it was dead
    began = time.monotonic()
    while sum(1 for e in partition_runs(log) if e[0] == "end") < KEYS * PER_KEY * 0.9 and len(killed) < 12:
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
    wait_for(lambda: not _remaining(app), 180, "every job to finish")
    elapsed = time.monotonic() - began
    for supervisor in supervisors:
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, supervisor.text()[-3000:]
    assert {h.status() for h in handles} == {"completed"}, "a job was lost or failed"

    spans: dict[str, list[tuple[int, int, int]]] = {}  # key -> (start ns, end ns, seq)
    open_runs: dict[tuple[int, int], tuple[int, str, int]] = {}
    for event, job, pid, at, key, seq in partition_runs(log):
        if event == "start":
            open_runs[(job, pid)] = (at, key, seq)
        else:
            start_at, _, _ = open_runs.pop((job, pid))
            spans.setdefault(key, []).append((start_at, at, seq))
    for (_, pid), (start_at, key, seq) in open_runs.items():  # cut short by a SIGKILL
        assert pid in killed, f"{key}#{seq} started in pid {pid}, never ended, and that process was not killed"
        spans.setdefault(key, []).append((start_at, killed[pid], seq))
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
