"""The procrastinate worker side: ``python -m procrastinate --app=benchmarks.peers.procrastinate_tasks.app worker``.

The database comes from PEERS_PROCRASTINATE_DSN (set by the adapter); the connector opens nothing until used.
"""

from __future__ import annotations

import os

import procrastinate

from benchmarks.peers._common import record_start

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("PEERS_PROCRASTINATE_DSN", "")),
)


@app.task(name="peer_noop")
async def noop() -> None:
    """The no-op job."""


@app.task(name="peer_probe")
async def probe(key: int) -> None:
    """Record when this job started, for the latency scenario."""
    record_start("procrastinate", key)
