"""The dashboard's pure parts: which addresses need a token, how values read, the chart's scale."""

from __future__ import annotations

from datetime import datetime

import pytest

from jobqueue.dashboard.formatting import CHART_HEIGHT, age, cell, chart, pretty_json, timestamp
from jobqueue.dashboard.security import check_bind, is_loopback
from jobqueue.errors import ConfigurationError
from jobqueue.storage.history import MinuteCount


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "LOCALHOST", "::1", "[::1]"])
def test_loopback_addresses_need_no_token(host: str) -> None:
    assert is_loopback(host)
    assert check_bind(host, None).token is None


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "192.168.1.10", "myhost", "localhost.evil.example"])
def test_every_other_address_needs_a_token(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigurationError, match="pass --token or set JOBQUEUE_DASHBOARD_TOKEN"):
        check_bind(host, None)
    assert check_bind(host, "x" * 16).token == "x" * 16


def test_a_short_token_is_refused_with_a_way_to_make_one() -> None:
    with pytest.raises(ConfigurationError, match="15 characters; use at least 16, e.g. python -c"):
        check_bind("127.0.0.1", "x" * 15)


@pytest.mark.parametrize(
    "seconds, text",
    [(None, "-"), (0.25, "0.2 s"), (9.96, "10.0 s"), (42.7, "42 s"), (60, "1 min"), (185, "3 min 5 s"),
     (7800, "2 h 10 min"), (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"), (-3, "0.0 s")],
)  # fmt: skip
def test_ages_read_in_the_largest_units(seconds: float | None, text: str) -> None:
    assert age(seconds) == text


def test_missing_values_read_as_a_dash() -> None:
    assert cell({"ready": 3}, "ready") == 3 and cell({"ready": 0}, "ready") == 0
    assert cell({"pending": 3}, "ready") == "-" and cell({"ready": None}, "ready") == "-"
    assert timestamp(None) == "-" and timestamp(datetime(2030, 3, 1, 9, 5, 7, 123)) == "2030-03-01 09:05:07 UTC"
    assert pretty_json({"b": [1]}) == '{\n  "b": [\n    1\n  ]\n}'
    assert pretty_json("<cannot decode: bad>") == "<cannot decode: bad>"


def test_the_chart_scales_to_the_busiest_minute() -> None:
    minutes = [
        MinuteCount(datetime(2030, 1, 1, 0, i), completed=c, failed=f)
        for i, (c, f) in enumerate([(0, 0), (3, 1), (1, 0)])
    ]
    bars, peak = chart(minutes)
    assert peak == 4 and len(bars) == 3
    assert bars[0].completed_height == bars[0].failed_height == 0
    assert bars[1].completed_height == 75 and bars[1].failed_height == 25 and bars[1].failed_y == 0
    assert bars[2].completed_y == CHART_HEIGHT - 25
    assert bars[1].title == "00:01 UTC: 3 completed, 1 failed"
    assert chart([MinuteCount(datetime(2030, 1, 1))])[1] == 0  # an idle hour: flat, no division by zero
