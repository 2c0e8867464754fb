"""Riding out database outages: retry with backoff (tenacity), log once per outage.

A dropped connection, a restarting server, a deadlock or a busy SQLite file raise transient errors;
the operation is retried after an exponential backoff with jitter until it succeeds or the caller
gives up. The first failure of an outage logs a warning, the recovery logs how long it lasted, and
the attempts in between log nothing above DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
import tenacity

from jobqueue.storage.dialects.connector import CANCELLED, CONTENTION, FULL, OUTAGE, READ_ONLY

T = TypeVar("T")

BACKOFF_INITIAL_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0


# Consecutive "outage" failures of one call after which a server that answers a probe is taken to be
# refusing that operation (a statement over MySQL's max_allowed_packet drops the connection).
REFUSED_AFTER_FAILURES = 3

# What a database error means: CONTENTION (a deadlock, a lock timeout, a busy file), OUTAGE (a lost
# connection, a server down or restarting), FULL (no room left to write: retried like an outage, and
# never taken for a refusal of one operation), READ_ONLY (this process may not write) and CANCELLED
# (the server's statement time limit cancelled the statement): no outage, retried like FULL, with
# the cause and its fix in the warning; or None (retrying cannot fix it). The store's dialect knows
# its driver's codes: Store.classify, and says what READ_ONLY and CANCELLED mean: Store.explain.
Classify = Callable[[BaseException], "str | None"]
Explain = Callable[[BaseException], "str | None"]

# Said when the dialect has nothing more precise to say.
EXPLAINED = {
    READ_ONLY: "it refuses this process's writes (attempt to write a readonly database); give the user "
    "the worker runs as write permission on the database",
    CANCELLED: "the server cancelled the statement (its statement time limit, or an administrator); raise "
    "the limit for the user the workers log in as",
}


def fresh_connection_retry(operation: Callable[[], T]) -> T:
    """Run ``operation``; if it failed on a pooled connection the server had closed, run it once more.

    After a server restart every pooled connection is dead; SQLAlchemy discards them all on the first
    such error, so the immediate second try gets a new connection. Only a second failure is an outage.
    """
    try:
        return operation()
    except sa.exc.DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    return operation()


def _stale_connection(state: tenacity.RetryCallState) -> bool:
    exc = state.outcome.exception() if state.outcome is not None else None
    return state.attempt_number == 1 and isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


class GaveUp(Exception):
    """The caller's ``give_up()`` said to stop retrying during an outage."""


class Refused(Exception):
    """An operation failed like an outage again and again while the server answered other queries:
    the server refuses this operation itself (``__cause__`` holds its last error)."""


