"""Signals: connect as a decorator, disconnect, keyword arguments, and receivers that raise."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from jobqueue import JobQueue, signals
from jobqueue.clock import utcnow
from jobqueue.job import Message
from jobqueue.runtime.executor import Executor
from jobqueue.serialization import dumps_call


def test_connect_as_decorator_and_disconnect() -> None:
    signal = signals.Signal("probe", ("sender", "value"))
    seen: list[dict[str, Any]] = []

    @signal.connect
    def receiver(**kwargs: Any) -> None:
        seen.append(kwargs)

    assert signal.connect(receiver) is receiver and signal.receivers == (receiver,)  # connected once
    signal.send("me", value=1)
    assert seen == [{"sender": "me", "value": 1}]
    assert signal.disconnect(receiver) is True and signal.disconnect(receiver) is False
    signal.send("me", value=2)
    assert len(seen) == 1
    with pytest.raises(TypeError, match="takes a callable"):
        signal.connect("not a function")  # type: ignore[arg-type]


def test_a_raising_receiver_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    signal = signals.Signal("probe", ("sender",))
    calls: list[str] = []

    def bad(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    signal.connect(bad)
    signal.connect(lambda **kwargs: calls.append("good"))
    with caplog.at_level(logging.ERROR, logger="jobqueue.signals"):
        signal.send(None)
    assert calls == ["good"]
    assert "a receiver of probe raised" in caplog.text and "receiver bug" in caplog.text


def message(task: str, payload: bytes) -> Message:
    now = utcnow()
    return Message(7, task, "default", 0, payload, None, 1, 1, 1, now, now, now, acquired_at=now)


def test_the_executor_signals_each_outcome_with_the_job_context() -> None:
    app = JobQueue("sqlite://")

    @app.task(name="probe.ok")
    def ok(x: int) -> int:
        return x * 2

    @app.task(name="probe.bad", retry_on=(ConnectionError,))
    def bad() -> None:
        raise KeyError("gone")

    events: list[tuple[str, dict[str, Any]]] = []
    receivers = {
        s: (lambda name: lambda **kw: events.append((name, kw)))(s.name)
        for s in (signals.job_started, signals.job_succeeded, signals.job_failed, signals.job_retrying)
    }
    for s, r in receivers.items():
        s.connect(r)
    try:
        executor = Executor(app)
        executor.execute(message("probe.ok", dumps_call(app.serializer, (21,), {})))
        executor.execute(message("probe.bad", dumps_call(app.serializer, (), {})))
        executor.execute(message("probe.unknown", b"[]"))
    finally:
        for s, r in receivers.items():
            s.disconnect(r)
    names = [name for name, _ in events]
    assert names == ["job_started", "job_succeeded", "job_started", "job_failed", "job_failed"]
    started, succeeded = events[0][1], events[1][1]
    assert started["sender"] is ok and started["job"].id == 7
    assert succeeded["result"] == 42
    failed = events[3][1]
    assert isinstance(failed["exception"], KeyError) and "KeyError: 'gone'" in failed["traceback"]
    assert failed["exception"].__traceback__ is not None
    unknown = events[4][1]
    assert unknown["sender"] is None and type(unknown["exception"]).__name__ == "UnknownTaskError"
