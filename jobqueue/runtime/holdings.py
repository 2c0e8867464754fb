"""What a worker process holds, shared by its loop and its keeper thread under one lock.

- ``buffer``: acquired messages not started yet, listed by batch (lease token) in the shared slot,
  so that the supervisor can take the buffer back while a slow job runs;
- ``outcomes``: outcomes of finished deliveries not written yet;
- ``returns``: messages handed back (unstarted) whose hand-back is not written yet;
- ``started``: ids of messages this process started whose outcome is not written yet (the running
  one included). It is mirrored into the shared slot, so that when the process dies the supervisor
  charges a delivery to the running one only, keeps the attempt of the finished ones, and returns
  the unstarted ones as if never fetched.

A partition's jobs come in runs, in enqueue order. The next job of a partition starts only once
the outcome of its previous one is written (``start_next`` says BEHIND until then): were the
process to die, the previous one would run again after it. When one does not finish for good (it retries, waits, or
its lease is lost), the partition's later jobs go back unstarted (``end_run``).
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Literal

from jobqueue.clock import utcnow
from jobqueue.job import Message, MessageState, Outcome, OutcomeKind
from jobqueue.runtime.slot import Slot


class Turn(enum.Enum):
    BEHIND = "behind"  # the next message waits for outcomes to be written (its partition's previous one)


BEHIND = Turn.BEHIND


def hand_back(message: Message) -> Outcome:
    """The outcome that returns an unstarted message to PENDING, uncounted."""
    return Outcome(
        message=message,
        kind=OutcomeKind.RETURN,
        state=MessageState.PENDING,
        finished_at=utcnow(),
        checkpoint=message.checkpoint,
    )


class Holdings:
    def __init__(
        self, slot: Slot, timeout_of: Callable[[Message], float | None], start_window: float = math.inf
    ) -> None:
        self.lock = threading.Lock()
        self.slot = slot
        self.timeout_of = timeout_of
        self.start_window_ns = start_window * 1e9
        self.buffer: deque[Message] = deque()
        # When each buffered batch's acquire was sent (time.monotonic_ns()), by lease token: its
        # lease runs from then at least.
        self.taken_ns: dict[int, int] = {}
        # Until when the message at the head of the buffer may start (monotonic ns): its lease
        # was taken or renewed less than the start window before (0: not worked out yet).
        self.fresh_from_ns, self.fresh_until_ns = 0, 0.0
        # The running message's lease was taken or renewed no earlier than this (monotonic ns).
        self.running_renewed_ns = 0
        self.stale: list[Message] = []  # handed back since the last look: their lease had aged
        self.outcomes: list[Outcome] = []
        self.returns: list[Outcome] = []
        self.started: set[int] = set()
        # Started deliveries (id, lease token) of a partition's messages whose outcome is unwritten.
        self.partition_of: dict[tuple[int, int], str] = {}
        self.unwritten: Counter[str] = Counter()  # how many of them each partition has
        self.running: Message | None = None
        self.running_since: float | None = None
        self.oldest_outcome_at: float | None = None

    # -- the loop ----------------------------------------------------------------------------------
    def can_fetch(self) -> bool:
        """False while every batch entry of the slot is in use."""
        return not self.slot.batches_full()

    def add_fetched(self, messages: list[Message], sent_ns: int = 0) -> None:
        """Buffer a fetched batch; ``sent_ns``: time.monotonic_ns() when its acquire was sent."""
        if not messages:
            return
        with self.lock:
            # One acquisition, one lease token.
            token = messages[0].lease_token
            if not self.buffer:
                self.taken_ns.clear()  # earlier batches are done
                self.fresh_until_ns = 0.0  # worked out again from this batch
            self.taken_ns[token] = sent_ns or time.monotonic_ns()
            self.slot.add_batch(token, len(self.buffer) + len(messages), only=not self.buffer)
            self.buffer.extend(messages)

    def start_next(self) -> Message | Literal[Turn.BEHIND] | None:
        """Take the next unstarted message and mark it running: None if the buffer is empty, and
        BEHIND (nothing taken) if outcomes must be written first: it is a partition's whose
        previous outcome is not written yet, or one delivered before without an outcome while
        this process holds unwritten outcomes.

        Messages whose batch the supervisor took back are dropped here: they are in the queue again.
        """
        with self.lock:
            while self.buffer:
                message = self.buffer[0]
                partition = message.partition
                if partition is not None and self.unwritten[partition]:
                    return BEHIND
                if message.deliveries_count > 1 and self.started:
                    # Delivered before without an outcome, it may be what killed a process: what
                    # this one finished is written before it starts, so that if it kills this one
                    # too, those jobs do not run again (nor count another attempt).
                    return BEHIND
                if time.monotonic_ns() > self.fresh_until_ns and not self._fresh(message):
                    self._hand_back_stale(message)
                    continue
                self.buffer.popleft()
                if not self.slot.start(message.id, message.lease_token, self.timeout_of(message), len(self.buffer)):
                    continue
                self.running, self.running_since = message, time.monotonic()
                self.running_renewed_ns = self.fresh_from_ns
                self.started.add(message.id)
                if partition is not None:
                    self.partition_of[(message.id, message.lease_token)] = partition
                    self.unwritten[partition] += 1
                return message
        return None

    def _fresh(self, message: Message) -> bool:
        """Whether ``message``'s lease was taken or renewed within the start window; if so, the
        messages after it in the buffer (of the same batch or later ones) are fresh until then too."""
        renewed_ns = self.slot.renewed_for(self.taken_ns.get(message.lease_token, 0))
        if time.monotonic_ns() - renewed_ns > self.start_window_ns:
            return False
        self.fresh_from_ns, self.fresh_until_ns = renewed_ns, renewed_ns + self.start_window_ns
        return True

    def _hand_back_stale(self, message: Message) -> None:
        """``message``'s lease has aged past the start window (the supervisor renews nothing): back
        to the queue unstarted, and with it the rest of its partition's run in the buffer."""
        self.buffer.popleft()
        if self.slot.listed(message.lease_token):
            self.returns.append(hand_back(message))
            self.stale.append(message)
        if message.partition is not None:
            self._end_run(message.partition)

    def take_stale(self) -> list[Message]:
        """The messages handed back for an aged lease since the last call (to say so in the log)."""
        with self.lock:
            stale, self.stale = self.stale, []
            return stale

    def running_lease(self) -> tuple[Message, int] | None:
        """The running message and when its lease was last taken or renewed (monotonic ns), if any."""
        with self.lock:
            if self.running is None:
                return None
            return self.running, self.slot.renewed_for(self.running_renewed_ns)

    def lease_extended(self, message: Message, sent_ns: int) -> None:
        """The running job's lease was renewed by a statement sent at ``sent_ns``."""
        with self.lock:
            if self.running is message:
                self.running_renewed_ns = max(self.running_renewed_ns, sent_ns)

    def finish(self, outcome: Outcome | None, settled: bool = False) -> int:
        """Record the running message's outcome (None: nothing to write; ``settled``: because it
        was written before the job ran, ACK_FIRST); return the pending count."""
        with self.lock:
            message, self.running, self.running_since = self.running, None, None
            if outcome is not None:
                if not self.outcomes:
                    self.oldest_outcome_at = time.monotonic()
                self.outcomes.append(outcome)
                if not outcome.ran and message is not None:
                    # Failed without running: should the process die before this outcome is
                    # written, the message goes back as if never fetched, its attempt uncounted.
                    self.started.discard(message.id)
                    self.slot.set_started(self.started)
            elif message is not None:
                self._forget([message])
            if message is not None and message.partition is not None:
                final = outcome.kind is OutcomeKind.ARCHIVE if outcome is not None else settled
                if not final:
                    self._end_run(message.partition)
            self.slot.finish()
            return len(self.outcomes)

    def _end_run(self, partition: str) -> None:
        """A job of a partition did not finish for good (it retries, waits, or its lease was lost):
        it holds its partition, so the partition's later jobs in the buffer go back unstarted."""
        kept: deque[Message] = deque()
        for message in self.buffer:
            if message.partition != partition:
                kept.append(message)
            elif self.slot.listed(message.lease_token):
                self.returns.append(hand_back(message))
        self.buffer = kept

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

    def written(self, applied: Sequence[Outcome], lost: Sequence[Outcome] = ()) -> None:
        """A flush committed ``applied`` and dropped ``lost`` (fencing): those messages are no
        longer ours to count.

        A partition's job whose outcome was lost (another worker may hold the partition now) or
        became a retry (the database refused the outcome itself) ends its run here, before its
        partition's next job may start.
        """
        not_final = [o for o in applied if o.kind is not OutcomeKind.ARCHIVE]
        with self.lock:
            for o in [*not_final, *lost]:
                if o.message.partition is not None and o.kind is not OutcomeKind.RETURN:
                    self._end_run(o.message.partition)
            self._forget([o.message for o in [*applied, *lost] if o.kind is not OutcomeKind.RETURN])

    def _forget(self, messages: list[Message]) -> None:
        self.started.difference_update(m.id for m in messages)
        if self.partition_of:  # else no partition's job is started and unwritten
            for message in messages:
                key = self.partition_of.pop((message.id, message.lease_token), None)
                if key is not None:
                    self.unwritten[key] -= 1
                    if not self.unwritten[key]:
                        del self.unwritten[key]
        self.slot.set_started(self.started)

    # -- the keeper --------------------------------------------------------------------------------
    def take_overdue(self, flush_interval: float) -> list[Outcome]:
        """While a job runs: the outcomes that have waited ``flush_interval`` (to write them now)."""
        now = time.monotonic()
        with self.lock:
            overdue = self.oldest_outcome_at is not None and now - self.oldest_outcome_at >= flush_interval
            if self.running_since is None or not overdue:
                return []
            taken, self.outcomes, self.oldest_outcome_at = self.outcomes, [], None
            return taken

    # -- leaving -----------------------------------------------------------------------------------
    def hand_back_all(self) -> None:
        """On the way out: every unstarted message still ours goes back, uncounted."""
        with self.lock:
            self.returns.extend(hand_back(m) for m in self.buffer if self.slot.listed(m.lease_token))
            self.buffer.clear()
