"""One frozen Settings object: the single source for JobQueue keywords, CLI options and integrations.

Each field's metadata carries its help text, which the CLI turns into ``jobqueue worker`` options
(``fetch_batch_size`` becomes ``--fetch-batch-size``), so a parameter is defined exactly once.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jobqueue.errors import ConfigurationError

DEFAULT_DATABASE_URL = "sqlite:///jobqueue.sqlite3"
MAX_LEASE_SECONDS = 365 * 86400
# A fetch takes at most this many messages in one statement, and a process holds at most
# MAX_BUFFERED unstarted: each process's shared bookkeeping is sized by what it may hold.
MAX_FETCH_BATCH_SIZE = 10_000
MAX_BUFFERED = 100_000
# Worker processes one supervisor forks: enough for hundreds on one host, and a typo such as
# -c 10000 is refused instead of forking ten thousand processes (each with its database
# connections and about 45 MiB of memory).
MAX_CONCURRENCY = 1024
DATABASE_URL_ENV = "JOBQUEUE_DATABASE_URL"
LISTEN_DATABASE_URL_ENV = "JOBQUEUE_LISTEN_DATABASE_URL"
APP_ENV = "JOBQUEUE_APP"
DASHBOARD_TOKEN_ENV = "JOBQUEUE_DASHBOARD_TOKEN"
# The least pause between two looks of a loop that polls (fetches, checks for news, releases).
MIN_POLL_SECONDS = 0.01

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}$")
TABLE_PREFIX = re.compile(r"^[a-z][a-z0-9_]{0,30}$")


def _opt(default: Any, help: str, worker: bool = True) -> Any:
    return field(default=default, metadata={"help": help, "worker": worker})


@dataclass(frozen=True)
class Settings:
    """Every tunable parameter, with its default and the reason for it (see docs/configuration.md)."""

    database_url: str | None = _opt(
        None, "Database URL (see 'jobqueue --help' for the order of precedence).", worker=False
    )
    table_prefix: str = _opt("jobqueue_", "Prefix of the jobqueue table names.", worker=False)
    serializer: str = _opt("json", "Payload serializer: json (safe default) or pickle (unsafe opt-in).", worker=False)
    default_queue: str = _opt("default", "Queue of tasks that do not name one.", worker=False)
    max_payload_bytes: int = _opt(1_048_576, "Largest serialized arguments or result accepted.", worker=False)
    configure_logging: bool | None = _opt(
        None,
        "Whether the jobqueue command sets up logging (stderr, text or --log-json); "
        "default yes, except under Django, whose LOGGING is kept.",
        worker=False,
    )
    concurrency: int | None = _opt(
        None,
        f"Worker processes to fork (default: CPU count; at most {MAX_CONCURRENCY}, run more supervisors for more).",
    )
    queues: tuple[str, ...] | None = _opt(None, "Queues to serve, comma-separated (default: every queue).")
    groups: tuple[str, ...] | None = _opt(
        None, "Consumer groups to run, comma-separated, as group or topic:group (default: every group of the app)."
    )
    fetch_batch_size: int = _opt(500, "Most messages one fetch acquires (adapted down for slow jobs).")
    overfetch_factor: float = _opt(1.0, "Buffer capacity as a multiple of fetch_batch_size.")
    min_fetch_interval: float = _opt(0.0, "Seconds between fetches while fetches come back full.")
    max_fetch_interval: float = _opt(1.0, "Seconds between fetches while the queues are empty (polling).")
    idle_poll_interval: float = _opt(
        0.05,
        "Seconds between the supervisor's checks for new work while its "
        "processes idle (SQLite, MySQL; PostgreSQL is notified).",
    )
    listen_database_url: str | None = _opt(
        None,
        "PostgreSQL: a direct connection (not a pooler in transaction mode) on which the supervisor "
        "LISTENs for new jobs (or JOBQUEUE_LISTEN_DATABASE_URL; default: the database URL).",
    )
    flush_interval: float = _opt(0.5, "Most seconds an outcome waits in the buffer before it is written.")
    release_stuck_interval: float = _opt(5.0, "Seconds between scans for expired leases.")
    release_stuck_timeout: float = _opt(30.0, "Lease (visibility timeout) in seconds, renewed by heartbeats.")
    max_deliveries: int = _opt(10, "Deliveries after which a message is failed without running (poison).")
    graceful_timeout: float = _opt(30.0, "Seconds running jobs get to finish after SIGTERM.")
    max_tasks_per_child: int | None = _opt(None, "Replace a worker process after this many jobs.")
    max_memory_per_child: int | None = _opt(None, "Replace a worker process whose RSS passes this many KiB.")
    metrics_port: int | None = _opt(None, "Serve Prometheus metrics of this supervisor's processes on this port.")
    metrics_host: str = _opt("0.0.0.0", "Address the metrics are served on (with --metrics-port).")
    retain_in_archive_on_ack: bool = _opt(True, "Keep COMPLETED jobs in the archive table.")
    retain_in_archive_on_reject: bool = _opt(True, "Keep FAILED jobs in the archive table (dead letters).")

    def __post_init__(self) -> None:
        self._validate()

    def __repr__(self) -> str:
        from jobqueue.storage.engine import mask_url  # storage imports settings

        fields = ", ".join(
            f"{f.name}={mask_url(value) if f.name.endswith('database_url') and value else value!r}"
            for f in dataclasses.fields(self)
            for value in [getattr(self, f.name)]
        )
        return f"Settings({fields})"

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied, naming any unknown key."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ConfigurationError(f"unknown setting(s): {', '.join(unknown)}; known: {', '.join(setting_names())}")
        return dataclasses.replace(self, **changes)

    def _validate(self) -> None:
        self._check_kinds()
        positive = ("fetch_batch_size", "max_deliveries")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")
        for name in (
            "min_fetch_interval",
            "max_fetch_interval",
            "idle_poll_interval",
            "flush_interval",
            "release_stuck_interval",
            "release_stuck_timeout",
            "graceful_timeout",
        ):
            value = getattr(self, name)
            if not _finite_number(value) or value < 0:
                raise ConfigurationError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        for name in ("max_fetch_interval", "idle_poll_interval", "release_stuck_interval"):
            if getattr(self, name) < MIN_POLL_SECONDS:
                raise ConfigurationError(
                    f"{name} must be at least {MIN_POLL_SECONDS} seconds, got {getattr(self, name)!r}: it paces a "
                    "loop that looks again after it, which would otherwise spin a CPU"
                )
        if self.release_stuck_timeout < 1:
            raise ConfigurationError("release_stuck_timeout must be at least 1 second (heartbeats run every third)")
        if self.release_stuck_timeout > MAX_LEASE_SECONDS:
            # A lease is a date in the database: one past the year 9999 fails every acquisition.
            raise ConfigurationError(
                f"release_stuck_timeout must be at most {MAX_LEASE_SECONDS} seconds (a year), got "
                f"{self.release_stuck_timeout!r}; it is how long a dead worker's jobs wait before they run again"
            )
        if self.min_fetch_interval > self.max_fetch_interval:
            raise ConfigurationError(
                f"min_fetch_interval must not exceed max_fetch_interval, got {self.min_fetch_interval!r} and "
                f"{self.max_fetch_interval!r}"
            )
        if not _finite_number(self.overfetch_factor) or self.overfetch_factor < 1:
            raise ConfigurationError(f"overfetch_factor must be a finite number >= 1, got {self.overfetch_factor!r}")
        if self.fetch_batch_size > MAX_FETCH_BATCH_SIZE:
            # One statement takes the batch; each process keeps shared bookkeeping sized by it.
            raise ConfigurationError(
                f"fetch_batch_size must be at most {MAX_FETCH_BATCH_SIZE}, got {self.fetch_batch_size!r}; "
                "larger batches gain nothing (500 already makes a fetch's cost per job small)"
            )
        if self.fetch_batch_size * self.overfetch_factor > MAX_BUFFERED:
            raise ConfigurationError(
                f"fetch_batch_size x overfetch_factor (the messages a process may hold unstarted) must be at most "
                f"{MAX_BUFFERED}, got {self.fetch_batch_size} x {self.overfetch_factor!r}; lower overfetch_factor"
            )
        if self.metrics_port is not None and (
            not isinstance(self.metrics_port, int) or not 0 < self.metrics_port < 65536
        ):
            raise ConfigurationError(f"metrics_port must be a TCP port (1-65535) or None, got {self.metrics_port!r}")
        for name in ("concurrency", "max_tasks_per_child", "max_memory_per_child"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"{name} must be an integer >= 1 or None, got {value!r}")
        if self.concurrency is not None and self.concurrency > MAX_CONCURRENCY:
            raise ConfigurationError(
                f"concurrency must be at most {MAX_CONCURRENCY} worker processes per supervisor, got "
                f"{self.concurrency!r}; for more processes run more supervisors (on more hosts, or several "
                "on one), each with its own --concurrency"
            )
        if not TABLE_PREFIX.fullmatch(self.table_prefix):
            raise ConfigurationError(
                f"table_prefix {self.table_prefix!r} is invalid: use lower-case letters, digits and _, "
                "starting with a letter, at most 31 characters (for example 'jobqueue_')"
            )
        validate_queue_name(self.default_queue)
        for queue in self.queues or ():
            validate_queue_name(queue)
        if self.queues is not None and not self.queues:
            raise ConfigurationError("queues must name at least one queue, or be None to serve every queue")
        if self.max_payload_bytes < 1024:
            raise ConfigurationError("max_payload_bytes must be at least 1024")

    def _check_kinds(self) -> None:
        """Each value is of its field's kind: ``concurrency=True`` would fork one process and
        ``retain_in_archive_on_ack="false"`` keep every job, as Python reads them."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            optional = f.type.endswith("| None")
            kind = f.type.removesuffix("| None").strip()
            if value is None and optional or kind not in _KINDS or f.name.endswith("database_url"):
                continue  # (a URL may be given as SQLAlchemy's URL object too)
            types, what = _KINDS[kind]
            if isinstance(value, bool) is not (kind == "bool") or not isinstance(value, types):
                raise ConfigurationError(
                    f"{f.name} must be {what}{' or None' if optional else ''}, got {type(value).__name__} {value!r}"
                )

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between lease renewals: a third of the lease, so two may be missed safely."""
        return self.release_stuck_timeout / 3

    @property
    def worker_stale_after(self) -> float:
        """Seconds without a heartbeat after which a worker process is reported stale: the lease,
        so three heartbeats in a row were missed and the leases it held have expired."""
        return self.release_stuck_timeout

    @property
    def effective_concurrency(self) -> int:
        return self.concurrency or os.cpu_count() or 1


# A field's declared kind: the types its value may have, and how a message names them.
_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "bool": (bool, "True or False"),
    "int": (int, "an integer"),
    "float": ((int, float), "a number"),
    "str": (str, "a string"),
}


def _finite_number(value: Any) -> bool:
    """An int or float that is neither NaN nor infinite (NaN passes every "at least" check)."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def setting_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Settings)]


