"""Names of queues and tasks are compared exactly on every database.

MariaDB's default collation holds names that differ only in case equal ("emails" and "Emails"):
there a worker of one queue took the jobs of the other, a unique key of one task held back the
jobs of another, and purging one task's archive deleted the other's. The name columns have a
binary collation there, as PostgreSQL and SQLite compare text.
"""

from __future__ import annotations

from datetime import timedelta

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.storage import deadletter, jobs

WORKER = "w" * 32
LEASE = 30.0
SPELLINGS = ("emails", "Emails", "EMAILS")


def test_a_fetch_takes_only_the_queues_it_names_as_they_are_spelled(app: JobQueue, add) -> None:
    keyed = app.task(name="t.keyed", concurrency_key="partner", concurrency_limit=5)(lambda: None)
    for queue in SPELLINGS[1:]:
        add.apply_async((1, 1), queue=queue)
        keyed.apply_async((), queue=queue)
    soon = utcnow() + timedelta(seconds=1)
    assert not app.store.has_work(("emails",), soon)
    assert app.store.acquire(WORKER, ("emails",), 10, LEASE, flow=True) == []
    assert app.store.acquire(WORKER, ("emails", "reports"), 10, LEASE, flow=True) == []
    ours = [add.apply_async((1, 1), queue="emails").id, keyed.apply_async((), queue="emails").id]
    taken = app.store.acquire(WORKER, ("emails",), 10, LEASE, flow=True)
    assert sorted(m.id for m in taken) == ours
    assert {m.queue for m in app.store.acquire(WORKER, SPELLINGS[1:], 10, LEASE, flow=True)} == set(SPELLINGS[1:])


def test_tasks_whose_names_differ_only_in_case_keep_their_unique_keys_apart(app: JobQueue) -> None:
    tasks = [app.task(name=name)(lambda: None) for name in ("app.send", "app.Send", "APP.SEND")]
    one_by_one = [task.apply_async((), unique_key="order-1") for task in tasks]
    in_bulk = [task.bulk([(), ()], unique_key=["order-2", "order-3"]) for task in tasks]
    handles = one_by_one + [handle for handles in in_bulk for handle in handles]
    assert not any(handle.existing for handle in handles)
    assert len({handle.id for handle in handles}) == 9
    assert [task.apply_async((), unique_key="order-1").id for task in tasks] == [h.id for h in one_by_one]


def test_queue_counts_list_each_spelling_of_a_queue(app: JobQueue, add) -> None:
    for n, queue in enumerate(SPELLINGS):
        add.bulk([(1, 1)] * (n + 1), queue=queue)
    counts = {c["queue"]: c["ready"] for c in jobs.queue_counts(app.store)}
    assert counts == {"emails": 1, "Emails": 2, "EMAILS": 3}


def test_listing_and_purging_by_name_leave_other_spellings_alone(app: JobQueue) -> None:
    tasks = {name: app.task(name=name, queue=name)(lambda: None) for name in ("app.send", "app.Send")}
    for task in tasks.values():
        assert jobs.cancel(app.store, task.delay().id)
    listed = deadletter.list_jobs(app.store, ["cancelled"], queue="app.send")
    assert [row["task_name"] for row in listed] == ["app.send"]
    listed = deadletter.list_jobs(app.store, ["cancelled"], task="app.Send")
    assert [row["queue"] for row in listed] == ["app.Send"]
    assert deadletter.count_archived(app.store, "cancelled", task="app.send") == 1
    assert deadletter.purge(app.store, "cancelled", None, task="app.send") == 1
    assert [row["task_name"] for row in deadletter.list_jobs(app.store, ["cancelled"])] == ["app.Send"]


def test_supervisors_of_queues_spelled_otherwise_are_not_peers(app: JobQueue) -> None:
    """Supervisors share out news of work among those serving the same queues: one of 'Emails'
    is none of them for one of 'emails'."""
    now = utcnow()
    for n, queue in enumerate(SPELLINGS):
        app.store.register_worker(
            {
                "id": f"w{n}",
                "supervisor_id": f"s{n}",
                "hostname": "web-1",
                "pid": n + 1,
                "queues": queue,
                "started_at": now,
                "heartbeat_at": now,
                "version": "test",
            }
        )
    assert [app.store.supervisor_peers(f"s{n}", (queue,), 60) for n, queue in enumerate(SPELLINGS)] == [(0, 1)] * 3
