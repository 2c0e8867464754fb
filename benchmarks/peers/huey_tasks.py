"""The huey worker side: ``python -m huey.bin.huey_consumer benchmarks.peers.huey_tasks.huey -k process -w N``.

Importing this module opens (and if needed creates) the SQLite file HUEY_FILE, as SqliteHuey does.
"""

from __future__ import annotations

from huey import SqliteHuey

from benchmarks.peers._common import record_start

HUEY_FILE = "/tmp/peer-huey/huey.sqlite3"

huey = SqliteHuey(name="peers", filename=HUEY_FILE)


@huey.task()  # type: ignore[untyped-decorator]
def noop() -> None:
    """The no-op job."""


@huey.task()  # type: ignore[untyped-decorator]
def probe(key: int) -> None:
    """Record when this job started, for the latency scenario."""
    record_start("huey", key)
