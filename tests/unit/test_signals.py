"""Signals: connect as a decorator, disconnect, keyword arguments, and receivers that raise."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from jobqueue import AckPolicy, JobQueue, signals
from jobqueue.clock import utcnow
from jobqueue.job import Message, MessageState
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


@contextlib.contextmanager
def job_signals_recorded() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every job signal sent meanwhile, as (name, keyword arguments)."""
    events: list[tuple[str, dict[str, Any]]] = []
    receivers = {
        s: (lambda name: lambda **kw: events.append((name, kw)))(s.name)
        for s in (signals.job_started, signals.job_succeeded, signals.job_failed, signals.job_retrying)
    }
    for s, r in receivers.items():
        s.connect(r)
    try:
        yield events
    finally:
        for s, r in receivers.items():
            s.disconnect(r)


def test_the_executor_signals_each_outcome_with_the_job_context() -> None:
    app = JobQueue("sqlite://")

    @app.task(name="probe.ok")
    def ok(x: int) -> int:
        return x * 2

    @app.task(name="probe.bad", retry_on=(ConnectionError,))
    def bad() -> None:
        raise KeyError("gone")

    with job_signals_recorded() as events:
        executor = Executor(app)
        executor.execute(message("probe.ok", dumps_call(app.serializer, (21,), {})))
        executor.execute(message("probe.bad", dumps_call(app.serializer, (), {})))
        executor.execute(message("probe.unknown", b"[]"))
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


@pytest.mark.parametrize(
    "raised",
    [SystemExit(9), KeyboardInterrupt(), asyncio.CancelledError()],
    ids=["sys.exit", "KeyboardInterrupt", "CancelledError"],
)
def test_a_receiver_raising_what_is_not_an_exception_leaves_the_outcome_alone(
    raised: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    app = JobQueue("sqlite://")

    @app.task(name="probe.charge")
    def charge(order: int) -> str:
        return f"charged {order}"

    def bad(**kwargs: Any) -> None:
        raise raised

    later: list[str] = []

    def good(**kwargs: Any) -> None:
        later.append(kwargs["result"])

    for signal in (signals.job_started, signals.job_succeeded):
        signal.connect(bad)
    signals.job_succeeded.connect(good)
    try:
        with caplog.at_level(logging.ERROR, logger="jobqueue.signals"):
            outcome = Executor(app).execute(message("probe.charge", dumps_call(app.serializer, (7,), {})))
    finally:
        for signal in (signals.job_started, signals.job_succeeded):
            signal.disconnect(bad)
        signals.job_succeeded.disconnect(good)
    assert outcome is not None and outcome.state is MessageState.COMPLETED and outcome.error is None
    assert later == ["charged 7"]  # the function ran, and the next receiver was called
    assert caplog.text.count("a receiver of job_") == 2 and "the job's outcome is unchanged" in caplog.text


def test_a_process_signal_receiver_that_raises_says_the_process_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    def bad(**kwargs: Any) -> None:
        raise SystemExit(4)

    said = {}
    for signal in (signals.worker_process_init, signals.worker_process_shutdown):
        signal.connect(bad)
        caplog.clear()
        try:
            with caplog.at_level(logging.ERROR, logger="jobqueue.signals"):
                signal.send(None, app=None, process_name="worker-0")
        finally:
            signal.disconnect(bad)
        said[signal.name] = caplog.text
    init = said["worker_process_init"]
    assert "; the worker process goes on" in init and "stopping" not in init and "outcome" not in init
    assert "; the worker process goes on stopping" in said["worker_process_shutdown"]


def test_the_users_ctrl_c_during_a_drain_is_passed_on_by_a_receiver() -> None:
    signal = signals.Signal("probe", ("sender",))
    calls: list[str] = []

    def pressed(**kwargs: Any) -> None:
        raise signals.Interrupted  # what drain() raises on a second Ctrl-C, wherever it lands

    signal.connect(pressed)
    signal.connect(lambda **kwargs: calls.append("later"))
    with pytest.raises(KeyboardInterrupt):
        signal.send(None)
    assert calls == []


def test_an_ack_first_job_sends_its_signals() -> None:
    app = JobQueue("sqlite://")

    @app.task(name="probe.fire", ack_policy=AckPolicy.ACK_FIRST)
    def fire(x: str) -> str:
        if x == "bad":
            raise ValueError("boom")
        return x.upper()

    with job_signals_recorded() as events:
        executor = Executor(app)
        assert executor.execute(message("probe.fire", dumps_call(app.serializer, ("ok",), {}))) is None
        assert executor.execute(message("probe.fire", dumps_call(app.serializer, ("bad",), {}))) is None
    assert [name for name, _ in events] == ["job_started", "job_succeeded", "job_started", "job_failed"]
    assert events[1][1]["result"] == "OK" and events[1][1]["sender"] is fire
    failed = events[3][1]
    assert isinstance(failed["exception"], ValueError) and "ValueError: boom" in failed["traceback"]
