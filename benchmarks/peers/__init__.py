"""Benchmark adapters for peer job queues (pgqueuer, procrastinate, huey), run side by side with jobqueue.

Importing this package imports no peer library: each adapter imports its library inside its functions.
See README.md in this directory for how each peer is run.
"""

from __future__ import annotations

from types import ModuleType

from benchmarks.peers import huey_peer, pgqueuer_peer, procrastinate_peer

PEERS: dict[str, ModuleType] = {
    "pgqueuer": pgqueuer_peer,
    "procrastinate": procrastinate_peer,
    "huey": huey_peer,
}


def available() -> list[str]:
    """The names in PEERS whose library imports."""
    return [name for name, module in PEERS.items() if module.available()]


__all__ = ["PEERS", "available"]
