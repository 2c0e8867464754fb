"""PostgreSQL: acquire in one statement, a CTE with FOR UPDATE SKIP LOCKED feeding UPDATE ... RETURNING."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from jobqueue.storage.dialects.base import Dialect


class PostgreSQLDialect(Dialect):
    name = "postgresql"
    insert_on_conflict = staticmethod(postgresql.insert)

    def check_server(self, connection: sa.Connection) -> None:
        self._require(connection.dialect.server_version_info, (13,), "PostgreSQL")

    def build_acquire(self, queues: str) -> Any:
        m = self.message
        ready = self.ready_select([m.c.id], queues != "all").with_for_update(skip_locked=True).cte("ready")
        return (sa.update(m).where(m.c.id == ready.c.id)
                .values(self.acquired_values()).returning(*self.returned))

    def renew_leases(self, connection: sa.Connection, worker_ids: list[str], until: datetime) -> int:
        # Rows a worker is flushing right now are skipped, not waited for: waiting could deadlock
        # with the flush's own row locks, and those rows are about to leave PROCESSING anyway.
        m = self.message
        locked = sa.select(m.c.id).where(*self.renewable(worker_ids, until)).with_for_update(skip_locked=True)
        stmt = sa.update(m).where(m.c.id.in_(locked.scalar_subquery())).values(lease_expires_at=until)
        return int(connection.execute(stmt).rowcount)
