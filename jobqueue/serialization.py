"""Payload and result serializers.

The default serializer is JSON with a few tagged types so that ``datetime``, ``date``, ``UUID``,
``Decimal`` and ``bytes`` come back as they went in, and dicts with non-string keys keep their keys.
Anything else is refused at enqueue time with a :class:`SerializationError` naming where it was.
Tuples come back as lists, as in Celery.

Pickle exists only as an explicit opt-in: unpickling runs code, so it is unsafe whenever anyone
else can write to the database.
"""

from __future__ import annotations

import base64
import json
import pickle
import uuid
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Protocol

from jobqueue.errors import ConfigurationError, SerializationError

TAG = "__jq__"
TAG_BYTES = TAG.encode("ascii")
FLAT = (str, int, float, bool, type(None))
SUPPORTED = "str, int, float, bool, None, list, tuple, dict, datetime, date, UUID, Decimal, bytes"
# One encoder for every payload: json.dumps with non-default options builds a new one per call.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _flat_encoder() -> Callable[[Any], str]:
    """``_JSON.encode`` for calls whose arguments are all FLAT values, without its cost per call.

    JSONEncoder.encode builds a C encoder for every call, which took two thirds of the time of
    serializing a small call; this one is built once. Without the check for cyclic structures,
    which flat values cannot form. Where the interpreter has no C encoder (or builds it
    differently), ``_JSON.encode`` itself.
    """
    try:
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]

        encode = c_make_encoder(None, None, encode_basestring, None, ":", ",", False, False, True)
        sample = [["é", 1, 2.5, True, None, float("nan")], {"k": "\n"}]
        if "".join(encode(sample, 0)) == _JSON.encode(sample):
            return lambda value: "".join(encode(value, 0))
    except Exception:  # another interpreter: the public way
        pass
    return _JSON.encode


_encode_flat = _flat_encoder()


class Serializer(Protocol):
    name: str

    def dumps(self, obj: Any, path: str = "value") -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


def dumps_call(serializer: Serializer, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> bytes:
    """Serialize a call's arguments; errors name the argument (``args[1]``, ``kwargs['when']``)."""
    if not isinstance(kwargs, dict) or kwargs and not all(isinstance(key, str) for key in kwargs):
        raise SerializationError("kwargs must be a dict with string keys")
    if serializer.name != "json":
        return serializer.dumps([list(args), kwargs], path="arguments")
    try:
        if (not args or all(type(v) in FLAT for v in args)) and (
            not kwargs or TAG not in kwargs and all(type(v) in FLAT for v in kwargs.values())
        ):
            # Flat arguments (the common case): the encoder alone, no walk to tag anything.
            return _encode_flat([list(args), kwargs]).encode("utf-8")
        return _JSON.encode([_encode(list(args), "args"), _encode(kwargs, "kwargs")]).encode("utf-8")
    except ENCODING_ERRORS as exc:
        parts = [(f"args[{i}]", value) for i, value in enumerate(args)] + [
            (f"kwargs[{key!r}]", value) for key, value in kwargs.items()
        ]
        for path, value in parts:  # name the argument at fault
            try:
                _JSON.encode(_encode(value, path)).encode("utf-8")
            except ENCODING_ERRORS as inner:
                raise _unencodable(path, inner) from None
        raise _unencodable("arguments", exc) from None


# What json and str.encode raise for values of the right types that JSON still cannot carry.
ENCODING_ERRORS = (ValueError, TypeError, RecursionError, OverflowError, UnicodeEncodeError)


def _unencodable(path: str, exc: BaseException) -> SerializationError:
    if isinstance(exc, RecursionError) or "Circular reference" in str(exc):
        why = "it is nested too deeply or contains itself (a cyclic structure)"
    elif isinstance(exc, UnicodeEncodeError):
        why = "it holds text that is not valid Unicode (an unpaired surrogate such as '\\ud800')"
    elif "integer string conversion" in str(exc) or isinstance(exc, OverflowError):
        why = "it holds an integer too large to write as JSON (over 4,300 digits)"
    else:
        why = str(exc)
    return SerializationError(f"{path}: cannot serialize as JSON: {why}")


def loads_call(serializer: Serializer, data: bytes) -> tuple[list[Any], dict[str, Any]]:
    """Read back what :func:`dumps_call` wrote; a malformed payload raises SerializationError."""
    value = serializer.loads(data)
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], list)
        or not isinstance(value[1], dict)
    ):
        raise SerializationError("corrupt payload: expected [args, kwargs]")
    return value[0], value[1]