class DatabaseGuard:
    """Run database operations for one process through outages."""

    def __init__(self, logger: logging.Logger, what: str, classify: Classify, explain: Explain | None = None) -> None:
        self.logger = logger
        self.what = what
        self.classify = classify
        self.explain = explain
        self.doing: str | None = None  # what the current call does, for the warning
        self.outage_started: float | None = None
        self.refusing = False  # whether the server answers and says no (READ_ONLY, CANCELLED)
        self.failures = 0
        self.last_call_retried = False

    def transient(self, exc: BaseException) -> bool:
        """Worth retrying: lost connections, server restarts, deadlocks, lock timeouts, busy files."""
        return self.classify(exc) is not None

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        if self.classify(exc) == CONTENTION:
            # Deadlocks and lock timeouts are part of normal concurrency: retried quietly.
            self.logger.debug("%s: lock contention, retrying: %s", self.what, exc)
            return
        if self.outage_started is None:
            self.outage_started = time.monotonic()
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            kind = self.classify(exc)
            self.refusing = kind in EXPLAINED
            if kind is not None and self.refusing:
                # No outage: the server answers, and says no. What it refused, why, and the fix.
                detail = self.explain(exc) if self.explain is not None else None
                self.logger.warning(
                    "%s%s: %s (%s: %s)%s; retrying with backoff, and nothing is lost meanwhile",
                    self.what,
                    f" while {self.doing}" if self.doing else "",
                    "cannot write" if kind == READ_ONLY else "a statement was cancelled",
                    type(exc).__name__,
                    reason[0] if reason else "",
                    f": {detail or EXPLAINED[kind]}",
                )
                return
            if kind == FULL:
                detail = (
                    ": it has no room left to write; free disk space (or raise its table space's limit), "
                    "and nothing is lost meanwhile"
                )
            else:  # a login refused (a password being changed, a database being restored), a
                # database that takes no writes (a failover in progress): what it is and its fix
                fix = self.explain(exc) if self.explain is not None else None
                detail = f": {fix}" if fix else ""
            self.logger.warning(
                "%s unavailable (%s: %s)%s; retrying with backoff",
                self.what,
                type(exc).__name__,
                reason[0] if reason else "",
                detail,
            )
        else:
            self.logger.debug("%s still unavailable: %s", self.what, exc)

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None and not _stale_connection(state):
            self._failed(exc)

    def _succeeded(self) -> None:
        if self.outage_started is not None:
            self.logger.warning(
                "%s %s again after %.1f s and %d failed attempts",
                self.what,
                "works" if self.refusing else "available",
                time.monotonic() - self.outage_started,
                self.failures,
            )
        self.outage_started, self.failures = None, 0

    def call(
        self,
        operation: Callable[[], T],
        give_up: Callable[[], bool] = lambda: False,
        on_retry: Callable[[], None] | None = None,
        probe: Callable[[], object] | None = None,
        doing: str | None = None,
    ) -> T:
        """Run ``operation`` until it succeeds; raise GaveUp once ``give_up()`` is true during an outage.

        ``doing`` says what the operation does ("acquiring jobs"), for the warning of a failure.

        ``on_retry`` runs before each new attempt (inside the retry, so it may fail transiently too).
        ``probe`` checks the server's health: when ``operation`` has failed like an outage
        ``REFUSED_AFTER_FAILURES`` times in a row and the probe succeeds, the server is refusing the
        operation itself and :class:`Refused` is raised instead of retrying for ever.
        """
        attempts = 0
        refused = False

        def should_retry(state: tenacity.RetryCallState) -> bool:
            nonlocal refused
            exc = state.outcome.exception() if state.outcome is not None else None
            if exc is None or not self.transient(exc):
                return False
            # A server that answers the probe refuses this operation itself: so too a database that
            # refuses this process's writes, whose outcomes the caller keeps (see OutcomeWriter).
            refusable = self.classify(exc) in (OUTAGE, READ_ONLY)
            if probe is not None and state.attempt_number >= REFUSED_AFTER_FAILURES and refusable:
                try:
                    probe()
                except Exception:
                    return True  # the server is down indeed: an outage
                refused = True
                return False
            return True

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            if (attempts > 1 or self.failures) and on_retry is not None:
                on_retry()
            return operation()

        backoff = tenacity.wait_exponential(
            multiplier=BACKOFF_INITIAL_SECONDS, max=BACKOFF_MAX_SECONDS
        ) + tenacity.wait_random(0, BACKOFF_INITIAL_SECONDS)
        retrying = tenacity.Retrying(
            retry=should_retry,
            # A first failure on a connection the server had closed retries at once, unlogged:
            # only a second failure is an outage (see fresh_connection_retry).
            wait=lambda state: 0.0 if _stale_connection(state) else backoff(state),
            stop=lambda state: give_up(),
            before_sleep=self._before_sleep,
            reraise=True,
        )
        self.doing = doing
        try:
            result = retrying(attempt)
        except BaseException as exc:
            self.last_call_retried = attempts > 1
            if refused:
                self.outage_started, self.failures = None, 0  # the server answers: this was no outage
                raise Refused(
                    f"the database refused this operation {attempts} times while answering other queries: {exc}"
                ) from exc
            if self.transient(exc):
                self._failed(exc)
                raise GaveUp(str(exc)) from exc
            raise
        self.last_call_retried = attempts > 1
        self._succeeded()
        return result

    def try_once(
        self, operation: Callable[[], T], doing: str | None = None, reads: bool = False
    ) -> tuple[bool, T | None]:
        """Run ``operation`` once; on a transient error note the outage and return (False, None).

        ``reads``: the operation only reads. Its success does not end an outage, which may be a
        database that answers and refuses writes (a full disk, a read-only database): said to be
        over at each read between two refused writes, it was logged again and again."""
        self.doing = doing
        try:
            result = fresh_connection_retry(operation)
        except Exception as exc:
            if not self.transient(exc):
                raise
            self._failed(exc)
            return False, None
        if not reads:
            self._succeeded()
        return True, result
