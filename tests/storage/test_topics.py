"""Topics on each database: publishing, consumer groups, their start, the log's garbage collection."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.errors import ConfigurationError, SerializationError
from jobqueue.serialization import loads_call
from jobqueue.storage import jobs, migrations
from jobqueue.storage.topics import delivery_task
from jobqueue.topics import served_consumers
from tests.conftest import only


def consumers(app: JobQueue, *groups: str, start: str = "latest") -> None:
    for group in groups:
        app.consumer("orders", group=group, start=start)(lambda payload: None)


def register(app: JobQueue) -> None:
    for consumer in app.consumers.values():
        app.topic_store.register(consumer.topic, consumer.group, consumer.start)


def deliveries(app: JobQueue, group: str) -> list[dict[str, Any]]:
    m = app.tables.message
    with app.engine.connect() as conn:
        rows = conn.execute(
            sa.select(m.c.id, m.c.unique_key, m.c.partition_key, m.c.payload, m.c.headers, m.c.queue)
            .where(m.c.task_name == delivery_task("orders", group))
            .order_by(m.c.id)
        ).mappings()
        return [dict(row) for row in rows]


def log_size(app: JobQueue) -> int:
    t = app.tables.topic_message
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())


def finish(app: JobQueue, group: str) -> None:
    """Finish a group's deliveries as an outcome would (here: cancelled, archived)."""
    for row in deliveries(app, group):
        assert jobs.cancel(app.store, row["id"])


def payloads(app: JobQueue, group: str) -> list[Any]:
    return [loads_call(app.serializer, row["payload"])[0][0] for row in deliveries(app, group)]


@only("postgresql", "mysql")
def test_a_publish_in_a_transaction_that_read_before_a_group_was_added_delivers_to_it(app: JobQueue) -> None:
    """The caller's transaction, at its database's default isolation (REPEATABLE READ on MariaDB),
    read before another process added a group: its publish still sees the group."""
    consumers(app, "billing")
    register(app)
    orders = app.topic("orders")
    engine = sa.create_engine(app.database_url)  # the application's own engine, default isolation
    with engine.connect() as conn, conn.begin():
        conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar()  # a first read
        app.topic_store.register("orders", "audit", "latest")  # another process, committed meanwhile
        published = orders.publish({"id": 1}, connection=conn)
    engine.dispose()
    assert [int(row["unique_key"]) for row in deliveries(app, "audit")] == [published]
    assert [int(row["unique_key"]) for row in deliveries(app, "billing")] == [published]


def test_every_group_gets_every_message_with_its_key_and_headers(app: JobQueue) -> None:
    consumers(app, "billing", "email")
    register(app)
    orders = app.topic("orders")
    first = orders.publish({"id": 1}, key="customer-7", headers={"trace": "abc"})
    rest = orders.publish_many([{"id": i} for i in range(2, 6)], key=lambda p: f"customer-{p['id'] % 2}")
    assert rest == sorted(rest) and first < rest[0]
    for group in ("billing", "email"):
        rows = deliveries(app, group)
        assert [p["id"] for p in payloads(app, group)] == [1, 2, 3, 4, 5]
        assert [int(r["unique_key"]) for r in rows] == [first, *rest]
        assert rows[0]["headers"] == {"trace": "abc"} and rows[0]["queue"] == f"topic:orders:{group}"
        # Keys are ordered within the group only: the partitions of two groups differ.
        assert rows[0]["partition_key"] == f"orders:{group}:customer-7"
    assert log_size(app) == 5


def test_a_topic_without_groups_keeps_its_messages_for_the_first(app: JobQueue) -> None:
    ids = app.topic("orders").publish_many(range(3))
    assert len(ids) == 3 and log_size(app) == 3
    assert app.topic_store.collect() == 0 and log_size(app) == 3
    # Listed with the fields every group's row has (a script read row["lag"] and met a KeyError).
    (row,) = app.topic_store.stats()
    assert row["group"] is None and row["kept"] == 3 and row["lag"] == 0 and row.keys() >= {"in_flight", "queue"}


