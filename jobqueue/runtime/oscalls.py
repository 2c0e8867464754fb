"""What a worker process asks of the operating system: file descriptors left, signals, dying
with its supervisor, wake-up pipes, its memory and its name in the logs; and, for the supervisor,
the programs a worker process's job started."""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys
from collections.abc import Container, Iterable
from typing import Any

PR_SET_PDEATHSIG = 1
# The exit status of a worker process whose own descriptors a job closed (see descriptor_identity).
DESCRIPTORS_LOST_STATUS = 3
OUT_OF_MEMORY_STATUS = 4  # the process could not go on: a job left it no memory to write outcomes with
# A process with fewer free file descriptors than this (or a tenth of its limit) is replaced.
DESCRIPTORS_SPARE = 16


def lowest_free_descriptor(own_fd: int) -> int | None:
    """The lowest file descriptor this process could open next (every one below it is in use),
    from a dup of ``own_fd``; None when it can open none."""
    try:
        fd = os.dup(own_fd)
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            return None
        raise
    os.close(fd)
    return fd


def descriptors_used_up(own_fd: int, baseline: int, floor: int = 0) -> tuple[int, int] | None:
    """(in use, limit) when this process has used up nearly every file descriptor it may open and
    a job took them (they grew by the spare margin since the process started, ``baseline``: a
    process that inherits that many from its supervisor is not recycled for them, as a fresh one
    would have them too); else None. Cheap enough for every job: one dup, and below ``floor``
    (see descriptors_floor) nothing more."""
    lowest_free = lowest_free_descriptor(own_fd)
    if lowest_free is not None and lowest_free < floor:
        return None
    limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limit == resource.RLIM_INFINITY:
        return None
    spare = max(DESCRIPTORS_SPARE, limit // 10)
    in_use = limit if lowest_free is None else lowest_free
    if in_use < limit - spare or in_use - baseline < spare:
        return None
    return in_use, limit


def descriptors_floor() -> int:
    """Below this many descriptors in use, no limit is near: the limit as it is now less its spare
    margin (a job that lowers the limit is seen once no descriptor is left)."""
    limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limit == resource.RLIM_INFINITY:
        return sys.maxsize
    return limit - max(DESCRIPTORS_SPARE, limit // 10)


def ignore_signal(signum: int, frame: Any) -> None:
    """Do nothing: a worker process's SIGINT (the supervisor decides what Ctrl-C means)."""


def forked_by_a_job() -> None:
    """In a process a job forks (a multiprocessing pool's, a daemon): SIGTERM ends it again, as
    in any Python program, instead of only telling a worker loop it does not run to stop (so
    ``Pool.terminate()``, which stops its processes with SIGTERM, does not wait forever), and its
    signals no longer wake the worker process. SIGINT still does nothing, as in the worker: Ctrl-C
    reaches the whole process group, and the supervisor decides what it means (a program it
    starts gets SIGINT's default again)."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # forked from a thread Python does not take for the main one
        pass


def watch_supervisor(supervisor_pid: int) -> None:
    """In a new worker process: die with the supervisor, whatever kills it.

    On Linux the kernel sends SIGKILL the moment the supervisor exits (a parent-death signal); a
    supervisor that died before this call is noticed at once. Elsewhere the keeper thread compares
    the parent's pid every tick.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the keeper's check is the only watch
    if orphaned(supervisor_pid):
        die_with_supervisor()


def orphaned(supervisor_pid: int) -> bool:
    return bool(supervisor_pid) and os.getppid() != supervisor_pid


def die_with_supervisor() -> None:
    """Stop at once: unsupervised, our leases are renewed by nobody, and a new supervisor will
    hand our messages to others. Outcomes not yet written are lost; those jobs run again."""
    os.kill(os.getpid(), signal.SIGKILL)


def descendants(pids: Iterable[int]) -> list[int]:
    """The processes below ``pids`` (their children, theirs...) in their own session, read from
    /proc in one pass; none where there is no /proc. A program started in a session of its own
    (``start_new_session=True``) is left out, with what it started: it was meant to outlive."""
    parents: dict[int, list[int]] = {}
    sessions: dict[int, int] = {}
    for pid, (ppid, sid) in _stats().items():
        parents.setdefault(ppid, []).append(pid)
        sessions[pid] = sid
    found: list[int] = []
    below = [(pid, sessions.get(pid)) for pid in pids]
    while below:
        parent, session = below.pop()
        for child in parents.get(parent, []):
            if sessions.get(child) == session:
                found.append(child)
                below.append((child, session))
    return found


HOST_NAME_MOST = 255  # characters of the worker registry's host name column


def host_name() -> str:
    """This host's name as the worker registry keeps it. Linux allows any bytes in it; bytes that
    are not UTF-8 are written as escapes (``\\xff``), which every database takes, and the whole
    kept to what the column holds."""
    name = os.uname().nodename.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return name[:HOST_NAME_MOST]


def reap_orphans(keep: Container[int]) -> int:
    """Wait for the children of this process that ended, but those in ``keep``; how many there were.

    For a supervisor that is the first process of a container (PID 1): the kernel makes it the
    parent of every orphan in the container (the programs of a job killed for its timeout, a
    daemon's children), and each orphan that ends stays a zombie, holding its process slot, until
    its parent waits for it. ``keep`` are the worker processes, whose ends the pool reads itself.
    """
    reaped = 0
    for child in _children():
        if child in keep:
            continue
        try:
            pid, _ = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:  # not ours after all, or waited for meanwhile
            continue
        reaped += bool(pid)
    return reaped


def _children() -> list[int]:
    """This process's children, from /proc: each thread's list (an orphan joins one thread's), or,
    on a kernel without those lists, every process's parent."""
    found: list[int] = []
    try:
        threads = os.listdir("/proc/self/task")
        for thread in threads:
            with open(f"/proc/self/task/{thread}/children", "rb") as listing:
                found.extend(int(pid) for pid in listing.read().split())
        return found
    except FileNotFoundError:  # a thread ended meanwhile, or no lists: read every process's parent
        return [child for child, (parent, _) in _stats().items() if parent == os.getpid()]
    except OSError:
        return found


def _stats() -> dict[int, tuple[int, int]]:
    """Every process's parent and session, read from /proc in one pass (empty without /proc)."""
    found: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                data = stat.read()
        except OSError:  # ended meanwhile
            continue
        # After the command, in parentheses (which may hold anything): state, ppid, pgrp, session.
        fields = data[data.rfind(b")") + 2 :].split()
        found[int(entry)] = (int(fields[1]), int(fields[3]))
    return found


def poke(fd: int) -> None:
    """Write a byte to a wake-up pipe (a full pipe means the reader is being woken already)."""
    try:
        os.write(fd, b"!")
    except OSError:
        pass


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def rss_kib() -> int:
    """This process's resident set size in KiB (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def name_process(name: str) -> str:
    """Name this process in every log line it writes: the logging module reads the name from the
    standard library's multiprocessing, which processes forked by ``multiprocess`` never set."""
    import multiprocessing

    import multiprocess

    multiprocessing.current_process().name = name
    multiprocess.current_process().name = name
    return name


def descriptor_identity(fd: int) -> tuple[int, int] | None:
    """What ``fd`` is open on (device and inode), or None if it is closed: a job that closed the
    descriptors it did not open (``os.closerange(3, ...)``, as daemonizing code does) took this
    process's pipes and database files with them, and a number reopened since names another file."""
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
