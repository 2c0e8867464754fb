"""A worker process's buffer: how it runs a partition's jobs, which come in runs."""

from __future__ import annotations

import dataclasses
import time

import multiprocess
import pytest

from jobqueue.clock import utcnow
from jobqueue.job import Message, MessageState, Outcome, OutcomeKind
from jobqueue.runtime.holdings import BEHIND, Holdings
from jobqueue.runtime.slot import Slot
from jobqueue.storage.dialects.flow import in_partition_order

TOKEN = 77


def message(id_: int, partition_key: str | None = None, priority: int = 0) -> Message:
    now = utcnow()
    return Message(id_, "t", "default", priority, b"", None, 1, 1, TOKEN, now, now, now, partition_key=partition_key)


def ended(msg: Message, kind: OutcomeKind = OutcomeKind.ARCHIVE) -> Outcome:
    state = {OutcomeKind.ARCHIVE: MessageState.COMPLETED, OutcomeKind.RETRY: MessageState.RETRYABLE}.get(
        kind, MessageState.PENDING
    )
    return Outcome(message=msg, kind=kind, state=state, finished_at=utcnow())


@pytest.fixture
def held() -> Holdings:
    return Holdings(Slot.create(multiprocess.get_context("fork"), 100), lambda m: None)


def test_runs_come_in_rounds_each_partition_in_enqueue_order() -> None:
    # As acquired (delivery order): a later job of "a" has a higher priority than its first.
    acquired = [
        message(5, "a", priority=9),
        message(1, "a"),
        message(2, "b"),
        message(3, "a"),
        message(4),
        message(6, "b"),
    ]
    order = [m.id for m in in_partition_order(acquired)]
    # Round one: each partition's oldest in the place of its first job, and the jobs without a key;
    # then each partition's second, then its third.
    assert order == [1, 2, 4, 3, 6, 5]


def test_the_next_job_of_a_partition_waits_for_the_previous_outcome_to_be_written(held: Holdings) -> None:
    held.add_fetched([message(1, "a"), message(2, "b"), message(3, "a")])
    first = held.start_next()
    assert isinstance(first, Message)
    held.finish(ended(first))
    second = held.start_next()  # "b" is next: nothing of it is unwritten
    assert isinstance(second, Message) and second.id == 2
    held.finish(ended(second))
    assert held.start_next() is BEHIND  # job 3 of "a" must not start before job 1's outcome is stored
    assert held.start_next() is BEHIND  # nothing was taken: it is still next
    held.written(held.take_pending())
    third = held.start_next()
    assert isinstance(third, Message) and third.id == 3


@pytest.mark.parametrize("kind", [OutcomeKind.RETRY, OutcomeKind.DEFER, None])
def test_a_job_that_does_not_finish_for_good_hands_back_the_rest_of_its_partition(
    held: Holdings, kind: OutcomeKind | None
) -> None:
    held.add_fetched([message(1, "a"), message(2, "b"), message(3, "a"), message(4, "a"), message(5)])
    first = held.start_next()
    assert isinstance(first, Message)
    held.finish(None if kind is None else ended(first, kind))  # None: its lease was lost
    pending = held.take_pending()
    returned = [o.message.id for o in pending if o.kind is OutcomeKind.RETURN]
    assert returned == [3, 4]  # back unstarted, uncounted: the retrying job holds them
    assert [m.id for m in held.buffer] == [2, 5]


def test_a_partition_run_goes_on_after_a_job_that_finished_for_good(held: Holdings) -> None:
    held.add_fetched([message(1, "a"), message(2, "a")])
    first = held.start_next()
    assert isinstance(first, Message)
    held.finish(ended(first))
    assert [m.id for m in held.buffer] == [2]
    assert not [o for o in held.take_pending() if o.kind is OutcomeKind.RETURN]


def test_an_outcome_the_database_turned_into_a_retry_ends_the_run(held: Holdings) -> None:
    held.add_fetched([message(1, "a"), message(2, "a")])
    first = held.start_next()
    assert isinstance(first, Message)
    held.finish(ended(first))  # completed: the run goes on...
    taken = held.take_pending()
    # ...but the database refused it, and even a bare failure: the job was requeued to retry.
    requeued = ended(first, OutcomeKind.RETRY)
    held.written([requeued])
    assert held.start_next() is None and len(held) == 0  # job 2 went back: job 1 holds the key
    assert [o.message.id for o in held.take_pending()] == [2]
    assert taken[0].message.id == 1


