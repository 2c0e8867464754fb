"""Enqueue in the application's own SQLAlchemy transaction: a job exists iff that transaction commits.

On SQLite, PostgreSQL and MariaDB, with the application's own engine (not jobqueue's), a Connection
and a Session: a rolled-back job never runs, a committed one runs once, and jobqueue never commits
the caller's transaction itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import orm

from jobqueue import JobQueue
from jobqueue.errors import ConfigurationError
from tests.acceptance.cli import jobqueue
from tests.conftest import only

APP_TABLE = sa.Table(
    "outbox_order", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("item", sa.String(50))
)


@pytest.fixture
def add(app: JobQueue):
    # The same task name as tests.apps.basic, whose worker runs these jobs.
    @app.task(name="basic.add")
    def add(x: int, y: int) -> int:
        return x + y

    return add


@pytest.fixture
def user_engine(db_url: str) -> Iterator[sa.Engine]:
    """The application's own engine, configured as an application would (no jobqueue settings)."""
    engine = sa.create_engine(db_url)
    APP_TABLE.create(engine, checkfirst=True)
    with engine.begin() as conn:
        conn.execute(sa.delete(APP_TABLE))
    yield engine
    engine.dispose()


def counts(app: JobQueue) -> tuple[int, int]:
    """(messages, archived jobs), read on a connection of jobqueue's own (a reader: on SQLite it
    must not wait for the application's open write transaction)."""
    with app.store.reading() as conn:
        return (
            conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar_one(),
            conn.execute(sa.select(sa.func.count()).select_from(app.tables.archive)).scalar_one(),
        )


def run_worker() -> None:
    jobqueue("worker", "--burst", "--concurrency", "1", "--max-fetch-interval", "0.2")


def test_connection_rollback_leaves_no_job_and_commit_runs_it_once(app: JobQueue, add, user_engine) -> None:
    with user_engine.connect() as conn:
        with conn.begin():
            conn.execute(sa.insert(APP_TABLE), {"item": "lost"})
            add.apply_async((1, 1), connection=conn)
            add.bulk([(2, 2), (3, 3)], connection=conn)
            # Inside the transaction the rows exist; no other connection sees them yet.
            inside = conn.execute(sa.select(sa.func.count()).select_from(app.tables.message)).scalar_one()
            assert inside == 3 and counts(app) == (0, 0)
            conn.rollback()
        with conn.begin():
            conn.execute(sa.insert(APP_TABLE), {"item": "kept"})
            handle = add.apply_async((20, 22), connection=conn)
            assert conn.in_transaction()  # jobqueue did not commit it
    assert counts(app) == (1, 0)
    run_worker()
    assert handle.get(timeout=10) == 42
    assert counts(app) == (0, 1)  # only the committed job ever existed, and it ran once
    with user_engine.connect() as conn:
        assert conn.execute(sa.select(APP_TABLE.c.item)).scalars().all() == ["kept"]


def test_session_rollback_leaves_no_job_and_commit_runs_it_once(app: JobQueue, add, user_engine) -> None:
    factory = orm.sessionmaker(user_engine)
    add.delay(5, 5)  # no connection: jobqueue's own, committed at once
    with factory() as session:
        session.execute(sa.insert(APP_TABLE), {"item": "lost"})
        add.apply_async((1, 2), connection=session)
        add.bulk([(3, 4)], connection=session)
        assert counts(app) == (1, 0)
        session.rollback()
    with factory() as session:
        handles = add.bulk([(i, i) for i in range(5)], connection=session)
        assert session.in_transaction() and counts(app) == (1, 0)
        session.commit()
    assert counts(app) == (6, 0)
    run_worker()
    assert [h.get(timeout=10) for h in handles] == [0, 2, 4, 6, 8]
    assert counts(app) == (0, 6)


def test_scoped_session_is_accepted(app: JobQueue, add, user_engine) -> None:
    scoped = orm.scoped_session(orm.sessionmaker(user_engine))
    add.apply_async((1, 1), connection=scoped)
    assert counts(app) == (0, 0)
    scoped.commit()
    assert counts(app) == (1, 0)
    scoped.remove()


def test_a_job_is_invisible_to_workers_until_commit(app: JobQueue, add, user_engine) -> None:
    with user_engine.connect() as conn:
        trans = conn.begin()
        handle = add.apply_async((2, 3), connection=conn)
        if user_engine.dialect.name != "sqlite":  # SQLite's writer lock would hold the worker up
            run_worker()  # finds nothing: the job is not committed
            assert counts(app) == (0, 0)
        trans.commit()
    run_worker()
    assert handle.get(timeout=10) == 5


def test_connection_must_be_a_connection_or_session(app: JobQueue, add) -> None:
    with pytest.raises(ConfigurationError, match="Connection or Session"):
        add.apply_async((1, 1), connection="postgresql://elsewhere/db")
    assert counts(app) == (0, 0)


def test_a_connection_to_another_kind_of_database_is_refused(app: JobQueue, add, backend: str, tmp_path) -> None:
    # The application's engine on another database server than the queue's: the job could not be
    # in that transaction, and the statements are the queue's database's own.
    other = (
        "postgresql+psycopg2://jobqueue_test@127.0.0.1/none" if backend == "sqlite" else f"sqlite:///{tmp_path}/a.db"
    )
    engine = sa.create_engine(other)
    session = orm.Session(engine)
    with pytest.raises(ConfigurationError, match=f"is a {engine.dialect.name} connection but this JobQueue's database"):
        add.apply_async((1, 1), connection=session)
    with pytest.raises(ConfigurationError, match="point the JobQueue at that database"):
        add.bulk([(1, 1), (2, 2)], connection=session)
    session.close()
    engine.dispose()
    assert counts(app) == (0, 0)


@only("mysql")
def test_mariadb_and_mysql_spellings_of_one_database_are_one_kind(app: JobQueue, add) -> None:
    """SQLAlchemy names the dialect after the URL's spelling (mariadb:// or mysql://): a session on
    the queue's own database, spelled the other way, is accepted."""
    url = app.engine.url
    other = url.set(drivername="mysql+mysqldb" if url.get_backend_name() == "mariadb" else "mariadb+mysqldb")
    engine = sa.create_engine(other)
    with orm.Session(engine) as session:
        handle = add.apply_async((1, 1), connection=session)
        session.commit()
    engine.dispose()
    assert handle.status() == "pending"
