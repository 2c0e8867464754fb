"""Raw-SQL references: what the database itself can do, measured with its driver and no framework.

Single inserts (one commit each), multi-row bulk inserts (batches of 100 as the reference, and of
1,000), and the batched cycle (claim with SKIP LOCKED, archive) with N processes, with and without
the inserts. The table is the simplest that supports the cycle: an id, a queue, a payload, a state
and a due time.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

PAYLOAD = b"[[],{}]"


class Raw:
    """One backend's raw statements over a plain DB-API connection."""

    def __init__(self, url: str) -> None:
        self.url = sa.make_url(url)
        self.backend = self.url.get_backend_name()

    # -- connections -------------------------------------------------------------------------------
    def connect(self) -> Any:
        u = self.url
        if self.backend == "sqlite":
            conn = sqlite3.connect(u.database, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            return conn
        if self.backend == "postgresql":
            import psycopg2

            return psycopg2.connect(
                host=u.host, port=u.port or 5432, user=u.username, password=u.password, dbname=u.database
            )
        import MySQLdb

        conn = MySQLdb.connect(
            host=u.host, port=u.port or 3306, user=u.username, password=u.password or "", database=u.database
        )
        conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn

    def begin(self, conn: Any) -> None:
        if self.backend == "sqlite":
            conn.execute("BEGIN IMMEDIATE")

    def commit(self, conn: Any) -> None:
        if self.backend == "sqlite":
            conn.execute("COMMIT")
        else:
            conn.commit()

    @property
    def marker(self) -> str:
        return "?" if self.backend == "sqlite" else "%s"

    def setup(self) -> None:
        conn = self.connect()
        cur = conn.cursor()
        for statement in self._ddl():
            cur.execute(statement)
        if self.backend != "sqlite":
            conn.commit()
        conn.close()

    def _ddl(self) -> list[str]:
        if self.backend == "postgresql":
            return [
                "DROP TABLE IF EXISTS raw_message, raw_archive",
                "CREATE TABLE raw_message (id bigserial PRIMARY KEY, queue text NOT NULL, payload bytea NOT NULL, "
                "state text NOT NULL DEFAULT 'PENDING', next_at timestamp NOT NULL DEFAULT now())",
                "CREATE INDEX raw_ready ON raw_message (next_at, id) WHERE state = 'PENDING'",
                "CREATE TABLE raw_archive (id bigint PRIMARY KEY, queue text, payload bytea, archived_at timestamp)",
            ]
        if self.backend == "mysql":
            return [
                "DROP TABLE IF EXISTS raw_message, raw_archive",
                "CREATE TABLE raw_message (id bigint AUTO_INCREMENT PRIMARY KEY, queue varchar(100) NOT NULL, "
                "payload longblob NOT NULL, state varchar(10) NOT NULL DEFAULT 'PENDING', "
                "next_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), INDEX raw_ready (state, next_at, id))",
                "CREATE TABLE raw_archive (id bigint PRIMARY KEY, queue varchar(100), payload longblob, "
                "archived_at datetime(6))",
            ]
        return [
            "DROP TABLE IF EXISTS raw_message",
            "DROP TABLE IF EXISTS raw_archive",
            "CREATE TABLE raw_message (id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, "
            "payload BLOB NOT NULL, "
            "state TEXT NOT NULL DEFAULT 'PENDING', next_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f')))",
            "CREATE INDEX raw_ready ON raw_message (next_at, id) WHERE state = 'PENDING'",
            "CREATE TABLE raw_archive (id INTEGER PRIMARY KEY, queue TEXT, payload BLOB, archived_at TEXT)",
        ]

    # -- enqueue -----------------------------------------------------------------------------------
    def insert_single(self, n: int) -> float:
        """Jobs/s inserting one row per transaction, each committed."""
        conn = self.connect()
        cur = conn.cursor()
        sql = f"INSERT INTO raw_message (queue, payload) VALUES ({self.marker}, {self.marker})"
        started = time.perf_counter()
        for _ in range(n):
            self.begin(conn)
            cur.execute(sql, ("default", PAYLOAD))
            self.commit(conn)
        rate = n / (time.perf_counter() - started)
        conn.close()
        return rate

    def insert_bulk(self, n: int, batch: int = 1000, conn: Any = None) -> float:
        """Jobs/s inserting multi-row VALUES of ``batch`` rows, one commit per batch."""
        own = conn is None
        conn = conn or self.connect()
        cur = conn.cursor()
        started = time.perf_counter()
        for start in range(0, n, batch):
            rows = min(batch, n - start)
            values = ",".join([f"({self.marker},{self.marker})"] * rows)
            params: list[Any] = []
            for _ in range(rows):
                params += ["default", PAYLOAD]
            self.begin(conn)
            cur.execute(f"INSERT INTO raw_message (queue, payload) VALUES {values}", params)
            self.commit(conn)
        rate = n / (time.perf_counter() - started)
        if own:
            conn.close()
        return rate

    # -- the cycle ---------------------------------------------------------------------------------
    def claim_and_archive(self, conn: Any, batch: int) -> int:
        """Claim up to ``batch`` due messages (SKIP LOCKED) and archive them; return how many."""
        cur = conn.cursor()
        m = self.marker
        if self.backend == "postgresql":
            cur.execute(
                f"""WITH r AS (SELECT id FROM raw_message WHERE state = 'PENDING' AND next_at <= now()
                                       ORDER BY next_at, id LIMIT {m} FOR UPDATE SKIP LOCKED)
                            UPDATE raw_message SET state = 'PROCESSING' FROM r WHERE raw_message.id = r.id
                            RETURNING raw_message.id, raw_message.queue, raw_message.payload""",
                (batch,),
            )
            rows = cur.fetchall()
            conn.commit()
            if rows:
                cur.execute(
                    """WITH d AS (DELETE FROM raw_message WHERE id = ANY(%s) RETURNING id, queue, payload)
                               INSERT INTO raw_archive SELECT id, queue, payload, now() FROM d""",
                    ([r[0] for r in rows],),
                )
                conn.commit()
            return len(rows)
        if self.backend == "mysql":
            cur.execute(f"""SELECT id, queue, payload FROM raw_message WHERE state = 'PENDING' AND next_at <= NOW(6)
                            ORDER BY state, next_at, id LIMIT {int(batch)} FOR UPDATE SKIP LOCKED""")
            rows = cur.fetchall()
            if rows:
                ids = ",".join(str(r[0]) for r in rows)
                cur.execute(f"UPDATE raw_message SET state = 'PROCESSING' WHERE id IN ({ids})")
            conn.commit()
            if rows:
                cur.execute(
                    f"INSERT INTO raw_archive SELECT id, queue, payload, NOW(6) FROM raw_message WHERE id IN ({ids})"
                )
                cur.execute(f"DELETE FROM raw_message WHERE id IN ({ids})")
                conn.commit()
            return len(rows)
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            """UPDATE raw_message SET state = 'PROCESSING' WHERE id IN (
                                 SELECT id FROM raw_message WHERE state = 'PENDING'
                                 AND next_at <= strftime('%Y-%m-%d %H:%M:%f') ORDER BY next_at, id LIMIT ?)
                               RETURNING id, queue, payload""",
            (batch,),
        ).fetchall()
        conn.execute("COMMIT")
        if rows:
            ids = ",".join(str(r[0]) for r in rows)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                f"INSERT INTO raw_archive SELECT id, queue, payload, strftime('%Y-%m-%d %H:%M:%f') "
                f"FROM raw_message WHERE id IN ({ids})"
            )
            conn.execute(f"DELETE FROM raw_message WHERE id IN ({ids})")
            conn.execute("COMMIT")
        return len(rows)

    def cycle(self, n: int, processes: int, batch: int = 100, with_inserts: bool = True) -> float:
        """Jobs/s for ``n`` jobs through ``processes`` processes in batches of ``batch``.

        With inserts each process enqueues its share in batches and claims and archives until the
        table is empty (the whole cycle); without, the jobs are inserted before the clock starts.
        """
        self.setup()
        if not with_inserts:
            self.insert_bulk(n)
        share = n // processes
        context = multiprocessing.get_context("fork")
        started = time.perf_counter()
        workers = [
            context.Process(
                target=_cycle_worker,
                args=(self.url.render_as_string(hide_password=False), share if with_inserts else 0, batch),
            )
            for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return n / (time.perf_counter() - started)


def _cycle_worker(url: str, inserts: int, batch: int) -> None:
    raw = Raw(url)
    conn = raw.connect()
    remaining = inserts
    while True:
        if remaining:
            step = min(batch, remaining)
            raw.insert_bulk(step, batch, conn)
            remaining -= step
        try:
            claimed = raw.claim_and_archive(conn, batch)
        except Exception as exc:  # InnoDB may pick two claimers as a deadlock: retry, as any consumer would
            if "1213" not in str(exc) and "Deadlock" not in str(exc):
                raise
            conn.rollback()
            continue
        if not claimed and not remaining:
            break
    conn.close()


def references(url: str, runs: int, jobs: int, processes: int) -> dict[str, Callable[[], float]]:
    """The raw variants, ready for ``interleave``."""
    raw = Raw(url)

    def single() -> float:
        raw.setup()
        return raw.insert_single(max(500, jobs // 10))

    def bulk(batch: int) -> Callable[[], float]:
        def run() -> float:
            raw.setup()
            return raw.insert_bulk(jobs * 2, batch)

        return run

    return {
        "raw single insert": single,
        # The reference: multi-row VALUES in batches of 100, a commit each; 1,000-row
        # batches are shown beside it.
        "raw bulk insert": bulk(100),
        "raw bulk insert, 1,000 rows": bulk(1000),
        "raw cycle": lambda: raw.cycle(jobs, processes, with_inserts=True),
        "raw claim+archive": lambda: raw.cycle(jobs, processes, with_inserts=False),
    }
