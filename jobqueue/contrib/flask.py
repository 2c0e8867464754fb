"""Flask and Flask-SQLAlchemy: jobs in the request's transaction, jobs run in an app context.

::

    db = SQLAlchemy(app)
    jq = JobQueue()
    jq.init_app(app, db)   # db may be left out when Flask-SQLAlchemy is registered on the app

Inside an app context, ``delay()`` writes through ``db.session``: the job is committed by the
application's ``db.session.commit()`` and is gone on rollback (Flask-SQLAlchemy rolls back an
uncommitted session when the app context ends). Outside an app context it is written and committed
at once on jobqueue's own connection. Workers run every job inside an app context, so tasks use
``db.session`` as views do. ``flask jobqueue <command>`` runs the jobqueue CLI on this app.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from jobqueue.contrib import Framework
from jobqueue.errors import ConfigurationError
from jobqueue.storage.engine import mask_url, same_database

if TYPE_CHECKING:
    from jobqueue.app import JobQueue


ENQUEUED_IN_SESSION = "_jobqueue_enqueued_in_session"  # in flask.g: each enqueue's commit watch


def unbound_warning(url: str) -> str | None:
    """What to say when a JobQueue made without a URL, and not bound with ``init_app``, is used in
    the app context of a Flask app with Flask-SQLAlchemy whose database is another than ``url``
    (the one the JobQueue uses): its jobs would go elsewhere than the app's data, and would not
    commit with ``db.session``. None outside an app context; "" where there is nothing to say."""
    from flask import current_app, has_app_context

    if not has_app_context():
        return None
    db = current_app.extensions.get("sqlalchemy")
    try:
        engine = db.engine if db is not None else None
        if engine is None or same_database(engine.url, url):
            return ""
    except Exception:  # a database jobqueue does not run on, or no engine: not the JobQueue's anyway
        pass
    return (
        f"this JobQueue has no database URL and is not bound to the Flask app {current_app.name!r}: its jobs "
        f"go to {mask_url(url)}, not to the app's Flask-SQLAlchemy database, and do not commit with "
        "db.session. Call jq.init_app(app, db), or give JobQueue the database URL you mean"
    )


class FlaskIntegration(Framework):
    name = "Flask"

    def __init__(self, flask_app: Any, db: Any) -> None:
        self.flask_app = flask_app
        self.db = db
        self._url: str | None = None

    def database_url(self) -> str:
        if self._url is None:
            # db.engine, not the config: Flask-SQLAlchemy resolves relative SQLite paths against the
            # app's instance folder, and the worker must open the very same file.
            with self.flask_app.app_context():
                self._url = self.db.engine.url.render_as_string(hide_password=False)
        return self._url

    @contextmanager
    def connection(self, one_statement: bool = False) -> Iterator[Any]:
        from flask import current_app, has_app_context

        owner = current_app._get_current_object() if has_app_context() else None  # type: ignore[attr-defined]
        if owner is self.flask_app:
            yield self.db.session
        elif owner is not None and owner.extensions.get("jobqueue") is self.flask_app.extensions.get("jobqueue"):
            yield self._session_of(owner)
        else:
            yield None

    def _session_of(self, other: Any) -> Any:
        """The session of another app this JobQueue was bound to by an app factory that ran again
        (the last app is the bound one): its request's transaction, if it is on the same database.
        On another database its job would be committed at once, outside that transaction, on the
        bound app's database: that is refused."""
        db = other.extensions.get("sqlalchemy")
        url = db.engine.url.render_as_string(hide_password=False) if db is not None else None
        if url is None or not same_database(url, self.database_url()):
            raise ConfigurationError(
                f"this JobQueue is bound to the Flask app made last, on {mask_url(self.database_url())}, "
                f"and this app context is another app's, on another database ({mask_url(url or 'none')}): "
                "its job could not be part of that app's transaction. Give each app its own JobQueue, "
                "or the same database"
            )
        return db.session

    def commit_watch(self, connection: Any) -> Callable[[], bool] | None:
        watch = super().commit_watch(connection)
        if watch is not None:
            from flask import g

            g.setdefault(ENQUEUED_IN_SESSION, []).append(watch)
        return watch

    @staticmethod
    def _uncommitted() -> bool:
        """Whether jobs enqueued through db.session in this app context wait for a commit."""
        from flask import g, has_app_context

        return has_app_context() and any(still_open() for still_open in g.get(ENQUEUED_IN_SESSION, ()))

    @contextmanager
    def job_scope(self) -> Iterator[None]:
        with self.flask_app.app_context():
            yield

    def job_returned(self) -> None:
        # The app context's end rolls back db.session: jobs the task enqueued through it and
        # left uncommitted would be gone without a word. The job fails instead (and is retried).
        if self._uncommitted():
            raise ConfigurationError(
                "this job enqueued jobs through db.session and returned without committing it: "
                "Flask-SQLAlchemy rolls the session back as the job ends, and those jobs with it. "
                "Call db.session.commit() before the task returns (db.session.rollback() to drop "
                "them on purpose)"
            )

    def check_drain(self) -> None:
        # drain() reads and writes on jobqueue's own connections, which cannot see jobs enqueued
        # in db.session's open transaction; on SQLite they would wait for its lock, then fail.
        if self._uncommitted():
            raise ConfigurationError(
                "drain() was called while db.session holds jobs enqueued in a transaction not yet "
                "committed: drain() runs jobs on jobqueue's own connections, which cannot see them "
                "(on SQLite they would also wait for its lock). Call db.session.commit() first"
            )

    def before_fork(self) -> None:
        # Pooled connections must not be shared with forked children.
        with self.flask_app.app_context():
            for engine in self.db.engines.values():
                engine.dispose()


def init_app(jq: JobQueue, flask_app: Any, db: Any = None) -> None:
    """Bind ``jq`` to a Flask app and its Flask-SQLAlchemy ``db``, and add ``flask jobqueue``."""
    if db is None:
        db = flask_app.extensions.get("sqlalchemy")
        if db is None:
            raise ConfigurationError(
                "init_app(app, db): Flask-SQLAlchemy is not registered on this app; "
                "pass db, or call db.init_app(app) first"
            )
    jq.bind_framework(FlaskIntegration(flask_app, db))
    flask_app.extensions["jobqueue"] = jq
    from jobqueue.cli import bound_cli

    flask_app.cli.add_command(bound_cli(jq, "jobqueue"))
