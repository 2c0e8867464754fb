from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from freezegun import freeze_time

from jobqueue import ConfigurationError
from jobqueue.clock import utcnow
from jobqueue.retry import (
    ConstantRetryStrategy,
    ConstantWithJitterRetryStrategy,
    ExponentialBackoffRetryStrategy,
    ExponentialBackoffWithJitterRetryStrategy,
    LinearRetryStrategy,
    NoRetryStrategy,
    RetryStrategy,
    default_strategy,
    strategy_from_dict,
)

T0 = datetime(2026, 1, 1, 12, 0, 0)


def schedule(strategy, attempts: int) -> list[float | None]:
    """Delays in seconds after each failed attempt 1..attempts, with the clock frozen at T0."""
    with freeze_time(T0):
        now = utcnow()
        out = []
        for attempt in range(1, attempts + 1):
            at = strategy.decide(attempt, now, now)
            out.append(None if at is None else (at - now).total_seconds())
        return out


def test_constant() -> None:
    assert schedule(ConstantRetryStrategy(delay_seconds=5, max_attempts=3), 4) == [5, 5, None, None]


def test_linear() -> None:
    s = LinearRetryStrategy(initial_delay_seconds=1, step_seconds=2, max_attempts=5)
    assert schedule(s, 5) == [1, 3, 5, 7, None]


def test_exponential_with_cap() -> None:
    s = ExponentialBackoffRetryStrategy(initial_delay_seconds=1, multiplier=2, max_delay_seconds=5, max_attempts=6)
    assert schedule(s, 6) == [1, 2, 4, 5, 5, None]


def test_exponential_jitter_stays_within_bounds() -> None:
    s = ExponentialBackoffWithJitterRetryStrategy(
        initial_delay_seconds=1, multiplier=2, jitter_factor=0.5, max_attempts=None, rng=random.Random(7)
    )
    for attempt, base in ((1, 1), (2, 2), (3, 4), (4, 8)):
        delays = [s.delay_for(attempt) for _ in range(200)]
        assert all(base <= d <= base * 1.5 for d in delays)
        assert max(delays) - min(delays) > 0  # it does jitter


def test_constant_jitter_stays_within_bounds_and_never_negative() -> None:
    s = ConstantWithJitterRetryStrategy(base_delay_seconds=1, jitter_seconds=2, rng=random.Random(3))
    delays = [s.delay_for(1) for _ in range(500)]
    assert all(0 <= d <= 3 for d in delays) and min(delays) == 0


def test_max_total_delay_counts_from_the_first_attempt() -> None:
    s = ConstantRetryStrategy(delay_seconds=10, max_total_delay_seconds=25)
    with freeze_time(T0):
        first = utcnow()
        assert s.decide(1, first, first) == first + timedelta(seconds=10)
        # The rule: fail when the next attempt would land *more than* 25 s after the first.
        assert s.decide(2, first, first + timedelta(seconds=15)) == first + timedelta(seconds=25)
        assert s.decide(2, first, first + timedelta(seconds=15, microseconds=1)) is None


def test_no_retry() -> None:
    assert schedule(NoRetryStrategy(), 2) == [None, None]


def test_default_is_exponential_jitter_three_attempts() -> None:
    s = default_strategy()
    assert isinstance(s, ExponentialBackoffWithJitterRetryStrategy) and s.max_attempts == 3
    assert schedule(s, 3)[2] is None


@pytest.mark.parametrize(
    "strategy",
    [
        ConstantRetryStrategy(delay_seconds=5, max_attempts=3),
        LinearRetryStrategy(initial_delay_seconds=1, step_seconds=2, max_attempts=5, max_total_delay_seconds=60),
        ExponentialBackoffRetryStrategy(initial_delay_seconds=1, multiplier=3, max_delay_seconds=60),
        ExponentialBackoffWithJitterRetryStrategy(initial_delay_seconds=1, jitter_factor=0.2),
        ConstantWithJitterRetryStrategy(base_delay_seconds=5, jitter_seconds=1),
        NoRetryStrategy(),
    ],
)
def test_stored_form_round_trips(strategy) -> None:
    assert strategy_from_dict(strategy.to_dict()) == strategy


def test_unknown_stored_kind_is_refused_not_imported() -> None:
    with pytest.raises(ConfigurationError, match="unknown retry strategy"):
        strategy_from_dict({"kind": "os.system"})


