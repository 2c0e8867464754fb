"""The periodic app on a host whose clock is off by $JOBQUEUE_TEST_SKEW_SECONDS (see tests.apps.skewed)."""

from __future__ import annotations

import tests.apps.skewed  # noqa: F401  # shifts this process's clock
from tests.apps.periodic import app

__all__ = ["app"]
