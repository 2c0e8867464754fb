from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from jobqueue.runtime import resilience
from jobqueue.runtime.resilience import DatabaseGuard, GaveUp
from jobqueue.storage.dialects import dialect_for
from jobqueue.storage.engine import create_engine
from jobqueue.storage.tables import build_tables


def dialect(url: str):
    """A dialect on an engine that never connects: for reading errors."""
    return dialect_for(create_engine(url), build_tables())


POSTGRES = dialect("postgresql+psycopg2://nobody@localhost/nowhere")
MYSQL = dialect("mysql+mysqldb://nobody@localhost/nowhere")
SQLITE = dialect("sqlite:////tmp/jobqueue-never-opened.sqlite3")


def guard() -> DatabaseGuard:
    return DatabaseGuard(logging.getLogger("test.guard"), "db", POSTGRES.classify)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resilience, "BACKOFF_INITIAL_SECONDS", 0.001)
    monkeypatch.setattr(resilience, "BACKOFF_MAX_SECONDS", 0.002)


def outage(invalidated: bool = False) -> sa.exc.OperationalError:
    return sa.exc.OperationalError(
        "SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=invalidated
    )


def test_transient_errors() -> None:
    assert POSTGRES.classify(outage()) == "outage"
    assert POSTGRES.classify(sa.exc.InterfaceError("x", {}, Exception("closed"))) == "outage"
    assert POSTGRES.classify(sa.exc.IntegrityError("x", {}, Exception("duplicate key"))) is None
    assert POSTGRES.classify(ValueError("bug")) is None
    assert SQLITE.classify(outage(invalidated=True)) == "outage"  # whatever the driver: a dead connection


def test_retries_through_an_outage_logging_once(caplog: pytest.LogCaptureFixture) -> None:
    guard_ = guard()
    calls = {"n": 0, "cleanups": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] <= 4:
            raise outage()
        return "ok"

    def cleanup() -> None:
        calls["cleanups"] += 1

    with caplog.at_level(logging.DEBUG, "test.guard"):
        assert guard_.call(flaky, on_retry=cleanup) == "ok"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2  # the outage began; it ended
    assert "db unavailable" in warnings[0] and "available again" in warnings[1] and "4 failed" in warnings[1]
    assert calls["cleanups"] == 4  # before every new attempt
    assert guard_.last_call_retried


def test_a_stale_pooled_connection_is_not_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    guard_ = guard()
    results = iter([outage(invalidated=True)])

    def once_stale() -> int:
        error = next(results, None)
        if error is not None:
            raise error
        return 7

    with caplog.at_level(logging.WARNING, "test.guard"):
        assert guard_.call(once_stale) == 7
        assert guard_.try_once(lambda: 8) == (True, 8)
    assert caplog.records == []


def test_gives_up_when_asked() -> None:
    guard_ = guard()
    with pytest.raises(GaveUp):
        guard_.call(lambda: (_ for _ in ()).throw(outage()), give_up=lambda: True)


def test_other_errors_are_not_retried() -> None:
    guard_ = guard()
    calls = []

    def bug() -> None:
        calls.append(1)
        raise sa.exc.ProgrammingError("x", {}, Exception("syntax error"))

    with pytest.raises(sa.exc.ProgrammingError):
        guard_.call(bug)
    assert calls == [1]


def test_try_once_reports_an_outage_without_raising() -> None:
    guard_ = guard()
    ok, value = guard_.try_once(lambda: (_ for _ in ()).throw(outage()))
    assert (ok, value) == (False, None) and guard_.outage_started is not None


class FakeMySQLError(Exception):
    pass


FakeMySQLError.__module__ = "MySQLdb._exceptions"


class FakeSQLiteError(Exception):
    pass


FakeSQLiteError.__module__ = "sqlite3"


class FakePostgresError(Exception):
    def __init__(self, pgcode: str) -> None:
        super().__init__(pgcode)
        self.pgcode = pgcode


