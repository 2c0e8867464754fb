"""``jobqueue dashboard``: serve the web dashboard of this app's database."""

from __future__ import annotations

import click

from jobqueue.cli.state import CliState
from jobqueue.settings import DASHBOARD_TOKEN_ENV
from jobqueue.storage.engine import mask_url

FLASK_PACKAGES = ("flask", "werkzeug", "jinja2", "markupsafe", "itsdangerous", "blinker")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
@click.option(
    "--token",
    envvar=DASHBOARD_TOKEN_ENV,
    show_envvar=True,
    help="Secret every request must carry (required unless --host is a loopback address).",
)
@click.pass_obj
def dashboard(state: CliState, /, host: str, port: int, token: str | None) -> None:
    """Serve a web page of queues, throughput, worker processes and failed jobs, with retry and cancel.

    Open it once as http://HOST:PORT/?token=TOKEN (the browser keeps the token in a cookie), or
    send "Authorization: Bearer TOKEN". Without a token it serves 127.0.0.1 only.
    """
    try:
        from jobqueue import dashboard as web
    except ModuleNotFoundError as exc:
        if exc.name not in FLASK_PACKAGES:
            raise
        raise click.ClickException(
            f"the dashboard needs Flask ({exc.name} is missing): install jobqueue[dashboard], "
            "e.g. pip install 'jobqueue[dashboard]'"
        ) from None
    access = web.check_bind(host, token or None)
    database = mask_url(state.app.database_url)  # an unusable URL fails here, not on the first page
    app = web.create_app(state.app, token=access.token)

    def ready(url: str) -> None:
        needs = "; open it with ?token=... once" if access.token else ""
        click.echo(f"jobqueue dashboard of {database} on {url}{needs}")

    web.serve(app, host, port, ready)
