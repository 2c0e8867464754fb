from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from jobqueue.runtime import resilience
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp, is_transient


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resilience, "BACKOFF_INITIAL_SECONDS", 0.001)
    monkeypatch.setattr(resilience, "BACKOFF_MAX_SECONDS", 0.002)


def outage(invalidated: bool = False) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"),
                                   connection_invalidated=invalidated)


def test_transient_errors() -> None:
    assert is_transient(outage())
    assert is_transient(sa.exc.InterfaceError("x", {}, Exception("closed")))
    assert not is_transient(sa.exc.IntegrityError("x", {}, Exception("duplicate key")))
    assert not is_transient(ValueError("bug"))


def test_retries_through_an_outage_logging_once(caplog: pytest.LogCaptureFixture) -> None:
    guard = DatabaseGuard(logging.getLogger("test.guard"), "db")
    calls = {"n": 0, "cleanups": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] <= 4:
            raise outage()
        return "ok"

    def cleanup() -> None:
        calls["cleanups"] += 1

    with caplog.at_level(logging.DEBUG, "test.guard"):
        assert guard.call(flaky, on_retry=cleanup) == "ok"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2  # the outage began; it ended
    assert "db unavailable" in warnings[0] and "available again" in warnings[1] and "4 failed" in warnings[1]
    assert calls["cleanups"] == 4  # before every new attempt
    assert guard.last_call_retried


def test_a_stale_pooled_connection_is_not_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    guard = DatabaseGuard(logging.getLogger("test.guard"), "db")
    results = iter([outage(invalidated=True)])

    def once_stale() -> int:
        error = next(results, None)
        if error is not None:
            raise error
        return 7

    with caplog.at_level(logging.WARNING, "test.guard"):
        assert guard.call(once_stale) == 7
        assert guard.try_once(lambda: 8) == (True, 8)
    assert caplog.records == []


def test_gives_up_when_asked() -> None:
    guard = DatabaseGuard(logging.getLogger("test.guard"), "db")
    with pytest.raises(GaveUp):
        guard.call(lambda: (_ for _ in ()).throw(outage()), give_up=lambda: True)


def test_other_errors_are_not_retried() -> None:
    guard = DatabaseGuard(logging.getLogger("test.guard"), "db")
    calls = []

    def bug() -> None:
        calls.append(1)
        raise sa.exc.ProgrammingError("x", {}, Exception("syntax error"))

    with pytest.raises(sa.exc.ProgrammingError):
        guard.call(bug)
    assert calls == [1]


def test_try_once_reports_an_outage_without_raising() -> None:
    guard = DatabaseGuard(logging.getLogger("test.guard"), "db")
    ok, value = guard.try_once(lambda: (_ for _ in ()).throw(outage()))
    assert (ok, value) == (False, None) and guard.outage_started is not None


class FakeMySQLError(Exception):
    pass


FakeMySQLError.__module__ = "MySQLdb._exceptions"


class FakeSQLiteError(Exception):
    pass


FakeSQLiteError.__module__ = "sqlite3"


@pytest.mark.parametrize("orig, expected", [
    (FakeMySQLError(2013, "Lost connection to server during query"), "outage"),
    (FakeMySQLError(1213, "Deadlock found"), "contention"),
    (FakeMySQLError(1153, "Got a packet bigger than 'max_allowed_packet'"), None),
    (FakeSQLiteError("database is locked"), "contention"),
    (FakeSQLiteError("too many SQL variables"), None),
    (FakeSQLiteError("attempt to write a readonly database"), None),
])
def test_driver_errors_are_classified_by_what_they_mean(orig: Exception, expected: str | None) -> None:
    assert resilience.classify(sa.exc.OperationalError("x", {}, orig)) == expected


def test_contention_is_retried_without_an_outage_warning(caplog: pytest.LogCaptureFixture) -> None:
    guard = DatabaseGuard(logging.getLogger("test.guard"), "db")
    errors = iter([sa.exc.OperationalError("x", {}, FakeMySQLError(1213, "Deadlock found"))])

    def deadlock_once() -> str:
        error = next(errors, None)
        if error is not None:
            raise error
        return "done"

    with caplog.at_level(logging.INFO, "test.guard"):
        assert guard.call(deadlock_once) == "done"
    assert caplog.records == []
