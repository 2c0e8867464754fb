"""``jobqueue worker --progress``: runs done (a retried job runs again), jobs left and rate, on one
line of the terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

import sqlalchemy as sa

from jobqueue import logs
from jobqueue.job import SCHEDULE_TASK
from jobqueue.storage.store import Store

BAR_WIDTH = 30


class Progress:
    def __init__(self, store: Store, queues: tuple[str, ...] | None, stream: TextIO | None = None) -> None:
        self.store = store
        self.queues = queues
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.next_at = 0.0
        self.interval = 0.25 if self.tty else 2.0
        # Log lines (of every process of the pool) then clear the bar's line before they print;
        # the next refresh draws the bar again below them.
        logs.progress_on_terminal = self.tty

    def remaining(self) -> int:
        m = self.store.tables.message
        stmt = sa.select(sa.func.count()).select_from(m).where(m.c.task_name != SCHEDULE_TASK)
        if self.queues:
            stmt = stmt.where(m.c.queue.in_(self.queues))
        with self.store.reading() as conn:
            return int(conn.execute(stmt).scalar() or 0)

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if now < self.next_at and not force:
            return
        self.next_at = now + self.interval
        try:
            left = self.remaining()
        except Exception:
            return  # a progress line is not worth failing over
        elapsed = max(now - self.started, 1e-9)
        total = done + left
        fraction = done / total if total else 1.0
        filled = int(BAR_WIDTH * fraction)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        # Runs, not jobs: a job that is retried runs again, and counts again.
        line = f"[{bar}] {done} runs done, {left} jobs left, {done / elapsed:,.0f} runs/s, {elapsed:.1f} s"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self, done: int) -> None:
        self.update(done, force=True)
        logs.progress_on_terminal = False
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
