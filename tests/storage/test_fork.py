"""A process forked after jobqueue connected (a pre-forking web server, a job's multiprocessing
pool) talks to the database through connections of its own, never its parent's."""

from __future__ import annotations

import os
from collections.abc import Callable

from jobqueue import JobQueue
from jobqueue.task import Task


def in_a_fork(work: Callable[[], object]) -> str:
    """Run ``work()`` in a forked child; return what it returned, as text (or its error)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            try:
                text = str(work())
            except BaseException as exc:
                text = f"error {type(exc).__name__}: {exc}"
            os.write(write_fd, text.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def test_a_forked_child_opens_its_own_connections(app: JobQueue, add: Task) -> None:
    def connection_id() -> int:
        with app.engine.connect() as conn:
            return id(conn.connection.driver_connection)

    parent = connection_id()  # pooled now: a child that took it would share its socket
    before = add.delay(1, 1)
    child = in_a_fork(connection_id)
    assert child.isdigit() and int(child) != parent, child
    enqueued = in_a_fork(lambda: add.delay(2, 2).id)
    assert enqueued.isdigit(), enqueued
    # The parent's connection still works, and both jobs are there.
    assert {before.status(), app.job(int(enqueued)).status()} == {"pending"}


def test_a_forked_child_leaves_the_parents_sessions_open(app: JobQueue, add: Task) -> None:
    """mysqlclient ends a connection's session when the connection is garbage collected, in
    whichever process: a child must never collect the pools it inherited."""
    import gc

    with app.engine.connect() as conn:  # pooled, idle, when the child is forked
        conn.exec_driver_sql("SELECT 1")
    assert in_a_fork(lambda: f"collected {gc.collect() >= 0}") == "collected True"
    assert add.delay(1, 1).status() == "pending"  # on the parent's pooled connection
