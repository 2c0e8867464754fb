"""python -m benchmarks SCENARIO [--backend B ...] [--runs N] [--jobs N] [--processes N] [--json PATH]"""

from __future__ import annotations

import argparse
import logging

from benchmarks.common import BACKENDS, database_url
from benchmarks.scenarios import SCENARIOS


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("scenario", choices=sorted(SCENARIOS) + ["all"])
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeatable; default: all three")
    parser.add_argument("--runs", type=int, default=5, help="rounds; the median is reported (default 5)")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per run (default 10,000)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--json", dest="json_path", help="append one JSON object per result to this file")
    parser.add_argument(
        "--worker-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="passed to `jobqueue worker`, e.g. --worker-option=--fetch-batch-size=500",
    )
    options = parser.parse_args()
    from benchmarks import scenarios

    scenarios.WORKER_OPTIONS[:] = options.worker_option
    logging.basicConfig(level=logging.WARNING)
    scenarios = sorted(SCENARIOS) if options.scenario == "all" else [options.scenario]
    for backend in options.backend or BACKENDS:
        url = database_url(backend)
        for name in scenarios:
            SCENARIOS[name](url, backend, options.runs, options.jobs, options.processes, options.json_path)


if __name__ == "__main__":
    main()
