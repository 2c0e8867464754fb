"""What a worker process shares with its supervisor: a few integers behind a lock.

The child writes what it is running (message id, lease token, hard deadline), whether it is idle,
how many jobs it has done and the ids of the messages it started whose outcome is not written yet;
the supervisor reads them to enforce time limits, release a dead child's messages (counting an
attempt only for those it started), decide when --burst is done and show progress. The lock is created anew for each
child: one killed while holding it takes it to the grave, not its replacement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

RUNNING_ID, TOKEN, DEADLINE_NS, DONE, IDLE, STARTED_COUNT = range(6)
SIZE = 6
UNKNOWN = -1  # more started ids than the list holds: count every held message as started
LOCK_TIMEOUT_SECONDS = 0.05


@dataclass(frozen=True)
class SlotView:
    running_id: int
    token: int
    deadline_ns: int
    done: int
    idle: bool


class Slot:
    def __init__(self, array: Any, started: Any, lock: Any) -> None:
        self.array = array
        self.started = started
        self.lock = lock

    @classmethod
    def create(cls, context: Any, capacity: int) -> Slot:
        # Started-but-unwritten ids: the running one, pending outcomes (flushed at ``capacity``) and
        # up to two flushes in flight (the loop's and the keeper's).
        return cls(context.Array("q", SIZE, lock=False), context.Array("q", 4 * capacity + 16, lock=False),
                   context.Lock())

    # -- the child's side --------------------------------------------------------------------------
    def start(self, message_id: int, token: int, timeout_seconds: float | None) -> None:
        deadline = time.monotonic_ns() + int(timeout_seconds * 1e9) if timeout_seconds else 0
        with self.lock:
            a = self.array
            a[RUNNING_ID], a[TOKEN], a[DEADLINE_NS], a[IDLE] = message_id, token, deadline, 0
            count = a[STARTED_COUNT]
            if count != UNKNOWN:
                if count < len(self.started):
                    self.started[count] = message_id
                    a[STARTED_COUNT] = count + 1
                else:
                    a[STARTED_COUNT] = UNKNOWN

    def set_started(self, ids: set[int]) -> None:
        with self.lock:
            if len(ids) > len(self.started):
                self.array[STARTED_COUNT] = UNKNOWN
                return
            for index, message_id in enumerate(ids):
                self.started[index] = message_id
            self.array[STARTED_COUNT] = len(ids)

    def finish(self) -> None:
        with self.lock:
            a = self.array
            a[RUNNING_ID] = a[TOKEN] = a[DEADLINE_NS] = 0
            a[DONE] += 1

    def set_idle(self, idle: bool) -> None:
        with self.lock:
            self.array[IDLE] = int(idle)

    # -- the supervisor's side ---------------------------------------------------------------------
    def read(self) -> SlotView | None:
        """A consistent view, or None if the child holds the lock too long (try again next tick)."""
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
            return None
        try:
            return self.read_raw()
        finally:
            self.lock.release()

    def started_ids(self) -> list[int] | None:
        """For a dead child: the ids it started whose outcome it never wrote; None if it lost count."""
        count = self.array[STARTED_COUNT]
        return None if count == UNKNOWN else [self.started[i] for i in range(count)]

    def read_raw(self) -> SlotView:
        """Read without the lock: for a dead child, which may have died holding it."""
        a = self.array
        return SlotView(a[RUNNING_ID], a[TOKEN], a[DEADLINE_NS], a[DONE], bool(a[IDLE]))
