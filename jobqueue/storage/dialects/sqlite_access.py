"""SQLite: why this process may not write the database file, as its permissions tell."""

from __future__ import annotations

import os


def user_name() -> str:
    """Who this process writes files as."""
    uid = os.geteuid()
    try:
        import pwd  # POSIX only

        return f"{pwd.getpwuid(uid).pw_name!r}"
    except (ImportError, KeyError):
        return f"uid {uid}"


def access_problem(database: str | None) -> str | None:
    """Why this process cannot write the database file at ``database`` (a URL's path), as far as
    its permissions tell; None if they allow it (or the database is no plain file path)."""
    if not database or database.startswith("file:"):
        return None
    path = os.path.abspath(database)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        return f"the directory {directory} of the SQLite database {path} does not exist: create it, or fix the URL"
    if os.path.isdir(path):
        return f"the SQLite database path {path} is a directory: fix the path in the URL (a database is a file)"
    if _mounted_read_only(directory):
        return (
            f"cannot write the SQLite database {path}: its file system is mounted read-only. Remount it "
            "read-write, or move the database to a writable file system"
        )
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return cannot_write(database, "this user may not write the file")
    if not os.access(directory, os.W_OK | os.X_OK):
        return cannot_write(database, f"this user may not create files in its directory {directory}")
    for journal in (f"{path}-wal", f"{path}-shm"):
        if os.path.exists(journal) and not os.access(journal, os.R_OK | os.W_OK):
            return cannot_write(database, f"this user may not write its journal file {journal}")
    return None


def _mounted_read_only(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # a platform without statvfs: the permissions tell the rest
        return False


def cannot_write(database: str | None, reason: str) -> str:
    """The error that says ``reason`` keeps this process from writing the database, and the fix."""
    path = os.path.abspath(database or "")
    directory, name = os.path.split(path)
    return (
        f"cannot write the SQLite database {path} as user {user_name()}: {reason}. Give that user "
        f"write permission on the file and on its directory {directory} (SQLite creates its journal, "
        f"{name}-wal and {name}-shm, beside the file), or run as the user who owns them"
    )
