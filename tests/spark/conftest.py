"""One local SparkSession for the whole test session: two cores, small shuffles, no web UI."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

if not os.environ.get("JOBQUEUE_TEST_REQUIRE_ALL"):
    pytest.importorskip("pyspark", reason='the Spark tests need pip install "jobqueue[spark]"')


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from jobqueue.spark import get_session

    # The JVM and the Python workers it starts run in another time zone than this process (whose
    # time module read TZ long ago), so the tests show that instants survive the trip.
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    try:
        session = get_session("local[2]")
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()
