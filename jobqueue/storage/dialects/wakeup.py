"""How idle workers learn that new work arrived, as each database can tell them.

The supervisor of each host learns it for all its processes, and wakes one idle process per piece
of news: idle processes themselves send no statement at all, so the idle load of a host does not
grow with its number of processes, and a new job wakes one process, not all of them. Its **Waker**
is the dialect's:

- SQLite reads ``PRAGMA data_version`` (it changes whenever another connection commits, and
  reading it touches no table) every ``idle_poll_interval``;
- MySQL asks one indexed question ("is anything ready?") every ``idle_poll_interval``;
- PostgreSQL LISTENs on one connection per supervisor: an insert trigger notifies at COMMIT.

Where the news is of commits (SQLite, PostgreSQL), the supervisor also asks "is anything ready?"
every ``max_fetch_interval``: delayed jobs and retries coming due, and leases that expired, make
no commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger("jobqueue.supervisor")


class Waker:
    """The supervisor's: nothing to wait on, never says there is news."""

    def fileno(self) -> int | None:
        """A descriptor that becomes readable on news, or None."""
        return None

    def due_in(self, now: float) -> float | None:
        """Seconds until the next poll, or None when this waker does not poll."""
        return None

    def check(self, now: float) -> int:
        """Consume what arrived; how many pieces of news (0: nothing new)."""
        return 0

    def set_peers(self, rank: int, peers: int) -> None:
        """This supervisor is number ``rank`` of ``peers`` serving the same queues (for wakers
        that share out the news among them)."""

    def close(self) -> None:
        pass


class Wakers(Waker):
    """Several wakers as one: news from any of them."""

    def __init__(self, *wakers: Waker) -> None:
        self.wakers = wakers

    def fileno(self) -> int | None:
        return next((fd for fd in (w.fileno() for w in self.wakers) if fd is not None), None)

    def due_in(self, now: float) -> float | None:
        due = [d for d in (w.due_in(now) for w in self.wakers) if d is not None]
        return min(due) if due else None

    def check(self, now: float) -> int:
        return sum(w.check(now) for w in self.wakers)

    def set_peers(self, rank: int, peers: int) -> None:
        for waker in self.wakers:
            waker.set_peers(rank, peers)

    def close(self) -> None:
        for waker in self.wakers:
            waker.close()


# A failed look for due jobs is said again after this long if it goes on failing the same way.
FAILED_POLL_REPEAT_SECONDS = 60.0


class PollingWaker(Waker):
    """Ask ``poll`` every ``interval`` seconds while processes idle."""

    def __init__(self, poll: Callable[[], bool], interval: float) -> None:
        self.poll = poll
        self.interval = interval
        self.next_at = 0.0
        self.failed: tuple[str, float] | None = None  # the last failure said, and when

    def due_in(self, now: float) -> float | None:
        return max(0.0, self.next_at - now)

    def check(self, now: float) -> int:
        if now < self.next_at:
            return 0
        self.next_at = now + self.interval
        try:
            found = int(self.poll())
        except Exception as exc:
            # An outage, or a statement the database refuses (an index dropped by hand): either way
            # an idle process looks for jobs itself, and its fetch meets the same error and says so
            # (an outage as one, waited out; a refusal with its fix). Said here too, once a minute.
            cause = getattr(exc, "orig", None) or exc  # the driver's error, without the statement
            text = f"{type(cause).__name__}: {cause}"
            # Once a minute, whatever the text: an outage's errors change as it goes (closed, refused).
            if self.failed is None or now - self.failed[1] > FAILED_POLL_REPEAT_SECONDS:
                logger.warning("looking whether jobs are due failed (%s); idle worker processes look themselves", text)
                self.failed = (text, now)
            return 1
        self.failed = None
        return found
