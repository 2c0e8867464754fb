from __future__ import annotations

import functools
import os
import sqlite3
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from jobqueue import AckPolicy, ConfigurationError, JobQueue, SerializationError
from jobqueue.handle import JobHandle
from jobqueue.retry import ConstantRetryStrategy, RetryStrategy


@pytest.fixture
def app(tmp_path) -> JobQueue:
    return JobQueue(f"sqlite:///{tmp_path}/unused.sqlite3")


def test_default_name_is_module_and_qualname(app: JobQueue) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    assert add.name == f"{__name__}.test_default_name_is_module_and_qualname.<locals>.add"
    assert app.registry[add.name] is add


def test_options_are_stored(app: JobQueue) -> None:
    strategy = ConstantRetryStrategy(delay_seconds=1, max_attempts=2)

    @app.task(
        name="emails.send",
        queue="emails",
        priority=5,
        retry_strategy=strategy,
        retry_on=(ConnectionError,),
        timeout=30,
        soft_timeout=20,
        max_deliveries=3,
        ack_policy=AckPolicy.REJECT_ON_ERROR,
        bind=True,
    )
    def send(context, to):
        return to

    options = send.options
    assert (options.name, options.queue, options.priority, options.timeout) == ("emails.send", "emails", 5, 30)
    assert options.retry_on == (ConnectionError,)
    assert options.retry_strategy is strategy
    assert send.queue == "emails"


