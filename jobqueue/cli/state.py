"""The CLI's shared state: global options, loading the app, logging set-up."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import os
import sys
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import click
import sqlalchemy as sa

from jobqueue import logs
from jobqueue.app import JobQueue
from jobqueue.duration import parse_age
from jobqueue.errors import ConfigurationError, JobQueueError
from jobqueue.settings import APP_ENV, DATABASE_URL_ENV
from jobqueue.storage.dialects.connector import CONTENTION, first_line, lacks_a_privilege, privilege_advice
from jobqueue.storage.engine import mask_in, mask_url


@dataclass
class CliState:
    """What the global options say; the app is imported on first use."""

    app_spec: str | None = None
    database_url: str | None = None
    log_json: bool = False
    log_level: str | None = None
    _app: JobQueue | None = field(default=None, repr=False)
    _given: bool = field(default=False, repr=False)

    @property
    def app(self) -> JobQueue:
        if self._app is None:
            app = load_app(self.app_spec or os.environ.get(APP_ENV))
            if self.database_url is not None:
                app.configure(database_url=self.database_url)
            setup_logging(self, app)
            self._app = app
        return self._app

    def use(self, app: JobQueue) -> None:
        """Use this app (``flask jobqueue``, ``manage.py jobqueue``) rather than --app/JOBQUEUE_APP."""
        self._app, self._given = app, True
        if self.database_url is not None:
            app.configure(database_url=self.database_url)
        setup_logging(self, app)

    @property
    def has_app(self) -> bool:
        return self._given or bool(self.app_spec or os.environ.get(APP_ENV))


def load_app(spec: str | None, named_by: str = f"--app/{APP_ENV}") -> JobQueue:
    """Import ``module:attribute`` (or ``path/to/file.py:attribute``); no spec gives a bare JobQueue.
    ``named_by``: where the spec came from, as errors name it."""
    if not spec:
        return JobQueue()
    target, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if not target:
        raise ConfigurationError(
            f"{named_by} {spec!r} names no module: give module:attribute, e.g. myproject.tasks:app"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = _import(target)
    except ModuleNotFoundError as exc:
        named = exc.name is not None and (target == exc.name or target.startswith(exc.name + "."))
        if not named or target.endswith(".py") or os.sep in target:
            raise _import_failed(target, exc, named_by) from exc  # the module's own import of another one failed
        raise ConfigurationError(
            f"cannot import {target!r} named by {named_by}: {exc} (looked for from {os.getcwd()} and "
            "PYTHONPATH): run jobqueue from the directory that holds it, set PYTHONPATH, or give the path of its "
            "file (path/to/tasks.py)"
        ) from exc
    except (ImportError, ValueError) as exc:  # ValueError: a relative or empty module name
        raise ConfigurationError(f"cannot import {target!r} named by {named_by}: {exc}") from exc
    except JobQueueError:  # a task declared with a bad option: its message says which
        raise
    except Exception as exc:  # the module's own code failed
        raise _import_failed(target, exc, named_by) from exc
    missing = object()
    app = getattr(module, attribute, missing)
    if not isinstance(app, JobQueue):
        found = [name for name, value in vars(module).items() if isinstance(value, JobQueue)]
        hint = f"; JobQueue objects there: {', '.join(found)}" if found else ""
        what = f" has no {attribute!r}" if app is missing else f":{attribute} is a {type(app).__name__}, not a JobQueue"
        raise ConfigurationError(f"{target}{what}{hint} (give {named_by} as module:attribute)")
    return app


def _import_failed(target: str, exc: Exception, named_by: str) -> ConfigurationError:
    """What the app's module raised as it was imported, and where (a SyntaxError says where)."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames and not isinstance(exc, SyntaxError) else None
    where = f", at {last.filename} line {last.lineno}" if last else ""
    return ConfigurationError(f"cannot import {target!r} named by {named_by}: {type(exc).__name__}: {exc}{where}")