def test_publishing_in_a_rolled_back_transaction_reaches_no_group(app: JobQueue) -> None:
    consumers(app, "billing")
    register(app)
    with app.engine.connect() as conn:
        with conn.begin() as transaction:
            app.topic("orders").publish({"id": 1}, connection=conn)
            app.topic("orders").publish_many([{"id": 2}], connection=conn)
            transaction.rollback()
    assert deliveries(app, "billing") == [] and log_size(app) == 0
    with app.engine.connect() as conn:
        with conn.begin():
            app.topic("orders").publish({"id": 3}, connection=conn)
    assert payloads(app, "billing") == [{"id": 3}]


def test_a_latest_group_sees_only_later_messages_an_earliest_one_all_that_remain(app: JobQueue) -> None:
    consumers(app, "old")
    register(app)
    orders = app.topic("orders")
    orders.publish_many([{"n": n} for n in range(1000)])
    finish(app, "old")
    app.topic_store.collect()
    assert log_size(app) == 0  # every group past them: gone
    orders.publish_many([{"n": n} for n in range(1000, 1010)])
    consumers(app, "latest")
    consumers(app, "earliest", start="earliest")
    register(app)
    orders.publish({"n": 1010})
    assert [p["n"] for p in payloads(app, "latest")] == [1010]
    assert [p["n"] for p in payloads(app, "earliest")] == list(range(1000, 1011))
    # Registering again (another worker starting) changes nothing.
    assert not app.topic_store.register("orders", "earliest", "earliest")
    assert len(deliveries(app, "earliest")) == 11


def test_the_log_is_trimmed_once_every_group_is_past_a_message(app: JobQueue) -> None:
    consumers(app, "fast", "stopped")
    register(app)
    app.topic("orders").publish_many([{"n": n} for n in range(50)], key=lambda p: str(p["n"] % 5))
    finish(app, "fast")
    assert app.topic_store.collect() == 0 and log_size(app) == 50  # "stopped" has not processed them
    # The stopped group catches up with its oldest ten: the log lets those go.
    for row in deliveries(app, "stopped")[:10]:
        jobs.cancel(app.store, row["id"])
    assert app.topic_store.collect() == 10 and log_size(app) == 40
    finish(app, "stopped")
    assert app.topic_store.collect() == 40 and log_size(app) == 0
    stats = {entry["group"]: entry for entry in app.topic_store.stats()}
    assert stats["fast"]["watermark"] == stats["stopped"]["watermark"] > 0


def test_a_group_stays_behind_a_message_it_has_not_finished(app: JobQueue) -> None:
    """The watermark stops at the oldest unfinished message, even when later ones are done."""
    consumers(app, "billing")
    register(app)
    app.topic("orders").publish_many([{"n": n} for n in range(10)])
    rows = deliveries(app, "billing")
    for row in rows[1:]:
        jobs.cancel(app.store, row["id"])
    assert app.topic_store.collect() == 0 and log_size(app) == 10
    jobs.cancel(app.store, rows[0]["id"])
    assert app.topic_store.collect() == 10


def test_stats_show_lag_and_what_the_log_keeps(app: JobQueue) -> None:
    consumers(app, "billing", "email")
    register(app)
    app.topic("orders").publish_many([{"n": n} for n in range(4)])
    finish(app, "email")
    stats = {entry["group"]: entry for entry in app.topic_store.stats()}
    assert stats["billing"]["lag"] == 4 and stats["billing"]["oldest_unfinished_seconds"] is not None
    assert stats["email"]["lag"] == 0 and stats["email"]["kept"] == 4


def test_dropping_a_group_frees_the_log(app: JobQueue) -> None:
    consumers(app, "billing", "gone")
    register(app)
    app.topic("orders").publish_many(range(5))
    finish(app, "billing")
    assert app.topic_store.drop("orders", "gone") == 5
    assert app.topic_store.drop("orders", "gone") == -1
    app.topic_store.collect()
    assert log_size(app) == 0
    # A drop of a topic that does not exist (a typo, say) does not make it.
    assert app.topic_store.drop("ordres", "billing") == -1
    assert {row["topic"] for row in app.topic_store.stats()} == {"orders"}


