"""What a worker process holds, shared by its loop and its keeper thread under one lock.

- ``buffer``: acquired messages not started yet;
- ``outcomes``: outcomes of finished deliveries not written yet;
- ``returns``: messages handed back (unstarted) whose hand-back is not written yet;
- ``started``: ids of messages this process started whose outcome is not written yet (the running
  one included). It is mirrored into the shared slot, so that when the process dies the supervisor
  counts an attempt and a delivery for exactly these, and for none of the unstarted ones.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from jobqueue.clock import utcnow
from jobqueue.job import Message, MessageState, Outcome, OutcomeKind
from jobqueue.runtime.slot import Slot


def hand_back(message: Message) -> Outcome:
    """The outcome that returns an unstarted message to PENDING, uncounted."""
    return Outcome(message=message, kind=OutcomeKind.RETURN, state=MessageState.PENDING, finished_at=utcnow(),
                   checkpoint=message.checkpoint)


class Holdings:
    def __init__(self, slot: Slot, timeout_of: Callable[[Message], float | None]) -> None:
        self.lock = threading.Lock()
        self.slot = slot
        self.timeout_of = timeout_of
        self.buffer: deque[Message] = deque()
        self.outcomes: list[Outcome] = []
        self.returns: list[Outcome] = []
        self.started: set[int] = set()
        self.running: Message | None = None
        self.running_since: float | None = None
        self.oldest_outcome_at: float | None = None

    # -- the loop ----------------------------------------------------------------------------------
    def add_fetched(self, messages: list[Message]) -> None:
        with self.lock:
            self.buffer.extend(messages)

    def start_next(self) -> Message | None:
        """Take the next unstarted message and mark it running (None if the keeper took the buffer)."""
        with self.lock:
            if not self.buffer:
                return None
            message = self.buffer.popleft()
            self.running, self.running_since = message, time.monotonic()
            self.started.add(message.id)
            self.slot.start(message.id, message.lease_token, self.timeout_of(message))
        return message

    def finish(self, outcome: Outcome | None) -> int:
        """Record the running message's outcome (None: nothing to write); return the pending count."""
        with self.lock:
            message, self.running, self.running_since = self.running, None, None
            if outcome is not None:
                if not self.outcomes:
                    self.oldest_outcome_at = time.monotonic()
                self.outcomes.append(outcome)
            elif message is not None:
                self._forget([message.id])
            self.slot.finish()
            return len(self.outcomes)

    def abandon(self) -> None:
        """The running job escaped the executor (the process is exiting): keep it counted as started."""
        with self.lock:
            self.running, self.running_since = None, None

    def __len__(self) -> int:
        return len(self.buffer)

    # -- flushing ----------------------------------------------------------------------------------
    def take_pending(self) -> list[Outcome]:
        """Take every outcome and hand-back waiting to be written."""
        with self.lock:
            taken, self.outcomes, self.returns = self.outcomes + self.returns, [], []
            self.oldest_outcome_at = None
            return taken

    def restore(self, taken: list[Outcome]) -> None:
        """Put back what a failed flush took (it is written again later: outcomes are fenced)."""
        with self.lock:
            outcomes = [o for o in taken if o.kind is not OutcomeKind.RETURN]
            if outcomes and not self.outcomes:
                self.oldest_outcome_at = time.monotonic()
            self.outcomes[:0] = outcomes
            self.returns[:0] = [o for o in taken if o.kind is OutcomeKind.RETURN]

    def written(self, taken: list[Outcome]) -> None:
        """A flush of ``taken`` committed: those messages are no longer ours to count."""
        with self.lock:
            self._forget([o.message.id for o in taken if o.kind is not OutcomeKind.RETURN])

    def _forget(self, ids: list[int]) -> None:
        self.started.difference_update(ids)
        self.slot.set_started(self.started)

    # -- the keeper --------------------------------------------------------------------------------
    def take_for_keeper(self, hoard_seconds: float, flush_interval: float) -> tuple[list[Outcome], int]:
        """While a job runs: hand back the buffer once the job is slow, and take overdue outcomes.

        Returns what to write and how many messages were just handed back.
        """
        now = time.monotonic()
        with self.lock:
            handed = 0
            if self.running_since is not None and now - self.running_since >= hoard_seconds and self.buffer:
                handed = len(self.buffer)
                self.returns.extend(hand_back(m) for m in self.buffer)
                self.buffer.clear()
            overdue = self.oldest_outcome_at is not None and now - self.oldest_outcome_at >= flush_interval
            if not self.returns and not (self.running_since is not None and overdue):
                return [], handed
            taken, self.returns = self.returns, []
            if self.running_since is not None and overdue:
                taken += self.outcomes
                self.outcomes, self.oldest_outcome_at = [], None
            return taken, handed

    # -- leaving -----------------------------------------------------------------------------------
    def hand_back_all(self) -> None:
        """On the way out: every unstarted message goes back, uncounted."""
        with self.lock:
            self.returns.extend(hand_back(m) for m in self.buffer)
            self.buffer.clear()