@pytest.mark.parametrize(
    "who, orig, expected",
    [
        (MYSQL, FakeMySQLError(2013, "Lost connection to server during query"), "outage"),
        (MYSQL, FakeMySQLError(1213, "Deadlock found"), "contention"),
        (MYSQL, FakeMySQLError(1153, "Got a packet bigger than 'max_allowed_packet'"), None),
        (SQLITE, FakeSQLiteError("database is locked"), "contention"),
        (SQLITE, FakeSQLiteError("too many SQL variables"), None),
        # A file (or its directory) this process may not write: no outage, but waited out with
        # the fix in the warning (a worker refuses to start on one).
        (SQLITE, FakeSQLiteError("attempt to write a readonly database"), "read-only"),
        (POSTGRES, FakePostgresError("57014"), "cancelled"),  # statement_timeout: no outage
        (MYSQL, FakeMySQLError(1969, "Query execution was interrupted (max_statement_time exceeded)"), "cancelled"),
        (POSTGRES, FakePostgresError("40P01"), "contention"),
        (POSTGRES, FakePostgresError("25006"), "outage"),  # read-only: a failover in progress
        # No room left to write: retried until there is, never taken for a refused operation.
        (SQLITE, FakeSQLiteError("database or disk is full"), "full"),
        (MYSQL, FakeMySQLError(1114, "The table 'jobqueue_archive' is full"), "full"),
        (MYSQL, FakeMySQLError(1021, "Disk full (/tmp/x); waiting for someone to free some space..."), "full"),
        (POSTGRES, FakePostgresError("53100"), "full"),
        (MYSQL, FakeMySQLError(1030, 'Got error 28 "No space left on device" from storage engine'), "full"),
        (MYSQL, FakeMySQLError(3, "Error writing file './test/t.MYD' (Errcode: 28 \"No space left\")"), "full"),
        (MYSQL, FakeMySQLError(1030, "Got error 168 from storage engine"), None),
        (MYSQL, FakeMySQLError(1114, "The table '/tmp/#sql_1c2_0' is full"), None),  # one query's limit
    ],
)
def test_driver_errors_are_classified_by_what_they_mean(who, orig: Exception, expected: str | None) -> None:
    assert who.classify(sa.exc.ProgrammingError("x", {}, orig)) == expected or (
        expected == "outage" and who.classify(sa.exc.OperationalError("x", {}, orig)) == "outage"
    )


def test_contention_is_retried_without_an_outage_warning(caplog: pytest.LogCaptureFixture) -> None:
    guard_ = DatabaseGuard(logging.getLogger("test.guard"), "db", MYSQL.classify)
    errors = iter([sa.exc.OperationalError("x", {}, FakeMySQLError(1213, "Deadlock found"))])

    def deadlock_once() -> str:
        error = next(errors, None)
        if error is not None:
            raise error
        return "done"

    with caplog.at_level(logging.INFO, "test.guard"):
        assert guard_.call(deadlock_once) == "done"
    assert caplog.records == []


def fails_then_writes(error: Exception, times: int) -> Callable[[], str]:
    """A write that raises ``error`` ``times`` times, then returns "written"."""
    failures = iter([error] * times)

    def write() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "written"

    return write


def test_a_full_database_is_retried_until_there_is_room_never_refused(caplog: pytest.LogCaptureFixture) -> None:
    # The server answers the probe (reads work) while every write fails for want of room: that is
    # not a refusal of this operation (which would fail the jobs whose outcomes it writes), and the
    # warning says what to do.
    guard_ = DatabaseGuard(logging.getLogger("test.guard"), "db", SQLITE.classify)
    write = fails_then_writes(sa.exc.OperationalError("x", {}, FakeSQLiteError("database or disk is full")), 6)
    probes = []

    with caplog.at_level(logging.WARNING, "test.guard"):
        assert guard_.call(write, probe=lambda: probes.append(1)) == "written"
    assert probes == []
    assert "no room left to write; free disk space" in caplog.records[0].getMessage()
    assert "available again" in caplog.records[-1].getMessage()


def test_a_cancelled_statement_is_no_outage_and_never_taken_for_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    # A statement_timeout cancels the statement while the server answers every probe: taken for
    # a refusal, the jobs whose outcomes it writes would be failed; taken for an outage, the log
    # said "database unavailable". The warning names what happened and the fix instead.
    def explain(exc: BaseException) -> str:
        return "the server's statement_timeout of 1 ms cancelled it; raise it"

    guard_ = DatabaseGuard(logging.getLogger("test.guard"), "db", POSTGRES.classify, explain)
    write = fails_then_writes(sa.exc.OperationalError("x", {}, FakePostgresError("57014")), 6)
    probes = []

    with caplog.at_level(logging.WARNING, "test.guard"):
        assert guard_.call(write, probe=lambda: probes.append(1), doing="writing job outcomes") == "written"
    assert probes == []
    first, last = caplog.records[0].getMessage(), caplog.records[-1].getMessage()
    assert first.startswith("db while writing job outcomes: a statement was cancelled"), first
    assert "statement_timeout of 1 ms cancelled it; raise it" in first and "unavailable" not in first
    assert "works again" in last and len(caplog.records) == 2


def test_reads_between_refused_writes_do_not_end_the_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A full disk (or a read-only database) refuses the supervisor's heartbeat while its reads of
    the clock and of its peers succeed: each read said "available again", and the next write
    "unavailable", every few seconds for as long as the disk was full."""
    guard_ = DatabaseGuard(logging.getLogger("test.guard"), "db", SQLITE.classify)
    full = sa.exc.OperationalError("x", {}, FakeSQLiteError("database or disk is full"))

    def refused_write() -> None:
        raise full

    with caplog.at_level(logging.WARNING, "test.guard"):
        for _ in range(3):
            assert guard_.try_once(refused_write) == (False, None)
            assert guard_.try_once(lambda: "read", reads=True) == (True, "read")
        assert len(caplog.records) == 1 and "no room left to write" in caplog.records[0].getMessage()
        assert guard_.try_once(lambda: "written") == (True, "written")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "available again after" in said[1] and "3 failed attempts" in said[1], said
