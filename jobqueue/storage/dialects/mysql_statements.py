"""MySQL and MariaDB: statements run on the driver, its error codes, and max_allowed_packet.

A statement over the server's max_allowed_packet is not refused with a reason: the server drops
the connection. So values are measured before they are sent: one too large even alone is refused
with SerializationError naming the setting, and rows and outcomes go in runs whose statements stay
well under it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import sqlalchemy as sa

from jobqueue.errors import SerializationError
from jobqueue.job import Outcome

T = TypeVar("T")
Runner = Callable[[str, tuple[Any, ...]], Any]  # runs a statement with its parameters
PACKET_OVERHEAD_PER_ROW = 1024  # the SQL text and the fixed columns of one row, generously
STATEMENT_OVERHEAD = 8192  # the rest of a statement that carries one large value, generously
# The bytes the client escapes with a backslash in a statement's text (mysql_real_escape_string).
_ESCAPED = (b"\0", b"'", b'"', b"\\", b"\n", b"\r", b"\x1a")


def mysql_code(exc: BaseException) -> int | None:
    """The server's or the client library's error number in ``exc`` (or the driver error it wraps)."""
    orig = getattr(exc, "orig", None) or exc
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def connection_runner(connection: sa.Connection) -> Runner:
    return lambda sql, params: connection.exec_driver_sql(sql, params)


def cursor_runner(cursor: Any) -> Runner:
    def run(sql: str, params: tuple[Any, ...]) -> Any:
        cursor.execute(sql, params)
        return cursor

    return run


def outcome_bytes(outcome: Outcome) -> int:
    """An outcome's values in bytes, at most (before escaping)."""
    error = outcome.error
    return (
        len(outcome.result or b"")
        + len(outcome.checkpoint or b"")
        + (len(error.message) + len(error.traceback or "") if error else 0) * 4
    )  # utf8mb4


def escaped_length(value: bytes | str | None) -> int:
    """How many bytes ``value`` takes in a statement's text, escaped."""
    if not value:
        return 0
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    return len(data) + sum(data.count(byte) for byte in _ESCAPED)


def outcome_length(outcome: Outcome) -> int:
    """How many bytes an outcome's own values take in the statements of a flush."""
    error = outcome.error
    texts = escaped_length(error.message) + escaped_length(error.traceback) if error else 0
    return escaped_length(outcome.result) + escaped_length(outcome.checkpoint) + texts


class PacketLimit:
    """The server's max_allowed_packet, and what fits under it."""

    def __init__(self) -> None:
        self._max_packet: int | None = None

    def limit(self, run: Runner) -> int:
        """The server's max_allowed_packet, asked once per process."""
        if self._max_packet is None:
            # Read once per process: changing it on a running server is rare, and a statement over
            # it anyway is refused on its own (the rest of a flush is still written).
            self._max_packet = int(run("SELECT @@max_allowed_packet", ()).fetchone()[0] or 0)
        return self._max_packet

    def check_fits(
        self, run: Runner, what: str, length: Callable[[], int], size: int, instead: str = "pass a reference"
    ) -> None:
        """Refuse, before sending it, a value the server would refuse: a statement over its
        max_allowed_packet is not an error the server names, it drops the connection. ``size`` is
        the value's length in bytes, or more (escaping at most doubles it); ``length()`` its
        escaped length, worked out only for values that might not fit. ``instead``: what the job
        does with a reference to data stored elsewhere."""
        limit = self.limit(run)
        if not limit or size + STATEMENT_OVERHEAD <= limit // 2:  # escaped, at most twice as long
            return
        escaped = length() + STATEMENT_OVERHEAD
        if escaped > limit:
            raise SerializationError(
                f"{what} {escaped:,} bytes once escaped into a statement, over this server's "
                f"max_allowed_packet ({limit:,} bytes): raise max_allowed_packet on the MySQL or MariaDB "
                f"server, or store large data elsewhere and {instead}"
            )

    def check_payloads(self, run: Runner, payloads: list[bytes], what: str = "the job's arguments take") -> None:
        for payload in payloads:
            self.check_fits(run, what, partial(escaped_length, payload), len(payload))

    def check_outcome(self, run: Runner, outcome: Outcome) -> None:
        self.check_fits(run, "the job's outcome takes", partial(outcome_length, outcome), outcome_bytes(outcome))

    def check_checkpoint(self, run: Runner, checkpoint: bytes) -> None:
        length = partial(escaped_length, checkpoint)
        self.check_fits(run, "the job's checkpoint takes", length, len(checkpoint), "save a reference")

    def packets(self, run: Runner, items: list[T], size: Callable[[T], int]) -> Iterator[list[T]]:
        """``items`` in runs whose statements stay well under the server's max_allowed_packet."""
        if not items:
            return
        budget = max(self.limit(run) // 2, 1)  # escaping can double binary data
        chunk: list[T] = []
        used = 0
        for item in items:
            cost = size(item) + PACKET_OVERHEAD_PER_ROW
            if chunk and used + cost > budget:
                yield chunk
                chunk, used = [], 0
            chunk.append(item)
            used += cost
        yield chunk