def _import(target: str) -> Any:
    if not (target.endswith(".py") or os.sep in target):
        return importlib.import_module(target)
    path = os.path.realpath(target)
    if not os.path.isfile(path):
        raise ImportError(f"no such file: {path}")
    folder, stem = os.path.split(os.path.splitext(path)[0])
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its sibling modules import as they do when it runs as a script
    # Imported under the name the application imports it by, so that its tasks have the same
    # names: a file in a package (folders with an __init__.py) as pkg.module, from the folder above.
    root, parts = folder, [] if stem == "__init__" else [stem]
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.basename(root).isidentifier():
        root, package = os.path.split(root)
        parts.insert(0, package)
    if not parts or not all(part.isidentifier() for part in parts):  # tasks.v2.py: no module name
        return _load_file(path, stem)
    name = ".".join(parts)
    loaded = sys.modules.get(name)
    if loaded is None:
        if root not in sys.path:
            sys.path.insert(0, root)
        loaded = importlib.import_module(name)
    where = getattr(loaded, "__file__", None)
    if where is None or os.path.realpath(where) != path:
        raise ImportError(
            f"{target} is imported as the module {name!r}, but that name is already the module of "
            f"{where or 'Python itself'}: rename the file (its tasks are named after it)"
        )
    return loaded


def _load_file(path: str, name: str) -> Any:
    """A file whose name is no module name (``tasks.v2.py``), loaded under that name as it stands."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no such file: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def setup_logging(state: CliState, app: JobQueue) -> None:
    """Configure logging for the command, unless the app keeps its host's (Django's LOGGING, or
    ``configure_logging=False``); then only an explicit ``--log-level`` applies, to jobqueue's loggers."""
    wanted = app.settings.configure_logging
    if wanted is None:
        wanted = app.framework is None or app.framework.name != "Django"
    if wanted:
        logs.configure(state.log_level or "INFO", state.log_json)
    elif state.log_level:
        logging.getLogger("jobqueue").setLevel(state.log_level.upper())


class Utf8Text(click.ParamType):
    """Text that can be sent to the database: a shell passes bytes that are not UTF-8 (a Latin-1
    terminal, a script) as surrogates, which no driver can encode."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raw = text[exc.start : exc.end].encode("utf-8", "surrogateescape")
            self.fail(
                f"holds the byte(s) {raw.hex(' ')}, which are not UTF-8 (a terminal in another encoding?); "
                "give it as UTF-8 text",
                param,
                ctx,
            )
        return text


UTF8_TEXT = Utf8Text()


class NameText(Utf8Text):
    """A name to filter by: empty, it would filter nothing (``--task "$T"`` with T unset would
    purge or retry the jobs of every task)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = super().convert(value, param, ctx)
        if not text.strip():
            self.fail("is empty: give a name, or leave the option out for all of them", param, ctx)
        return text


NAME_TEXT = NameText()


