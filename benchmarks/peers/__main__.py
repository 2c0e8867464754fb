"""``python -m benchmarks.peers [peer ...]``: every adapter function once per available peer, as JSON lines.

Options (environment): PEERS_JOBS (10000), PEERS_PROCESSES (2), PEERS_SINGLE (1000), PEERS_LATENCY (100),
PEERS_POSTGRES_URL (the server; default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.peers import PEERS, available


def main(names: list[str]) -> None:
    jobs = int(os.environ.get("PEERS_JOBS", "10000"))
    processes = int(os.environ.get("PEERS_PROCESSES", "2"))
    single = int(os.environ.get("PEERS_SINGLE", "1000"))
    probes = int(os.environ.get("PEERS_LATENCY", "100"))
    for name in names or available():
        peer = PEERS[name]
        peer.setup(os.environ.get("PEERS_POSTGRES_URL"))
        result = {
            "peer": peer.NAME,
            "jobs": jobs,
            "processes": processes,
            "processing": peer.processing(jobs, processes),
            "enqueue_single": peer.enqueue_single(single),
            "enqueue_bulk": peer.enqueue_bulk(jobs),
        }
        result["latency_p50_ms"], result["latency_p99_ms"] = peer.latency(probes)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
