"""Database URLs (which database, the same one, masked for logs) and engine creation.

What each database needs of its connections is its dialect's (``engine_options``, ``configure``).
"""

from __future__ import annotations

import contextvars
import re
import weakref
from typing import Any

import sqlalchemy as sa

from jobqueue.errors import ConfigurationError
from jobqueue.storage.liveness import check_idle_connections

READONLY = "jobqueue_readonly"  # an execution option: this transaction only reads
# Set while the tables are created: only then may a connection make the database itself (a SQLite
# file). A status, a worker or an enqueue given a mistyped path said "no tables" and left an empty
# database file behind.
CREATING_DATABASE: contextvars.ContextVar[bool] = contextvars.ContextVar("jobqueue_creating_database", default=False)
# jobqueue's transactions last milliseconds. A process frozen inside one (SIGSTOP, a stalled VM)
# would keep its row locks for ever, and the lock waits of everyone else would run into
# lock_timeout; after this long idle inside a transaction the server ends its session instead.
IDLE_IN_TRANSACTION_SECONDS = 10


# Query parameters that carry a password for the drivers jobqueue supports (psycopg2's password and
# sslpassword, mysqlclient's passwd), in any case.
SECRET_PARAMETERS = {"password", "passwd", "pwd", "sslpassword"}


def _spilled(parsed: sa.URL) -> sa.URL:
    """``parsed`` as its writer meant it when an ``@`` of its user name or password was not written
    ``%40``: the URL is then read up to its first ``@`` as user part and the rest of it as host (so
    ``u:p@ss@host`` has password ``p`` and host ``ss@host``); here the user part runs to the last
    ``@``, as Python's own URL parser reads it."""
    host = parsed.host or ""
    if "@" not in host:
        return parsed
    spill, host = host.rsplit("@", 1)
    if parsed.password is not None:
        return parsed.set(password=f"{parsed.password}@{spill}", host=host)
    return parsed.set(username=f"{parsed.username or ''}@{spill}", host=host)


def mask_url(url: str | sa.URL) -> str:
    """Return ``url`` as text with any password, in its user part or its query, replaced by ``***``."""
    try:
        parsed = _spilled(sa.make_url(url))
        hidden = {key: "***" for key in parsed.query if key.lower() in SECRET_PARAMETERS}
        if hidden:
            parsed = parsed.update_query_dict(hidden)
        return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")  # not URL-escaped
    except Exception:  # not a URL at all: show nothing that might be a secret
        return str(url) if _sqlite_file_name(str(url)) else "<unparseable database URL>"


SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".db3")


def _sqlite_file_name(text: str) -> bool:
    """True for text that is a SQLite file's name given for a URL (``jobs.sqlite3``), which is then
    worth showing with the URL to write. Anything else may be a secret (a libpq connection string,
    an environment variable filled with the password itself) and is never shown."""
    return text.lower().endswith(SQLITE_SUFFIXES) and not any(c in text for c in ":@= \t\n")


def url_secrets(url: str | sa.URL | None) -> list[str]:
    """The passwords written in ``url`` (user part and query), to scrub from any text."""
    if not url:
        return []
    try:
        read = sa.make_url(url)
    except Exception:
        return []
    parsed = _spilled(read)
    found = [parsed.password] if parsed.password else []
    if parsed is not read and parsed.password and read.host:
        found.append(read.host)  # what a driver would take for the host: the password's end in it
    for key, value in parsed.query.items():
        if key.lower() in SECRET_PARAMETERS:
            found.extend([value] if isinstance(value, str) else list(value))
    return [str(secret) for secret in found if secret]


def mask_in(text: str, url: str | sa.URL | None) -> str:
    """``text`` with ``url`` and the passwords written in it masked. Each is masked where it stands
    on its own, not inside a longer word: a password ``postgres`` leaves ``postgresql`` readable."""
    if not url or not str(url).strip():
        return text
    text = _standing_alone(str(url)).sub(lambda _: mask_url(url), text)
    for secret in url_secrets(url):
        text = _standing_alone(secret).sub("***", text)
    return text


def _standing_alone(word: str) -> re.Pattern[str]:
    """``word`` where no letter or digit runs on from its own first or last one."""
    before = r"(?<!\w)" if re.match(r"\w", word) else ""
    after = r"(?!\w)" if re.search(r"\w$", word) else ""
    return re.compile(before + re.escape(word) + after)


DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+mysqldb", "mariadb": "mariadb+mysqldb"}


BLANK_URL = (
    "the database URL given is blank (a variable that is not set?): give one, for example "
    "postgresql+psycopg2://user@host/db, or give none to use JOBQUEUE_DATABASE_URL, then sqlite:///jobqueue.sqlite3"
)


def parse_url(url: str | sa.URL) -> sa.URL:
    """``url`` parsed, or ConfigurationError saying what is wrong with it (its password hidden)."""
    if isinstance(url, str) and not url.strip():
        raise ConfigurationError(BLANK_URL)
    if isinstance(url, str) and url != url.strip():
        # It would name another file, database or password: a new empty SQLite database, say.
        where, char = ("begins", url[0]) if url[:1].isspace() else ("ends", url[-1])
        raise ConfigurationError(
            f"the database URL {mask_url(url.strip())!r} {where} with {char!r} (a line break from an env file "
            "or a secret?): remove it"
        )
    if isinstance(url, str) and _sqlite_file_name(url):
        raise ConfigurationError(
            f"{url!r} is not a database URL: for that SQLite file write sqlite:///{url} (three slashes, then "
            "the path: a fourth for an absolute one); for a server, postgresql+psycopg2://user@host:5432/db "
            "or mysql+mysqldb://user@host/db"
        )
    try:
        parsed = sa.make_url(url)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot parse database URL {mask_url(url)!r} ({exc}); expected for example "
            "sqlite:///jobqueue.sqlite3, postgresql+psycopg2://user@host:5432/db or mysql+mysqldb://user@host/db"
        ) from None
    if parsed.get_backend_name() == "sqlite" and (parsed.host or parsed.port or parsed.username):
        # sqlite://jobs.sqlite3: two slashes make the file's name a host, which SQLite has none of.
        path = "/".join(part for part in (parsed.host, parsed.database) if part)
        raise ConfigurationError(
            f"the SQLite URL {mask_url(url)!r} names a host, which a file has none of: write three slashes "
            f"before a relative path (sqlite:///{path}) and four before an absolute one (sqlite:////srv/app/jobs.sqlite3)"
        )
    if _spilled(parsed) is not parsed:
        raise ConfigurationError(
            f"the database URL {mask_url(url)!r} has more than one '@' before its host: write each '@' of "
            "the user name or password as %40 (urllib.parse.quote(password, safe='') escapes it)"
        )
    return parsed


def database_kind(name: str) -> str:
    """The kind of database a SQLAlchemy backend or dialect name is: MariaDB's is "mysql", which
    SQLAlchemy also calls it for a mysql:// URL."""
    return {"mariadb": "mysql"}.get(name, name)


def backend_name(url: str | sa.URL) -> str:
    """Return "sqlite", "postgresql" or "mysql" for a URL, or raise ConfigurationError."""
    name = database_kind(parse_url(url).get_backend_name())
    if name == "postgres":  # what Heroku and many hosts hand out, and SQLAlchemy refuses
        raise ConfigurationError(
            f"unsupported database 'postgres' in {mask_url(url)!r}: write the scheme as postgresql:// "
            "(or postgresql+psycopg2://)"
        )
    if name not in ("sqlite", "postgresql", "mysql"):
        raise ConfigurationError(
            f"unsupported database {name!r} in {mask_url(url)!r}: jobqueue runs on sqlite, postgresql and mysql/mariadb"
        )
    return name


def _dialect_class(url: sa.URL) -> Any:
    from jobqueue.storage.dialects import dialect_class  # the dialects build on this module

    return dialect_class(backend_name(url))


def same_database(first: str | sa.URL, second: str | sa.URL) -> bool:
    """True when two URLs name the same database (drivers, users and passwords aside)."""
    a, b = sa.make_url(first), sa.make_url(second)
    if backend_name(a) != backend_name(b):
        return False
    identity = _dialect_class(a).database_identity
    return bool(identity(a) == identity(b))


def absolute_url(url: str | sa.URL) -> sa.URL:
    """``url`` as any working directory reads it (a relative SQLite path made absolute)."""
    parsed = parse_url(url)  # its mistakes named as every other entry point names them
    return _dialect_class(parsed).absolute_url(parsed)  # type: ignore[no-any-return]


