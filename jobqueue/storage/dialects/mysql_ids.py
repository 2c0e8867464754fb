"""MySQL and MariaDB: new job ids that no archived job has.

A job keeps its id in the archive, so a new message must never get the id of an archived job.
TRUNCATE of the message table resets AUTO_INCREMENT (PostgreSQL's sequence and SQLite's
AUTOINCREMENT never go back), and the next ids would collide. A healthy counter only goes up, so
each process remembers the largest archived id (read again at most every FLOOR_MAX_AGE_SECONDS)
and the largest id it was given itself: a new id above both is fresh, and only one at or below
them is checked against the archive and, if taken, moved to a fresh id, which moves
AUTO_INCREMENT past the archive. The first insert after a TRUNCATE gets a small id, so it is
caught, and the counter is mended for everyone.
"""

from __future__ import annotations

import logging
import time

from jobqueue.storage.dialects.mysql_statements import Runner, mysql_code
from jobqueue.storage.outcomes import RELEASED

DUPLICATE_KEY = 1062
FRESH_ID_TRIES = 10
FLOOR_MAX_AGE_SECONDS = 1.0
logger = logging.getLogger("jobqueue.storage")


class FreshIds:
    """What this process knows of the ids in use: the archive's largest, and the largest it was given."""

    def __init__(self, message: str, archive: str) -> None:
        self.message, self.archive = message, archive
        self.floor_sql = f"(SELECT COALESCE(MAX(id), 0) FROM {archive})"  # the largest archived id
        self._floor = 0
        self._floor_read_at: float | None = None
        self._largest_id = 0

    def checked(self, run: Runner, ids: list[int], floor: int | None = None) -> list[int]:
        """``ids`` as they are, or with those an archived job has moved to fresh ids. ``floor``:
        the largest archived id, if the caller read it with its insert."""
        if not ids:
            return ids
        now = time.monotonic()
        if floor is not None:
            self._floor, self._floor_read_at = floor, now
        elif self._floor_read_at is None or now - self._floor_read_at > FLOOR_MAX_AGE_SECONDS:
            self._floor, self._floor_read_at = int(run(f"SELECT {self.floor_sql}", ()).fetchone()[0]), now
        if min(ids) <= max(self._floor, self._largest_id):
            # Perhaps the counter went back, perhaps another thread of ours was quicker: look at the
            # archive and the counter as they are now. Then remember the counter from here (else
            # every later insert would be checked until it passed the old ids).
            self._floor = int(run(f"SELECT {self.floor_sql}", ()).fetchone()[0])
            ids = self.move(run, ids, self._floor)
            self._largest_id = max(ids)
        else:
            self._largest_id = max(self._largest_id, max(ids))
        return ids

    def move(self, run: Runner, ids: list[int], floor: int) -> list[int]:
        """Move those of ``ids`` that an archived job has to fresh ids above ``floor``; and if the
        counter itself is at or below ``floor`` (it went back), move the newest of ours too, which
        sets it past the archive for every later insert."""
        suspects = [job_id for job_id in ids if job_id <= floor]
        if not suspects:
            return ids
        marks = ", ".join(["%s"] * len(suspects))
        moving = {
            int(row[0])
            for row in run(f"SELECT id FROM {self.archive} WHERE id IN ({marks})", tuple(suspects)).fetchall()
        }
        counter = run(
            "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (self.message,),
        ).fetchone()
        if counter is not None and counter[0] is not None and int(counter[0]) <= floor:
            moving.add(max(ids))  # still ours alone: nobody has its id yet
        colliding = sorted(moving)
        if not colliding:
            return ids
        moved: dict[int, int] = {}
        for old in colliding:
            for _ in range(FRESH_ID_TRIES):
                new = int(
                    run(f"SELECT GREATEST(COALESCE(MAX(id), 0), %s) + 1 FROM {self.message}", (floor,)).fetchone()[0]
                )
                try:
                    # A worker may have taken the row in the instant since an autocommitted insert:
                    # it goes back to the queue, uncounted, and that delivery's outcome is fenced out.
                    # (MySQL assigns left to right, each seeing the ones before: counters first.)
                    run(
                        f"UPDATE {self.message} SET id = %s, first_attempt_at = IF(state = 'PROCESSING' AND "
                        "attempts_count <= 1, NULL, first_attempt_at), "
                        "attempts_count = attempts_count - (state = 'PROCESSING'), "
                        "deliveries_count = deliveries_count - (state = 'PROCESSING'), state = 'PENDING', "
                        f"{', '.join(f'{column} = NULL' for column in RELEASED)} WHERE id = %s",
                        (new, old),
                    )
                except Exception as exc:
                    if mysql_code(exc) == DUPLICATE_KEY:  # another insert took that id just now
                        continue
                    raise
                moved[old] = new
                break
            else:
                raise RuntimeError(f"could not give job {old} a fresh id after {FRESH_ID_TRIES} tries")
        logger.warning(
            "%s new job id(s) collided with archived jobs (the message table's AUTO_INCREMENT went "
            "back, after a TRUNCATE?); they were given fresh ids",
            len(moved),
        )
        return [moved.get(job_id, job_id) for job_id in ids]
