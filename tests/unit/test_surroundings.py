"""What a worker process puts back after each job: its working directory, umask and signal handlers."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobqueue.runtime.surroundings import Surroundings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A process started in tmp_path/home; the test's own directory and umask come back after."""
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path / "home")
    umask = os.umask(0o022)
    yield tmp_path / "home"
    os.umask(umask)


def test_a_jobs_chdir_and_umask_are_put_back(home: Path, tmp_path: Path) -> None:
    surroundings = Surroundings()
    os.chdir(tmp_path)
    os.umask(0o077)
    surroundings.restore()
    assert os.getcwd() == str(home) and os.umask(0o022) == 0o022


def test_a_job_that_closed_the_descriptor_is_put_back_by_the_path(home: Path, tmp_path: Path) -> None:
    surroundings = Surroundings()
    assert surroundings.directory is not None
    os.close(surroundings.directory)  # as os.closerange() in daemonizing code would
    os.chdir(tmp_path)
    surroundings.restore()
    assert os.getcwd() == str(home)
    os.chdir(tmp_path)
    surroundings.restore()  # with a descriptor of its own again
    assert os.getcwd() == str(home) and surroundings.directory is not None


def test_a_working_directory_that_cannot_be_reached_is_said_once(
    home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    surroundings = Surroundings()
    assert surroundings.directory is not None
    os.close(surroundings.directory)
    os.chdir(tmp_path)
    home.rmdir()
    with caplog.at_level(logging.WARNING, "jobqueue.worker"):
        surroundings.restore()
        surroundings.restore()
    assert os.getcwd() == str(tmp_path)
    assert [r.getMessage() for r in caplog.records if "cannot go back" in r.getMessage()] != []
    assert len(caplog.records) == 1


def test_a_jobs_sigterm_handler_is_replaced_by_the_workers_once_said(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def workers(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, workers)
    try:
        surroundings = Surroundings()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the job's
        with caplog.at_level(logging.WARNING, "jobqueue.worker"):
            surroundings.restore()
            surroundings.restore()  # nothing to put back: nothing said
        assert signal.getsignal(signal.SIGTERM) is workers
        assert [r.getMessage() for r in caplog.records if "SIGTERM handler" in r.getMessage()] != []
        assert len(caplog.records) == 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_logging_disabled_by_a_job_is_put_back_and_said(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A job's logging.disable(logging.CRITICAL) silenced the errors of every later job of its process."""
    with caplog.at_level(logging.WARNING, "jobqueue.worker"):  # (which enables logging first)
        surroundings = Surroundings()
        logging.disable(logging.CRITICAL)  # the job's
        try:
            surroundings.restore()
            surroundings.restore()  # nothing to put back: nothing said
            assert logging.root.manager.disable == surroundings.logging_disabled
            logging.getLogger("jobqueue.worker").error("a later job failed")
        finally:
            logging.disable(logging.NOTSET)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "a job called logging.disable(CRITICAL)" in said[0], said
    assert said[1] == "a later job failed"
