"""The pgqueuer worker side: ``python -m benchmarks.peers.pgqueuer_tasks [batch size]``.

That does what ``pgq run benchmarks.peers.pgqueuer_tasks:create_pgqueuer --batch-size N --log-level WARNING``
does (same supervisor, same event loop choice: uvloop when installed); ``pgq run`` itself fails in
pgqueuer 1.6.0 with typer 0.29 (its --log-level parser hands a str where a LogLevel is expected).
The database comes from PEERS_PGQUEUER_DSN (set by the adapter).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import Job, PgQueuer

from benchmarks.peers._common import record_start

NOOP = "peer_noop"
PROBE = "peer_probe"


async def noop(job: Job) -> None:
    """The no-op job."""


async def probe(job: Job) -> None:
    """Record when this job started (the payload is its key), for the latency scenario."""
    record_start("pgqueuer", int(job.payload or b"0"))


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` calls: one asyncpg connection, the two entrypoints."""
    connection = await asyncpg.connect(os.environ["PEERS_PGQUEUER_DSN"])
    try:
        pgq = PgQueuer.from_asyncpg_connection(connection)
        pgq.entrypoint(NOOP)(noop)
        pgq.entrypoint(PROBE)(probe)
        yield pgq
    finally:
        await connection.close()


def main(batch_size: int) -> None:
    """Run one worker as ``pgq run`` would."""
    import pgqueuer
    from pgqueuer.adapters.cli.cli import asyncio_run
    from pgqueuer.core.logconfig import LogLevel, setup_fancy_logger

    setup_fancy_logger(LogLevel.WARNING)
    asyncio_run(pgqueuer.run(create_pgqueuer, batch_size=batch_size))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
