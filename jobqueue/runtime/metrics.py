"""Prometheus metrics of one supervisor and its worker processes (``jobqueue worker --metrics-port``).

Worker processes count what they do in prometheus_client's multiprocess files, in a directory of
the supervisor's own: a process that dies (a crash, SIGKILL, recycling) leaves its counts there, so
totals survive restarts. The supervisor serves them summed, with what it reads at scrape time: the
depth and oldest ready age of each queue, and its processes busy or idle.

Needs the ``prometheus_client`` package (``pip install 'jobqueue[metrics]'``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from jobqueue.errors import ConfigurationError
from jobqueue.job import Outcome, OutcomeKind
from jobqueue.storage import jobs as job_queries

if TYPE_CHECKING:
    from jobqueue.storage.store import Store

logger = logging.getLogger("jobqueue.supervisor")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A scrape reads the queues at most this often; more frequent scrapes get the last figures.
QUEUE_READ_SECONDS = 5.0
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

# The metrics of this process tree, once the supervisor started them; None costs the hot path a test.
active: Metrics | None = None


class Metrics:
    """The counters every process of the tree writes, and the supervisor's HTTP endpoint."""

    def __init__(self, directory: str) -> None:
        from prometheus_client import Counter, Histogram

        self.directory = directory
        self.jobs = Counter(
            "jobqueue_jobs",
            "Job outcomes written, by task, queue and outcome.",
            ["task", "queue", "outcome"],
            registry=None,
        )
        self.duration = Histogram(
            "jobqueue_job_duration_seconds",
            "Run time of jobs' handlers, by task.",
            ["task"],
            buckets=DURATION_BUCKETS,
            registry=None,
        )
        self.lease_lost = Counter(
            "jobqueue_lease_lost",
            "Outcomes dropped because the job's lease was lost meanwhile, by task.",
            ["task"],
            registry=None,
        )
        self.restarts = Counter(
            "jobqueue_child_restarts",
            "Worker processes that ended and were replaced, by cause.",
            ["cause"],
            registry=None,
        )
        self.server: Any = None

    def written(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            m = outcome.message
            if outcome.kind is OutcomeKind.RETURN:
                continue
            self.jobs.labels(m.task_name, m.queue, outcome.name).inc()
            if outcome.duration_seconds is not None:
                self.duration.labels(m.task_name).observe(outcome.duration_seconds)

    def lost(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.kind is not OutcomeKind.RETURN:
                self.lease_lost.labels(outcome.message.task_name).inc()

    def serve(self, host: str, port: int, store: Store, processes: Callable[[], dict[str, int]]) -> None:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        registry.register(QueueCollector(store, processes))
        try:
            self.server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc}; choose a free port with --metrics-port"
            ) from exc
        logger.info("Prometheus metrics on http://%s:%s/metrics", host, port)

    def in_child(self) -> None:
        """In a forked worker process: let go of the supervisor's listening socket."""
        if self.server is not None:
            self.server.socket.close()
            self.server = None

    def process_died(self, pid: int | None, cause: str) -> None:
        from prometheus_client import multiprocess

        self.restarts.labels(cause).inc()
        if pid:
            multiprocess.mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)


class QueueCollector:
    """What the supervisor reads when scraped: queue depth by state, oldest ready age, processes."""

    def __init__(self, store: Store, processes: Callable[[], dict[str, int]]) -> None:
        self.store = store
        self.processes = processes
        self.read_at = 0.0
        self.queues: list[dict[str, Any]] = []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        if time.monotonic() - self.read_at >= QUEUE_READ_SECONDS:
            try:
                self.queues = job_queries.queue_counts(self.store)
                self.read_at = time.monotonic()
            except Exception as exc:  # a scrape during an outage shows the last figures
                logger.warning("metrics: could not read the queues: %s", exc)
        depth = GaugeMetricFamily("jobqueue_queue_depth", "Messages per queue and state.", labels=["queue", "state"])
        oldest = GaugeMetricFamily(
            "jobqueue_queue_oldest_ready_seconds", "Age of the oldest ready message, per queue.", labels=["queue"]
        )
        for row in self.queues:
            for state in job_queries.QUEUE_STATES:
                depth.add_metric([row["queue"], state], row[state])
            if row.get(job_queries.UNKNOWN_STATE):  # rows edited by hand into a state no worker takes
                depth.add_metric([row["queue"], job_queries.UNKNOWN_STATE], row[job_queries.UNKNOWN_STATE])
            oldest.add_metric([row["queue"]], row["oldest_ready_seconds"] or 0.0)
        workers = GaugeMetricFamily(
            "jobqueue_worker_processes", "This supervisor's worker processes, busy or idle.", labels=["state"]
        )
        for state, count in self.processes().items():
            workers.add_metric([state], count)
        yield from (depth, oldest, workers)


def start(host: str, port: int, store: Store, processes: Callable[[], dict[str, int]]) -> Metrics:
    """Start counting in this process tree and serve the metrics; call before forking."""
    global active
    try:
        import prometheus_client.values as values
    except ImportError:
        raise ConfigurationError(
            "--metrics-port needs the prometheus_client package: pip install 'jobqueue[metrics]'"
        ) from None
    directory = tempfile.mkdtemp(prefix="jobqueue-metrics-")
    os.environ[MULTIPROC_ENV] = directory
    # prometheus_client picks single- or multi-process values when first imported; the app may have
    # imported it before this point, so pick again now that the directory is known.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    metrics = Metrics(directory)
    try:
        metrics.serve(host, port, store, processes)
    except BaseException:
        metrics.close()
        raise
    active = metrics
    return metrics
