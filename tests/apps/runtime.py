"""Tasks for the runtime tests. Each records its runs in $JOBQUEUE_TEST_RUNS ("event job_id pid")."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from jobqueue import JobQueue, SoftTimeLimitExceeded, current_job, signals
from jobqueue.retry import ConstantRetryStrategy, NoRetryStrategy

app = JobQueue()

_ballast: list[bytes] = []


def record(event: str) -> None:
    path = os.environ.get("JOBQUEUE_TEST_RUNS")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{event} {current_job().id} {os.getpid()}\n".encode())  # one write: atomic append
        finally:
            os.close(fd)


@app.task(name="rt.short")
def short(seconds: float = 0.002) -> int:
    record("run")
    time.sleep(seconds)
    return os.getpid()


@app.task(name="rt.noop", priority=10)
def noop() -> None:
    return None


@app.task(name="rt.journal")
def journal() -> list[int]:
    """SQLite: past how many journal pages this worker process's commits write it back."""
    with app.engine.connect() as conn:
        return [conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar(), os.getpid()]


@app.task(name="rt.slow")
def slow(seconds: float) -> int:
    record("start")
    time.sleep(seconds)
    record("end")
    return os.getpid()


@app.task(name="rt.leaves_a_thread")
def leaves_a_thread() -> None:
    """Starts a thread that is not a daemon and never ends (an executor never shut down)."""
    threading.Thread(target=threading.Event().wait, name="left-by-a-job", daemon=False).start()


@app.task(name="rt.crash", max_deliveries=2)
def crash(code: int = 1) -> None:
    record("start")
    os._exit(code)


@app.task(name="rt.close_descriptors", max_deliveries=2)
def close_descriptors() -> None:
    """Daemonizing code run inside a job: it closes every descriptor past stderr, the worker's own too."""
    record("start")
    os.closerange(3, 4096)


@app.task(name="rt.hang", timeout=1, retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=2))
def hang() -> None:
    record("start")
    time.sleep(60)


@app.task(name="rt.hang_with_programs", timeout=1, retry_strategy=NoRetryStrategy())
def hang_with_programs() -> None:
    """Starts a program, and one in a session of its own (meant to outlive it), then hangs."""
    program = subprocess.Popen(["sleep", "300"])
    apart = subprocess.Popen(["sleep", "301"], start_new_session=True)
    record(f"program-{program.pid}")
    record(f"apart-{apart.pid}")
    time.sleep(60)


@app.task(name="rt.keeps_starting_programs", timeout=1, retry_strategy=NoRetryStrategy())
def keeps_starting_programs(seconds: str) -> None:
    """A shell that starts a program every few milliseconds until the job is killed."""
    subprocess.run(["sh", "-c", f"while :; do sleep {seconds} & sleep 0.002; done"])


if os.environ.get("JOBQUEUE_TEST_SLOW_START"):  # worker processes take this long to start

    @signals.worker_process_init.connect
    def _slow_start(**kwargs: Any) -> None:
        time.sleep(float(os.environ["JOBQUEUE_TEST_SLOW_START"]))


@app.task(name="rt.async_in_a_thread")
async def async_in_a_thread() -> int:
    return await asyncio.to_thread(os.getpid)


@app.task(name="rt.checkpoints_as_it_goes", bind=True, retry_strategy=NoRetryStrategy())
def checkpoints_as_it_goes(job: Any, steps: int) -> int:
    """Saves a checkpoint and extends its lease at every step: writes of the job's own."""
    for step in range(job.state or 0, steps):
        job.checkpoint(step + 1)
        job.extend(30)
        record(f"step-{step + 1}")
        time.sleep(0.05)
    return steps


@app.task(name="rt.leaves_orphans")
def leaves_orphans(count: int, seconds: float) -> None:
    """Starts programs in the background of shells that end at once: the programs are orphans."""
    for _ in range(count):
        subprocess.run(["sh", "-c", f"sleep {seconds} &"], check=True)


