"""A task's options: what ``@app.task(...)`` accepts, each checked when the decorator runs (so a
typo fails at import rather than in production), and the checker of a call's arguments."""

from __future__ import annotations

import difflib
import inspect
import keyword
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jobqueue.ack import AckPolicy
from jobqueue.errors import ConfigurationError
from jobqueue.flow import Flow
from jobqueue.retry import RetryStrategy
from jobqueue.settings import validate_queue_name

TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-<>]{0,254}$")
PRIORITY_RANGE = (-32768, 32767)
# The longest time limit a task may set: a year. The hard limit becomes a deadline in nanoseconds
# and the soft one an interval timer, and neither holds much more (nor NaN, nor infinity).
MAX_TIME_LIMIT_SECONDS = 365 * 86400
# jobqueue's own tasks, and consumer groups' deliveries ("topic:<topic>:<group>").
RESERVED_PREFIXES = ("jobqueue.", "topic:")


@dataclass(frozen=True)
class TaskOptions:
    """A task's options; ``None`` means "use the worker's setting"."""

    name: str
    queue: str | None = None
    priority: int = 0
    retry_strategy: RetryStrategy | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    timeout: float | None = None
    soft_timeout: float | None = None
    max_deliveries: int | None = None
    ack_policy: AckPolicy | None = None
    bind: bool = False
    concurrency_key: str | Callable[..., Any] | None = None
    concurrency_limit: int | None = None
    rate_limit: str | None = None


OPTION_NAMES = tuple(TaskOptions.__dataclass_fields__)


def validate_task_name(name: Any, reserved_ok: bool = False) -> str:
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise ConfigurationError(
            f"invalid task name {name!r}: use up to 255 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or '_'"
        )
    for prefix in RESERVED_PREFIXES:
        if name.startswith(prefix) and not reserved_ok:
            raise ConfigurationError(f"task names starting with {prefix!r} are reserved; rename {name!r}")
    return name


def validate_priority(priority: Any) -> int:
    low, high = PRIORITY_RANGE
    if not isinstance(priority, int) or isinstance(priority, bool) or not low <= priority <= high:
        raise ConfigurationError(f"priority must be an integer from {low} to {high}, got {priority!r}")
    return priority


def _positive(name: str, value: Any, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) or not value > 0):
        raise ConfigurationError(
            f"task option {name} must be a positive {'integer' if integer else 'number'} or None, got {value!r}"
        )


def _time_limit(name: str, value: Any) -> None:
    """A hard or soft time limit: a positive number of seconds up to a year, or None for no limit."""
    _positive(name, value)
    # Compared before isfinite, which cannot take an integer past a float's range (10**400).
    if value is not None and not (value <= MAX_TIME_LIMIT_SECONDS and math.isfinite(value)):
        raise ConfigurationError(
            f"task option {name} must be at most {MAX_TIME_LIMIT_SECONDS} seconds (a year), got {value!r}; "
            "use None for no limit"
        )


def default_task_name(fn: Callable[..., Any]) -> str:
    """``module.qualname``; a script run as __main__ is named after its file, as it is when imported."""
    qualname, module = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
    if not isinstance(qualname, str) or not isinstance(module, str):  # functools.partial, a callable object
        raise ConfigurationError(f"{fn!r} has no name of its own to register as a task; give one: @app.task(name=...)")
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if spec is not None and spec.name:
            module = spec.name
        elif main_file:
            module = os.path.splitext(os.path.basename(main_file))[0]
    return f"{module}.{qualname}"


def unknown_names(unknown: Iterable[str], known: Sequence[str]) -> str:
    """``unknown`` names quoted, each with the known name it is likely a typo of."""
    return ", ".join(
        f"{u!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, known, 1)) else repr(u) for u in unknown
    )