def worker_fields() -> list[dataclasses.Field[Any]]:
    """The settings a ``jobqueue worker`` option can override."""
    return [f for f in dataclasses.fields(Settings) if f.metadata.get("worker")]


def validate_queue_name(queue: Any) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
        raise ConfigurationError(
            f"invalid queue name {queue!r}: use 1 to 100 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or digit"
        )
    return queue


def parse_queues(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Turn ``"a,b"`` or a sequence into a validated tuple; None or empty means every queue."""
    if value is None:
        return None
    items = names_given("queues", value)
    queues = tuple(dict.fromkeys(item.strip() for item in items if item.strip()))
    return tuple(validate_queue_name(q) for q in queues) or None


def names_given(setting: str, value: Any) -> list[str]:
    """The names in ``value``, a comma-separated string or a sequence of strings; ConfigurationError
    for anything else (an int, bytes, a list holding a number)."""
    if isinstance(value, str):
        return value.split(",")
    if not isinstance(value, (bytes, bytearray)) and isinstance(value, Iterable):
        items = list(value)
        if all(isinstance(item, str) for item in items):
            return items
    raise ConfigurationError(
        f"{setting} must be a comma-separated string or a list of names, got {type(value).__name__} {value!r}"
    )


def resolve_listen_url(settings: Settings) -> str | None:
    """Where a supervisor LISTENs, first found wins: --listen-database-url (or the setting given in
    code, which the option overrides), JOBQUEUE_LISTEN_DATABASE_URL; None: the database URL itself."""
    return settings.listen_database_url or os.environ.get(LISTEN_DATABASE_URL_ENV) or None


def resolve_database_url(option_url: str | None, given_url: str | None) -> str:
    """The database URL, first found wins: --database-url, JOBQUEUE_DATABASE_URL, the URL given in code,
    then ``sqlite:///jobqueue.sqlite3``."""
    return option_url or os.environ.get(DATABASE_URL_ENV) or given_url or DEFAULT_DATABASE_URL