@app.task(name="rt.soft", soft_timeout=0.5)
def soft() -> str:
    started = time.monotonic()
    try:
        time.sleep(10)
    except SoftTimeLimitExceeded:
        return f"caught after {time.monotonic() - started:.1f} s"
    return "not interrupted"


@app.task(name="rt.async_flaky", retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=3))
async def async_flaky(seconds: float) -> None:
    record("start")
    await asyncio.sleep(seconds)
    raise RuntimeError(f"async attempt {current_job().attempt} failed")


@app.task(name="rt.async_ok", bind=True)
async def async_ok(job, value: int) -> dict:
    record("run")
    await asyncio.sleep(0.01)
    loop = id(asyncio.get_running_loop())
    return {"value": value * 2, "attempt": job.attempt, "same": current_job() is job, "pid": os.getpid(), "loop": loop}


@app.task(name="rt.async_hang", timeout=1, retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=2))
async def async_hang() -> None:
    record("start")
    await asyncio.sleep(60)


@app.task(name="rt.async_soft", soft_timeout=0.5)
async def async_soft() -> str:
    started = time.monotonic()
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        record("cancelled")  # the job sees the cancellation at its await, then the soft limit fails it
        raise
    return f"not interrupted after {time.monotonic() - started:.1f} s"


@app.task(name="rt.grow")
def grow(megabytes: int) -> int:
    _ballast.append(b"x" * (megabytes * 1024 * 1024))
    return os.getpid()


@app.task(name="rt.resumable", bind=True)
def resumable(job, steps: int, die_at: int) -> list[int]:
    """Checkpoints after every step; the first delivery SIGKILLs its own process after step ``die_at``."""
    done = job.state or []
    for step in range(len(done), steps):
        record(f"step{step}")
        done = done + [step]
        job.checkpoint(done)
        if step == die_at and job.attempt == 1:
            os.kill(os.getpid(), 9)
    return done


# -- jobs that misbehave: each must end only itself ----------------------------------------------
NO_RETRY = NoRetryStrategy()


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


@app.task(name="rt.bad_str", retry_strategy=NO_RETRY)
def bad_str() -> None:
    raise BadStr()


class ExitInStr(Exception):
    def __str__(self) -> str:
        raise SystemExit("raised by __str__")


@app.task(name="rt.exit_in_str", retry_strategy=NO_RETRY)
def exit_in_str() -> None:
    raise ExitInStr()


@app.task(name="rt.unstorable", retry_strategy=NO_RETRY)
def unstorable(kind: str) -> object:
    if kind == "cyclic":
        value: list[object] = []
        value.append(value)
        return value
    if kind == "deep":
        deep: list[object] = []
        for _ in range(1200):
            deep = [deep]
        return deep
    return 10**5000  # over the 4,300 digits Python writes as text


@app.task(name="rt.bad_nack", bind=True, retry_strategy=NO_RETRY)
def bad_nack(job) -> None:
    job.nack(delay_seconds="60")


@app.task(name="rt.exits", retry_strategy=NO_RETRY)
def exits() -> None:
    sys.exit(3)


@app.task(name="rt.interrupt", retry_strategy=NO_RETRY)
def interrupt() -> None:
    raise KeyboardInterrupt


class Halt(BaseException):
    """Derives from BaseException, not Exception, as SystemExit and KeyboardInterrupt do."""


@app.task(name="rt.halts", retry_strategy=NO_RETRY)
def halts() -> None:
    raise Halt("a BaseException of its own")


@app.task(name="rt.close_stdio", retry_strategy=NO_RETRY)
def close_stdio(fail: bool) -> str:
    """Closes the process's sys.stdout and sys.stderr, as daemonizing code does."""
    record("run")
    sys.stdout.close()
    sys.stderr.close()
    if fail:
        raise RuntimeError("failed with stdout and stderr closed")
    return "closed"