def decode_row(serializer: Serializer, row: dict[str, Any]) -> dict[str, Any]:
    """The arguments, result and checkpoint of a message or archive row, for people to read.

    What this serializer cannot read becomes a ``<cannot decode: ...>`` string instead of an error:
    the rest of the job (state, error, traceback) is still worth showing. Dict keys that JSON cannot
    write (tuples, dates) come back as text, so that every value decoded prints as JSON.
    """
    out: dict[str, Any] = {}
    try:
        args, kwargs = loads_call(serializer, row["payload"])
        out["args"], out["kwargs"] = _readable(args), _readable(kwargs)
    except Exception as exc:
        out["args"] = out["kwargs"] = f"<cannot decode: {exc}>"
    for name in ("result", "checkpoint"):
        if row.get(name) is not None:
            try:
                out[name] = _readable(serializer.loads(row[name]))
            except Exception as exc:
                out[name] = f"<cannot decode: {exc}>"
    return out


# The dict keys JSON writes as they are; any other key (a tuple, a date, bytes) is shown as text.
_JSON_KEYS = (str, int, float, bool, type(None))


def _readable(value: Any) -> Any:
    """``value`` with the keys JSON cannot write (tuples, dates, ...) as text, to print it as JSON."""
    if isinstance(value, list):
        return [_readable(item) for item in value]
    if isinstance(value, dict):
        return {key if isinstance(key, _JSON_KEYS) else str(key): _readable(item) for key, item in value.items()}
    return value


def _encode(obj: Any, path: str) -> Any:
    kind = type(obj)
    if obj is None or kind is str or kind is int or kind is bool or kind is float:
        return obj
    if kind is list or kind is tuple:
        return [_encode(item, f"{path}[{i}]") for i, item in enumerate(obj)]
    if kind is dict:
        if TAG not in obj and all(type(key) is str for key in obj):
            return {key: _encode(value, f"{path}[{key!r}]") for key, value in obj.items()}
        return {
            TAG: "dict",
            "v": [
                [_encode(key, f"{path} key {key!r}"), _encode(value, f"{path}[{key!r}]")] for key, value in obj.items()
            ],
        }
    if kind is datetime:
        return {TAG: "datetime", "v": obj.isoformat()}
    if kind is date:
        return {TAG: "date", "v": obj.isoformat()}
    if kind is uuid.UUID:
        return {TAG: "uuid", "v": str(obj)}
    if kind is Decimal:
        return {TAG: "decimal", "v": str(obj)}
    if kind is bytes or kind is bytearray:
        return {TAG: "bytes", "v": base64.b64encode(obj).decode("ascii")}
    raise SerializationError(
        f"{path}: cannot serialize an object of type {kind.__module__}.{kind.__qualname__} as JSON; "
        f"pass one of {SUPPORTED} (convert it first), or opt in to JobQueue(serializer='pickle')"
    )


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": datetime.fromisoformat,
    "date": date.fromisoformat,
    "uuid": uuid.UUID,
    "decimal": Decimal,
    "bytes": lambda value: base64.b64decode(value),
    "dict": lambda pairs: {_hashable(key): value for key, value in pairs},
}


def _hashable(key: Any) -> Any:
    """A dict key as it went in: a key holds no list, so each list in it was a tuple, at any depth."""
    return tuple(_hashable(item) for item in key) if isinstance(key, list) else key


def _decode_object(obj: dict[str, Any]) -> Any:
    tag = obj.get(TAG)
    if tag is None:
        return obj
    try:
        return _DECODERS[tag](obj["v"])
    except (KeyError, ValueError, TypeError, ArithmeticError) as exc:
        raise SerializationError(f"corrupt payload: bad {TAG} value {obj!r}") from exc


# Made once: json.loads builds a decoder per call whenever it is given an option.
_PLAIN = json.JSONDecoder()
_TAGGED = json.JSONDecoder(object_hook=_decode_object)
_PLAIN_STARTS = (b"[", b"{")