def test_unknown_option_fails_at_decoration_naming_it(app: JobQueue) -> None:
    with pytest.raises(ConfigurationError) as info:

        @app.task(quue="emails")
        def f() -> None: ...

    assert "'quue'" in str(info.value) and "did you mean 'queue'" in str(info.value)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"queue": "bad queue!"}, "invalid queue name"),
        ({"priority": 10**6}, "priority must be"),
        ({"priority": "high"}, "priority must be"),
        ({"timeout": -1}, "timeout must be"),
        # NaN, infinity and huge limits crash-looped every worker process that fetched the job.
        ({"timeout": float("nan")}, "timeout must be a positive number"),
        ({"timeout": float("inf")}, "timeout must be at most 31536000 seconds"),
        ({"timeout": 1e300}, "timeout must be at most"),
        ({"soft_timeout": float("nan")}, "soft_timeout must be a positive number"),
        ({"soft_timeout": 10**10}, "soft_timeout must be at most"),
        ({"timeout": 10**400}, "timeout must be at most"),  # was a bare OverflowError
        ({"concurrency_limit": 2**31}, "concurrency_limit must be an integer from 1 to 2147483647"),
        ({"max_deliveries": 0}, "max_deliveries must be"),
        ({"retry_on": "ValueError"}, "retry_on must be exception classes"),
        ({"retry_strategy": 3}, "retry_strategy must be"),
        ({"ack_policy": "ack"}, "ack_policy must be"),
        ({"name": "has space"}, "invalid task name"),
        # A pattern's $ also matches before a final newline: such names were taken as valid.
        ({"name": "reports.daily\n"}, "invalid task name"),
        ({"queue": "emails\n"}, "invalid queue name"),
        ({"name": ""}, "invalid task name ''"),  # it fell back to the function's name unnoticed
        ({"timeout": 10, "soft_timeout": 10}, r"soft_timeout=10 is not below timeout=10.*soft_timeout=9\)"),
        ({"bind": True}, r"bind=True passes the job context .* takes none"),
    ],
)
def test_invalid_option_values(app: JobQueue, options: dict, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        app.task(**options)(lambda: None)


def test_same_name_twice_from_different_functions_is_refused(app: JobQueue) -> None:
    app.task(name="dup")(lambda: 1)
    with pytest.raises(ConfigurationError, match="already registered"):

        @app.task(name="dup")
        def other() -> int:
            return 2


def test_inline_call_runs_the_function(app: JobQueue) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    assert add(2, 3) == 5


def test_bind_needs_a_first_positional_parameter_and_leaves_the_rest_checked(app: JobQueue) -> None:
    def keyword_only(*, x):
        return x

    def keywords(**kwargs):
        return kwargs

    for fn in (keyword_only, keywords):  # the check took x for the context, and refused x=1 at enqueue
        with pytest.raises(ConfigurationError, match=rf"task .*{fn.__name__}: bind=True .* add a first parameter"):
            app.task(bind=True)(fn)

    @app.task(bind=True)
    def either(*args):
        return args

    @app.task(bind=True)
    def bound(job, *, x):
        return x

    either.check_call((), {})
    bound.check_call((), {"x": 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
        bound.check_call((), {"y": 1})


def test_inline_call_of_bound_task_gets_a_context(app: JobQueue) -> None:
    @app.task(bind=True)
    def who(context, x):
        return (context.id, context.attempt, x)

    assert who(7) == (None, 1, 7)


def test_non_serializable_arguments_raise_before_any_database_access(app: JobQueue) -> None:
    @app.task
    def f(x: object) -> None: ...

    # The database file does not even exist: the error comes first, nothing is written.
    with pytest.raises(SerializationError, match=r"args\[0\]"):
        f.delay(object())
    with pytest.raises(SerializationError, match="item 1"):
        f.bulk([(1,), (object(),)])
    database = sa.make_url(app.database_url).database
    assert database and not os.path.exists(database), "the database was opened"


def test_oversized_payload_is_refused(tmp_path) -> None:
    app = JobQueue(f"sqlite:///{tmp_path}/x.sqlite3", max_payload_bytes=2048)

    @app.task
    def f(x: str) -> None: ...

    with pytest.raises(SerializationError, match="max_payload_bytes=2048"):
        f.delay("x" * 5000)


def test_oversized_headers_are_refused_and_write_nothing(tmp_path) -> None:
    """Headers are stored with the job (once per group for a topic): they were accepted at any size."""
    app = JobQueue(f"sqlite:///{tmp_path}/x.sqlite3", max_payload_bytes=2048)

    @app.task
    def f() -> None: ...

    app.init_schema()
    with pytest.raises(
        SerializationError, match="headers serialize to about 50[0-9]{2} bytes, over max_payload_bytes=2048"
    ):
        f.apply_async(headers={"trace": "x" * 5000})
    with pytest.raises(SerializationError, match="max_payload_bytes=2048"):
        app.topic("orders").publish({"n": 1}, headers={"a": "x" * 1500, "b": "y" * 1500})
    f.apply_async(headers={"trace": "x" * 1000})  # within the limit
    database = sa.make_url(app.database_url).database
    with sqlite3.connect(database or "") as raw:
        assert raw.execute("SELECT count(*) FROM jobqueue_message").fetchone()[0] == 1
    app.close()


def test_bad_bulk_item_names_the_fix(app: JobQueue) -> None:
    @app.task
    def f(x: int) -> None: ...

    with pytest.raises(SerializationError, match=r"\(value,\)"):
        f.bulk([1, 2])  # type: ignore[list-item]
    for batch_size in ("5", True, 0, 2.5):  # a string was a bare TypeError, True was taken as 1
        with pytest.raises(ConfigurationError, match="batch_size must be an integer of at least 1"):
            f.bulk([(1,)], batch_size=batch_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"eta": "tomorrow"}, "eta must be a datetime"),
        ({"countdown": 1, "eta": __import__("datetime").datetime(2030, 1, 1)}, "not both"),
        ({"headers": {1: "x"}}, "headers must be"),
        ({"unique_key": ""}, "unique_key must be"),
        ({"queue": "no spaces allowed"}, "invalid queue name"),
    ],
)
def test_invalid_call_options(app: JobQueue, kwargs: dict, fragment: str) -> None:
    @app.task
    def f() -> None: ...

    with pytest.raises(ConfigurationError, match=fragment):
        f.apply_async((), **kwargs)


