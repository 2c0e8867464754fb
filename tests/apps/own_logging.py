"""The runtime tests' app with logging left to the application, as under Django: the command adds
no handler, so jobqueue's warnings and errors reach Python's last-resort handler on sys.stderr."""

from __future__ import annotations

from tests.apps.runtime import app

app.configure(configure_logging=False)

__all__ = ["app"]
