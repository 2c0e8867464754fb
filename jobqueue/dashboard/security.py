"""Who may see the dashboard and who may act through it.

Three rules, checked before any view runs:

- Without a token the dashboard listens on a loopback address only, and answers only requests
  addressed to a loopback name: a web page elsewhere that points its own host name at 127.0.0.1
  (DNS rebinding) is refused, since the browser would otherwise treat it as the same site.
- With a token every request carries it, as an ``Authorization: Bearer`` header or as the cookie set
  by a first visit with ``?token=``; the token is compared in constant time.
- Every POST carries the session's CSRF token (a random value kept in the signed session cookie and
  repeated in each form), so another site cannot make a logged-in browser retry or cancel jobs.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from urllib.parse import urlencode

from flask import Flask, abort, redirect, request, session
from werkzeug.wrappers import Response

from jobqueue.errors import ConfigurationError
from jobqueue.settings import DASHBOARD_TOKEN_ENV

TOKEN_COOKIE = "jobqueue_dashboard_token"
MIN_TOKEN_LENGTH = 16
CSRF_FIELD = "csrf_token"
_MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe())'"

# What a browser may do with our pages: our own stylesheet, no script at all, forms only to us,
# never inside another site's frame (a framed Retry button could be clicked by trickery).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


ACCESS_EXTENSION = "jobqueue_dashboard_access"


@dataclass(frozen=True)
class Access:
    """The dashboard's access rule: a token, or None to trust whoever reaches a loopback address."""

    token: str | None = None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); False for any other name."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_token(token: str | None) -> None:
    """Refuse a token too short to be secret."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"the dashboard token is {len(token)} characters; use at least {MIN_TOKEN_LENGTH}, e.g. {_MAKE_TOKEN}"
        )


def check_bind(host: str, token: str | None) -> Access:
    """Refuse to serve beyond this machine without a token; refuse a token too short to be secret."""
    check_token(token)
    if token is None and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host} without a token: pass --token or set {DASHBOARD_TOKEN_ENV} "
            "(or bind to 127.0.0.1)"
        )
    return Access(token)


def _request_hostname() -> str:
    host = request.host
    if host.startswith("["):  # [::1]:8080
        return host[1 : host.index("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _given_token() -> tuple[str | None, bool]:
    """The token this request carries, and whether it came in the query string."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip(), False
    if "token" in request.args:
        return request.args["token"], True
    return request.cookies.get(TOKEN_COOKIE), False


def _refuse(status: int, text: str) -> Response:
    response = Response(text + "\n", status=status, mimetype="text/plain")
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="jobqueue dashboard"'
    return response


def check_request(access: Access) -> Response | None:
    """Run before every view (static files included): a response refuses the request, None lets it in."""
    if access.token is None:
        if not is_loopback(_request_hostname()):
            return _refuse(403, "this dashboard has no token, so it answers only at localhost or 127.0.0.1")
        return None
    given, from_query = _given_token()
    if not given:
        return _refuse(401, "this dashboard needs its token: open it once with ?token=... or send a Bearer header")
    if not hmac.compare_digest(given.encode(), access.token.encode()):
        return _refuse(403, "wrong dashboard token")
    if from_query and request.method == "GET":
        # Keep the token in an HttpOnly cookie and take it out of the address bar (and history).
        query = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != "token"])
        response = redirect(request.path + (f"?{query}" if query else ""), code=303)
        response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="Lax", secure=request.is_secure, path="/")
        return response
    return None


def csrf_token() -> str:
    """The session's CSRF token, made on first use; forms send it back in ``csrf_token``."""
    if CSRF_FIELD not in session:
        session[CSRF_FIELD] = secrets.token_urlsafe(32)
    return str(session[CSRF_FIELD])


def check_csrf() -> None:
    """Abort with 403 unless this POST carries the session's CSRF token."""
    expected = session.get(CSRF_FIELD)
    given = request.form.get(CSRF_FIELD, "")
    if not expected or not given or not hmac.compare_digest(given.encode(), str(expected).encode()):
        abort(403, "this form has expired or did not come from the dashboard; reload the page and try again")


def install(app: Flask, access: Access) -> None:
    """Check every request against ``access``, every POST for its CSRF token; add the safety headers."""
    app.extensions[ACCESS_EXTENSION] = access  # the server's access log masks the token wherever it shows

    @app.before_request
    def _guard() -> Response | None:
        refused = check_request(access)
        if refused is None and request.method == "POST":
            check_csrf()
        return refused

    @app.after_request
    def _headers(response: Response) -> Response:
        response.headers.update(HEADERS)
        return response

    app.jinja_env.globals["csrf_token"] = csrf_token
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax")
