"""Retry strategies: pure decisions of whether and when a nacked job runs again.

A strategy is asked after attempt number ``attempt`` (1 on the first run) failed at ``now``; it
returns the time of the next attempt, or ``None`` when the job must be FAILED because
``attempt >= max_attempts`` or because the next attempt would fall more than
``max_total_delay_seconds`` after the first one. A delay that no date can hold (past the year
9999) raises ConfigurationError, which fails the job with that reason added to its error. Base
delays come from tenacity's wait functions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any, ClassVar

import tenacity

from jobqueue.errors import ConfigurationError

_RETRYING = tenacity.Retrying()  # owns the call states below; never called


def _tenacity_wait(wait: Callable[[tenacity.RetryCallState], float], attempt: int) -> float:
    """The wait tenacity computes after attempt number ``attempt``."""
    state = tenacity.RetryCallState(retry_object=_RETRYING, fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    return float(wait(state))


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigurationError(message)


def _finite(strategy: RetryStrategy, name: str, minimum: float | None = 0.0, optional: bool = False) -> None:
    """Check that parameter ``name`` is a finite number (at least ``minimum``).

    NaN passes every "at least" comparison and infinity makes no date, and a per-call strategy is
    stored as JSON, which holds neither: both are refused here, with wrong types, as the strategy is made.
    """
    value = getattr(strategy, name)
    if optional and value is None:
        return
    bound = "" if minimum is None else f" >= {minimum:g}"
    try:
        finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        finite = False
    _check(
        finite and (minimum is None or value >= minimum),
        f"{type(strategy).__name__}: {name} must be a finite number{bound}{' or None' if optional else ''}, "
        f"got {value!r}",
    )


@dataclass(frozen=True, kw_only=True)
class RetryStrategy:
    """Base of the strategies; subclasses define :meth:`delay_for`."""

    kind: ClassVar[str] = ""
    max_attempts: int | None = None
    max_total_delay_seconds: float | None = None

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        _check(
            attempts is None or isinstance(attempts, int) and not isinstance(attempts, bool) and attempts >= 1,
            f"{type(self).__name__}: max_attempts must be an integer >= 1 or None (no limit), got {attempts!r}",
        )
        _finite(self, "max_total_delay_seconds", optional=True)

    def delay_for(self, attempt: int) -> float:
        """Return the delay before the attempt after ``attempt``."""
        raise NotImplementedError

    def decide(self, attempt: int, first_attempt_at: datetime | None, now: datetime) -> datetime | None:
        """Return when attempt ``attempt + 1`` runs, or None if the job must fail now."""
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return None
        delay = self.delay_for(attempt)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay != delay:
            # A strategy of the user's own: NaN would be read as "now", a string fail deep in a comparison.
            raise TypeError(
                f"{type(self).__name__}.delay_for({attempt}) returned {delay!r}; return a number of seconds"
            )
        try:
            next_attempt_at = now + timedelta(seconds=max(0.0, delay))
        except (OverflowError, ValueError):
            self._past_9999(attempt, first_attempt_at, now, delay)
            return None
        if self.max_total_delay_seconds is not None:
            started = first_attempt_at or now
            # In seconds: a limit past what a timedelta holds (1e15) is no limit, not an OverflowError.
            if (next_attempt_at - started).total_seconds() > self.max_total_delay_seconds:
                return None
        return next_attempt_at

    def _past_9999(self, attempt: int, first_attempt_at: datetime | None, now: datetime, delay: float) -> None:
        """No date holds the next attempt: return (no retry) if ``max_total_delay_seconds`` ends
        the retries before then anyway, else raise a ConfigurationError that says so and how to
        fix the strategy."""
        total = self.max_total_delay_seconds
        if total is not None and (now - (first_attempt_at or now)).total_seconds() + delay > total:
            return
        cap = "max_delay_seconds (a cap on each delay), " if hasattr(self, "max_delay_seconds") else ""
        raise ConfigurationError(
            f"{type(self).__name__}: the delay after attempt {attempt}, {delay:g} s, puts the next attempt "
            f"past the year 9999, the last date a job can be given; give the strategy shorter delays, "
            f"{cap}max_attempts or max_total_delay_seconds"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe description, stored with a message for a per-call override."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.init and f.name != "rng"}
        return {"kind": self.kind, **data}


@dataclass(frozen=True, kw_only=True)
class NoRetryStrategy(RetryStrategy):
    """Never retry: the first nack fails the job."""

    kind: ClassVar[str] = "none"
    max_attempts: int | None = 1

    def delay_for(self, attempt: int) -> float:
        return 0.0

    def decide(self, attempt: int, first_attempt_at: datetime | None, now: datetime) -> datetime | None:
        return None


@dataclass(frozen=True, kw_only=True)
class ConstantRetryStrategy(RetryStrategy):
    """Retry after ``delay_seconds`` every time."""

    kind: ClassVar[str] = "constant"
    delay_seconds: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite(self, "delay_seconds")

    def delay_for(self, attempt: int) -> float:
        return _tenacity_wait(tenacity.wait_fixed(self.delay_seconds), attempt)


@dataclass(frozen=True, kw_only=True)
class LinearRetryStrategy(RetryStrategy):
    """First retry after ``initial_delay_seconds``; each later one ``step_seconds`` longer."""

    kind: ClassVar[str] = "linear"
    initial_delay_seconds: float
    step_seconds: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite(self, "initial_delay_seconds")
        _finite(self, "step_seconds", minimum=None)

    def delay_for(self, attempt: int) -> float:
        wait = tenacity.wait_incrementing(
            start=self.initial_delay_seconds, increment=self.step_seconds, max=float("inf")
        )
        return _tenacity_wait(wait, attempt)


@dataclass(frozen=True, kw_only=True)
class ExponentialBackoffRetryStrategy(RetryStrategy):
    """Delay ``initial_delay_seconds * multiplier ** (attempt - 1)``, capped at ``max_delay_seconds``."""

    kind: ClassVar[str] = "exponential"
    initial_delay_seconds: float
    multiplier: float = 2.0
    max_delay_seconds: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite(self, "initial_delay_seconds")
        _finite(self, "multiplier", minimum=1)
        _finite(self, "max_delay_seconds", optional=True)

    def delay_for(self, attempt: int) -> float:
        cap = float("inf") if self.max_delay_seconds is None else self.max_delay_seconds
        wait = tenacity.wait_exponential(
            multiplier=self.initial_delay_seconds, exp_base=self.multiplier, min=0, max=cap
        )
        return _tenacity_wait(wait, attempt)


@dataclass(frozen=True, kw_only=True)
class ExponentialBackoffWithJitterRetryStrategy(ExponentialBackoffRetryStrategy):
    """Exponential backoff plus a random jitter in ``[0, delay * jitter_factor]``."""

    kind: ClassVar[str] = "exponential_jitter"
    jitter_factor: float = 0.5
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite(self, "jitter_factor")

    def delay_for(self, attempt: int) -> float:
        delay = super().delay_for(attempt)
        return delay + self.rng.uniform(0, delay * self.jitter_factor)


@dataclass(frozen=True, kw_only=True)
class ConstantWithJitterRetryStrategy(RetryStrategy):
    """``base_delay_seconds`` plus a random jitter in ``[-jitter_seconds, +jitter_seconds]`` (never < 0)."""

    kind: ClassVar[str] = "constant_jitter"
    base_delay_seconds: float
    jitter_seconds: float
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite(self, "base_delay_seconds")
        _finite(self, "jitter_seconds")

    def delay_for(self, attempt: int) -> float:
        base = _tenacity_wait(tenacity.wait_fixed(self.base_delay_seconds), attempt)
        return max(0.0, base + self.rng.uniform(-self.jitter_seconds, self.jitter_seconds))


STRATEGIES: dict[str, type[RetryStrategy]] = {
    cls.kind: cls
    for cls in (
        NoRetryStrategy,
        ConstantRetryStrategy,
        LinearRetryStrategy,
        ExponentialBackoffRetryStrategy,
        ExponentialBackoffWithJitterRetryStrategy,
        ConstantWithJitterRetryStrategy,
    )
}


def storable(strategy: object) -> bool:
    """Whether a worker can rebuild ``strategy`` from what a job stores of it: one of the built-in
    strategies itself, not a subclass (a per-call strategy is stored as its kind and parameters)."""
    return isinstance(strategy, RetryStrategy) and STRATEGIES.get(strategy.kind) is type(strategy)


def strategy_from_dict(data: dict[str, Any]) -> RetryStrategy:
    """Rebuild a strategy stored by :meth:`RetryStrategy.to_dict` (built-in kinds only)."""
    params = dict(data)
    kind = params.pop("kind", None)
    cls = STRATEGIES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigurationError(f"unknown retry strategy kind {kind!r}")
    return cls(**params)


def default_strategy() -> RetryStrategy:
    """Exponential backoff with jitter, 3 attempts: 1 s then 2 s (plus up to 50% jitter)."""
    return ExponentialBackoffWithJitterRetryStrategy(
        initial_delay_seconds=1.0, multiplier=2.0, max_delay_seconds=60.0, max_attempts=3
    )


__all__ = [
    "RetryStrategy",
    "NoRetryStrategy",
    "ConstantRetryStrategy",
    "LinearRetryStrategy",
    "ExponentialBackoffRetryStrategy",
    "ExponentialBackoffWithJitterRetryStrategy",
    "ConstantWithJitterRetryStrategy",
    "strategy_from_dict",
    "default_strategy",
]