@app.task(name="rt.forks", retry_strategy=NO_RETRY)
def forks(how: str) -> object:
    """Forks a child that leaves the job as ``how`` says (returns, sys.exit(3), raises) instead of
    with os._exit: the child must end there. Returns the child's exit status, or "still running"
    (then killed) if it went on, running the worker's loop."""
    record("run")
    pid = os.fork()
    if pid == 0:
        if how == "exit":
            sys.exit(3)
        if how == "raise":
            raise RuntimeError("raised in the forked child")
        return "returned in the forked child"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "still running"


def _enqueue_from_a_fork(count: int) -> list[int]:
    return [noop.delay().id for _ in range(count)]


@app.task(name="rt.terminates", retry_strategy=NO_RETRY)
def terminates() -> object:
    """Starts a forked multiprocessing Process and stops it with terminate() (SIGTERM), as a
    multiprocessing pool does on leaving its with block: its exit code, or "ignored SIGTERM"."""
    import multiprocessing

    process = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    process.start()
    time.sleep(0.2)
    process.terminate()
    process.join(5)
    if process.exitcode is None:
        process.kill()
        process.join()
        return "ignored SIGTERM"
    return process.exitcode


@app.task(name="rt.fork_pool", retry_strategy=NO_RETRY)
def fork_pool(processes: int, count: int) -> int:
    """Enqueues from a pool of forked processes, as a job that fans out with multiprocessing does,
    and from the worker process itself before and after (the pool's processes must leave its
    connections alone, even when they free what they inherited)."""
    import gc
    import multiprocessing

    noop.delay()
    with multiprocessing.get_context("fork").Pool(processes, initializer=gc.collect) as pool:
        result = pool.map_async(_enqueue_from_a_fork, [count] * processes)
        total = sum(len(ids) for ids in result.get(timeout=20))
    noop.delay()
    return total


def signal_status(**popen: Any) -> dict[str, str]:
    """The signals a program sees ignored and blocked when it starts (from Linux's /proc, read by
    cat, which changes neither); ``popen`` as for subprocess.run."""
    status = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True, check=True, **popen).stdout
    return {k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines()) if k in ("SigIgn", "SigBlk")}


@app.task(name="rt.starts_programs", retry_strategy=NO_RETRY)
def starts_programs() -> dict[str, object]:
    """Starts programs as a job that runs a tool does: what one sees of its signals, and how one
    that the job interrupts with SIGINT ends (its exit status, or "ignored SIGINT")."""
    tool = subprocess.Popen(["sh", "-c", "echo ready && exec sleep 30"], stdout=subprocess.PIPE, text=True)
    assert tool.stdout is not None
    tool.stdout.readline()  # running: from here on the program's own dispositions apply
    tool.send_signal(signal.SIGINT)
    try:
        interrupted: object = tool.wait(10)
    except subprocess.TimeoutExpired:
        tool.kill()
        tool.wait()
        interrupted = "ignored SIGINT"
    return {**signal_status(), "interrupted": interrupted}


@app.task(name="rt.runs_program", retry_strategy=NO_RETRY)
def runs_program(seconds: float) -> int:
    """Runs ``sleep seconds`` and returns its exit status (recording "start" first)."""
    record("start")
    return subprocess.run(["sleep", str(seconds)]).returncode


@app.task(name="rt.sleeps", retry_strategy=NO_RETRY)
def sleeps(seconds: float) -> float:
    """Sleeps ``seconds`` and returns how long it slept (recording "start" first)."""
    record("start")
    began = time.monotonic()
    time.sleep(seconds)
    return time.monotonic() - began


@app.task(name="rt.moves", retry_strategy=NO_RETRY)
def moves(directory: str, umask: int) -> None:
    """Changes its process's working directory and umask, and leaves them so."""
    os.chdir(directory)
    os.umask(umask)


