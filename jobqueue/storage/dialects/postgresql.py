"""PostgreSQL: acquire in one statement, a CTE with FOR UPDATE SKIP LOCKED feeding UPDATE ... RETURNING."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from jobqueue.storage.dialects.base import Dialect


class PostgreSQLDialect(Dialect):
    name = "postgresql"
    insert_on_conflict = staticmethod(postgresql.insert)

    def check_server(self, connection: sa.Connection) -> None:
        self._require(connection.dialect.server_version_info, (13,), "PostgreSQL")

    def build_acquire(self, filtered: bool) -> Any:
        m = self.message
        ready = self.ready_select([m.c.id], filtered).with_for_update(skip_locked=True).cte("ready")
        return (sa.update(m).where(m.c.id == ready.c.id)
                .values(self.acquired_values()).returning(*self.returned))