def build_options(fn: Callable[..., Any], options: dict[str, Any], reserved_ok: bool = False) -> TaskOptions:
    """Check decorator options now, so a typo fails at import rather than in production."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ConfigurationError(
            f"unknown task option {unknown_names(unknown, OPTION_NAMES)} on {fn.__qualname__}; "
            f"known options: {', '.join(OPTION_NAMES)}"
        )
    values = dict(options)
    name = values.get("name")
    values["name"] = validate_task_name(default_task_name(fn) if name is None else name, reserved_ok)
    if values.get("queue") is not None:
        validate_queue_name(values["queue"])
    validate_priority(values.get("priority", 0))
    strategy = values.get("retry_strategy")
    if strategy is not None and not isinstance(strategy, RetryStrategy):
        raise ConfigurationError(
            "retry_strategy must be a strategy from jobqueue.retry, "
            f"for example ConstantRetryStrategy(delay_seconds=5), got {strategy!r}"
        )
    retry_on = values.get("retry_on")
    if retry_on is not None:
        retry_on = tuple(retry_on) if isinstance(retry_on, (tuple, list)) else (retry_on,)
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in retry_on):
            raise ConfigurationError(f"retry_on must be exception classes, got {options['retry_on']!r}")
        values["retry_on"] = retry_on
    _time_limit("timeout", values.get("timeout"))
    _time_limit("soft_timeout", values.get("soft_timeout"))
    hard, soft = values.get("timeout"), values.get("soft_timeout")
    if hard is not None and soft is not None and soft >= hard:
        raise ConfigurationError(
            f"task {values['name']}: soft_timeout={soft} is not below timeout={hard}, so the job would be killed "
            "before its soft limit could fire; make soft_timeout smaller, leaving the job time to clean up "
            f"(for example soft_timeout={hard * 0.9:g})"
        )
    _positive("max_deliveries", values.get("max_deliveries"), integer=True)
    policy = values.get("ack_policy")
    if policy is not None and not isinstance(policy, AckPolicy):
        raise ConfigurationError(f"ack_policy must be an AckPolicy member, got {policy!r}")
    if not isinstance(values.get("bind", False), bool):
        raise ConfigurationError("bind must be True or False")
    Flow.of(values["name"], values.get("concurrency_key"), values.get("concurrency_limit"), values.get("rate_limit"))
    if policy is AckPolicy.ACK_FIRST and values.get("concurrency_limit") is not None:
        raise ConfigurationError(
            f"task {values['name']}: ack_policy=ACK_FIRST completes each job before it runs, which frees its "
            f"concurrency slot at once, so concurrency_limit={values['concurrency_limit']} could not bound the "
            "jobs running; keep the default ack policy (and make the task safe to run twice), or drop "
            "concurrency_limit"
        )
    return TaskOptions(**values)


class _Default:
    """Stands for every default value in a call checker's source (the values themselves do not matter)."""

    def __repr__(self) -> str:
        return "_default"


def call_checker(fn: Callable[..., Any], bind: bool, task_name: str) -> Callable[..., None] | None:
    """A function with ``fn``'s parameters and an empty body: calling it binds a call as ``fn`` would,
    raising Python's own TypeError when it cannot (twenty times cheaper than ``Signature.bind``).

    None when Python cannot read ``fn``'s signature (some builtins): such calls are not checked.
    A bound task's first parameter is the job context, which no caller passes: a function that
    takes no positional parameter cannot be bound (ConfigurationError).
    """
    try:
        # Not through functools.wraps: a decorator may take other arguments than the function it wraps.
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    params = list(signature.parameters.values())
    if bind and (not params or params[0].kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD)):
        raise ConfigurationError(
            f"task {task_name}: bind=True passes the job context as the first positional argument, and "
            f"{getattr(fn, '__name__', 'the function')}{signature} takes none; add a first parameter for it "
            "(def task(job, ...)), or drop bind=True (current_job() gives the context too)"
        )
    if bind and params[0].kind is not inspect.Parameter.VAR_POSITIONAL:
        params = params[1:]
    default = _Default()
    stripped = inspect.Signature(
        [p.replace(annotation=p.empty, default=p.empty if p.default is p.empty else default) for p in params]
    )
    name = getattr(fn, "__name__", "")
    name = name if name.isidentifier() and not keyword.iskeyword(name) and name != "_default" else "task"
    namespace: dict[str, Any] = {"_default": None}
    # The source holds only identifiers: parameter names, the function name, and the default stand-in.
    exec(f"def {name}{stripped}:\n    pass", namespace)
    checker: Callable[..., None] = namespace[name]
    return checker


def origin(fn: Callable[..., Any]) -> str:
    """Where a function is defined, as ``module.qualname``, to name it in a message."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