@app.task(name="rt.takes_sigterm", retry_strategy=NO_RETRY)
def takes_sigterm() -> None:
    """Ignores SIGTERM in its process from now on, as a job that installs a handler of its own
    and never puts the previous one back."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@app.task(name="rt.where")
def where() -> list[object]:
    """The working directory and umask this job runs with, and its process."""
    umask = os.umask(0)
    os.umask(umask)
    return [os.getcwd(), umask, os.getpid()]


@app.task(name="rt.leak_fds", retry_strategy=NO_RETRY)
def leak_fds() -> int:
    """Leaks file descriptors until its process has none left (its limit lowered to 256 first)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    leaked = 0
    try:
        while True:
            _leaked_fds.append(os.open(os.devnull, os.O_RDONLY))
            leaked += 1
    except OSError:
        return leaked


_leaked_fds: list[int] = []


@app.task(name="rt.opens", retry_strategy=NO_RETRY)
def opens(count: int) -> int:
    """Opens ``count`` files at once and closes them, as a job writing a few files does."""
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    for fd in fds:
        os.close(fd)
    return count


@app.task(name="rt.nul", retry_strategy=NO_RETRY)
def nul() -> None:
    raise ValueError("a NUL \x00 inside")


@app.task(name="rt.bad_defer", bind=True, retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=2))
def bad_defer(job, until: object) -> None:
    record("run")
    job.defer(until=float(until) if isinstance(until, str) and until in ("1e12", "nan") else until)


@app.task(name="rt.far_retry", retry_strategy=ConstantRetryStrategy(delay_seconds=1e12))
def far_retry() -> None:
    """Fails; its strategy would retry it past the year 9999."""
    raise RuntimeError("the job's own error")


@app.task(name="rt.far_nack", bind=True, retry_strategy=ConstantRetryStrategy(delay_seconds=0.1, max_attempts=2))
def far_nack(job, seconds: float) -> None:
    """Asks to be retried in ``seconds`` (up to the last moment a date can hold)."""
    job.nack(delay_seconds=seconds)


@app.task(name="rt.far_extend", bind=True, retry_strategy=NO_RETRY)
def far_extend(job, seconds: float) -> str:
    """Keeps its lease for ``seconds`` more, then completes."""
    job.extend(seconds)
    return "extended"


@app.task(name="rt.big_state", bind=True, retry_strategy=NO_RETRY)
def big_state(job, how: str) -> None:
    data = "x" * (2 * 1024 * 1024)
    if how == "checkpoint":
        job.checkpoint(data)
    else:
        job.defer(until=60, state=data)


@app.task(name="rt.regex", retry_strategy=NO_RETRY)
def regex(length: int) -> bool:
    """Holds the GIL for seconds: the regular expression engine never lets go of it."""
    record("start")
    matched = re.match(r"(a+)+$", "a" * length + "b") is not None
    record("end")
    return matched


@app.task(name="rt.fail_after", retry_strategy=ConstantRetryStrategy(delay_seconds=60, max_attempts=3))
def fail_after(seconds: float) -> None:
    record("start")
    time.sleep(seconds)
    raise RuntimeError("failed after sleeping")


def record_timed(event: str) -> None:
    """Like record, with the monotonic time in nanoseconds (one clock for every process of the host)."""
    path = os.environ.get("JOBQUEUE_TEST_RUNS")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{event} {current_job().id} {os.getpid()} {time.monotonic_ns()}\n".encode())
        finally:
            os.close(fd)


@app.task(name="rt.timed")
def timed(seconds: float) -> None:
    record_timed("start")
    time.sleep(seconds)
    record_timed("end")


@app.task(name="rt.ordered")
def ordered(key: str, seq: int) -> None:
    """One message of a partition: records "start|end job pid ns key seq"."""
    span(key, seq, 0.003)


@app.task(name="rt.in_turn")
def in_turn(key: str, seq: int, seconds: float) -> None:
    """A partition's job that takes ``seconds``: records "start|end job pid ns key seq"."""
    span(key, seq, seconds)


@app.task(name="rt.limited", concurrency_key="partner", concurrency_limit=2)
def limited(seq: int, seconds: float = 0.01) -> None:
    """At most two at once across every host: records "start|end job pid ns partner seq"."""
    span("partner", seq, seconds)


@app.task(name="rt.rated", rate_limit="20/s")
def rated(seq: int) -> None:
    span("rated", seq, 0.0)


