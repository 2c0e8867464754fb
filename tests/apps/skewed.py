"""The runtime tests' app on a host whose clock is off by $JOBQUEUE_TEST_SKEW_SECONDS.

Every time jobqueue reads from this host's clock goes through ``jobqueue.clock``; shifting it here
is what a host with a wrong clock looks like to jobqueue.
"""

from __future__ import annotations

import os
from datetime import timedelta

import jobqueue.clock
from tests.apps.runtime import app

SKEW = timedelta(seconds=float(os.environ.get("JOBQUEUE_TEST_SKEW_SECONDS", "0")))

# utcnow() counts from this epoch: moving it moves every host clock reading.
jobqueue.clock._EPOCH += SKEW

__all__ = ["app"]