def _decode(decoder: json.JSONDecoder, text: str) -> Any:
    """``decoder.decode(text)``, straight through the C scanner when the text is one JSON value
    with no surrounding whitespace (what we write); else the decoder's own way, errors included."""
    try:
        value, end = decoder.scan_once(text, 0)  # type: ignore[attr-defined]
    except StopIteration:
        return decoder.decode(text)
    return value if end == len(text) else decoder.decode(text)


def _as_text(data: bytes | str) -> str:
    """``data`` as text, as json.loads reads it (any of UTF-8, UTF-16 or UTF-32)."""
    if isinstance(data, str):
        return data
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"the JSON object must be str, bytes or bytearray, not {type(data).__name__}")
    return data.decode(json.detect_encoding(data), "surrogatepass")


class JSONSerializer:
    """JSON with tagged types; the safe default."""

    name = "json"

    def dumps(self, obj: Any, path: str = "value") -> bytes:
        try:
            return _JSON.encode(_encode(obj, path)).encode("utf-8")
        except ENCODING_ERRORS as exc:
            raise _unencodable(path, exc) from None

    def loads(self, data: bytes) -> Any:
        try:
            # Nothing tagged: the C decoder alone, no Python hook per dict.
            decoder = _PLAIN if TAG_BYTES not in data else _TAGGED
            if type(data) is bytes and data[:1] in _PLAIN_STARTS and data[1:2] != b"\x00":
                # What we write: UTF-8 starting with "[" or "{" (json.loads would work that out
                # byte by byte first, to read UTF-16 and UTF-32 as well).
                return _decode(decoder, data.decode("utf-8", "surrogatepass"))
            if data[:1] == PICKLE_START:
                raise SerializationError(WRITTEN_BY_PICKLE)
            return decoder.decode(_as_text(data))
        except (ValueError, UnicodeDecodeError, TypeError, RecursionError) as exc:
            raise SerializationError(f"corrupt payload: not valid JSON ({exc})") from exc


PICKLE_START = b"\x80"  # the PROTO opcode every pickle written since Python 2.3 begins with
WRITTEN_BY_PICKLE = (
    "written with serializer='pickle', and this app's serializer is 'json', which never unpickles: run "
    "it with workers whose app has serializer='pickle' (switch to json once no job written so is left)"
)


class PickleSerializer:
    """Pickle: any picklable object. Unsafe when anyone else can write to the database."""

    name = "pickle"

    def dumps(self, obj: Any, path: str = "value") -> bytes:
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except (Exception, RecursionError) as exc:  # PicklingError, TypeError, AttributeError, deep nesting
            raise SerializationError(f"{path}: cannot pickle: {exc}") from exc
        # Read back at once: an object that pickles may not unpickle (an exception whose __init__
        # takes other arguments than it gives its base class), and would be stored only to fail
        # in the worker, or in the caller that reads the result.
        try:
            pickle.loads(data)
        except (Exception, RecursionError) as exc:
            raise SerializationError(f"{path}: pickles, but cannot be unpickled: {exc}; {UNPICKLABLE_FIX}") from exc
        return data

    def loads(self, data: bytes) -> Any:
        if data[:1] != PICKLE_START:  # not a pickle of ours: written with serializer='json' (safe to read)
            return JSONSerializer().loads(data)
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise SerializationError(
                f"cannot unpickle the payload ({exc}): it was damaged, or a class in it cannot be rebuilt here "
                "(its module is not importable in this process, or it changed since the value was written; "
                f"{UNPICKLABLE_FIX})"
            ) from exc


UNPICKLABLE_FIX = (
    "a class whose __init__ needs arguments that pickle does not pass (an exception that does not give them all "
    "to its base class) needs a __reduce__ method; or pass plain data (str, numbers, dicts, lists) instead"
)


SERIALIZERS: dict[str, type[JSONSerializer] | type[PickleSerializer]] = {
    "json": JSONSerializer,
    "pickle": PickleSerializer,
}


def get_serializer(name: str) -> JSONSerializer | PickleSerializer:
    """Return the serializer called ``name`` ("json" or "pickle")."""
    try:
        return SERIALIZERS[name]()
    except KeyError:
        raise ConfigurationError(
            f"unknown serializer {name!r}; choose one of {', '.join(sorted(SERIALIZERS))}"
        ) from None