@app.task(name="rt.tenant", concurrency_key=lambda tenant, seq: tenant)
def tenant(tenant: str, seq: int) -> None:
    return None


def span(key: str, seq: int, seconds: float) -> None:
    """Record "start" and "end" lines ("event job pid monotonic-ns key seq") around a sleep."""
    path = os.environ.get("JOBQUEUE_TEST_RUNS")
    job = current_job().id
    for event in ("start", "end"):
        if path:
            line = f"{event} {job} {os.getpid()} {time.monotonic_ns()} {key} {seq}\n"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        if event == "start":
            time.sleep(seconds)


FILLED: list[bytearray | None] = []  # what rt.fills_memory keeps, as a leak would


@app.task(name="rt.fills_memory", max_deliveries=2, retry_strategy=NoRetryStrategy())
def fills_memory() -> int:
    """Takes all the memory it may (its process's address space capped 256 MB above what it uses)
    and keeps it: the process has none left to write the job's outcome with."""
    import resource

    FILLED.extend([None] * 1_000_000)  # room to keep each piece without growing the list
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 1024 * 1024, resource.RLIM_INFINITY))
    # Large pieces first, then every small size Python's allocator keeps free blocks of (multiples
    # of 16 bytes up to 512): no free block of any size is left for writing the outcome.
    kept = 0
    for size in (1024 * 1024, 4096, 1024, *range(512, 0, -16)):
        try:
            while kept < len(FILLED):
                FILLED[kept] = bytearray(size - 1)
                kept += 1
        except MemoryError:
            pass
    return kept


@app.task(name="rt.leaves_a_stubborn_task")
async def leaves_a_stubborn_task() -> None:
    """Leaves a task on the loop whose cleanup, once cancelled, waits for ever."""

    async def flusher() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.Event().wait()  # a last flush that never comes

    STUBBORN.append(asyncio.get_running_loop().create_task(flusher()))


STUBBORN: list[asyncio.Task[None]] = []


@app.task(name="rt.stops_the_loop", retry_strategy=NoRetryStrategy())
async def stops_the_loop() -> None:
    """Stops the event loop under itself, then would go on where it was."""
    record("start")
    asyncio.get_running_loop().stop()
    await asyncio.sleep(0.05)
    record("resumed")


@app.task(
    name="rt.checkpoints_past_its_soft_limit",
    soft_timeout=0.05,
    timeout=10,
    bind=True,
    retry_strategy=NoRetryStrategy(),
)
def checkpoints_past_its_soft_limit(job) -> None:
    """Spends its time in checkpoint(): the soft limit's alarm lands in jobqueue's and SQLAlchemy's
    code, most often while a connection goes back to its pool."""
    saved = 0
    while True:
        job.checkpoint({"saved": saved})
        saved += 1


@app.task(name="rt.sets_its_own_alarm", soft_timeout=0.5, retry_strategy=NoRetryStrategy())
def sets_its_own_alarm() -> str:
    """Times a call with its own alarm, as timeout helpers do, and puts the handler back after."""
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    signal.setitimer(signal.ITIMER_REAL, 5)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    return "done"


@app.task(name="rt.leaves_an_alarm")
def leaves_an_alarm() -> None:
    """signal.alarm(1) and returns: the alarm would end the process during a later job."""
    signal.alarm(1)


@app.task(name="rt.clears_wakeup")
def clears_wakeup() -> None:
    """What asyncio.run() leaves after loop.add_signal_handler(): no signal wake-up descriptor."""
    signal.set_wakeup_fd(-1)


@app.task(name="rt.handles_sigterm")
def handles_sigterm(seconds: float) -> None:
    """Handles SIGTERM itself while it runs, and leaves its handler in place."""
    record("start")
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    time.sleep(seconds)
    record("end")


@app.task(name="rt.lowers_files_limit")
def lowers_files_limit() -> None:
    """Lowers its process's limit of open files to what it has open: it can open no more."""
    import resource

    in_use = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
