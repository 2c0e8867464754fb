"""The web dashboard (``jobqueue dashboard``): queues, throughput, workers and failed jobs.

Needs Flask (``pip install 'jobqueue[dashboard]'``); the rest of jobqueue never imports this
package, so the core runs without it.
"""

from __future__ import annotations

try:
    import flask  # noqa: F401 -- only to fail early with the fix
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError("the dashboard needs Flask: pip install 'jobqueue[dashboard]'", name=exc.name) from exc

from jobqueue.dashboard.app import create_app
from jobqueue.dashboard.security import check_bind
from jobqueue.dashboard.server import serve

__all__ = ["check_bind", "create_app", "serve"]
