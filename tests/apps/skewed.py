"""The runtime tests' app on a host whose clock is off by $JOBQUEUE_TEST_SKEW_SECONDS.

Every time jobqueue reads from this host's clock goes through ``jobqueue.clock``; shifting it here
is what a host with a wrong clock looks like to jobqueue.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, tzinfo

import jobqueue.clock
from tests.apps.runtime import app

SKEW = timedelta(seconds=float(os.environ.get("JOBQUEUE_TEST_SKEW_SECONDS", "0")))


class SkewedDatetime(datetime):
    @classmethod
    def now(cls, tz: tzinfo | None = None) -> SkewedDatetime:
        return super().now(tz) + SKEW


jobqueue.clock.datetime = SkewedDatetime  # type: ignore[attr-defined]  # every host clock reading goes through it

__all__ = ["app"]
