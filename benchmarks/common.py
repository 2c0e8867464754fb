"""What every scenario shares: databases, timing, medians, output."""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

# The login scripts/test.sh creates; override with JOBQUEUE_BENCH_<BACKEND>_URL.
ADMIN_URLS = {
    "postgresql": os.environ.get(
        "JOBQUEUE_BENCH_POSTGRESQL_URL", "postgresql+psycopg2://jobqueue_test:jobqueue_test@127.0.0.1:5432/postgres"
    ),
    "mysql": os.environ.get("JOBQUEUE_BENCH_MYSQL_URL", "mysql+mysqldb://jobqueue_test:jobqueue_test@127.0.0.1:3306/"),
}


def _bench_database() -> str:
    """``JOBQUEUE_BENCH_DATABASE``, else one database per checkout (``jobqueue_test_bench_<its
    folder>``, inside the test login's grant): two checkouts benchmarking at once on one server
    must not empty each other's tables."""
    root = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.environ.get("JOBQUEUE_BENCH_DATABASE") or ("jobqueue_test_bench_" + re.sub(r"\W", "_", root.lower()))[:60]


BENCH_DATABASE = _bench_database()
BACKENDS = ("sqlite", "postgresql", "mysql")


def database_url(backend: str) -> str:
    """A database of the benchmarks' own on ``backend`` (created if missing; emptied by each scenario)."""
    if backend == "sqlite":
        os.makedirs("benchmarks/results", exist_ok=True)
        return "sqlite:///benchmarks/results/bench.sqlite3"
    admin = ADMIN_URLS[backend]
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        if backend == "postgresql":
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": BENCH_DATABASE}
            ).first()
            if not exists:
                conn.execute(sa.text(f"CREATE DATABASE {BENCH_DATABASE}"))
        else:
            conn.execute(sa.text(f"CREATE DATABASE IF NOT EXISTS {BENCH_DATABASE} CHARACTER SET utf8mb4"))
    engine.dispose()
    return sa.make_url(admin).set(database=BENCH_DATABASE).render_as_string(hide_password=False)


@dataclass
class Measure:
    """Repeated measurements of one figure; the median is what is reported."""

    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    higher_is_better: bool = True

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "median": self.median, "runs": self.values}


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def interleave(runs: int, variants: dict[str, Callable[[], float]], units: dict[str, str]) -> list[Measure]:
    """Run every variant once per round, ``runs`` rounds: on a noisy machine each round's figures
    share its conditions, so ratios between variants hold even when absolute figures swing."""
    measures = {name: Measure(name, units[name]) for name in variants}
    for round_number in range(runs):
        for name, variant in variants.items():
            measures[name].values.append(variant())
        print(
            f"  round {round_number + 1}/{runs}: " + ", ".join(f"{n} {m.values[-1]:,.0f}" for n, m in measures.items()),
            file=sys.stderr,
        )
    return list(measures.values())


def report(
    title: str,
    backend: str,
    measures: list[Measure],
    ratios: dict[str, tuple[str, str]],
    extra: dict[str, Any] | None = None,
    json_path: str | None = None,
) -> dict[str, Any]:
    """Print a table (medians and ratios) and return (and optionally save) the JSON form."""
    by_name = {m.name: m for m in measures}
    print(f"\n{title} on {backend} (median of {len(measures[0].values)} runs)")
    width = max(len(m.name) for m in measures) + 2
    for m in measures:
        print(f"  {m.name:<{width}} {m.median:>12,.1f} {m.unit}")
    ratio_values = {}
    for label, (a, b) in ratios.items():
        ratio_values[label] = by_name[a].median / by_name[b].median
        print(f"  {label:<{width}} {ratio_values[label]:>12.2f}x")
    data = {
        "scenario": title,
        "backend": backend,
        "measures": [m.as_dict() for m in measures],
        "ratios": ratio_values,
        "machine": machine(),
        **(extra or {}),
    }
    if json_path:
        with open(json_path, "a") as out:
            out.write(json.dumps(data) + "\n")
    return data


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": sys.platform, "load": os.getloadavg()}