def create_engine(url: str | sa.URL, **kwargs: Any) -> sa.Engine:
    """Create an engine configured for jobqueue's access pattern on its database (the dialect's settings)."""
    parsed = parse_url(url)
    cls = _dialect_class(parsed)
    if parsed.drivername in DEFAULT_DRIVERS:
        # A URL without a driver gets the one jobqueue installs (SQLAlchemy 2.1 would pick psycopg 3).
        parsed = parsed.set(drivername=DEFAULT_DRIVERS[parsed.drivername])
    try:
        dialect = parsed.get_dialect()
    except sa.exc.NoSuchModuleError:
        raise ConfigurationError(
            f"SQLAlchemy knows no driver {parsed.get_driver_name()!r} for {mask_url(parsed)}: "
            f"use {_default_url(parsed)}"
        ) from None
    if getattr(dialect, "is_async", False):
        raise ConfigurationError(
            f"{mask_url(parsed)} names an asyncio driver ({parsed.get_driver_name()}); jobqueue's workers and "
            f"enqueues are synchronous: use {_default_url(parsed)}"
        )
    parsed, options = cls.engine_options(parsed)
    options.update(kwargs)
    # A password given as a query parameter goes to the driver as a connection argument, as the
    # driver would take it from the URL: the engine's URL (its repr, its str) then shows none.
    secrets = {key: value for key, value in parsed.query.items() if key.lower() in SECRET_PARAMETERS}
    if secrets:
        parsed = parsed.difference_update_query(secrets)
        options["connect_args"] = {**secrets, **options.get("connect_args", {})}
    try:
        engine = sa.create_engine(parsed, **options)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(_missing_driver(parsed, exc.name)) from None
    cls.configure(engine)
    if cls.name != "sqlite":  # a file has no server to close connections
        check_idle_connections(engine)
    if secrets:
        _URL_SECRETS[engine] = secrets
    return engine


# The password query parameters taken out of an engine's URL (see create_engine), by engine.
_URL_SECRETS: weakref.WeakKeyDictionary[sa.Engine, dict[str, Any]] = weakref.WeakKeyDictionary()


def engine_like(engine: sa.Engine, **kwargs: Any) -> sa.Engine:
    """A new engine to ``engine``'s database, as create_engine made it (its URL's password query
    parameters included), with ``kwargs`` for options of its own."""
    secrets = _URL_SECRETS.get(engine)
    return create_engine(engine.url.update_query_dict(secrets) if secrets else engine.url, **kwargs)


def _missing_driver(url: sa.URL, module: str | None) -> str:
    """What to do when the driver a URL names cannot be imported."""
    kind = backend_name(url)
    extra = f"pip install 'jobqueue[{kind}]'"
    if kind == "sqlite" or url.drivername in DEFAULT_DRIVERS.values():
        return f"the driver for {mask_url(url)} is not installed ({module}); {extra}"
    return (
        f"the driver for {mask_url(url)} is not installed ({module}); install it, or use the driver "
        f"{extra} brings: {_default_url(url)}"
    )


def _default_url(url: sa.URL) -> str:
    """The scheme of the driver jobqueue installs for ``url``'s database, as a user would write it."""
    backend = url.get_backend_name()
    return "sqlite:///PATH" if backend == "sqlite" else f"{DEFAULT_DRIVERS.get(backend, backend)}://..."


def check_listen_url(database_url: str | sa.URL, listen_url: str | None) -> None:
    """Raise ConfigurationError unless ``listen_url`` (where a supervisor LISTENs) can serve
    ``database_url``: PostgreSQL both."""
    if listen_url is None:
        return
    if backend_name(database_url) != "postgresql":
        raise ConfigurationError(
            f"listen_database_url is for PostgreSQL, and this database is {backend_name(database_url)}: "
            "remove the option (or unset JOBQUEUE_LISTEN_DATABASE_URL)"
        )
    if backend_name(listen_url) != "postgresql":
        raise ConfigurationError(
            f"listen_database_url {mask_url(listen_url)!r} is not a PostgreSQL URL: give a direct "
            "connection to the same database, e.g. postgresql://user@db-host:5432/app"
        )


def unless_in_url(url: sa.URL, defaults: dict[str, Any]) -> dict[str, Any]:
    """Connection defaults that the URL's own query parameters override."""
    return {key: value for key, value in defaults.items() if key not in url.query}