def test_bad_input_is_refused_and_writes_nothing(app: JobQueue) -> None:
    consumers(app, "billing")
    register(app)
    orders = app.topic("orders")
    with pytest.raises(SerializationError, match=r"^message 1: topic orders: payload\['bad'\]: cannot serialize"):
        orders.publish_many([{"ok": 1}, {"bad": object()}])  # the payload, not the "args[0]" it is carried as
    with pytest.raises(ConfigurationError, match="key must be a string"):
        orders.publish({"n": 1}, key="")
    # A key function that fails says on which message, as a bad key it returns does.
    with pytest.raises(ConfigurationError, match=r"^message 1: the key function failed .*KeyError\('customer'\)"):
        orders.publish_many([{"customer": 7}, {"id": 8}], key=lambda order: f"customer-{order['customer']}")
    with pytest.raises(ConfigurationError, match=r"^message 1: key must be a string"):
        orders.publish_many([{"customer": 7}, {"id": 8}], key=lambda order: order.get("customer", 2.5))
    with pytest.raises(SerializationError, match="max_payload_bytes"):
        orders.publish("x" * (app.settings.max_payload_bytes + 1))
    assert log_size(app) == 0 and deliveries(app, "billing") == []
    # "orders\n" (a name read from a file with its newline) was a topic of its own that no group read.
    for bad in ("", "a b", "x" * 41, "-x", "orders\n"):
        with pytest.raises(ConfigurationError, match="topic name"):
            app.topic(bad)
    with pytest.raises(ConfigurationError, match="group name"):
        app.consumer("orders", group="billing\n")
    with pytest.raises(ConfigurationError, match="start must be"):
        app.consumer("orders", group="x", start="oldest")
    with pytest.raises(ConfigurationError, match="does not take queue"):
        app.consumer("orders", group="x", queue="q")(lambda p: None)
    with pytest.raises(ConfigurationError, match="already has a consumer"):
        consumers(app, "billing")
    with pytest.raises(ConfigurationError, match="reserved"):
        app.task(name="topic:orders:billing")(lambda: None)
    with pytest.raises(ConfigurationError, match="no consumer for"):
        served_consumers(app.consumers.values(), ("nobody",))
    assert [c.group for c in served_consumers(app.consumers.values(), ("orders:billing",))] == ["billing"]


@only("postgresql", "mysql")
def test_a_group_added_while_a_publish_is_open_gets_that_message(app: JobQueue) -> None:
    """A group being added waits for publishes in progress, and they never miss it."""
    consumers(app, "billing")
    register(app)
    added: list[bool] = []
    with app.engine.connect() as conn:
        with conn.begin():
            app.topic("orders").publish({"n": 1}, connection=conn)
            thread = threading.Thread(
                target=lambda: added.append(app.topic_store.register("orders", "new", "earliest"))
            )
            thread.start()
            time.sleep(0.5)
            assert not added, "the group was added while a publish was open"
        thread.join(30)
    assert added == [True]
    assert [p["n"] for p in payloads(app, "new")] == [1]
    # And a publish that begins while a group is being added waits for it, then delivers to it.
    with app.engine.connect() as conn:
        with conn.begin():
            app.topic_store._groups_locked(conn, "orders", utcnow(), exclusive=True)
            thread = threading.Thread(target=lambda: app.topic("orders").publish({"n": 2}))
            thread.start()
            time.sleep(0.5)
            assert thread.is_alive(), "a publish went on while a group was being added"
            conn.execute(
                sa.insert(app.tables.topic_group),
                {
                    "topic": "orders",
                    "group_name": "newer",
                    "start": "latest",
                    "finished_id": 0,
                    "created_at": utcnow(),
                },
            )
        thread.join(30)
    assert [p["n"] for p in payloads(app, "newer")] == [2]


def test_big_payloads_are_published_in_statements_the_server_accepts(app: JobQueue) -> None:
    """Twenty payloads of 900 KB to two groups: 54 MB of rows, over MariaDB's 16 MB packet."""
    consumers(app, "billing", "email")
    register(app)
    big = "x" * 900_000
    ids = app.topic("orders").publish_many([{"n": n, "blob": big} for n in range(20)])
    assert len(ids) == 20 and log_size(app) == 20
    assert [p["n"] for p in payloads(app, "email")] == list(range(20))


