"""When a worker process counts its file descriptors as used up (then it is replaced)."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

from jobqueue.runtime import oscalls as process


@pytest.fixture
def limit_64(monkeypatch: pytest.MonkeyPatch) -> int:
    """A limit of 64 descriptors more than this process has open now (the ones earlier tests of
    this pytest process left open), seen by the check only (spare: 16, so 48 more in use is the
    line); returns how many it has open now, which every figure of the tests counts from."""
    base = process.lowest_free_descriptor(0) or 0
    monkeypatch.setattr(resource, "getrlimit", lambda which: (base + 64, resource.RLIM_INFINITY))
    return base


@pytest.fixture
def opened() -> Iterator[list[int]]:
    fds: list[int] = []
    yield fds
    for fd in fds:
        os.close(fd)


def open_until(fds: list[int], lowest_free: int) -> None:
    while (process.lowest_free_descriptor(0) or 0) < lowest_free:
        fds.append(os.open(os.devnull, os.O_RDONLY))


def test_descriptors_a_job_took_up_to_the_limit_count_as_used_up(limit_64: int, opened: list[int]) -> None:
    start = process.lowest_free_descriptor(0) or 0
    assert process.descriptors_used_up(0, start) is None
    open_until(opened, limit_64 + 50)
    assert process.descriptors_used_up(0, start) == (limit_64 + 50, limit_64 + 64)


def test_descriptors_the_process_started_with_do_not(limit_64: int, opened: list[int]) -> None:
    """A process that inherits nearly all of them from its supervisor is not replaced for that:
    a fresh one would have them too."""
    open_until(opened, limit_64 + 45)
    start = process.lowest_free_descriptor(0) or 0
    open_until(opened, limit_64 + 52)  # a few more, as its own connections would add
    assert process.descriptors_used_up(0, start) is None
    open_until(opened, start + 16)
    assert process.descriptors_used_up(0, start) == (start + 16, limit_64 + 64)


def test_below_the_floor_the_check_stops_at_its_dup(limit_64: int, opened: list[int]) -> None:
    floor = process.descriptors_floor()
    assert floor == limit_64 + 48  # the limit less the spare margin of 16
    start = process.lowest_free_descriptor(0) or 0
    assert process.descriptors_used_up(0, start, floor) is None
    open_until(opened, limit_64 + 50)
    assert process.descriptors_used_up(0, start, floor) == (limit_64 + 50, limit_64 + 64)  # past the floor
