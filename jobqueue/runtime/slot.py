"""What a worker process shares with its supervisor: a few integers behind a lock.

The child writes what it is running (message id, lease token, hard deadline), whether it is idle
and how many jobs it has done; the supervisor reads them to enforce time limits, release a dead
child's messages, decide when --burst is done and show progress. The lock is created anew for each
child: one killed while holding it takes it to the grave, not its replacement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

RUNNING_ID, TOKEN, DEADLINE_NS, DONE, IDLE = range(5)
SIZE = 5
LOCK_TIMEOUT_SECONDS = 0.05


@dataclass(frozen=True)
class SlotView:
    running_id: int
    token: int
    deadline_ns: int
    done: int
    idle: bool


class Slot:
    def __init__(self, array: Any, lock: Any) -> None:
        self.array = array
        self.lock = lock

    @classmethod
    def create(cls, context: Any) -> Slot:
        return cls(context.Array("q", SIZE, lock=False), context.Lock())

    # -- the child's side --------------------------------------------------------------------------
    def start(self, message_id: int, token: int, timeout_seconds: float | None) -> None:
        deadline = time.monotonic_ns() + int(timeout_seconds * 1e9) if timeout_seconds else 0
        with self.lock:
            a = self.array
            a[RUNNING_ID], a[TOKEN], a[DEADLINE_NS], a[IDLE] = message_id, token, deadline, 0

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

    def read_raw(self) -> SlotView:
        """Read without the lock: for a dead child, which may have died holding it."""
        a = self.array
        return SlotView(a[RUNNING_ID], a[TOKEN], a[DEADLINE_NS], a[DONE], bool(a[IDLE]))
