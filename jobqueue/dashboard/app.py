"""The dashboard's Flask application: pages rendered on the server, no script, one stylesheet."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING

import sqlalchemy as sa
from flask import Flask, render_template
from werkzeug.exceptions import HTTPException

from jobqueue.dashboard import security, views
from jobqueue.dashboard.formatting import FILTERS, cell
from jobqueue.errors import JobQueueError
from jobqueue.storage.dialects.connector import lacks_a_privilege
from jobqueue.storage.engine import mask_in

if TYPE_CHECKING:
    from jobqueue.app import JobQueue

log = logging.getLogger("jobqueue.dashboard")


def create_app(queue: JobQueue, token: str | None = None, page_size: int = 50) -> Flask:
    """The dashboard of ``queue`` as a WSGI application.

    Args:
        queue: the JobQueue whose database the pages show and whose jobs the buttons retry or cancel.
        token: if given, every request must carry it (see :mod:`jobqueue.dashboard.security`);
            if None, only requests addressed to localhost are answered. One shorter than 16
            characters is refused (ConfigurationError).
        page_size: failed jobs per page.
    """
    security.check_token(token)
    app = Flask(__name__)
    app.secret_key = session_key(token)
    app.extensions["jobqueue_dashboard"] = views.Dashboard(queue, page_size)
    app.jinja_env.filters.update(FILTERS)
    app.jinja_env.globals["cell"] = cell
    app.context_processor(views.context)
    security.install(app, security.Access(token))
    app.register_blueprint(views.pages)
    _handle_errors(app, queue)
    return app


def session_key(token: str | None) -> bytes:
    """The key that signs sessions (the CSRF token, the message after an action).

    With a token it is derived from the token, so every process serving the dashboard (a WSGI
    server's workers) and every restart signs alike; it is as secret as the token, which opens the
    dashboard anyway. Without one it is random: a restart only means reloading the page.
    """
    if token is None:
        return secrets.token_bytes(32)
    return hmac.new(token.encode(), b"jobqueue dashboard session", hashlib.sha256).digest()


def _handle_errors(app: Flask, queue: JobQueue) -> None:
    @app.errorhandler(HTTPException)
    def _http(error: HTTPException) -> tuple[str, int]:
        return render_template("error.html", title=error.name, message=error.description), error.code or 500

    @app.errorhandler(sa.exc.SQLAlchemyError)
    @app.errorhandler(JobQueueError)
    def _database(error: Exception) -> tuple[str, int]:
        # Driver messages can quote the URL; the page and the log get it with its password masked.
        message = mask_in((str(error).strip().splitlines() or [type(error).__name__])[0], queue.database_url)
        log.error("dashboard request failed: %s", message)
        if isinstance(error, sa.exc.DBAPIError) and lacks_a_privilege(error):
            # It answered, and said no: a login that may read the tables but not change them.
            login = queue.engine.url.username or "the dashboard's login"
            message += (
                f" (grant {login} SELECT, INSERT, UPDATE and DELETE on the jobqueue tables to act on jobs "
                "from the dashboard; reading them needs SELECT only)"
            )
            return render_template("error.html", title="The database refused this", message=message), 403
        return render_template("error.html", title="The database did not answer", message=message), 503
