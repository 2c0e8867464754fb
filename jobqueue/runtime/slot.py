"""What a worker process shares with its supervisor: a few integers behind a lock.

The child writes what it is running (message id, lease token, hard deadline, since when), whether
it is idle, how many jobs it has done, the ids of the messages it started whose outcome is not
written yet, and the lease tokens of the batches still waiting in its buffer. The supervisor reads
them to enforce time limits, to charge a dead child's messages fairly (only the running one counts a
delivery), to decide when --burst is done, and to take back a buffer stuck behind a slow job.

Taking back a buffer works even while the running job holds the GIL (a long C call): the
supervisor removes the batches' tokens here, under the lock, before it returns their messages to
the queue, and the child starts a buffered message only if its token is still listed, checked under
the same lock. So a message the supervisor returned can never also be started by the child.

The supervisor also writes when it last renewed the leases of what the child holds (the monotonic
clock every process of the host shares): a child whose supervisor is stopped or stuck sees its
leases age, and stops taking work whose lease nobody would renew.

And it writes how far this host's clock is off the database server's (see jobqueue.clock): a child
takes that correction before each fetch, so that the processes of a host count due times alike.

The lock is created anew for each child: one killed while holding it takes it to the grave, not its
replacement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from jobqueue import clock

(
    RUNNING_ID,
    TOKEN,
    DEADLINE_NS,
    DONE,
    IDLE,
    STARTED_COUNT,
    RUNNING_SINCE_NS,
    TOKEN_COUNT,
    BUFFERED,
    REVOKES,
    RENEWED_NS,
    LAPSED_NS,
    CLOCK_BASE_US,
) = range(13)
SIZE = 13
UNKNOWN = -1  # more started ids than the list holds: only the running one is known
NO_READING = -(2**63)  # the clock base of a supervisor that has read no server's clock (SQLite)
MAX_BATCHES = 16  # buffered batches a child may hold (it stops fetching when they are all in use)
LOCK_TIMEOUT_SECONDS = 0.05


@dataclass(frozen=True)
class SlotView:
    running_id: int
    token: int
    deadline_ns: int
    done: int
    idle: bool
    running_since_ns: int = 0
    buffered: int = 0


@dataclass(frozen=True)
class Revoked:
    """A buffer the supervisor took back: the batches' tokens, and the ids the child had started."""

    tokens: list[int]
    started: list[int] | None


