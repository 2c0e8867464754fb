"""Consumer groups under chaos: real supervisors, real SIGKILLs, real databases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from tests.apps import topics as tp
from tests.conftest import only
from tests.runtime.harness import REPORTS, Worker, recorded, start, wait_for
from tests.runtime.test_flow import kill_children_until

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.topics:app"
GOOD = ("billing", "email", "analytics")
KEYS = 100
PER_KEY = 100


@pytest.fixture
def app(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobQueue]:
    tp.app.configure(database_url=db_url)
    monkeypatch.setenv("JOBQUEUE_TEST_RUNS", str(tmp_path / "runs.txt"))
    yield tp.app
    tp.app.close()


def events(path: Path) -> list[tuple[str, str, str, int, int, int]]:
    """(event, group, key, seq, pid, monotonic ns) as the handlers recorded them."""
    out = []
    for event, group, key, seq, pid, at in recorded(path):
        out.append((event, group, key, int(seq), int(pid), int(at)))
    return out


def topics_json() -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-m", "jobqueue", "--app", APP, "topics", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    entries: list[dict] = json.loads(result.stdout)
    return entries


def log_size(app: JobQueue) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(app.tables.topic_message)).scalar_one())


def test_every_group_gets_every_message_in_key_order_under_sigkills(
    app: JobQueue, backend: str, tmp_path: Path, workers: list[Worker]
) -> None:
    """10,000 messages over 100 keys, three groups and one that always fails, two supervisors of
    two processes, children SIGKILLed at random: every good group ran every message, each key's in
    publish order; the failing group dead-lettered every message; the log ends empty."""
    log = tmp_path / "runs.txt"
    args = ("--concurrency", "2", "--release-stuck-timeout", "2", "--release-stuck-interval", "0.5")
    groups = ("--groups", ",".join((*GOOD, "broken")))
    supervisors = [start(workers, tmp_path, *args, *groups, name=f"sup{n}", app=APP) for n in range(2)]
    wait_for(lambda: len(topics_json()) == 4, 60, "the four groups to be added")
    began = time.monotonic()
    tp.orders.publish_many(
        [{"key": f"k{k}", "seq": seq} for seq in range(PER_KEY) for k in range(KEYS)], key=lambda p: p["key"]
    )
    total = KEYS * PER_KEY

    def ended() -> int:
        return sum(1 for e in events(log) if e[0] == "end")

    killed = kill_children_until(supervisors, lambda: ended() >= 3 * total * 0.9)
    wait_for(lambda: all(entry["lag"] == 0 for entry in topics_json()), 300, "every group to finish")
    elapsed = time.monotonic() - began

    runs = events(log)
    for group in GOOD:
        by_key: dict[str, list[int]] = {}
        for event, g, key, seq, _, _ in runs:
            if event == "end" and g == group:
                seqs = by_key.setdefault(key, [])
                if not seqs or seqs[-1] != seq:  # a run whose ack a SIGKILL lost runs again, next
                    seqs.append(seq)
        assert len(by_key) == KEYS, f"{group} saw {len(by_key)} keys"
        for key, seqs in by_key.items():
            assert seqs == list(range(PER_KEY)), f"{group}/{key} ran out of order or missed some: {seqs[:20]}"
    failed = {(key, seq) for event, g, key, seq, _, _ in runs if event == "fail"}
    assert len(failed) == total
    stats = {entry["group"]: entry for entry in topics_json()}
    assert stats["broken"]["dead_letters"] == total
    assert all(stats[g]["dead_letters"] == 0 for g in GOOD)
    wait_for(lambda: log_size(app) == 0, 60, "the log to be emptied once every group is past it")
    for supervisor in supervisors:
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, supervisor.text()[-3000:]
    reruns = sum(1 for e in runs if e[0] == "end" and e[1] in GOOD) - 3 * total
    REPORTS.append(
        f"topics [{backend}]: {total} messages over {KEYS} keys to 3 groups and a failing one in "
        f"{elapsed:.1f} s, {len(killed)} children SIGKILLed, {reruns} runs again, key order kept"
    )


def test_a_stopped_group_keeps_its_messages_and_the_log_shrinks_once_it_catches_up(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    args = ("--concurrency", "1", "--burst")
    # "late" is added (from the latest message) by a worker that runs it, then stopped.
    first = start(workers, tmp_path, *args, "--groups", "late,billing", name="first", app=APP)
    assert first.wait(60) == 0, first.text()[-3000:]
    tp.orders.publish_many([{"key": "k", "seq": n} for n in range(200)], key=lambda p: p["key"])
    billing = start(workers, tmp_path, *args, "--groups", "billing", name="billing", app=APP)
    assert billing.wait(120) == 0, billing.text()[-3000:]
    app.topic_store.collect()
    stats = {entry["group"]: entry for entry in topics_json()}
    assert stats["billing"]["lag"] == 0 and stats["late"]["lag"] == 200
    assert log_size(app) == 200, "the log let go of messages the stopped group has not processed"
    late = start(workers, tmp_path, *args, "--groups", "late", name="late", app=APP)
    assert late.wait(120) == 0, late.text()[-3000:]
    wait_for(lambda: app.topic_store.collect() >= 0 and log_size(app) == 0, 30, "the log to shrink")
    seqs = [seq for event, group, _, seq, _, _ in events(tmp_path / "runs.txt") if group == "late"]
    assert seqs == list(range(200))


def test_the_log_is_trimmed_by_one_supervisor_and_by_another_once_it_dies(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """Trimming the topic log is housekeeping for one supervisor of a pool, not one per host: the
    first by id does it. SIGKILLed, it leaves the job to the survivor once its rows go stale."""
    args = ("--concurrency", "1", "--release-stuck-timeout", "2", "--release-stuck-interval", "0.5")
    supervisors = [start(workers, tmp_path, *args, "--groups", "billing", name=f"sup{n}", app=APP) for n in range(2)]
    w = app.tables.worker

    def registered() -> dict[int, str]:
        """supervisor process id -> supervisor_id, from the registry (each child's parent)."""
        with app.engine.connect() as conn:
            rows = conn.execute(sa.select(w.c.pid, w.c.supervisor_id)).all()
        found = {}
        for pid, supervisor_id in rows:
            for supervisor in supervisors:
                if pid in supervisor.children():
                    found[supervisor.pid] = supervisor_id
        return found

    wait_for(lambda: len(set(registered().values())) == 2, 60, "both supervisors to register")
    tp.orders.publish_many([{"key": "k", "seq": n} for n in range(50)], key=lambda p: p["key"])
    wait_for(lambda: log_size(app) == 0, 60, "the log to be trimmed while both supervisors run")

    ids = registered()
    first = next(s for s in supervisors if ids[s.pid] == min(ids.values()))
    survivor = next(s for s in supervisors if s is not first)
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL
    tp.orders.publish_many([{"key": "k", "seq": n} for n in range(50, 100)], key=lambda p: p["key"])
    wait_for(lambda: log_size(app) == 0, 60, "the survivor to trim the log")
    seqs = [seq for event, group, _, seq, _, _ in events(tmp_path / "runs.txt") if event == "end"]
    assert sorted(set(seqs)) == list(range(100))
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(30) == 0, survivor.text()[-3000:]


def cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "jobqueue", "--app", APP, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result.stdout


def test_dead_letters_of_a_group_are_retried_and_a_group_dropped_from_the_command_line(
    app: JobQueue, tmp_path: Path
) -> None:
    cli("worker", "--burst", "--concurrency", "1", "--groups", "broken,billing")
    tp.orders.publish_many([{"key": "k", "seq": n} for n in range(3)], key="k")
    cli("worker", "--burst", "--concurrency", "1", "--groups", "broken,billing")
    stats = {entry["group"]: entry for entry in json.loads(cli("topics", "--json"))}
    assert stats["broken"]["dead_letters"] == 3 and stats["billing"]["lag"] == 0
    dead = json.loads(cli("jobs", "list", "--state", "failed", "--queue", "topic:orders:broken", "--json"))
    assert len(dead) == 3 and {row["error_type"] for row in dead} == {"RuntimeError"}
    cli("jobs", "retry", str(dead[0]["id"]))
    stats = {entry["group"]: entry for entry in json.loads(cli("topics", "--json"))}
    assert stats["broken"]["lag"] == 1 and stats["broken"]["dead_letters"] == 2
    table = cli("topics")
    assert "broken" in table and "billing" in table
    assert "1 waiting delivery deleted" in cli("topics", "drop-group", "orders", "broken", "--yes")
    assert "broken" not in {entry["group"] for entry in json.loads(cli("topics", "--json"))}
    app.topic_store.collect()
    assert log_size(app) == 0


def starts(log: Path, group: str) -> int:
    return sum(1 for e in events(log) if e[0] == "start" and e[1] == group) if log.exists() else 0


def billing_ended(log: Path) -> set[int]:
    """The messages billing finished: a set, since one finished just before its process was killed
    runs again when its outcome had not been written yet."""
    return {e[3] for e in events(log) if e[:2] == ("end", "billing")} if log.exists() else set()


def test_a_delivery_running_when_its_group_is_dropped_never_runs_again_after_a_sigkill(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    log = tmp_path / "runs.txt"
    args = ("--concurrency", "1", "--release-stuck-timeout", "1", "--release-stuck-interval", "0.2")
    worker = start(workers, tmp_path, *args, "--groups", "stuck,billing", app=APP)
    wait_for(lambda: len(topics_json()) == 2, 60, "the groups to be added")
    tp.orders.publish({"key": "k", "seq": 1}, key="k")
    wait_for(lambda: starts(log, "stuck") == 1, 60, "the delivery to start")
    assert "0 waiting deliveries deleted" in cli("topics", "drop-group", "orders", "stuck", "--yes")
    (child,) = worker.children()
    os.kill(child, signal.SIGKILL)  # its lease is released at once, or expires: either must not bring it back
    # A later message for another group, run by the process started in the killed one's place: by
    # then the released delivery would have run first (one process, oldest first).
    tp.orders.publish({"key": "k", "seq": 2}, key="k")

    def billing_ran_both_or_stuck_ran_again() -> bool:
        return billing_ended(log) == {1, 2} or starts(log, "stuck") > 1

    try:
        wait_for(billing_ran_both_or_stuck_ran_again, 60, "billing to run both")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the runs: {events(log)}; the worker's log:\n{worker.text()}") from None
    time.sleep(2)  # two lease timeouts: a delivery returned to PENDING would have run by now
    assert starts(log, "stuck") == 1, worker.text()


def test_a_delivery_running_when_its_group_is_dropped_is_not_retried(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    log = tmp_path / "runs.txt"
    worker = start(workers, tmp_path, "--concurrency", "1", "--groups", "retried,billing", app=APP)
    wait_for(lambda: len(topics_json()) == 2, 60, "the groups to be added")
    tp.orders.publish({"key": "k", "seq": 1}, key="k")
    wait_for(lambda: starts(log, "retried") == 1, 60, "the delivery to start")
    cli("topics", "drop-group", "orders", "retried", "--yes")
    Path(f"{log}.go").touch()  # it fails now, and its retry strategy would run it again in 0.1 s
    tp.orders.publish({"key": "k", "seq": 2}, key="k")
    wait_for(lambda: billing_ended(log) == {1, 2}, 60, "billing to run both")
    time.sleep(1)  # ten retry delays
    assert starts(log, "retried") == 1, worker.text()
    with app.engine.connect() as conn:
        m = app.tables.message
        left = conn.execute(sa.select(sa.func.count()).where(m.c.task_name == "topic:orders:retried")).scalar_one()
    assert left == 0


def test_drop_group_names_a_missing_group_before_asking_and_never_asks_without_a_terminal(app: JobQueue) -> None:
    def drop(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "jobqueue", "--app", APP, "topics", "drop-group", *args]
        return subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)

    app.topic_store.register("orders", "billing", "latest")
    missing = drop("orders", "nobody")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == "Error: topic 'orders' has no group 'nobody'; `jobqueue topics` lists them\n"
    unconfirmed = drop("orders", "billing")
    assert unconfirmed.returncode == 2 and unconfirmed.stdout == "", unconfirmed.stderr
    assert "add --yes to confirm" in unconfirmed.stderr
    assert "billing" in {entry["group"] for entry in app.topic_store.stats()}  # still there
    dropped = drop("orders", "billing", "-y")
    assert dropped.returncode == 0 and "dropped group 'billing'" in dropped.stdout, dropped.stderr


def test_a_start_changed_for_a_group_that_exists_is_warned_of_not_applied(app: JobQueue) -> None:
    """billing is "earliest" in the code; added from the latest before, it goes on from where it
    is (no replay of what the log keeps), and the worker says so rather than nothing."""
    tp.orders.publish({"key": "k", "seq": 1})
    app.topic_store.register("orders", "billing", "latest")
    command = [sys.executable, "-m", "jobqueue", "--app", APP, "worker", "--burst", "--groups", "billing,email"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "start applies only when a group is added" in line]
    assert len(warned) == 1 and "WARNING" in warned[0], result.stderr
    assert "consumer group orders:billing has start='earliest', but it was added from the latest" in warned[0]
    assert "`jobqueue topics drop-group orders billing`" in warned[0]
    assert "consumer groups added: orders:email (from the earliest)" in result.stderr  # a new one is no change
    assert app.topic_store.start_of("orders", "billing") == "latest"
    assert {(e["group"], e["lag"]) for e in topics_json()} == {("billing", 0), ("email", 0)}


def test_a_consumer_groups_delivery_cannot_be_enqueued_by_hand(app: JobQueue) -> None:
    """`jobqueue enqueue topic:orders:billing` made a delivery job of no message of the topic: the
    group ran it, out of the topic's order, and no other group heard of it."""
    command = [sys.executable, "-m", "jobqueue", "--app", APP, "enqueue", "topic:orders:billing", "--args", "[1]"]
    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "publish the message to the topic instead" in refused.stderr, refused.stderr
    assert "app.topic('orders').publish(payload)" in refused.stderr
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar() == 0


@only("postgresql", "mysql")
def test_a_group_added_while_a_publishing_transaction_stays_open_holds_no_other_publish_back(
    app: JobQueue, tmp_path: Path, workers: list[Worker]
) -> None:
    """The worker adding the group waited for the open transaction's lock, and on MariaDB every
    publish begun after it queued behind that wait, for up to innodb_lock_wait_timeout (50 s) at
    a time, with nothing in the log. It now waits a moment at a time, saying why."""
    import threading

    tp.orders.publish({"key": "k", "seq": 0})  # the topic exists
    holder = app.engine.connect()
    transaction = holder.begin()
    tp.orders.publish({"key": "k", "seq": 1}, connection=holder)  # an application's, left open
    worker = start(workers, tmp_path, "--concurrency", "1", "--groups", "late", name="late", app=APP)
    try:
        wait_for(lambda: "waits for a transaction that published to topic orders" in worker.text(), 30, "the wait")
        published = threading.Event()

        def publish() -> None:
            tp.orders.publish({"key": "k", "seq": 2})
            published.set()

        threading.Thread(target=publish).start()
        # While the application's transaction is still open: not behind the group being added.
        assert published.wait(20), worker.text()[-3000:]
    finally:
        transaction.commit()
        holder.close()
    wait_for(lambda: "consumer groups added: orders:late" in worker.text(), 30, "the group to be added")
