"""Normalising task arguments and results to JSON that PostgreSQL's jsonb stores exactly.

Tuples become lists, as in Django's Tasks framework. ``UUID``, ``datetime``, ``date``, ``time``
and ``Decimal`` values are stored as one-key objects that say what they are
(``{"$uuid": "…"}``, ``{"$datetime": "2030-01-01T09:00:00+01:00"}``, ``{"$decimal": "9.99"}``),
readable by any JSON reader, and ``revive`` turns them back into the same values for the task;
the project's own types go through its ``ARGUMENT_CODEC`` the same way (``{"$<tag>": …}``). A
dict of the caller's whose only key starts with ``$`` is stored as ``{"$dict": …}``, so that it
is never taken for one of these. Anything else that would not come back from the database as it
went in is refused with a ``TypeError`` naming where it is.

Floats need care on the way in and out, because jsonb keeps every number as a ``numeric``: the
integer digits of ``1e+16`` come back as the int 10000000000000000, and ``-0.0`` as ``0.0``
(``numeric`` has no negative zero). ``dumps`` therefore writes a float of 1e16 or more in
positional notation with a ``.0`` (``10000000000000000.0``: a numeric with a decimal place, which
jsonb hands back as written), and ``-0.0`` as a zero of 20 decimal places, which no float is
written as otherwise and which ``loads`` reads back as ``-0.0``. Plain JSON readers see the same
numbers (a negative zero as zero). Only text that contains such a float takes the slow path.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any, Protocol

from django.utils.module_loading import import_string

from django_eddyq.conf import eddyq_settings

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]

# Python turns ints of more digits than this into text only if told to (sys.set_int_max_str_digits)
# and json.dumps and json.loads, here and in the worker, refuse them otherwise.
MAX_INT_DIGITS = 4300
_INT_BOUND = 10**MAX_INT_DIGITS
# PostgreSQL refuses the escape of a lone surrogate (\ud800) in JSON text.
_SURROGATE = re.compile("[\ud800-\udfff]")
# How -0.0 is written: PostgreSQL keeps the 20 decimal places but not the sign.
NEGATIVE_ZERO = "-0." + "0" * 20
_STORED_NEGATIVE_ZERO = NEGATIVE_ZERO[1:]
_DECODER = json.JSONDecoder()

# The keys of the one-key objects that stand for other types.
ESCAPED_DICT = "$dict"
_REVIVERS: dict[str, Callable[[Any], Any]] = {
    "$uuid": uuid.UUID,
    "$datetime": datetime.datetime.fromisoformat,
    "$date": datetime.date.fromisoformat,
    "$time": datetime.time.fromisoformat,
    "$decimal": Decimal,
}


class ArgumentCodec(Protocol):
    """What ``EDDYQ["ARGUMENT_CODEC"]`` names: how the project's own types become JSON and back.

    ``encode(value)`` returns ``(tag, json_value)`` for a value of one of its types, else None;
    ``decode(tag, json_value)`` makes the value again. A tag is a word of its own (not ``uuid``,
    ``datetime``, ``date``, ``time``, ``decimal`` or ``dict``); the value is stored as
    ``{"$<tag>": json_value}``.
    """

    def encode(self, value: Any) -> tuple[str, Any] | None: ...

    def decode(self, tag: str, value: Any) -> Any: ...


@cache
def _codec_at(path: str) -> ArgumentCodec:
    codec: ArgumentCodec = import_string(path)
    return codec


def argument_codec() -> ArgumentCodec | None:
    """The codec ``EDDYQ["ARGUMENT_CODEC"]`` names, imported once; None without one."""
    path = eddyq_settings.ARGUMENT_CODEC
    return None if path is None else _codec_at(path)


def normalize_json(value: Any, *, where: str) -> JSONValue:
    """Return ``value`` as plain JSON types, or raise ``TypeError`` naming ``where`` it fails."""
    return _normalize(value, where, "")


def normalize_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Normalise a call's arguments; the error names the argument and the path inside it."""
    # Exact type checks first: the ABC checks cost more than the rest of a no-argument call.
    if (type(args) is not tuple and type(args) is not list) and (
        isinstance(args, str | bytes) or not isinstance(args, Sequence)
    ):
        raise TypeError(f"positional arguments must be a list or tuple, not {type(args).__name__}")
    if type(kwargs) is not dict and not isinstance(kwargs, Mapping):
        raise TypeError(f"keyword arguments must be a mapping, not {type(kwargs).__name__}")
    normal_args = [_normalize(value, f"argument {index}", "") for index, value in enumerate(args)]
    normal_kwargs: dict[str, Any] = {}
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise TypeError(f"keyword argument names must be strings, not {type(key).__name__}")
        problem = _text_problem(key)
        if problem is not None:
            raise TypeError(f"keyword argument name {key!r} contains {problem}")
        normal_kwargs[key] = _normalize(value, f"argument {key!r}", "")
    return normal_args, normal_kwargs


