"""``jobqueue dashboard`` as a user starts it: refusals, a token on a non-loopback address, its log."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from jobqueue.storage.engine import url_secrets
from tests.acceptance.cli import ROOT, jobqueue
from tests.conftest import only
from tests.dashboard.process import DashboardProcess

TOKEN = "a-long-enough-dashboard-token"


def status_of(request: urllib.request.Request | str, opener: urllib.request.OpenerDirector | None = None) -> int:
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_a_non_loopback_address_needs_a_token() -> None:
    refused = jobqueue("dashboard", "--host", "0.0.0.0", check=False, app=None)
    assert refused.returncode == 1
    assert refused.stderr == (
        "Error: refusing to serve the dashboard on 0.0.0.0 without a token: pass --token or set "
        "JOBQUEUE_DASHBOARD_TOKEN (or bind to 127.0.0.1)\n"
    )
    short = jobqueue("dashboard", "--host", "0.0.0.0", check=False, app=None, env={"JOBQUEUE_DASHBOARD_TOKEN": "abc"})
    assert short.returncode == 1 and "use at least 16" in short.stderr and len(short.stderr.splitlines()) == 1


def test_without_flask_the_command_names_the_extra() -> None:
    hide_flask = "import sys; sys.modules['flask'] = None; from jobqueue.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", hide_flask, "dashboard"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "install jobqueue[dashboard]" in result.stderr and len(result.stderr.splitlines()) == 1


def test_the_core_never_imports_flask() -> None:
    probe = "import sys, jobqueue, jobqueue.cli, jobqueue.app, jobqueue.runtime; print('flask' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_on_every_address_with_a_token_a_request_without_it_is_refused(db_url: str, tmp_path: Path) -> None:
    with DashboardProcess(tmp_path, "--host", "0.0.0.0", "--token", TOKEN) as dashboard:
        assert "http://0.0.0.0:" in dashboard.ready_line and "?token=..." in dashboard.ready_line
        assert status_of(dashboard.url) == 401
        assert status_of(dashboard.url + "failed?token=not-the-right-one") == 403
        bearer = urllib.request.Request(dashboard.url, headers={"Authorization": f"Bearer {TOKEN}"})
        assert status_of(bearer) == 200
        wrong = urllib.request.Request(dashboard.url, headers={"Authorization": "Bearer " + TOKEN.upper()})
        assert status_of(wrong) == 403
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        assert status_of(dashboard.url + f"?token={TOKEN}", browser) == 200  # redirected, then the cookie
        assert status_of(dashboard.url + "failed", browser) == 200
        # the parameter's name percent-encoded is read as the token too: masked all the same
        assert status_of(dashboard.url + f"failed?%74oken={TOKEN}&task=x", browser) == 200
        # Request lines no URL reading takes apart as a query (refused, 400 or 403): logged all the same.
        for line in (f"GET /?token\t={TOKEN} HTTP/1.1", f'GET /?token="{TOKEN} HTTP/1.1', f"GET /{TOKEN} HTTP/1.1"):
            raw_request(dashboard.url, line)
        log = dashboard.text()
    assert '"GET /?token=*** HTTP/1.1" 303' in log and TOKEN not in log + dashboard.ready_line
    assert '"GET /failed?%74oken=***&task=x HTTP/1.1" 303' in log
    for secret in url_secrets(db_url):
        assert f":{secret}@" not in log + dashboard.ready_line


def raw_request(url: str, line: str) -> bytes:
    """Send ``line`` as a request line, as no HTTP library would write it; the reply's first line."""
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    with socket.create_connection(("127.0.0.1" if host == "0.0.0.0" else host, int(port)), timeout=10) as conn:
        conn.sendall(f"{line}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        return conn.recv(200).split(b"\r\n")[0]


@only("sqlite")
def test_a_port_in_use_is_a_one_line_error(db_url: str, tmp_path: Path) -> None:
    with DashboardProcess(tmp_path) as first:
        port = first.url.rstrip("/").rsplit(":", 1)[1]
        second = jobqueue("dashboard", "--port", port, check=False, timeout=30)
    assert second.returncode == 1
    assert second.stderr == (
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port or --host\n"
    )


@only("sqlite")
@pytest.mark.parametrize(
    "host, reason",
    [("192.0.2.1", "Cannot assign requested address"), ("no-such-host.invalid", "not known")],
)
def test_an_address_this_host_cannot_listen_on_is_a_one_line_error_that_says_why(host: str, reason: str) -> None:
    result = jobqueue("dashboard", "--host", host, "--token", TOKEN, check=False, timeout=30)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"Error: cannot listen on {host}:8080: ") and reason in result.stderr
    assert "in use" not in result.stderr
