"""Serve the dashboard with werkzeug's threaded WSGI server.

The dashboard is a page a few people open now and then: werkzeug (which Flask brings anyway)
serves that well, one thread a request, with no other server to install. Put a TLS-terminating
proxy in front of it when it is reached over a network.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

from flask import Flask
from werkzeug.serving import WSGIRequestHandler, make_server

from jobqueue.dashboard.security import ACCESS_EXTENSION
from jobqueue.errors import ConfigurationError

# A query parameter of the request line; its name is compared decoded, as the dashboard reads it
# (``?%74oken=`` is the token too).
_QUERY_PARAMETER = re.compile(r"([?&;])([^=&;\s\"]*)=([^&;\s\"]*)")


def _mask_token(text: str, token: str | None = None) -> str:
    """``text`` with the value of any ``token`` query parameter masked, and ``token`` itself (as
    given, or URL-escaped) wherever else it shows: a request line that cannot be read as a URL
    may hold it anywhere."""
    if token:
        for form in {token, quote(token, safe=""), quote_plus(token, safe="")}:
            text = text.replace(form, "***")

    def mask(found: re.Match[str]) -> str:
        name = unquote_plus(found.group(2))
        return f"{found.group(1)}{found.group(2)}=***" if name.lower() == "token" else found.group(0)

    return _QUERY_PARAMETER.sub(mask, text)


class RequestHandler(WSGIRequestHandler):
    """werkzeug's handler, with any ``?token=`` masked in the access log, and no terminal colours
    in it (log lines may be JSON, or go to a file)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.log("info", '"%s" %s %s', self.requestline, code, size)

    def log(self, type: str, message: str, *args: Any) -> None:
        app = getattr(self.server, "app", None)
        access = app.extensions.get(ACCESS_EXTENSION) if isinstance(app, Flask) else None
        token = access.token if access is not None else None
        super().log(type, message, *(_mask_token(a, token) if isinstance(a, str) else a for a in args))


def serve(app: Flask, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Listen on ``host``:``port`` (0: any free port), call ``on_ready(url)``, serve until interrupted."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            server = make_server(host, port, app, threaded=True, request_handler=RequestHandler)
    except (OSError, SystemExit) as exc:  # werkzeug prints why it cannot bind (first line), then exits
        printed = said.getvalue().strip().splitlines()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else printed[0] if printed else None
        raise ConfigurationError(
            f"cannot listen on {host}:{port}: {reason or 'refused'}; choose another --port or --host"
        ) from None
    shown_host = f"[{host}]" if ":" in host else host
    on_ready(f"http://{shown_host}:{server.server_port}/")
    server.serve_forever()  # returns on KeyboardInterrupt, having closed the socket