def _normalize(value: Any, where: str, path: str) -> JSONValue:
    # bool before int: bool is an int subclass and must stay a bool.
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem is not None:
            raise _error(where, path, f"a string containing {problem}")
        return value
    if isinstance(value, int):
        if not -_INT_BOUND < value < _INT_BOUND:
            raise _error(where, path, f"an integer of more than {MAX_INT_DIGITS} digits")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _error(where, path, f"the float {value!r}, which JSON cannot represent")
        return float(value)
    if isinstance(value, Mapping):
        result: dict[str, JSONValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _error(where, path, f"a dict key of type {type(key).__name__} ({key!r})")
            problem = _text_problem(key)
            if problem is not None:
                raise _error(where, path, f"a dict key containing {problem}")
            result[key] = _normalize(item, where, f"{path}[{key!r}]")
        if len(result) == 1 and next(iter(result)).startswith("$"):
            return {ESCAPED_DICT: result}
        return result
    if isinstance(value, list | tuple):
        return [_normalize(item, where, f"{path}[{index}]") for index, item in enumerate(value)]
    return _tagged(value, where, path)


def _tagged(value: Any, where: str, path: str) -> JSONValue:
    """A value of another type as a one-key object saying what it is, or the ``TypeError``."""
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    # datetime before date: a datetime is a date.
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, datetime.time):
        return {"$time": value.isoformat()}
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _error(where, path, f"the Decimal {value}, which is not a number")
        return {"$decimal": str(value)}
    codec = argument_codec()
    encoded = None if codec is None else codec.encode(value)
    if encoded is None:
        raise _error(where, path, f"an object of type {type(value).__name__}")
    tag, inner = encoded
    if (
        not isinstance(tag, str)
        or not tag.isidentifier()
        or f"${tag}" in _REVIVERS
        or (f"${tag}" == ESCAPED_DICT)
    ):
        raise TypeError(
            f"ARGUMENT_CODEC gave {type(value).__name__} the tag {tag!r}: use a word of its own"
        )
    return {f"${tag}": _normalize(inner, where, f"{path} (as {tag})")}


def load_arguments(data: str) -> Any:
    """Stored ``args`` (an array) or ``kwargs`` (an object of argument names), from their JSON
    text, as the task receives them: each argument revived (see ``revive``)."""
    value = loads(data)
    # Most arguments hold no tagged value, and their text no "$" at all.
    if "$" not in data:
        return value
    if isinstance(value, list):
        return [revive(item) for item in value]
    if isinstance(value, dict):
        return {name: revive(item) for name, item in value.items()}
    return value


