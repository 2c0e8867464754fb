"""Schedule math: next fire times (DST included), catch-up, validation, the decorator."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from jobqueue import ConfigurationError, JobQueue, SerializationError
from jobqueue.clock import utcnow
from jobqueue.periodic import Schedule


def cron(expression: str, zone: str = "UTC") -> Schedule:
    return Schedule(name="s", task_name="t", cron=expression, timezone=zone)


def fires(schedule: Schedule, start: datetime, count: int) -> list[str]:
    out, at = [], start
    for _ in range(count):
        at = schedule.next_fire(at)
        out.append(at.strftime("%m-%d %H:%M"))
    return out


# Europe/Paris: spring forward 2026-03-29 02:00 CET -> 03:00 CEST; fall back 2026-10-25 03:00 CEST -> 02:00 CET.
# America/New_York: spring forward 2026-03-08 02:00 EST -> 03:00 EDT; fall back 2026-11-01 02:00 EDT -> 01:00 EST.


def test_daily_job_in_the_skipped_hour_fires_just_after_the_change() -> None:
    with freeze_time("2026-03-28 12:00:00"):
        first = cron("30 2 * * *", "Europe/Paris").first_fire(utcnow())
    assert first == datetime(2026, 3, 29, 1, 0)  # 03:00 CEST: 02:30 did not exist that night
    assert fires(cron("30 2 * * *", "Europe/Paris"), first, 2) == ["03-30 00:30", "03-31 00:30"]  # 02:30 CEST


def test_daily_job_in_the_repeated_hour_fires_once() -> None:
    with freeze_time("2026-10-24 12:00:00"):
        first = cron("30 2 * * *", "Europe/Paris").first_fire(utcnow())
    assert first == datetime(2026, 10, 25, 0, 30)  # the first 02:30 (CEST)
    assert cron("30 2 * * *", "Europe/Paris").next_fire(first) == datetime(2026, 10, 26, 1, 30)  # next day, CET


def test_wildcard_hour_keeps_real_time_spacing_across_both_changes() -> None:
    every_half_hour = cron("*/30 * * * *", "America/New_York")
    spring = fires(every_half_hour, datetime(2026, 3, 8, 6, 0), 4)  # from 01:00 EST
    assert spring == ["03-08 06:30", "03-08 07:00", "03-08 07:30", "03-08 08:00"]  # 01:30 EST, 03:00 EDT, ...
    autumn = fires(every_half_hour, datetime(2026, 11, 1, 5, 0), 4)  # from 01:00 EDT
    assert autumn == ["11-01 05:30", "11-01 06:00", "11-01 06:30", "11-01 07:00"]  # 01:30 EDT, 01:00 EST, ...


def test_hourly_job_during_fall_back_fires_each_real_hour() -> None:
    hourly = cron("0 * * * *", "Europe/Paris")
    assert fires(hourly, datetime(2026, 10, 24, 23, 30), 4) == [
        "10-25 00:00",
        "10-25 01:00",
        "10-25 02:00",
        "10-25 03:00",
    ]


def test_every_first_fires_one_interval_after_creation() -> None:
    schedule = Schedule(name="s", task_name="t", every_seconds=300)
    with freeze_time("2026-05-01 10:00:00"):
        assert schedule.first_fire(utcnow()) == datetime(2026, 5, 1, 10, 5)
    assert schedule.next_fire(datetime(2026, 5, 1, 10, 5)) == datetime(2026, 5, 1, 10, 10)


def test_a_late_fire_within_the_grace_is_the_scheduled_one() -> None:
    schedule = Schedule(name="s", task_name="t", every_seconds=1)
    due = datetime(2026, 5, 1, 10, 0, 0)
    assert schedule.to_fire(due, due + timedelta(seconds=30), grace_seconds=60) == due  # backfilled, no gap


def test_after_downtime_one_catch_up_for_the_latest_missed_fire() -> None:
    every_minute = Schedule(name="s", task_name="t", every_seconds=60)
    due = datetime(2026, 5, 1, 10, 0, 0)
    now = due + timedelta(hours=1, seconds=20)
    fire = every_minute.to_fire(due, now, grace_seconds=60)
    assert fire == datetime(2026, 5, 1, 11, 0, 0)
    assert every_minute.next_fire(fire) == datetime(2026, 5, 1, 11, 1, 0)  # then on schedule again
    quarter = cron("*/15 * * * *", "Europe/Paris")
    assert quarter.to_fire(due, now, 60) == datetime(2026, 5, 1, 11, 0, 0)


@pytest.mark.parametrize(
    "expression, latest",
    [
        ("* * * * *", datetime(2026, 5, 1, 10, 0)),
        ("0 0 1 1 *", datetime(2026, 1, 1)),  # yearly
        ("0 12 29 2 *", datetime(2024, 2, 29, 12)),  # leap days only: the one just after the outage began
    ],
)
def test_catch_up_after_a_very_long_outage_finds_the_latest_fire(expression: str, latest: datetime) -> None:
    assert cron(expression).latest_fire(datetime(2024, 1, 1), datetime(2026, 5, 1, 10, 0, 30)) == latest


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * *"}, "invalid cron expression"),
        ({"cron": "* * *"}, "five fields: minute hour day-of-month month day-of-week .or six, seconds first."),
        ({"cron": "0 0 12 * * ?"}, "'\\?' is Quartz's, not cron's: write '\\*' for the day you leave open"),
        ({"cron": "@reboot"}, "no reboot to fire at"),
        (
            {"cron": "@fortnightly"},
            "the nicknames are @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly",
        ),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"cron": "* * * * *", "timezone": None}, "unknown timezone None"),  # a bare TypeError before
        ({"cron": "* * * * *", "timezone": 2}, "unknown timezone 2"),
        ({"cron": "* * * * *", "timezone": "Europe/Pari"}, "did you mean 'Europe/Paris'"),
        # Each host's own zone: workers on hosts set differently would disagree on the fire times.
        ({"cron": "0 9 * * *", "timezone": "localtime"}, "'localtime' is a link to each host's own /etc/localtime"),
        ({"every_seconds": 60, "timezone": "localtime"}, "give an IANA name such as 'Europe/Paris', or 'UTC'"),
        ({"cron": "0 9 * * *", "timezone": "posixrules"}, "each host's default rules"),
        ({"cron": "0 9 * * *", "timezone": "Factory"}, "never set, not a place; give an IANA name"),
        (
            {"cron": "0 9 * * *", "timezone": "right/Europe/Paris"},
            "leap seconds.*give the plain IANA name 'Europe/Paris'",
        ),
        ({"cron": "0 9 * * *", "timezone": "posix/Europe/Paris"}, "give the plain IANA name 'Europe/Paris'"),
        ({"cron": "* * * * *", "every_seconds": 5}, "exactly one"),
        ({}, "exactly one"),
        ({"every_seconds": 0}, "positive"),
        ({"every_seconds": float("nan")}, "positive duration, got nan"),
        ({"every_seconds": float("inf")}, "positive duration, got inf"),
        ({"every_seconds": "5m"}, "takes a timedelta or a number of seconds, got str '5m'"),
        ({"every_seconds": True}, "takes a timedelta or a number of seconds, got bool"),
        # Rounded to the stored microsecond, the next fire would be this one again, fired over and over.
        ({"every_seconds": 1e-7}, "shorter than a microsecond"),
        ({"every_seconds": 3e11}, "past the year 9999"),
        ({"every_seconds": 10**400}, "past the year 9999"),  # an integer too large for a float
        ({"cron": 5}, "cron= takes a string"),
    ],
)
def test_invalid_schedules(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        Schedule(name="s", task_name="t", **kwargs)


@pytest.mark.parametrize(
    "nickname, expression",
    [("@hourly", "0 * * * *"), ("@DAILY", "0 0 * * *"), (" @midnight ", "0 0 * * *"), ("@weekly", "0 0 * * 0")]
    + [("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *")],
)
def test_crons_nicknames_are_the_expressions_they_stand_for(nickname: str, expression: str) -> None:
    schedule = cron(nickname, "Europe/Paris")
    assert schedule.expression == expression and schedule.definition() == cron(expression, "Europe/Paris").definition()
    start = datetime(2026, 11, 28, 5, 30)
    assert fires(schedule, start, 3) == fires(cron(expression, "Europe/Paris"), start, 3)


def test_six_fields_count_seconds_first() -> None:
    assert fires(cron("30 */20 * * * *"), datetime(2026, 11, 28, 5, 0), 2) == ["11-28 05:00", "11-28 05:20"]
    schedule, at = cron("*/15 * * * * *"), datetime(2026, 11, 28, 5, 0)
    assert [str(at := schedule.next_fire(at)) for _ in range(3)] == [
        "2026-11-28 05:00:15",
        "2026-11-28 05:00:30",
        "2026-11-28 05:00:45",
    ]


def test_a_zoneinfo_is_taken_by_its_name() -> None:
    # ZoneInfo("Europe/Paris") itself was refused with "expected str, bytes or os.PathLike object".
    schedule = Schedule(name="s", task_name="t", cron="0 9 * * *", timezone=ZoneInfo("Europe/Paris"))  # type: ignore[arg-type]
    assert schedule.timezone == "Europe/Paris"
    assert Schedule.decode(schedule.encode()) == schedule


def test_the_hosts_own_zone_is_refused_at_import() -> None:
    """By name, or as a ZoneInfo read from a file (it has no name: stored, it would mean nothing)."""
    app = JobQueue()

    @app.task(name="t")
    def t() -> None: ...

    with open("/usr/share/zoneinfo/Europe/Paris", "rb") as file:
        from_file = ZoneInfo.from_file(file)
    for zone in ("localtime", from_file):
        with pytest.raises(ConfigurationError, match="give an IANA name such as 'Europe/Paris', or 'UTC'"):
            app.periodic(cron="0 9 * * *", timezone=zone)(t)
    assert not app.schedules


def test_stored_definition_round_trips() -> None:
    schedule = Schedule(
        name="n", task_name="t", cron="0 9 * * MON", timezone="Europe/Paris", queue="q", priority=3, payload=b"[[1],{}]"
    )
    assert Schedule.decode(schedule.encode()) == schedule


def test_decorator(tmp_path) -> None:
    app = JobQueue(f"sqlite:///{tmp_path}/x.sqlite3")

    @app.periodic(every=timedelta(minutes=5), args=(1,), kwargs={"b": 2})
    @app.periodic(cron="0 8 * * *", timezone="Europe/Paris", name="morning")
    @app.task
    def report(a: int = 0, b: int = 0) -> int:
        return a + b

    assert set(app.schedules) == {report.name, "morning"}
    assert app.schedules[report.name].every_seconds == 300
    assert app.schedules["morning"].cron == "0 8 * * *"
    assert report(1, b=2) == 3  # still a task

    with pytest.raises(ConfigurationError, match="above @app.task"):
        app.periodic(every=60)(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="defined twice"):
        app.periodic(every=60, name="morning")(report)
    with pytest.raises(SerializationError, match="cannot serialize"):
        app.periodic(every=60, name="bad", args=(object(),))(report)
    # Checked at import, not when a worker starts and computes the first fire.
    with pytest.raises(ConfigurationError, match="too long"):
        app.periodic(every=timedelta(days=3_000_000), name="never")(report)
    with pytest.raises(ConfigurationError, match="reserved"):
        app.task(name="jobqueue.schedule")(lambda: None)


def test_a_concurrency_key_that_fails_on_the_schedules_arguments_fails_at_import(tmp_path) -> None:
    app = JobQueue(f"sqlite:///{tmp_path}/x.sqlite3")

    @app.task(concurrency_key=lambda region: f"region-{region['code']}", concurrency_limit=1)
    def refresh(region: dict) -> None: ...

    with pytest.raises(ConfigurationError, match="concurrency_key of task .*refresh failed on these arguments"):
        app.periodic(every=60, args=("eu",))(refresh)
    app.periodic(every=60, args=({"code": "eu"},))(refresh)
    assert list(app.schedules) == [refresh.name]


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("a\x00b", "must not contain NUL"),  # PostgreSQL refused it when a worker started, in a raw ValueError
        ("\ud800", "not valid Unicode"),
        (5, "must be a string"),  # a bare TypeError before
        ("x" * 201, "1 to 200 characters"),
    ],
)
def test_a_schedule_name_no_database_can_store_fails_at_import(tmp_path, name: object, fragment: str) -> None:
    app = JobQueue(f"sqlite:///{tmp_path}/x.sqlite3")
    task = app.task(name="report")(lambda: None)
    with pytest.raises(ConfigurationError, match=fragment):
        app.periodic(every=60, name=name)(task)  # type: ignore[arg-type]
    assert app.schedules == {}


def test_the_latest_fire_in_the_repeated_hour_is_the_first_of_that_night() -> None:
    # 01:01 UTC is 02:01 CET, the second 02:01 of the night: the 02:30 CEST of 00:30 UTC has passed.
    daily = cron("30 2 * * *", "Europe/Paris")
    assert daily.latest_fire(datetime(2026, 10, 20), datetime(2026, 10, 25, 1, 1)) == datetime(2026, 10, 25, 0, 30)
    assert daily.latest_fire(datetime(2026, 10, 20), datetime(2026, 10, 25, 0, 29)) == datetime(2026, 10, 24, 0, 30)
    hourly = cron("0 * * * *", "Europe/Paris")
    assert hourly.latest_fire(datetime(2026, 10, 20), datetime(2026, 10, 25, 1, 1)) == datetime(2026, 10, 25, 1, 0)


@pytest.mark.parametrize("length", [201, 300])
def test_a_schedule_name_too_long_names_the_limit_that_applies(length: int) -> None:
    """A name of 300 characters was refused as over "1 to 255 characters", one of 201 as over
    "1 to 200": the limit is 200 (its jobs' unique keys add "@" and the fire time)."""
    app = JobQueue("sqlite:///unused.sqlite3")

    @app.task
    def tick() -> None:
        pass

    with pytest.raises(ConfigurationError, match=f"1 to 200 characters, got a string of {length} characters"):
        app.periodic(every=5, name="x" * length)(tick)
    app.periodic(every=5, name="x" * 200)(tick)
