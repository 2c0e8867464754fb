"""get_session and the session the Spark tests run on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobqueue.errors import ConfigurationError


def test_get_session_gives_the_running_session_and_refuses_another_master(spark: Any) -> None:
    from jobqueue.spark import get_session

    master = spark.sparkContext.master
    assert get_session() is spark and get_session(master) is spark
    # Spark runs one session per process: a session on another master is not handed out in its place.
    refused = rf"a SparkSession on {re.escape(master)} is active .* one on local\[1\]"
    with pytest.raises(ConfigurationError, match=refused):
        get_session("local[1]")
