"""A SparkSession set up for jobqueue's jobs, local by default."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from jobqueue.errors import ConfigurationError

DEFAULT_MASTER = "local[*]"


def get_session(master: str | None = None, app_name: str = "jobqueue") -> SparkSession:
    """The active SparkSession, or a new one on ``master`` (default ``local[*]``).

    On a local master, Python workers get this interpreter (``PYSPARK_PYTHON``), or they would
    import from another Python; times are read and shown in UTC, as jobqueue stores them; the web UI stays off.

    Raises:
        ConfigurationError: a session on another master is active (a process runs one at a time).
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        running = active.sparkContext.master
        if master is None or master == running:
            return active
        raise ConfigurationError(
            f"a SparkSession on {running} is active in this process, and Spark runs one at a time: "
            f"stop it (spark.stop()) before asking for one on {master}"
        )
    master = master or DEFAULT_MASTER
    if master.startswith("local"):  # on a cluster the executors' Python is the cluster's business
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8" if master.startswith("local") else "200")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session
