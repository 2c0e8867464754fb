from __future__ import annotations

import pickle
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from jobqueue import SerializationError
from jobqueue.serialization import JSONSerializer, PickleSerializer, dumps_call, get_serializer, loads_call

json_ser = JSONSerializer()


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -7,
        2**62,
        1.5,
        "héllo ✓",
        [],
        {},
        [1, [2, [3]]],
        datetime(2026, 1, 2, 3, 4, 5, 678901),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5))),
        date(2026, 2, 28),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        Decimal("3.14159265358979323846264338327950288"),
        b"\x00\xffbinary",
        {"nested": {"when": datetime(2026, 1, 1), "amounts": [Decimal("1.10"), Decimal("-2")]}},
        {1: "int key", None: "none key", 2.5: "float key"},
        {"__jq__": "a user key that looks like our tag"},
    ],
)
def test_round_trip_preserves_value_and_type(value: object) -> None:
    back = json_ser.loads(json_ser.dumps(value))
    assert back == value
    assert type(back) is type(value)


def test_nested_types_are_preserved() -> None:
    value = {"at": [date(2026, 1, 1), {"id": uuid.uuid4(), "raw": b"x"}]}
    back = json_ser.loads(json_ser.dumps(value))
    assert type(back["at"][0]) is date
    assert type(back["at"][1]["id"]) is uuid.UUID
    assert type(back["at"][1]["raw"]) is bytes


def test_tuples_come_back_as_lists() -> None:
    assert json_ser.loads(json_ser.dumps((1, (2, 3)))) == [1, [2, 3]]


def test_tuple_dict_keys_stay_hashable() -> None:
    assert json_ser.loads(json_ser.dumps({(1, 2): "pair"})) == {(1, 2): "pair"}
    # A tuple nested in a key was read back as a list, unhashable: a job whose arguments held one
    # was enqueued, then failed in the worker as a corrupt payload.
    nested = {((1, 2), (3, ("a", date(2026, 1, 1)))): "deep", (): "empty"}
    assert json_ser.loads(json_ser.dumps(nested)) == nested


class Opaque:
    pass


@pytest.mark.parametrize(
    "value, where",
    [
        (Opaque(), "value"),
        ({"a": [1, {2, 3}]}, "value['a'][1]"),
        ({"a": {"b": object()}}, "value['a']['b']"),
    ],
)
def test_unsupported_types_raise_naming_the_place(value: object, where: str) -> None:
    with pytest.raises(SerializationError) as info:
        json_ser.dumps(value)
    assert where in str(info.value)
    assert "pickle" in str(info.value)  # names the way out


def test_call_payload_names_the_argument() -> None:
    with pytest.raises(SerializationError, match=r"kwargs\['when'\]"):
        dumps_call(json_ser, (1,), {"when": Opaque()})
    with pytest.raises(SerializationError, match=r"args\[1\]"):
        dumps_call(json_ser, (1, Opaque()), {})


def test_call_round_trip() -> None:
    data = dumps_call(json_ser, (1, "x"), {"d": Decimal("1.5")})
    assert loads_call(json_ser, data) == ([1, "x"], {"d": Decimal("1.5")})


@pytest.mark.parametrize(
    "payload", [b"not json", b"\xff\xfe", b"[1, 2, 3]", b'{"a": 1}', b'[[], {"x": {"__jq__": "decimal", "v": "nope"}}]']
)
def test_corrupt_payload_is_a_serialization_error(payload: bytes) -> None:
    with pytest.raises(SerializationError, match="corrupt payload"):
        loads_call(json_ser, payload)


def test_a_corrupt_checkpoint_is_named_as_one() -> None:
    from jobqueue.context import JobContext
    from jobqueue.job import Message

    now = datetime(2026, 1, 1)
    message = Message(7, "t", "default", 0, b"[[],{}]", None, 2, 1, 99, now, now, now, now, checkpoint=b"\xff\xfe")
    with pytest.raises(SerializationError, match="^corrupt checkpoint: not valid JSON"):
        _ = JobContext(message, json_ser).state


def test_pickle_is_opt_in_and_round_trips_objects() -> None:
    pickle_ser = get_serializer("pickle")
    assert isinstance(pickle_ser, PickleSerializer)
    data = dumps_call(pickle_ser, ({1, 2},), {})
    assert loads_call(pickle_ser, data) == ([{1, 2}], {})


def test_unknown_serializer_is_a_configuration_error() -> None:
    from jobqueue import ConfigurationError

    with pytest.raises(ConfigurationError, match="json, pickle"):
        get_serializer("yaml")


def test_a_pickle_app_reads_what_a_json_app_wrote() -> None:
    """Switching an app to serializer='pickle' failed every job already queued as 'corrupt payload'."""
    written = dumps_call(JSONSerializer(), (1, Decimal("2.5"), datetime(2026, 1, 2, tzinfo=timezone.utc)), {"k": b"x"})
    assert loads_call(PickleSerializer(), written) == loads_call(JSONSerializer(), written)
    for value in ({"result": [1, 2]}, 42, -3, 1.5, "hello", True, None, Decimal("2.5")):  # results, checkpoints
        assert PickleSerializer().loads(JSONSerializer().dumps(value)) == value


def test_a_json_app_never_unpickles_and_says_which_serializer_wrote_the_payload() -> None:
    written = dumps_call(PickleSerializer(), (1, 2), {})
    with pytest.raises(SerializationError, match=r"written with serializer='pickle'.*never unpickles") as info:
        loads_call(JSONSerializer(), written)
    assert "corrupt" not in str(info.value)


def test_an_unpicklable_payload_is_not_called_corrupt_and_names_the_fix() -> None:
    written = pickle.dumps(ValueError("x"), protocol=pickle.HIGHEST_PROTOCOL)
    assert isinstance(PickleSerializer().loads(written), ValueError)
    missing = written.replace(b"builtins", b"nomodule")  # its class's module is not importable here
    with pytest.raises(SerializationError, match=r"cannot unpickle the payload .*damaged, or a class in it") as info:
        PickleSerializer().loads(missing)
    assert "__reduce__" in str(info.value) and "corrupt" not in str(info.value)