def test_a_per_call_strategy_must_be_one_the_worker_can_rebuild(app: JobQueue) -> None:
    @dataclass(frozen=True, kw_only=True)
    class Mine(ConstantRetryStrategy):
        """A subclass keeps its parent's kind: a worker would rebuild the parent, silently."""

    @app.task
    def f() -> None: ...

    # Accepted before, then the job failed in the worker with "unknown retry strategy kind", or
    # ran with its parent's behaviour; now refused at enqueue, before the database is opened.
    for strategy in (Mine(delay_seconds=1), _Custom()):
        with pytest.raises(ConfigurationError, match="per-call retry_strategy must be one of jobqueue.retry"):
            f.apply_async((), retry_strategy=strategy)
        with pytest.raises(ConfigurationError, match="per-call retry_strategy"):
            f.bulk([()], retry_strategy=strategy)

    @app.task(retry_strategy=_Custom())  # on the task itself, a strategy of one's own is fine
    def g() -> None: ...

    database = sa.make_url(app.database_url).database
    assert database and not os.path.exists(database), "the database was opened"


@dataclass(frozen=True, kw_only=True)
class _Custom(RetryStrategy):
    kind = "custom"

    def delay_for(self, attempt: int) -> float:
        return 1.0


def test_unknown_jobqueue_setting_is_named() -> None:
    with pytest.raises(ConfigurationError, match="fetch_batchsize"):
        JobQueue(fetch_batchsize=5)


@pytest.mark.parametrize("timeout", [float("nan"), "5", True])
def test_get_refuses_a_timeout_that_is_not_a_number_of_seconds(app: JobQueue, timeout: object) -> None:
    # A NaN timeout compared false with every deadline: get() polled the database for ever.
    with pytest.raises(ValueError, match=r"get\(timeout=\.\.\.\) takes a number of seconds or None"):
        JobHandle(app, 1).get(timeout=timeout)  # type: ignore[arg-type]
    database = sa.make_url(app.database_url).database
    assert database and not os.path.exists(database), "the database was opened"


def test_app_task_of_something_not_callable_names_the_fix(app: JobQueue) -> None:
    # An AttributeError ('int' object has no attribute '__module__') before.
    with pytest.raises(ConfigurationError, match="@app.task decorates a function, got str 'emails.send'"):
        app.task("emails.send")  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "job_id, error", [(1.5, TypeError), (True, TypeError), (None, TypeError), (0, ValueError), (2**63, ValueError)]
)
def test_app_job_refuses_what_cannot_be_a_job_id(app: JobQueue, job_id: object, error: type) -> None:
    # 1.5 and True gave a handle on job 1; 2**63 raised OverflowError on SQLite, JobNotFound elsewhere.
    with pytest.raises(error, match="job id"):
        app.job(job_id)  # type: ignore[arg-type]
    assert app.job("12").id == app.job(12).id == 12


def test_a_callable_without_a_name_must_be_given_one(app: JobQueue) -> None:
    def add(x: int, y: int) -> int:
        return x + y

    # An AttributeError about __qualname__ before.
    with pytest.raises(ConfigurationError, match=r"has no name of its own.*@app.task\(name=\.\.\.\)"):
        app.task(functools.partial(add, 1))
    assert app.task(name="add_one")(functools.partial(add, 1))(2) == 3


def test_acking_first_is_refused_with_a_concurrency_limit_or_a_partition_key(app: JobQueue) -> None:
    """ACK_FIRST completes a job before its handler runs: the slot of its concurrency key and the
    turn of its partition ended then, and the key's next jobs ran alongside it (three at once under
    concurrency_limit=1). The combinations are refused, before anything is written."""
    with pytest.raises(ConfigurationError, match="ACK_FIRST completes each job before it runs.*concurrency_limit=1"):
        app.task(name="t.api", concurrency_key="partner", concurrency_limit=1, ack_policy=AckPolicy.ACK_FIRST)(
            lambda: None
        )

    @app.task(name="t.once", concurrency_key="partner", rate_limit="5/s", ack_policy=AckPolicy.ACK_FIRST)
    def once(n: int) -> None: ...

    for enqueue in (
        lambda: once.apply_async((1,), partition_key="acct"),
        lambda: once.bulk([(1,), (2,)], partition_key="acct"),
    ):
        with pytest.raises(ConfigurationError, match="acks first.*enqueue it without partition_key"):
            enqueue()