def revive(value: Any) -> Any:
    """What ``normalize_json`` stored, back as it was given: tagged objects become their values
    again (through ``ARGUMENT_CODEC`` for the project's tags). ``ValueError`` names a tagged
    value that cannot be read (an unknown tag, a malformed date)."""
    if isinstance(value, list):
        return [revive(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key.startswith("$"):
                return _revive_tagged(key, inner)
        return {key: revive(item) for key, item in value.items()}
    return value


def _revive_tagged(key: str, inner: Any) -> Any:
    if key == ESCAPED_DICT:
        if not isinstance(inner, dict):
            raise ValueError(f"{key} holds {type(inner).__name__}, not an object")
        return {name: revive(item) for name, item in inner.items()}
    reviver = _REVIVERS.get(key)
    try:
        if reviver is not None:
            if not isinstance(inner, str):
                raise ValueError(f"{key} holds {type(inner).__name__}, not a string")
            return reviver(inner)
    except (ValueError, InvalidOperation) as error:
        raise ValueError(f"{key} {inner!r} cannot be read: {error}") from None
    codec = argument_codec()
    if codec is None:
        raise ValueError(f"a value tagged {key!r}, and no ARGUMENT_CODEC to decode it")
    return codec.decode(key[1:], revive(inner))


def _text_problem(text: str) -> str | None:
    """What in ``text`` jsonb cannot store: NUL, or a lone surrogate; None if nothing."""
    if "\x00" in text:
        return "NUL (\\x00)"
    if not text.isascii():
        surrogate = _SURROGATE.search(text)
        if surrogate is not None:
            return f"a lone surrogate (U+{ord(surrogate.group()):04X})"
    return None


def storable_text(text: str, limit: int) -> str:
    """``text`` as jsonb can store it, for messages the queue writes itself (errors): NUL and
    lone surrogates replaced, and cut to ``limit`` characters, saying so."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit} more characters cut)"
    return text


def _error(where: str, path: str, what: str) -> TypeError:
    location = f"{where}{path}" if path else where
    return TypeError(f"{location} is {what}, which cannot be stored as JSON")


# Writing and reading JSON so that floats come back as the same floats.


def dumps(value: Any) -> str:
    """``value`` as JSON text that jsonb keeps exactly: ``json.dumps``, unless a float of 1e16
    or more, or ``-0.0``, needs writing another way."""
    text = json.dumps(value)
    # json.dumps writes every float of 1e16 or more with "e+", and -0.0 as "-0.0": text without
    # either (nearly all of it) holds no float to rewrite. Strings holding them take the slow
    # path for nothing, and come out the same.
    if "e+" not in text and "-0.0" not in text:
        return text
    return _encode(value)


def _encode(value: Any) -> str:
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, Mapping):
        items = (
            f"{json.dumps(key if isinstance(key, str) else json.dumps(key))}: {_encode(item)}"
            for key, item in value.items()
        )
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_encode(item) for item in value) + "]"
    return json.dumps(value)


def _float_text(value: float) -> str:
    if value == 0 and math.copysign(1.0, value) < 0:
        return NEGATIVE_ZERO
    text = float.__repr__(value)
    if "e+" in text and math.isfinite(value):
        # Every float this large is a whole number: its digits, and a decimal place to keep it
        # a float. The shortest repr's digits read back as the same float.
        return f"{Decimal(text):f}.0"
    return json.dumps(value)


def loads(data: str | bytes) -> Any:
    """Read JSON text that ``dumps`` wrote and jsonb gave back: ``-0.0`` comes back too."""
    # Most jobs' args, kwargs and metadata are empty: the worker reads three per job.
    if data == "[]" or data == b"[]":
        return []
    if data == "{}" or data == b"{}":
        return {}
    text = data if isinstance(data, str) else bytes(data).decode()
    if _STORED_NEGATIVE_ZERO not in text:
        return _DECODER.decode(text)
    return json.loads(text, parse_float=_parse_float)


def _parse_float(text: str) -> float:
    if text.lstrip("-") == _STORED_NEGATIVE_ZERO:
        return -0.0
    return float(text)


class ExactJSONEncoder(json.JSONEncoder):
    """For a ``JSONField``: writes floats as ``dumps`` does, and otherwise honours the options
    it is given (the admin's form asks for ``ensure_ascii=False``), which ``dumps`` has none of."""

    def encode(self, o: Any) -> str:
        text = super().encode(o)
        if "e+" not in text and "-0.0" not in text:
            return text
        return _encode(o)


class ExactJSONDecoder(json.JSONDecoder):
    """For a ``JSONField``: reads ``-0.0`` back as ``loads`` does."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("parse_float", _parse_float)
        super().__init__(**kwargs)
