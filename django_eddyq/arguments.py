"""Normalising task arguments and results to JSON that PostgreSQL's jsonb stores exactly.

Tuples become lists, as in Django's Tasks framework. Anything that would not come back from the
database as it went in is refused with a ``TypeError`` naming where it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def normalize_json(value: Any, *, where: str) -> JSONValue:
    """Return ``value`` as plain JSON types, or raise ``TypeError`` naming ``where`` it fails."""
    return _normalize(value, where, "")


def normalize_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Normalise a call's arguments; the error names the argument and the path inside it."""
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise TypeError(f"positional arguments must be a list or tuple, not {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"keyword arguments must be a mapping, not {type(kwargs).__name__}")
    normal_args = [_normalize(value, f"argument {index}", "") for index, value in enumerate(args)]
    normal_kwargs: dict[str, Any] = {}
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise TypeError(f"keyword argument names must be strings, not {type(key).__name__}")
        normal_kwargs[key] = _normalize(value, f"argument {key!r}", "")
    return normal_args, normal_kwargs


def _normalize(value: Any, where: str, path: str) -> JSONValue:
    # bool before int: bool is an int subclass and must stay a bool.
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str) and "\x00" in value:
            raise _error(where, path, "a string containing NUL (\\x00), which jsonb cannot store")
        return value
    if isinstance(value, int):
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
            if "\x00" in key:
                raise _error(where, path, "a dict key containing NUL (\\x00)")
            result[key] = _normalize(item, where, f"{path}[{key!r}]")
        return result
    if isinstance(value, list | tuple):
        return [_normalize(item, where, f"{path}[{index}]") for index, item in enumerate(value)]
    raise _error(where, path, f"an object of type {type(value).__name__}")


def _error(where: str, path: str, what: str) -> TypeError:
    location = f"{where}{path}" if path else where
    return TypeError(f"{location} is {what}, which cannot be stored as JSON")