def test_a_lost_outcome_ends_the_run_before_the_next_job_may_start(held: Holdings) -> None:
    held.add_fetched([message(1, "a"), message(2, "a"), message(3, "b")])
    first = held.start_next()
    assert isinstance(first, Message)
    held.finish(ended(first))
    taken = held.take_pending()
    held.written([], lost=taken)  # its lease had gone: another worker may hold "a" now
    assert [m.id for m in held.buffer] == [3]


def test_an_acked_first_job_keeps_its_run(held: Holdings) -> None:
    held.add_fetched([message(1, "a"), message(2, "a")])
    first = held.start_next()
    assert isinstance(first, Message)
    held.finish(None, settled=True)  # ACK_FIRST: its outcome was written before it ran
    second = held.start_next()
    assert isinstance(second, Message) and second.id == 2


def test_a_delivery_started_twice_is_counted_per_lease(held: Holdings) -> None:
    held.add_fetched([message(1, "a")])
    first = held.start_next()
    assert isinstance(first, Message)
    held.finish(ended(first))
    # Its lease ran out before the outcome was written; the queue gave it to us again.
    again = dataclasses.replace(first, lease_token=TOKEN + 1)
    held.add_fetched([again])
    held.take_pending()  # the first delivery's outcome is being written
    assert held.start_next() is BEHIND  # the second delivery waits for it, as a later job would
    held.written([ended(first)])  # the first delivery's write counts down only its own delivery
    started = held.start_next()
    assert isinstance(started, Message) and started.lease_token == TOKEN + 1
    held.finish(ended(started))
    held.add_fetched([message(2, "a")])
    assert held.start_next() is BEHIND  # the second delivery's outcome is still unwritten
    held.written(held.take_pending())
    after = held.start_next()
    assert isinstance(after, Message) and after.id == 2


def test_a_batch_taken_back_is_never_started_even_once_its_partition_may_go_on(held: Holdings) -> None:
    held.add_fetched([message(1, "a"), message(2, "a"), message(3, "b")])
    first = held.start_next()
    assert isinstance(first, Message)
    # The job runs long: the supervisor takes the rest of the buffer back (it is queued again).
    revoked = held.slot.revoke_buffer(slow_since_ns=time.monotonic_ns() + 10**9)
    assert revoked is not None and revoked.tokens == [TOKEN]
    held.finish(ended(first))
    assert held.start_next() is BEHIND  # job 2 of "a" still waits for job 1's outcome...
    held.written(held.take_pending())
    assert held.start_next() is None  # ...and then is dropped, as is job 3: both were taken back
    assert len(held) == 0 and held.running is None


def test_a_job_delivered_before_without_an_outcome_waits_for_what_was_finished_to_be_written(
    held: Holdings,
) -> None:
    """It may be what killed a process: what this one finished is written before it starts, and it
    is not marked running meanwhile (no time limit runs for it while the writes wait)."""
    suspect = dataclasses.replace(message(2), deliveries_count=2)
    held.add_fetched([message(1), suspect, dataclasses.replace(message(3), deliveries_count=3)])
    first = held.start_next()
    assert isinstance(first, Message) and first.id == 1
    held.finish(ended(first))
    assert held.start_next() is BEHIND
    view = held.slot.read()
    assert held.running is None and view is not None and (view.running_id, view.deadline_ns) == (0, 0)
    taken = held.take_pending()
    assert held.start_next() is BEHIND  # taken, not yet written (the keeper may be writing them)
    held.written(taken)
    second = held.start_next()
    assert isinstance(second, Message) and second.id == 2
    held.finish(None)  # nothing to write: the next suspect need not wait
    third = held.start_next()
    assert isinstance(third, Message) and third.id == 3


def aged(seconds: float) -> int:
    """A time.monotonic_ns() reading ``seconds`` ago."""
    return time.monotonic_ns() - int(seconds * 1e9)


def windowed(window: float) -> Holdings:
    return Holdings(Slot.create(multiprocess.get_context("fork"), 100), lambda m: None, start_window=window)