@pytest.mark.parametrize(
    "make",
    [
        lambda: ConstantRetryStrategy(delay_seconds=-1),
        lambda: ConstantRetryStrategy(delay_seconds=1, max_attempts=0),
        lambda: ExponentialBackoffRetryStrategy(initial_delay_seconds=1, multiplier=0.5),
    ],
)
def test_invalid_parameters(make) -> None:
    with pytest.raises(ConfigurationError):
        make()


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "make, fragment",
    [
        # Wrong types raised a bare TypeError, or were accepted and broke the first retry.
        (lambda: ConstantRetryStrategy(delay_seconds="5"), "delay_seconds must be a finite number >= 0, got '5'"),  # type: ignore[arg-type]
        (lambda: ConstantRetryStrategy(delay_seconds=True), "delay_seconds must be a finite number"),
        (lambda: ConstantRetryStrategy(delay_seconds=1, max_attempts="3"), "max_attempts must be an integer >= 1"),  # type: ignore[arg-type]
        (lambda: ConstantRetryStrategy(delay_seconds=1, max_attempts=2.5), "max_attempts must be an integer"),  # type: ignore[arg-type]
        (lambda: ExponentialBackoffRetryStrategy(initial_delay_seconds=1, max_delay_seconds="60"), "max_delay_seconds"),  # type: ignore[arg-type]
        (lambda: ExponentialBackoffRetryStrategy(initial_delay_seconds=1, max_delay_seconds=-1), "max_delay_seconds"),
        # Infinity and NaN: no retry could be scheduled, and a per-call strategy holding one could
        # not be stored on PostgreSQL or MariaDB (JSON has neither).
        (lambda: ConstantRetryStrategy(delay_seconds=INF), "delay_seconds must be a finite number"),
        (lambda: ConstantRetryStrategy(delay_seconds=2**2000), "delay_seconds must be a finite number"),
        (lambda: ConstantRetryStrategy(delay_seconds=1, max_attempts=INF), "max_attempts must be an integer"),  # type: ignore[arg-type]
        (lambda: ConstantRetryStrategy(delay_seconds=1, max_total_delay_seconds=INF), "max_total_delay_seconds"),
        (lambda: LinearRetryStrategy(initial_delay_seconds=1, step_seconds=NAN), "step_seconds must be a finite"),
        (lambda: ExponentialBackoffRetryStrategy(initial_delay_seconds=INF), "initial_delay_seconds"),
        (lambda: ExponentialBackoffRetryStrategy(initial_delay_seconds=1, multiplier=INF), "multiplier"),
        (
            lambda: ExponentialBackoffWithJitterRetryStrategy(initial_delay_seconds=1, jitter_factor=INF),
            "jitter_factor must be a finite number >= 0",
        ),
        (
            lambda: ConstantWithJitterRetryStrategy(base_delay_seconds=1, jitter_seconds=INF),
            "jitter_seconds must be a finite number >= 0",
        ),
    ],
)
def test_parameters_must_be_finite_numbers(make, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        make()


def test_a_negative_linear_step_is_allowed_and_floors_at_zero() -> None:
    assert schedule(LinearRetryStrategy(initial_delay_seconds=2, step_seconds=-1), 3) == [2.0, 1.0, 0.0]


@dataclass(frozen=True, kw_only=True)
class _Returns(RetryStrategy):
    """A strategy of one's own whose delay_for returns ``value``."""

    kind = "returns"
    value: object = None

    def delay_for(self, attempt: int) -> float:
        return self.value  # type: ignore[return-value]


@pytest.mark.parametrize("value", [float("nan"), "5", None, True])
def test_a_delay_that_is_not_a_number_of_seconds_is_named(value: object) -> None:
    # NaN was read as "retry now"; a string or None failed in a comparison that named nothing.
    with pytest.raises(TypeError, match=r"_Returns.delay_for\(2\) returned .*; return a number of seconds"):
        _Returns(value=value).decide(2, T0, T0)


def test_a_delay_of_a_strategy_of_ones_own_may_be_an_int_or_negative() -> None:
    assert _Returns(value=3).decide(1, T0, T0) == T0 + timedelta(seconds=3)
    assert _Returns(value=-3.5).decide(1, T0, T0) == T0


@pytest.mark.parametrize("value", [float("inf"), 10**30, 3e11])
def test_a_delay_past_the_year_9999_is_an_error_that_says_so(value: object) -> None:
    # It used to fail the job as if its attempts were used up, with nothing to say why.
    with pytest.raises(ConfigurationError, match=r"_Returns: the delay after attempt 1, .* past the year 9999"):
        _Returns(value=value).decide(1, T0, T0)


def test_a_growing_delay_past_the_year_9999_names_the_cap_that_prevents_it() -> None:
    strategy = ExponentialBackoffWithJitterRetryStrategy(initial_delay_seconds=60, multiplier=10)
    with freeze_time(T0):
        assert strategy.decide(10, T0, utcnow()) is not None  # 6e10 s and its jitter: some 2,000 years
        with pytest.raises(ConfigurationError, match=r"give the strategy shorter delays, max_delay_seconds"):
            strategy.decide(11, T0, utcnow())  # 6e11 s: some 19,000 years
    capped = ExponentialBackoffRetryStrategy(initial_delay_seconds=60, multiplier=10, max_delay_seconds=86400)
    assert schedule(capped, 11)[-1] == 86400


def test_a_delay_past_the_year_9999_beyond_max_total_delay_simply_ends_the_retries() -> None:
    strategy = ConstantRetryStrategy(delay_seconds=1e12, max_total_delay_seconds=3600)
    assert strategy.decide(1, T0, T0) is None
    with pytest.raises(ConfigurationError, match="max_attempts or max_total_delay_seconds"):
        ConstantRetryStrategy(delay_seconds=1e12, max_total_delay_seconds=1e13).decide(1, T0, T0)


@pytest.mark.parametrize("limit", [1e15, 1e308, 10**20])
def test_a_total_delay_limit_past_what_a_date_holds_is_no_limit(limit: float) -> None:
    """It was accepted when the strategy was made, then raised OverflowError at the first failure:
    the job failed without a retry."""
    now = datetime(2030, 1, 1)
    strategy = ConstantRetryStrategy(delay_seconds=1, max_attempts=3, max_total_delay_seconds=limit)
    assert strategy.decide(1, now, now) == now + timedelta(seconds=1)
    assert strategy.decide(3, now, now) is None  # max_attempts still ends them
