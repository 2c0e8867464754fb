"""Ack policies: what a handler's return or exception does to its message."""

from __future__ import annotations

import enum


class AckPolicy(str, enum.Enum):
    """How a delivery's outcome follows from the handler.

    - ``ACK_FIRST``: at most once; the message is completed before the handler runs.
    - ``ACK``: completed after the handler, whatever happened.
    - ``REJECT_ON_ERROR``: an exception fails the message at once (no retry).
    - ``NACK_ON_ERROR`` (default): an exception is retried by the retry strategy; with
      ``retry_on``, only those exceptions are, and any other fails the message at once.
    - ``MANUAL``: the handler calls ack/nack/reject on its context; returning without deciding
      acks with a warning, raising without deciding nacks.
    """

    ACK_FIRST = "ack_first"
    ACK = "ack"
    REJECT_ON_ERROR = "reject_on_error"
    NACK_ON_ERROR = "nack_on_error"
    MANUAL = "manual"