def test_a_buffered_message_whose_lease_aged_past_the_window_goes_back_unstarted() -> None:
    # The supervisor renewed nothing since the batch was taken 25 s ago, past a 20 s window: the
    # message's lease may run out while it runs (another worker would then run it too).
    held = windowed(20.0)
    held.slot.renewed(aged(25.0))
    held.add_fetched([message(1), message(2, "a"), message(3, "a")], sent_ns=aged(25.0))
    assert held.start_next() is None
    pending = held.take_pending()
    assert sorted(o.message.id for o in pending) == [1, 2, 3]  # back, uncounted (partition "a" with them)
    assert all(o.kind is OutcomeKind.RETURN for o in pending)
    assert [m.id for m in held.take_stale()] == [1, 2]  # 3 went back with its partition's run
    assert held.slot.read_raw().running_id == 0  # nothing marked running


def test_a_renewal_after_the_fetch_keeps_an_old_batch_startable() -> None:
    held = windowed(20.0)
    held.add_fetched([message(1)], sent_ns=aged(25.0))
    held.slot.renewed(aged(5.0))  # the supervisor renewed what the process held, 5 s ago
    started = held.start_next()
    assert isinstance(started, Message) and started.id == 1
    running = held.running_lease()
    assert running is not None and running[0] is started
    assert time.monotonic_ns() - running[1] < 6e9  # the renewal, not the fetch, dates its lease


def test_a_renewal_before_the_fetch_does_not_cover_it() -> None:
    # Renewed 30 s ago, then fetched 25 s ago: the batch's lease dates from its fetch.
    held = windowed(20.0)
    held.slot.renewed(aged(30.0))
    held.add_fetched([message(1)], sent_ns=aged(25.0))
    assert held.start_next() is None
    assert [o.message.id for o in held.take_pending()] == [1]


def test_a_fresh_batch_starts_even_when_the_supervisor_is_silent() -> None:
    # Its own fetch gave it a whole lease a moment ago.
    held = windowed(20.0)
    held.slot.renewed(aged(60.0))
    held.add_fetched([message(1)], sent_ns=aged(0.5))
    started = held.start_next()
    assert isinstance(started, Message) and started.id == 1
    assert held.take_stale() == []


def test_the_running_lease_dates_from_the_latest_renewal() -> None:
    held = windowed(20.0)
    held.slot.renewed(aged(60.0))
    held.add_fetched([message(1), message(2)], sent_ns=aged(15.0))
    started = held.start_next()
    assert isinstance(started, Message)
    before = held.running_lease()
    assert before is not None and 14e9 < time.monotonic_ns() - before[1] < 16e9
    held.lease_extended(started, aged(1.0))  # the keeper renewed it
    after = held.running_lease()
    assert after is not None and time.monotonic_ns() - after[1] < 2e9
    held.lease_extended(message(2), time.monotonic_ns())  # not the running one: ignored
    held.finish(ended(started))
    assert held.running_lease() is None


def test_a_renewal_after_the_renewals_lapsed_does_not_vouch_for_an_older_batch() -> None:
    # The database was down (or the whole tree frozen) past the lease: the batch taken 25 s ago
    # may have been released and taken by another worker meanwhile. The renewal that follows the
    # gap renews what is still ours, but says nothing of that batch.
    held = windowed(20.0)
    held.add_fetched([message(1)], sent_ns=aged(25.0))
    held.slot.renewed(aged(1.0), lapsed=True)
    assert held.start_next() is None
    assert [o.message.id for o in held.take_pending()] == [1]
    held.add_fetched([message(2)], sent_ns=aged(0.5))  # taken since: its own fetch vouches for it
    started = held.start_next()
    assert isinstance(started, Message) and started.id == 2
    held.finish(ended(started))
    held.written(held.take_pending())
    # A later renewal vouches again for a batch taken after the gap (here 25 s ago, so only the
    # renewal keeps it startable).
    held.slot.renewed(aged(60.0), lapsed=True)
    held.add_fetched([message(3)], sent_ns=aged(25.0))
    held.slot.renewed(aged(0.2))
    third = held.start_next()
    assert isinstance(third, Message) and third.id == 3
