"""A few integers a worker process shares with its supervisor, written with a sequence lock.

The child writes what it is running (message id, lease token, hard deadline) and how many jobs it
has done; the supervisor reads them to enforce time limits, release a dead child's messages and
show progress. A seqlock (odd while writing) gives consistent reads without a lock the child could
die holding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

SEQ, RUNNING_ID, TOKEN, DEADLINE_NS, DONE, IDLE = range(6)
SIZE = 6


@dataclass(frozen=True)
class SlotView:
    running_id: int
    token: int
    deadline_ns: int
    done: int
    idle: bool


class Slot:
    def __init__(self, array: Any) -> None:
        self.array = array

    @classmethod
    def create(cls, context: Any) -> Slot:
        return cls(context.Array("q", SIZE, lock=False))

    def _write(self, **values: int) -> None:
        array = self.array
        array[SEQ] += 1  # odd: a write is under way
        for name, value in values.items():
            array[_INDEX[name]] = value
        array[SEQ] += 1

    def start(self, message_id: int, token: int, timeout_seconds: float | None) -> None:
        deadline = time.monotonic_ns() + int(timeout_seconds * 1e9) if timeout_seconds else 0
        self._write(running_id=message_id, token=token, deadline_ns=deadline, idle=0)

    def finish(self) -> None:
        self._write(running_id=0, token=0, deadline_ns=0, done=self.array[DONE] + 1)

    def set_idle(self, idle: bool) -> None:
        self._write(idle=int(idle))

    def read(self) -> SlotView:
        array = self.array
        while True:
            seq = array[SEQ]
            if seq % 2 == 0:
                view = SlotView(array[RUNNING_ID], array[TOKEN], array[DEADLINE_NS], array[DONE], bool(array[IDLE]))
                if array[SEQ] == seq:
                    return view
            time.sleep(0)

    def read_raw(self) -> SlotView:
        """Read without the seqlock: for a dead child, which may have died in the middle of a write."""
        a = self.array
        return SlotView(a[RUNNING_ID], a[TOKEN], a[DEADLINE_NS], a[DONE], bool(a[IDLE]))

    def reset(self) -> None:
        """Clear a dead child's slot for its replacement (the supervisor is the only writer then)."""
        for index in range(SIZE):
            self.array[index] = 0 if index != DONE else self.array[DONE]
        self.array[SEQ] = 0


_INDEX = {"running_id": RUNNING_ID, "token": TOKEN, "deadline_ns": DEADLINE_NS, "done": DONE, "idle": IDLE}
