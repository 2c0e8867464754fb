"""The collation of the name and key columns on MySQL and MariaDB, connected or not.

MariaDB runs the DDL of every case here in tests/acceptance/test_upgrade.py; MySQL's cases are
checked as text.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from jobqueue.storage.tables import Key, Name, build_tables


def dialect(url: str, server: str | None) -> sa.Dialect:
    """The dialect of ``url``, as after connecting to a server that reports version ``server``
    (None: not connected)."""
    found = sa.make_url(url).get_dialect()()
    if server is not None:
        found._parse_server_version(server)  # type: ignore[attr-defined]  # as SQLAlchemy does on connecting
    return found


@pytest.mark.parametrize(
    "url, server, collation",
    [
        ("mysql://", "8.0.36", "COLLATE utf8mb4_0900_bin"),
        ("mysql://", "8.0.16", "COLLATE utf8mb4_bin"),  # no binary collation that does not pad
        ("mysql://", "10.11.19-MariaDB-0+deb12u1", "COLLATE utf8mb4_nopad_bin"),
        ("mariadb://", None, "COLLATE utf8mb4_nopad_bin"),
        # Offline, a mysql:// URL may name either server: each runs the clause meant for it.
        ("mysql://", None, "/*!80017 COLLATE utf8mb4_0900_bin */ /*M! COLLATE utf8mb4_nopad_bin */"),
    ],
)
def test_names_and_keys_get_the_servers_binary_collation_that_does_not_pad(
    url: str, server: str | None, collation: str
) -> None:
    on = dialect(url, server)
    assert Name(100).compile(dialect=on) == Key(100).compile(dialect=on) == f"VARCHAR(100) {collation}"
    assert build_tables().worker.c.queues.type.compile(dialect=on) == f"TEXT {collation}"


def test_postgresql_and_sqlite_compare_text_exactly_without_a_collation() -> None:
    for url in ("postgresql://", "sqlite://"):
        assert Name(100).compile(dialect=dialect(url, None)) == "VARCHAR(100)"
        assert build_tables().worker.c.queues.type.compile(dialect=dialect(url, None)) == "TEXT"
