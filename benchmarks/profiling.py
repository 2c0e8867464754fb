"""Profile every worker process of a benchmark worker (JOBQUEUE_BENCH_PROFILE=directory).

Each process runs under cProfile from its start to its shutdown and writes ``<directory>/<pid>.prof``;
read them with ``python -m benchmarks.profiling DIRECTORY`` (the 30 costliest functions, all
processes together).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from pathlib import Path
from typing import Any

from jobqueue import signals


def install(directory: str) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)
    profiler = cProfile.Profile()

    @signals.worker_process_init.connect
    def start(**kwargs: Any) -> None:
        profiler.enable()

    @signals.worker_process_shutdown.connect
    def stop(**kwargs: Any) -> None:
        profiler.disable()
        profiler.dump_stats(os.path.join(directory, f"{os.getpid()}.prof"))


def main(directory: str, sort: str = "tottime", count: int = 30) -> None:
    files = sorted(str(p) for p in Path(directory).glob("*.prof"))
    stats = pstats.Stats(*files)
    stats.sort_stats(sort).print_stats(count)


if __name__ == "__main__":
    main(sys.argv[1], *(sys.argv[2:3] or []))