def test_topics_and_groups_whose_names_differ_only_in_case_are_apart(app: JobQueue) -> None:
    """'Orders' and 'orders' are two topics, 'Billing' and 'billing' two groups of one, on MariaDB
    too: its default collation took each for the other, so a worker refused the second name."""
    consumers(app, "billing")
    app.consumer("orders", group="Billing")(lambda payload: None)
    app.consumer("Orders", group="audit")(lambda payload: None)
    assert [app.topic_store.register(c.topic, c.group, c.start) for c in app.consumers.values()] == [True] * 3
    app.topic("orders").publish({"id": 1})
    app.topic("Orders").publish({"id": 2})
    assert payloads(app, "billing") == payloads(app, "Billing") == [{"id": 1}]
    m = app.tables.message
    with app.engine.connect() as conn:
        audit = conn.execute(sa.select(m.c.payload).where(m.c.task_name == delivery_task("Orders", "audit"))).scalars()
        assert [loads_call(app.serializer, payload)[0][0] for payload in audit] == [{"id": 2}]
    stats = {(row["topic"], row["group"]) for row in app.topic_store.stats()}
    assert stats == {("orders", "billing"), ("orders", "Billing"), ("Orders", "audit")}


@only("mysql")
def test_names_a_collation_changed_by_hand_holds_equal_are_refused_not_merged(app: JobQueue) -> None:
    """Changed by hand to one that ignores case, the collation of the topic tables would make
    'Billing' the group 'billing' (sharing its deliveries) and 'Orders' the topic 'orders'."""
    tp, g = app.tables.topic, app.tables.topic_group
    ignoring_case = [
        f"ALTER TABLE {tp.name} MODIFY COLUMN name VARCHAR(100) COLLATE utf8mb4_general_ci NOT NULL",
        f"ALTER TABLE {g.name} MODIFY COLUMN topic VARCHAR(100) COLLATE utf8mb4_general_ci NOT NULL, "
        "MODIFY COLUMN group_name VARCHAR(100) COLLATE utf8mb4_general_ci NOT NULL",
    ]
    names_exact = next(step for step in migrations.MIGRATIONS if step.version == 7)  # restores them
    with app.engine.begin() as conn:
        for statement in ignoring_case:
            conn.exec_driver_sql(statement)
    try:
        app.topic_store.register("orders", "billing", "latest")
        with pytest.raises(ConfigurationError, match="group 'Billing' is the topic 'orders': group 'billing'"):
            app.topic_store.register("orders", "Billing", "latest")
        with pytest.raises(ConfigurationError, match="topic 'Orders' is the topic 'orders' on this database"):
            app.topic_store.register("Orders", "audit", "latest")
        with pytest.raises(ConfigurationError, match="collation was changed.*differs in more than case"):
            app.topic("Orders").publish({"id": 1})
        assert not app.topic_store.register("orders", "billing", "latest")  # the group as it was
    finally:
        with app.engine.begin() as conn:
            for statement in names_exact.statements(conn, app.tables):
                conn.exec_driver_sql(statement)


def test_a_group_added_from_the_earliest_gets_the_whole_log_while_another_worker_trims_it(app: JobQueue) -> None:
    """An earliest group's catch-up reads the log a page at a time; a collection by another worker
    meanwhile deleted the pages it had not read yet (messages every other group had finished), and
    the new group got the first 1,000 of 5,000. Now it gets the log as it was when it was added:
    all of it, or nothing if the collection came first."""
    app.topic("orders").publish_many(range(5000))
    app.topic_store.register("orders", "old", "latest")  # past every message: the log may go
    adding = threading.Thread(target=lambda: app.topic_store.register("orders", "new", "earliest"))
    adding.start()
    while adding.is_alive():
        app.topic_store.collect()
    adding.join()
    assert len(deliveries(app, "new")) in (0, 5000)


def _register_at(app: JobQueue, topic: str, at: float) -> int:
    """In a forked process: register three groups of ``topic`` from ``at`` (time.time()); the exit
    status is 3 for a deadlock, 4 for another database error."""
    pid = os.fork()
    if pid:
        return pid
    status = 0
    try:
        app.engine.dispose(close=False)  # the parent's connections are not the child's
        while time.time() < at:
            pass
        for group in ("a", "b", "c"):
            app.topic_store.register(topic, group, "latest")
    except sa.exc.OperationalError as exc:
        status = 3 if "deadlock" in str(exc).lower() else 4
    except BaseException:
        status = 4
    os._exit(status)