class Slot:
    def __init__(self, array: Any, started: Any, tokens: Any, lock: Any) -> None:
        self.array = array
        self.started = started
        self.tokens = tokens
        self.lock = lock
        self.seen_revokes = 0  # the child's: revocations already accounted for

    @classmethod
    def create(cls, context: Any, capacity: int) -> Slot:
        # Started-but-unwritten ids: the running one, pending outcomes (flushed at ``capacity``) and
        # up to two flushes in flight (the loop's and the keeper's).
        slot = cls(
            context.Array("q", SIZE, lock=False),
            context.Array("q", 4 * capacity + 16, lock=False),
            context.Array("q", MAX_BATCHES, lock=False),
            context.Lock(),
        )
        slot.renewed(time.monotonic_ns())  # a new child's supervisor is alive: it just forked it
        slot.set_clock_base(clock.shared())
        return slot

    # -- the child's side --------------------------------------------------------------------------
    def start(self, message_id: int, token: int, timeout_seconds: float | None, buffered: int) -> bool:
        """Mark ``message_id`` running, ``buffered`` messages left behind it; False (nothing marked)
        if the supervisor took its batch back."""
        now = time.monotonic_ns()
        deadline = now + int(timeout_seconds * 1e9) if timeout_seconds else 0
        with self.lock:
            a = self.array
            if a[REVOKES] != self.seen_revokes:
                # Taken back since: the buffer holds revoked messages first, in fetch order, then
                # any fetched after the revocation, whose batches are listed again.
                if not self._listed(token):
                    a[BUFFERED] = buffered
                    return False
                self.seen_revokes = a[REVOKES]
            a[RUNNING_ID], a[TOKEN], a[DEADLINE_NS], a[IDLE], a[RUNNING_SINCE_NS] = (
                message_id,
                token,
                deadline,
                0,
                now,
            )
            a[BUFFERED] = buffered
            count = a[STARTED_COUNT]
            if count != UNKNOWN:
                if count < len(self.started):
                    self.started[count] = message_id
                    a[STARTED_COUNT] = count + 1
                else:
                    a[STARTED_COUNT] = UNKNOWN
            return True

    def batches_full(self) -> bool:
        """True when no further buffered batch can be listed (the child then waits to fetch)."""
        return bool(self.array[TOKEN_COUNT] >= MAX_BATCHES)

    def add_batch(self, token: int, buffered: int, only: bool) -> None:
        """List a fetched batch; ``only``: the buffer held nothing else, so earlier batches are done."""
        with self.lock:
            a = self.array
            count = 0 if only else a[TOKEN_COUNT]
            self.tokens[count] = token
            a[TOKEN_COUNT] = count + 1
            a[BUFFERED] = buffered

    def listed(self, token: int) -> bool:
        with self.lock:
            return self._listed(token)

    def set_started(self, ids: set[int]) -> None:
        with self.lock:
            if len(ids) > len(self.started):
                self.array[STARTED_COUNT] = UNKNOWN
                return
            for index, message_id in enumerate(ids):
                self.started[index] = message_id
            self.array[STARTED_COUNT] = len(ids)

    def blame(self, message_id: int, token: int) -> None:
        """Mark ``message_id`` (finished) running again, as the process exits because of it: the
        supervisor charges it a delivery, as the job that killed the process."""
        with self.lock:
            self.array[RUNNING_ID], self.array[TOKEN] = message_id, token

    def finish(self) -> None:
        with self.lock:
            a = self.array
            a[RUNNING_ID] = a[TOKEN] = a[DEADLINE_NS] = a[RUNNING_SINCE_NS] = 0
            a[DONE] += 1

    def renewed_ns(self) -> int:
        """When the supervisor last renewed this child's leases (time.monotonic_ns() as it sent
        the renewal); read without the lock: one aligned 64-bit word."""
        return int(self.array[RENEWED_NS])

    def renewed_for(self, taken_ns: int) -> int:
        """When the lease of what was taken (or last renewed by the child) at ``taken_ns`` was last
        renewed: the supervisor's last renewal if later, unless the renewals lapsed since (then
        the lease may have run out, and been taken by another worker, before that renewal came)."""
        if taken_ns < self.array[LAPSED_NS]:
            return taken_ns
        return max(taken_ns, int(self.array[RENEWED_NS]))

    def clock_base(self) -> float | None:
        """The supervisor's reading of the server's clock, as :func:`jobqueue.clock.follow` takes it
        (read without the lock: one word)."""
        base = int(self.array[CLOCK_BASE_US])
        return None if base == NO_READING else base / 1e6

    def set_idle(self, idle: bool) -> None:
        with self.lock:
            self.array[IDLE] = int(idle)

    def _listed(self, token: int) -> bool:
        tokens = self.tokens
        return any(tokens[i] == token for i in range(self.array[TOKEN_COUNT]))

    # -- the supervisor's side ---------------------------------------------------------------------
    def read(self) -> SlotView | None:
        """A consistent view, or None if the child holds the lock too long (try again next tick)."""
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
            return None
        try:
            return self.read_raw()
        finally:
            self.lock.release()

    def revoke_buffer(self, slow_since_ns: int) -> Revoked | None:
        """Take back the buffered batches if a job has been running since before ``slow_since_ns``.

        Returns the tokens taken and the ids started under them, or None (nothing to take, or the
        lock is busy: try again next tick).
        """
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
            return None
        try:
            a = self.array
            if (
                not a[RUNNING_ID]
                or not a[BUFFERED]
                or a[RUNNING_SINCE_NS] > slow_since_ns
                or a[STARTED_COUNT] == UNKNOWN
            ):  # without the started ids, nothing could be released
                return None
            tokens = [self.tokens[i] for i in range(a[TOKEN_COUNT])]
            a[TOKEN_COUNT] = a[BUFFERED] = 0
            a[REVOKES] += 1
            return Revoked(tokens, self.started_ids())
        finally:
            self.lock.release()

    def renewed(self, sent_ns: int, lapsed: bool = False) -> None:
        """Say that the leases of everything the child held at ``sent_ns`` were renewed, or with
        ``lapsed`` that the renewals stopped for longer than a lease before that: what the child
        held may have been released meanwhile, and is not vouched for (written without the lock:
        aligned 64-bit words, which only the supervisor writes)."""
        if lapsed:
            self.array[LAPSED_NS] = sent_ns
        self.array[RENEWED_NS] = sent_ns

    def set_clock_base(self, base: float | None) -> None:
        """Tell the child the supervisor's reading of the server's clock (written without the lock)."""
        self.array[CLOCK_BASE_US] = NO_READING if base is None else round(base * 1e6)

    def started_ids(self) -> list[int] | None:
        """The ids the child started whose outcome it never wrote; None if it lost count."""
        count = self.array[STARTED_COUNT]
        return None if count == UNKNOWN else [self.started[i] for i in range(count)]

    def read_raw(self) -> SlotView:
        """Read without the lock: for a dead child, which may have died holding it."""
        a = self.array
        return SlotView(
            a[RUNNING_ID], a[TOKEN], a[DEADLINE_NS], a[DONE], bool(a[IDLE]), a[RUNNING_SINCE_NS], a[BUFFERED]
        )
