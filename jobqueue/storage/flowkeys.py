"""Flow rows for the keys of jobs that have none: the rows a worker finds keyed jobs through.

Workers find the jobs of a flow key through its row in the flow table (see dialects/flow.py), so a
job whose key has no row is never acquired. Every enqueue adds its key's row before its job, and
the sweep of idle keys deletes only rows without jobs, both under a lock on the row: a row goes
missing only when it is deleted by hand (or a restore brings back the jobs and not their rows).
The supervisors' sweep then adds it back, as an enqueue would have made it.

The keys with jobs are found by a walk of the index of keyed jobs (``flow_key, state``), one
index probe per key however many jobs each key holds, where ``SELECT DISTINCT`` would read every
keyed job (a million of them for a backlog of a million): a recursive query that repeats
``flow_key > previous ORDER BY flow_key LIMIT 1`` (PostgreSQL, SQLite), or a ``GROUP BY`` that
the database reads by skipping from one key to the next (MariaDB's loose index scan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from jobqueue.storage.dialects.flow import mariadb_hint

if TYPE_CHECKING:
    from jobqueue.storage.store_base import StoreBase
    from jobqueue.storage.tables import Tables

# Keys walked by one statement, and by one call: a call walks WALK_MOST keys in key order and says
# where the next one goes on, so that a queue of a million keys (one partition per job, say) costs
# each sweep a few hundred milliseconds of index probes, not seconds.
WALK_PAGE = 500
WALK_MOST = 20_000


@dataclass(frozen=True)
class Restored:
    """What a call of :func:`restore_missing` did."""

    keys: list[str] = field(default_factory=list)  # the keys whose rows it added back
    resume_after: str | None = None  # the last key it walked; None once it walked to the last key


def walk_keys(tables: Tables, first: bool, grouped: bool) -> Any:
    """The next keys with jobs, ``page`` at most, in key order from the first (``first``) or after
    ``after``, each with whether it has a flow row (``has_row``): read by a ``GROUP BY``
    (``grouped``) or by a recursive query. Keys are compared as the database compares them
    (MariaDB: 'Acme' and 'acme ' are one key)."""
    m, f = tables.message, tables.flow
    hint = f"FORCE INDEX (ix_{tables.prefix}message_flow_state)"  # MariaDB may otherwise scan the table
    start = m.c.flow_key.isnot(None) if first else m.c.flow_key > sa.bindparam("after", type_=sa.String)
    page = sa.bindparam("page", type_=sa.Integer)
    if grouped:
        select = sa.select(m.c.flow_key).where(start).group_by(m.c.flow_key).order_by(m.c.flow_key).limit(page)
        keys = mariadb_hint(select, m, hint).subquery("walk")
        has_row = sa.exists().where(f.c.flow_key == keys.c.flow_key)
        return sa.select(keys.c.flow_key, has_row.label("has_row")).order_by(keys.c.flow_key)

    def next_key(condition: Any) -> Any:
        select = sa.select(m.c.flow_key).where(condition).order_by(m.c.flow_key).limit(1)
        return mariadb_hint(select, m, hint).scalar_subquery()

    walk = sa.select(next_key(start).label("flow_key"), sa.literal_column("1").label("n")).cte("walk", recursive=True)
    previous = walk.alias("previous")
    walk = walk.union_all(
        sa.select(next_key(m.c.flow_key > previous.c.flow_key), previous.c.n + sa.literal_column("1")).where(
            previous.c.flow_key.isnot(None), previous.c.n < page
        )
    )
    has_row = sa.exists().where(f.c.flow_key == walk.c.flow_key)
    return sa.select(walk.c.flow_key, has_row.label("has_row")).where(walk.c.flow_key.isnot(None)).order_by(walk.c.n)


def restore_missing(
    store: StoreBase, after: str | None = None, most: int = WALK_MOST, page: int = WALK_PAGE
) -> Restored:
    """Add the missing flow rows of keys with jobs, walking at most ``most`` keys from the one
    after ``after`` (from the first without it). A row comes back as the key's next enqueue would
    add it: served now, no start held back by a rate (the key's limits are on each of its jobs)."""
    missing: list[str] = []
    walked = 0
    grouped = store.dialect.distinct_keys_by_group
    while walked < most:
        wanted = min(page, most - walked)
        binds: dict[str, Any] = {"page": wanted}
        if after is not None:
            binds["after"] = after
        # A read of its own per page: no snapshot is held while the walk goes on.
        with store.reading() as conn:
            rows = conn.execute(walk_keys(store.tables, after is None, grouped), binds).all()
        missing += [row.flow_key for row in rows if not row.has_row]
        walked += len(rows)
        after = rows[-1].flow_key if rows else None
        if len(rows) < wanted:
            after = None  # past the last key: the next call starts from the first again
            break
    if missing:
        with store.writing() as conn:
            now = store.database_now(conn)
            # Leaves alone a row an enqueue added meanwhile. A key whose last job ended meanwhile
            # gets a row without jobs, which the sweep forgets.
            conn.execute(store.dialect.insert_flow_rows(), store.dialect.flow_rows(missing, now))
    return Restored(missing, after)