@only("mysql")
def test_two_processes_registering_a_new_topics_groups_at_once_never_deadlock(app: JobQueue) -> None:
    # Before the topic's row was created in a transaction of its own, about one round in sixty
    # deadlocked on MariaDB (5 in 300 rounds, where this finds none).
    outcomes = []
    for round_ in range(300):
        app.engine.dispose()
        at = time.time() + 0.03  # both forked by then (a few ms each): they start at once
        pids = [_register_at(app, f"new{round_}", at) for _ in range(2)]
        outcomes += [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert outcomes.count(3) == 0 and outcomes.count(4) == 0, outcomes
    stats = {(row["topic"], row["group"]) for row in app.topic_store.stats()}
    assert len(stats) == 300 * 3


def test_a_delivery_key_edited_into_no_log_id_stops_no_trimming(app: JobQueue) -> None:
    # A delivery's unique key names its message in the log. Edited by hand into text that names
    # none, it used to make every collection raise, so no topic's log was trimmed again.
    consumers(app, "billing")
    register(app)
    app.topic("orders").publish_many([{"n": n} for n in range(10)])
    rows = deliveries(app, "billing")
    m = app.tables.message
    with app.engine.begin() as conn:
        for row, text in zip(rows[:3], ("not-an-id", "0", "-1"), strict=True):
            conn.execute(sa.update(m).where(m.c.id == row["id"]).values(unique_key=text))
    for row in rows[3:6]:
        jobs.cancel(app.store, row["id"])
    # The oldest delivery that names its message is the seventh: the six before it may go.
    assert app.topic_store.collect() == 6 and log_size(app) == 4
    # The edited deliveries still run from their own copies of the payloads.
    assert [loads_call(app.serializer, r["payload"])[0][0]["n"] for r in deliveries(app, "billing")[:3]] == [0, 1, 2]


def test_a_tasks_partition_key_that_is_a_groups_message_partition_is_refused(app: JobQueue) -> None:
    """A task's jobs enqueued with partition_key "orders:billing:cust-1" shared one order with group
    billing's messages of key "cust-1": a lagging group held the task's jobs back, and the
    task's older job did not hold the group's message back as its waiting column said."""
    consumers(app, "billing")

    @app.task(name="t.slow")
    def slow() -> None: ...

    for call in (
        lambda: slow.apply_async(partition_key="orders:billing:cust-1"),
        lambda: slow.bulk([()], partition_key="orders:billing:cust-1"),
    ):
        with pytest.raises(ConfigurationError, match="consumer group 'billing' of topic 'orders' keeps its messages"):
            call()
    assert slow.apply_async(partition_key="orders:shipping:cust-1").status() == "pending"  # no such group here
    assert slow.apply_async(partition_key="tenant:eu:7").status() == "pending"


def test_a_consumer_groups_task_enqueues_nothing_but_says_to_publish(app: JobQueue) -> None:
    """Its delay(), apply_async() and bulk() made deliveries of no published message: `jobqueue
    topics` did not count them, no other group got them, and dropping the group left them to run."""
    consumers(app, "billing")
    register(app)
    task = app.consumers[("orders", "billing")].task
    assert app.get_task("topic:orders:billing") is task
    for call in (lambda: task.delay({"id": 1}), lambda: task.apply_async(({"id": 1},)), lambda: task.bulk([({},)])):
        with pytest.raises(
            ConfigurationError, match=r"publish the message to the topic instead \(app.topic\('orders'\)"
        ):
            call()
    m = app.tables.message
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(m)).scalar() == 0
    app.topic("orders").publish({"id": 2})  # as it should be
    assert [g["lag"] for g in app.topic_store.stats() if g["group"] == "billing"] == [1]


def test_a_handler_that_cannot_take_the_payload_alone_is_refused_where_it_is_defined(app: JobQueue) -> None:
    """It was accepted, and every message then failed with TypeError until it was a dead letter."""
    for handler in (lambda payload, extra: None, lambda: None):
        with pytest.raises(ConfigurationError, match="cannot be called with the message's payload alone"):
            app.consumer("orders", group="strict")(handler)
    app.consumer("orders", group="loose")(lambda payload, extra=None: None)
    app.consumer("orders", group="bound", bind=True)(lambda context, payload: None)
    assert set(app.consumers) == {("orders", "loose"), ("orders", "bound")}
