"""The Flask example shop (examples/flask_app) driven by Flask's test client on each database.

A request writes an order and its confirmation job in one transaction: a declined payment rolls
both back; a committed order's job is run once by ``flask jobqueue worker``, inside an app context.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa

from jobqueue import JobHandle, Task
from jobqueue.errors import ConfigurationError, JobFailed, JobNotCommitted
from jobqueue.retry import NoRetryStrategy
from jobqueue.testing import drain
from tests.acceptance.cli import ROOT

SHOP_DIR = ROOT / "examples" / "flask_app"
_module: ModuleType | None = None


def shop_module() -> ModuleType:
    """examples/flask_app/shop.py, imported once under its own name (Django's example has a "shop")."""
    global _module
    if _module is None:
        spec = importlib.util.spec_from_file_location("flask_shop", SHOP_DIR / "shop.py")
        assert spec is not None and spec.loader is not None
        _module = importlib.util.module_from_spec(spec)
        sys.modules["flask_shop"] = _module
        spec.loader.exec_module(_module)
    return _module


@pytest.fixture
def shop(db_url: str) -> Iterator[tuple[ModuleType, Any]]:
    module = shop_module()
    flask_app = module.create_app(db_url)
    with flask_app.app_context():
        module.db.create_all()
        module.db.session.execute(sa.delete(module.Order))
        module.db.session.commit()
    yield module, flask_app
    with flask_app.app_context():
        module.db.engine.dispose()
    module.jq.close()


def flask_cli(*args: str, db_url: str) -> subprocess.CompletedProcess[str]:
    """``flask --app shop ...`` run from the example's folder, as its README says."""
    env = dict(os.environ, SHOP_DATABASE_URL=db_url, PYTHONPATH=str(ROOT))
    env.pop("JOBQUEUE_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "shop", *args],
        cwd=SHOP_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def jobs(module: ModuleType) -> tuple[int, int]:
    with module.jq.store.reading() as conn:
        tables = module.jq.tables
        return (
            conn.execute(sa.select(sa.func.count()).select_from(tables.message)).scalar_one(),
            conn.execute(sa.select(sa.func.count()).select_from(tables.archive)).scalar_one(),
        )


def test_declined_payment_rolls_back_the_order_and_its_job(shop) -> None:
    module, flask_app = shop
    response = flask_app.test_client().post("/orders", json={"item": "yacht", "quantity": 500})
    assert response.status_code == 402, response.text
    with flask_app.app_context():
        assert module.db.session.scalar(sa.select(sa.func.count()).select_from(module.Order)) == 0
    assert jobs(module) == (0, 0)


def test_an_app_the_factory_made_before_the_last_keeps_its_jobs_in_its_transaction(shop, db_url: str) -> None:
    """The factory runs again (a second test app, a CLI) and binds jq to the new app: a request of
    the first app still writes its job through that app's db.session, so a rollback takes it along."""
    module, first = shop
    second = module.create_app(db_url)
    response = first.test_client().post("/orders", json={"item": "yacht", "quantity": 500})
    assert response.status_code == 402, response.text
    assert jobs(module) == (0, 0)
    placed = first.test_client().post("/orders", json={"item": "book", "quantity": 1})
    assert placed.status_code == 201 and jobs(module) == (1, 0)
    with second.app_context():
        module.confirm_order.delay(placed.json["id"])  # and the last app's requests, as before
    assert jobs(module) == (1, 0)


def test_an_earlier_app_on_another_database_cannot_enqueue_outside_its_transaction(
    shop, db_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app of the factory on another database than the one jq is bound to (the last app's)
    refuses to enqueue: its job would be committed at once, on the other database, whatever its
    request then did."""
    module, bound = shop
    monkeypatch.delenv("JOBQUEUE_DATABASE_URL")  # the apps name their databases
    other = module.create_app(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    module.create_app(db_url)  # the factory again: jq is bound to this app, on the test database
    with other.app_context():
        with pytest.raises(ConfigurationError, match="another database"):
            module.confirm_order.delay(1)
    assert jobs(module) == (0, 0)
    del bound


def test_a_placed_order_is_confirmed_once_by_the_worker(shop, db_url: str) -> None:
    module, flask_app = shop
    client = flask_app.test_client()
    placed = [client.post("/orders", json={"item": f"book {i}", "quantity": i + 1}).json for i in range(3)]
    assert jobs(module) == (3, 0)
    assert client.get(f"/orders/{placed[0]['id']}").json["status"] == "placed"
    result = flask_cli("jobqueue", "worker", "--burst", "--concurrency", "2", db_url=db_url)
    assert result.returncode == 0, result.stderr
    assert jobs(module) == (0, 3)
    for order in placed:
        shown = client.get(f"/orders/{order['id']}").json
        assert shown["status"] == "confirmed" and shown["confirmation"] == f"CONF-{order['id']:06d}"
        assert module.jq.job(order["job"]).get(timeout=5) == shown["confirmation"]


def test_an_uncommitted_session_takes_its_jobs_with_it(shop) -> None:
    module, flask_app = shop
    with flask_app.app_context():
        module.confirm_order.delay(1)  # through db.session, never committed
    assert jobs(module) == (0, 0)
    with flask_app.app_context():
        module.confirm_order.delay(2)
        module.db.session.commit()
    assert jobs(module) == (1, 0)
    module.confirm_order.delay(3)  # outside an app context: jobqueue's own connection, committed at once
    assert jobs(module) == (2, 0)


def test_a_handle_says_when_db_session_has_not_committed_its_job(shop) -> None:
    module, flask_app = shop
    with flask_app.app_context():
        handle = module.confirm_order.delay(7)
        with pytest.raises(JobNotCommitted, match="has not committed yet"):
            handle.status()
        module.db.session.commit()
        assert handle.status() == "pending"


def test_drain_runs_the_shops_jobs_in_the_test_process(shop) -> None:
    module, flask_app = shop
    client = flask_app.test_client()
    placed = [client.post("/orders", json={"item": f"pen {i}", "quantity": 1}).json for i in range(3)]
    handles = drain(module.jq)  # each job inside an app context, as a worker runs it
    assert [h.id for h in handles] == [order["job"] for order in placed]
    for order in placed:
        assert client.get(f"/orders/{order['id']}").json["status"] == "confirmed"
    assert jobs(module) == (0, 3)


def test_a_jobs_signal_receivers_run_in_its_app_context(shop) -> None:
    """A job runs in an app context; its signals' receivers ran outside it, where current_app and
    db.session raised (logged, the job's outcome unchanged), and Django's connection upkeep
    around each job did not cover them either."""
    from flask import current_app

    from jobqueue import signals

    module, flask_app = shop
    seen: list[str] = []

    def started(sender: Any, job: Any, **kwargs: Any) -> None:
        seen.append(f"started in {current_app.name}")

    def succeeded(sender: Any, job: Any, **kwargs: Any) -> None:
        seen.append(f"succeeded in {current_app.name}")

    signals.job_started.connect(started)
    signals.job_succeeded.connect(succeeded)
    try:
        placed = flask_app.test_client().post("/orders", json={"item": "pen", "quantity": 1}).json
        assert [h.id for h in drain(module.jq)] == [placed["job"]]
    finally:
        signals.job_started.disconnect(started)
        signals.job_succeeded.disconnect(succeeded)
    assert seen == [f"started in {flask_app.name}", f"succeeded in {flask_app.name}"]


def chained(module: ModuleType) -> tuple[Task, Task]:
    """Two tasks of the shop's JobQueue, made once: a parent that enqueues the shop's confirmation
    job through db.session, committing it or not."""
    jq = module.jq
    if jq.registry.get("test.enqueues_and_commits") is None:

        @jq.task(name="test.enqueues_and_commits", retry_strategy=NoRetryStrategy())
        def enqueues_and_commits(order_id: int) -> int:
            job: JobHandle = module.confirm_order.delay(order_id)
            module.db.session.commit()
            return job.id

        @jq.task(name="test.enqueues_only", retry_strategy=NoRetryStrategy())
        def enqueues_only(order_id: int) -> int:
            job: JobHandle = module.confirm_order.delay(order_id)
            return job.id  # db.session never committed

    return jq.get_task("test.enqueues_and_commits"), jq.get_task("test.enqueues_only")


def test_a_job_that_enqueues_through_db_session_without_committing_fails_naming_the_fix(shop) -> None:
    """A task that enqueued its next step through db.session and returned without committing it:
    the app context's end rolled the session back, and the next step was gone without a word."""
    module, flask_app = shop
    commits, forgets = chained(module)
    with flask_app.app_context():
        order = module.Order(item="lamp", quantity=1)
        module.db.session.add(order)
        module.db.session.commit()
        order_id = order.id
    forgot = forgets.delay(order_id)
    drain(module.jq)
    with pytest.raises(JobFailed, match=r"returned without committing it.*db\.session\.commit\(\)"):
        forgot.get(timeout=5)
    assert jobs(module) == (0, 1)  # nothing was enqueued by it
    committed = commits.delay(order_id)
    ran = drain(module.jq)
    assert [h.id for h in ran] == [committed.id, committed.get(timeout=5)]  # the parent, then its child
    with flask_app.app_context():
        assert module.db.session.get(module.Order, order_id).status == "confirmed"


def test_a_job_that_leaves_db_session_uncommitted_is_retried_by_its_strategy(shop) -> None:
    """The job fails as any job does, before its outcome is decided: it was failed for good after
    its job_succeeded signal, whatever its retry strategy said."""
    from jobqueue import signals
    from jobqueue.retry import ConstantRetryStrategy

    module, flask_app = shop
    jq = module.jq
    if jq.registry.get("test.enqueues_only_retried") is None:

        @jq.task(
            name="test.enqueues_only_retried", retry_strategy=ConstantRetryStrategy(delay_seconds=60, max_attempts=3)
        )
        def enqueues_only_retried(order_id: int) -> None:
            module.confirm_order.delay(order_id)  # db.session never committed

    sent: list[str] = []

    def retrying(sender: Any, **kwargs: Any) -> None:
        sent.append("retrying")

    def succeeded(sender: Any, **kwargs: Any) -> None:
        sent.append("succeeded")

    signals.job_retrying.connect(retrying)
    signals.job_succeeded.connect(succeeded)
    try:
        forgot = jq.get_task("test.enqueues_only_retried").delay(1)
        drain(jq)
    finally:
        signals.job_retrying.disconnect(retrying)
        signals.job_succeeded.disconnect(succeeded)
    assert (forgot.status(), sent) == ("retryable", ["retrying"])


def test_drain_with_jobs_db_session_has_not_committed_says_to_commit(shop) -> None:
    """drain() in an app context whose db.session held uncommitted jobs waited 30 s for SQLite's
    lock and failed, or (PostgreSQL, MariaDB) ran nothing, without a word."""
    module, flask_app = shop
    with flask_app.app_context():
        module.confirm_order.delay(1)
        with pytest.raises(ConfigurationError, match=r"not yet committed.*db\.session\.commit\(\) first"):
            drain(module.jq)
        module.db.session.commit()
        assert len(drain(module.jq)) == 1  # the order does not exist: the job fails, but it ran


def test_flask_jobqueue_commands_use_the_apps_database(shop, db_url: str, tmp_path) -> None:
    module, flask_app = shop
    flask_app.test_client().post("/orders", json={"item": "pen", "quantity": 1})
    status = flask_cli("jobqueue", "status", "--json", db_url=db_url)
    assert status.returncode == 0, status.stderr
    assert '"ready": 1' in status.stdout
    other = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    refused = flask_cli("jobqueue", "--database-url", other, "status", db_url=db_url)
    assert refused.returncode == 1
    assert "Flask's database" in refused.stderr and "other.sqlite3" in refused.stderr


def test_flask_jobqueue_help_offers_neither_app_nor_database(shop) -> None:
    from click.testing import CliRunner

    from jobqueue.cli import bound_cli

    module, _flask_app = shop
    group = bound_cli(module.jq, "jobqueue")
    helped = CliRunner().invoke(group, ["--help"], prog_name="flask jobqueue")
    assert helped.exit_code == 0 and "--log-level" in helped.output
    assert "--app" not in helped.output and "--database-url" not in helped.output
    refused = CliRunner().invoke(group, ["--app", "other:app", "status"], prog_name="flask jobqueue")
    assert refused.exit_code == 2 and "--app does not apply to flask jobqueue: it runs <JobQueue" in refused.output


def test_init_app_needs_flask_sqlalchemy(shop) -> None:
    from flask import Flask

    from jobqueue import JobQueue

    with pytest.raises(ConfigurationError, match="Flask-SQLAlchemy is not registered"):
        JobQueue().init_app(Flask("bare"))


def test_a_jobqueue_used_in_a_flask_app_it_is_not_bound_to_says_so_once(
    shop, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """init_app forgotten: the jobs went to ./jobqueue.sqlite3 without a word, away from the
    app's data and its transactions."""
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy

    from jobqueue import JobQueue

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JOBQUEUE_DATABASE_URL", raising=False)
    flask_app = Flask("forgetful")
    flask_app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    SQLAlchemy(flask_app)
    jq = JobQueue()
    jq.task(name="forgetful.add")(lambda a, b: a + b)
    jq.init_schema()  # outside an app context: nothing to say
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="jobqueue"), flask_app.app_context():
        jq.registry["forgetful.add"].delay(1, 2)
        jq.registry["forgetful.add"].delay(3, 4)
    said = [r.getMessage() for r in caplog.records if "not bound to the Flask app" in r.getMessage()]
    assert said == [
        "this JobQueue has no database URL and is not bound to the Flask app 'forgetful': its jobs go to "
        "sqlite:///jobqueue.sqlite3, not to the app's Flask-SQLAlchemy database, and do not commit with "
        "db.session. Call jq.init_app(app, db), or give JobQueue the database URL you mean"
    ]
    jq.close()
    # A database chosen on purpose (JOBQUEUE_DATABASE_URL) for jobs kept apart: nothing to say.
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", f"sqlite:///{tmp_path / 'jobs.sqlite3'}")
    apart = JobQueue()
    apart.task(name="forgetful.add")(lambda a, b: a + b)
    apart.init_schema()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobqueue"), flask_app.app_context():
        apart.registry["forgetful.add"].delay(1, 2)
    assert "not bound to the Flask app" not in caplog.text
    apart.close()
