"""What a job wrote, as the ``jobqueue`` commands print it to the operator's terminal."""

from __future__ import annotations

import json

from jobqueue import JobQueue
from tests.acceptance.cli import jobqueue
from tests.apps import basic


def test_bidirectional_controls_in_a_job_are_shown_as_escapes(app: JobQueue) -> None:
    """A right-to-left override makes a terminal that honours it show what follows reversed: an
    error could read as another. The commands write such characters as escapes."""
    hostile = "payment \u202edeliaf\u202c ok \u2067x\u2069 \u200f"
    handle = basic.fail.apply_async((hostile,), unique_key="key\u202e")
    jobqueue("worker", "--burst", "--concurrency", "1")
    for command in (("jobs", "list"), ("jobs", "show", str(handle.id))):
        shown = jobqueue(*command).stdout
        assert not any(c in shown for c in "\u202e\u202c\u2067\u2069\u200f"), command
        assert "payment \\u202edeliaf\\u202c ok \\u2067x\\u2069 \\u200f" in shown, shown
    assert "unique_key   key\\u202e" in jobqueue("jobs", "show", str(handle.id)).stdout
    assert json.loads(jobqueue("jobs", "show", str(handle.id), "--json").stdout)["error_message"] == hostile
