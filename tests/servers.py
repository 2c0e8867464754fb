"""Database servers and throwaway databases for the tests.

Each session creates its own databases (``jobqueue_test_<random>``) on the real PostgreSQL and
MariaDB servers and drops only those. A stopped server is started with the commands from the
project brief; a server that cannot be reached fails the tests that need it (never a skip).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import sqlalchemy as sa

POSTGRES_URL = os.environ.get(
    "JOBQUEUE_TEST_POSTGRES_URL", "postgresql+psycopg2://jobqueue_test:jobqueue_test@127.0.0.1:5432/postgres"
)
MYSQL_URL = os.environ.get("JOBQUEUE_TEST_MYSQL_URL", "mysql+mysqldb://jobqueue_test:jobqueue_test@127.0.0.1:3306/")
ALL_BACKENDS = ("sqlite", "postgresql", "mysql")


def selected_backends() -> tuple[str, ...]:
    chosen = os.environ.get("JOBQUEUE_TEST_BACKENDS")
    if not chosen:
        return ALL_BACKENDS
    return tuple(name.strip() for name in chosen.split(",") if name.strip() in ALL_BACKENDS)


def _start_commands(backend: str) -> list[list[str]]:
    if backend == "postgresql":
        versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
        return [["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"]] if versions else []
    return [
        ["mkdir", "-p", "/run/mysqld"],
        ["chown", "mysql:mysql", "/run/mysqld"],
        ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"],
    ]


def _reachable(url: str) -> Exception | None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except Exception as exc:  # any failure to connect
        return exc
    finally:
        engine.dispose()


def ensure_server(backend: str) -> None:
    """Start the server if it is down; raise RuntimeError if it stays unreachable."""
    url = POSTGRES_URL if backend == "postgresql" else MYSQL_URL
    error = _reachable(url)
    if error is None:
        return
    if os.geteuid() == 0:
        for command in _start_commands(backend):
            subprocess.run(command, check=False, capture_output=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            error = _reachable(url)
            if error is None:
                return
            time.sleep(0.5)
    raise RuntimeError(
        f"{backend} server unreachable at {sa.make_url(url).render_as_string(hide_password=True)}: "
        f"{error}. Run scripts/test.sh, which installs and starts it and creates the "
        "jobqueue_test login."
    )


def create_database(backend: str, tmp_dir: str) -> str:
    """Create a fresh database for this session and return its URL."""
    if backend == "sqlite":
        return f"sqlite:///{os.path.join(tmp_dir, 'session.sqlite3')}"
    ensure_server(backend)
    name = f"jobqueue_test_{uuid.uuid4().hex[:10]}"
    admin = POSTGRES_URL if backend == "postgresql" else MYSQL_URL
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}" + (" CHARACTER SET utf8mb4" if backend == "mysql" else "")))
    engine.dispose()
    return str(sa.make_url(admin).set(database=name).render_as_string(hide_password=False))


def drop_database(backend: str, url: str) -> None:
    if backend == "sqlite":
        return
    name = sa.make_url(url).database
    assert name and name.startswith("jobqueue_test_"), name  # only ever drop our own
    admin = POSTGRES_URL if backend == "postgresql" else MYSQL_URL
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        if backend == "postgresql":
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        else:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
    engine.dispose()


# -- private servers, for tests that stop or restart them ------------------------------------------------

import contextlib  # noqa: E402
import glob  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as(user: str, command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run as ``user`` when we are root (initdb and mariadbd refuse root), else as ourselves."""
    if os.geteuid() == 0:
        command = ["runuser", "-u", user, "--"] + command
    return subprocess.run(command, check=True, capture_output=True, text=True, cwd="/tmp", **kwargs)


def _private_dir(owner: str) -> str:
    directory = tempfile.mkdtemp(prefix=f"jobqueue-{owner}-", dir="/tmp")
    if os.geteuid() == 0:
        shutil.chown(directory, owner, owner)
    return directory