class Group(click.Group):
    """A click group that turns jobqueue errors into a one-line message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as exc:
            # `jobqueue worker --app x` as Celery 4 took it: the option exists, before the command.
            shown = [param for param in self.params if not getattr(param, "hidden", False)]  # bound: no --app
            given = {name for param in shown for name in param.opts} if ctx.parent is None else set()
            if exc.option_name in given and exc.ctx is not None and exc.ctx is not ctx:
                command = exc.ctx.command_path.removeprefix(ctx.command_path).strip()
                where = f"{ctx.command_path} {exc.option_name} ... {command} ..."
                raise click.UsageError(f"{exc.option_name} goes before the command: {where}", exc.ctx) from None
            raise
        except JobQueueError as exc:
            raise click.ClickException(mask_secrets(str(exc), ctx)) from None
        except sa.exc.DBAPIError as exc:
            # The server or the driver refused the connection (no statement ran), or it broke: say
            # so in a line. An error of a statement is a bug to report, with its traceback.
            lacks_privilege = lacks_a_privilege(exc)
            _raise_schema_damage(ctx, exc)  # a table or column dropped by hand: what lacks, and the fix
            classified = _classify(ctx, exc)  # a database refusing writes (read-only), full, cancelling
            explained = _explain(ctx, exc)  # a statement time limit, a file that may not be written
            if (
                not isinstance(exc, sa.exc.OperationalError)
                and exc.statement is not None
                and not lacks_privilege
                and classified is None
                and not explained
            ):
                raise
            reason = first_line(exc)
            if explained:
                reason += f": {explained}"
            elif classified == CONTENTION:
                app = _loaded_app(ctx)
                where = app.store.dialect.lock_holder_hint if app is not None else "find the session that holds it"
                reason += (
                    ": another session held a lock on jobqueue's tables past the lock timeout (a long "
                    f"transaction, LOCK TABLES, a schema change): {where}, then run the command again"
                )
            if lacks_privilege:
                reason += f"; {privilege_advice(reason)}"
            raise click.ClickException(mask_secrets(f"cannot use {_where(ctx)}: {reason}", ctx)) from None
        except TypeError as exc:
            if "argument for connect()" not in str(exc):  # mysqlclient, given an option it does not take
                raise
            reason = f"the URL's query has an option the driver does not take ({exc})"
            raise click.ClickException(mask_secrets(f"cannot use {_where(ctx)}: {reason}", ctx)) from None


class FiniteSeconds(click.FloatRange):
    """A number of seconds, at least ``min``: NaN, infinity and lengths no date can add are refused
    (click's FloatRange lets NaN through, which compares false with any bound)."""

    LONGEST = 10**9  # about 31 years

    def __init__(self, min: float = 0) -> None:
        super().__init__(min=min, max=self.LONGEST)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is no finite number of seconds", param, ctx)
        return seconds


class Age(click.ParamType):
    """An age such as ``7d``, read as a timedelta: one that cannot be read is a usage error (exit 2)."""

    name = "AGE"

    def __init__(self, everything: str | None = None) -> None:
        self.everything = everything  # a word that means no age (None): "all"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        if self.everything is not None and str(value).strip().lower() == self.everything:
            return None
        try:
            return parse_age(str(value))
        except ConfigurationError as exc:
            self.fail(str(exc), param, ctx)


def _loaded_app(ctx: click.Context) -> JobQueue | None:
    """The command's app, if it was loaded (an error before that has no database to ask)."""
    state = ctx.find_object(CliState)
    return state._app if state is not None else None


def _classify(ctx: click.Context, exc: sa.exc.DBAPIError) -> str | None:
    app = _loaded_app(ctx)
    return app.store.classify(exc) if app is not None else None


def _raise_schema_damage(ctx: click.Context, exc: sa.exc.DBAPIError) -> None:
    """If ``exc`` is of a table or column the database lacks: the SchemaError that names what the
    schema lacks and the fix (as `db check` says it), as one line."""
    app = _loaded_app(ctx)
    if app is None or not (app.store.dialect.missing_table(exc) or app.store.dialect.missing_column(exc)):
        return
    try:
        app.check_schema()
    except JobQueueError as damage:
        raise click.ClickException(mask_secrets(str(damage), ctx)) from None
    except Exception:  # the check itself failed: the driver's error says more
        return


def _explain(ctx: click.Context, exc: sa.exc.DBAPIError) -> str | None:
    app = _loaded_app(ctx)
    return app.store.explain(exc) if app is not None else None


def _where(ctx: click.Context) -> str:
    state = ctx.find_object(CliState)
    return mask_url(state.app.database_url) if state and state._app else "the database"


def mask_secrets(message: str, ctx: click.Context) -> str:
    """Mask the database URLs in play (option, environment, app) and their passwords in ``message``."""
    state = ctx.find_object(CliState)
    urls = [state.database_url if state else None, os.environ.get(DATABASE_URL_ENV)]
    if state is not None and state._app is not None:
        urls.append(state._app.settings.database_url)
    for url in urls:
        message = mask_in(message, url)
    return message
