"""The runtime tests' app on a host whose clock is set forward while it runs.

When the file named by $JOBQUEUE_TEST_JUMP_FILE appears, holding a number of seconds, every process
of the worker (the supervisor, and each worker process once it starts) moves its reading of this
host's clock forward by that much, as a clock set forward by hand or by a resumed machine would.

With $JOBQUEUE_TEST_JUMP_WALL set, only the wall clock (``time.time``) moves, as when NTP or
``date -s`` sets the clock of a running host: the time since boot goes on as it was.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

import jobqueue.clock
from jobqueue import signals
from tests.apps.runtime import app

JUMP_FILE = os.environ.get("JOBQUEUE_TEST_JUMP_FILE", "")
WALL = bool(os.environ.get("JOBQUEUE_TEST_JUMP_WALL"))
_applied = 0.0  # seconds this process has moved its clock by (a forked process inherits it)
_real_time = time.time


def _wall_clock() -> float:
    return _real_time() + _applied


if JUMP_FILE and WALL:  # jobqueue takes this for the interpreter's own clock, not a test's
    time.time = _wall_clock
    jobqueue.clock._REAL_TIME = (_wall_clock,)


def _watch() -> None:
    global _applied
    while True:
        try:
            with open(JUMP_FILE) as f:
                wanted = float(f.read().strip() or 0)
        except (OSError, ValueError):
            wanted = _applied
        if wanted != _applied:
            if not WALL:
                jobqueue.clock._EPOCH += timedelta(seconds=wanted - _applied)
            _applied = wanted
        time.sleep(0.01)


def _start_watching(**_: Any) -> None:
    threading.Thread(target=_watch, daemon=True, name="clock-jump").start()


if JUMP_FILE:
    _start_watching()
    signals.worker_process_init.connect(_start_watching)

__all__ = ["app"]