def _wait_reachable(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (error := _reachable(url)) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"private server did not come up: {error}")
        time.sleep(0.2)


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, that a test may stop and restart."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        """``settings``: server settings (``-c name=value``) besides those of a throwaway cluster."""
        self.settings = settings or {}
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql (run scripts/test.sh)")
        self.bin = bins[-1]
        self.dir = _private_dir("postgres")
        self.port = free_port()
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"
        _as("postgres", [f"{self.bin}/initdb", "-D", f"{self.dir}/data", "-A", "trust", "-U", "postgres", "--no-sync"])

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        _as(
            "postgres",
            [
                f"{self.bin}/pg_ctl",
                "-D",
                f"{self.dir}/data",
                "-o",
                options,
                "-l",
                f"{self.dir}/server.log",
                "-w",
                "start",
            ],
        )
        _wait_reachable(self.url)

    def stop(self) -> None:
        _as("postgres", [f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m", "fast", "-w", "stop"])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateMariaDB:
    """A throwaway MariaDB server on a free port, that a test may stop and restart."""

    def __init__(self) -> None:
        self.dir = _private_dir("mysql")
        self.port = free_port()
        self.url = f"mysql+mysqldb://root@127.0.0.1:{self.port}/jobqueue_private"
        self.process: subprocess.Popen | None = None
        command = [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={self.dir}/data",
            "--skip-test-db",
            "--auth-root-authentication-method=normal",
        ]
        if os.geteuid() == 0:
            command.append("--user=mysql")
        # A MariaDB server starting removes every "#sql..." file of its temporary folder: /tmp's
        # were the shared test server's temporary tables, whose queries then failed ("Error on
        # delete of '/tmp/#sql-temptable-...'"). A private server keeps to a folder of its own.
        subprocess.run(command, check=True, capture_output=True, text=True, cwd="/tmp", env=self._own_tmp())

    def _own_tmp(self) -> dict[str, str]:
        return dict(os.environ, TMPDIR=self.dir)

    def start(self) -> None:
        command = [
            "/usr/sbin/mariadbd",
            "--no-defaults",
            f"--datadir={self.dir}/data",
            f"--port={self.port}",
            f"--socket={self.dir}/mysqld.sock",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.dir}/pid",
            "--skip-grant-tables",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=64M",
            "--innodb-flush-log-at-trx-commit=2",
            f"--log-error={self.dir}/error.log",
            f"--tmpdir={self.dir}",
        ]
        if os.geteuid() == 0:
            command.append("--user=mysql")
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self._own_tmp()
        )
        admin = self.url.rsplit("/", 1)[0] + "/"
        _wait_reachable(admin)
        engine = sa.create_engine(admin, poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE IF NOT EXISTS jobqueue_private"))
        engine.dispose()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(60)
            self.process = None

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_server(backend: str) -> Iterator[PrivatePostgres | PrivateMariaDB]:
    server: PrivatePostgres | PrivateMariaDB = PrivatePostgres() if backend == "postgresql" else PrivateMariaDB()
    try:
        server.start()
        yield server
    finally:
        server.close()


class PgBouncer:
    """PgBouncer in transaction mode on a free loopback port, in front of the shared PostgreSQL.

    Every database of that server is reachable through it under its own name, as the same user
    (jobqueue_test), who is also an admin of its console (database ``pgbouncer``: SHOW, RECONNECT).
    A small pool per database and user (``POOL_SIZE`` server connections), so that clients share
    server connections as they do in production.
    """

    POOL_SIZE = 4

    def __init__(self, upstream_url: str = POSTGRES_URL, pool_size: int = POOL_SIZE, max_clients: int = 200) -> None:
        """In front of the server of ``upstream_url`` (the shared one by default), ``pool_size``
        server connections per database and user, at most ``max_clients`` client connections."""
        self.binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.path.exists(self.binary):
            raise FileNotFoundError("pgbouncer is not installed (run scripts/test.sh)")
        self.upstream_url = upstream_url
        upstream = sa.make_url(upstream_url)
        self.user, password = upstream.username or "postgres", upstream.password or ""
        self.dir = _private_dir("postgres")
        self.port = free_port()
        self.ini = os.path.join(self.dir, "pgbouncer.ini")
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": self.port,
            "unix_socket_dir": "",  # no socket: loopback TCP only
            "auth_type": "trust",
            "auth_file": os.path.join(self.dir, "users.txt"),  # trust still needs the user listed
            "admin_users": self.user,
            "pool_mode": "transaction",
            "default_pool_size": pool_size,
            "max_client_conn": max_clients,
            "logfile": os.path.join(self.dir, "pgbouncer.log"),
            "pidfile": os.path.join(self.dir, "pgbouncer.pid"),
        }
        host, port = upstream.host or "127.0.0.1", upstream.port or 5432
        lines = ["[databases]", f"* = host={host} port={port}", "[pgbouncer]"]
        lines += [f"{name} = {value}" for name, value in settings.items()]
        self._write("pgbouncer.ini", "\n".join(lines) + "\n")
        # The password logs PgBouncer in to the server, should the server ask for one.
        self._write("users.txt", f'"{self.user}" "{password}"\n')

    def _write(self, name: str, text: str) -> None:
        path = os.path.join(self.dir, name)
        with open(path, "w") as out:
            out.write(text)
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")

    def url(self, direct: str) -> str:
        """The URL of the database that ``direct`` names, through the pooler."""
        return sa.make_url(direct).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    @property
    def admin_url(self) -> str:
        return self.url(self.upstream_url.rsplit("/", 1)[0] + "/pgbouncer")

    def admin(self, command: str) -> list[dict[str, object]]:
        """Run a console command (``SHOW POOLS``, ``RECONNECT db``); rows as dicts."""
        import psycopg2  # type: ignore[import-untyped]  # the console speaks only simple queries, no transactions

        url = sa.make_url(self.admin_url)
        connection = psycopg2.connect(
            host=url.host, port=url.port, user=url.username, password=url.password, dbname="pgbouncer"
        )
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(command)
                if cursor.description is None:
                    return []
                names = [column.name for column in cursor.description]
                return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            connection.close()

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "pgbouncer.log")) as log:
                return log.read()
        except OSError:
            return ""

    def start(self) -> None:
        try:
            _as("postgres", [self.binary, "-d", self.ini])  # pgbouncer refuses to run as root
            _wait_reachable(self.url(self.upstream_url), timeout=20)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            output = getattr(exc, "stderr", "") or ""
            raise RuntimeError(f"pgbouncer did not start: {exc}\n{output}\n{self.log()[-2000:]}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(self.dir, "pgbouncer.pid")) as pidfile:
                pid = int(pidfile.read())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)  # raises once it is gone
                time.sleep(0.05)
        shutil.rmtree(self.dir, ignore_errors=True)
