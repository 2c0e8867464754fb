"""Every Spark test runs twice: on a local SparkSession (``local[2]``) and on a standalone cluster
(a master and a worker started for the session, see cluster.py), whose executors are processes of
their own. Two cores, small shuffles, no web UI for the driver."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.cluster import StandaloneCluster

if not os.environ.get("JOBQUEUE_TEST_REQUIRE_ALL"):
    pytest.importorskip("pyspark", reason='the Spark tests need pip install "jobqueue[spark]"')

# The JVMs and the Python workers they start run in another time zone than this process (whose
# time module read TZ long ago), so the tests show that instants survive the trip.
OTHER_ZONE = "America/New_York"


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), {"TZ": OTHER_ZONE})
    try:
        cluster.start()
    except Exception as exc:  # never a skip: a cluster that does not start fails the tests that need it
        pytest.fail(f"the Spark standalone cluster did not start: {exc}", pytrace=False)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session", params=["local", "cluster"])
def master(request: pytest.FixtureRequest) -> str:
    """The master URL of the session the test runs on: ``local[2]``, or the cluster's."""
    if request.param == "local":
        return "local[2]"
    cluster: StandaloneCluster = request.getfixturevalue("spark_cluster")
    return cluster.url


@pytest.fixture(scope="session")
def spark(master: str) -> Iterator[Any]:
    from jobqueue.spark import get_session

    saved = {name: os.environ.get(name) for name in ("TZ", "PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    os.environ["TZ"] = OTHER_ZONE
    # On a cluster get_session leaves the executors' Python to the cluster: this one is on this
    # machine, and the driver must listen where the executors can reach it.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    try:
        session = get_session(master)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests by their session parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test on the local session, then every one on the cluster: pytest's own grouping went
    back and forth between the two, and each switch stopped one SparkSession and started the other
    (10 to 30 s each)."""
    spark = [i for i, item in enumerate(items) if "master" in getattr(item, "fixturenames", ())]
    ordered = sorted((items[i] for i in spark), key=lambda item: _master(item) == "cluster")
    for i, item in zip(spark, ordered, strict=True):
        items[i] = item


def _master(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    return str(callspec.params.get("master", "")) if callspec is not None else ""
