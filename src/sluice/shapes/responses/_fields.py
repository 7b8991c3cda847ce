"""Reading a Responses body's fields the way OpenAI's API does, with its 400 messages.

OpenAI words a refused field one way everywhere (``Invalid type for 'temperature':
expected a decimal, but got a string instead.``, ``Missing required parameter:
'input[0].content'.``, ``Invalid value: 'x'. Supported values are: 'a' and 'b'.``) and
gives a machine-readable ``code`` beside it; a client that shows or matches these sees
the same from ``sluice serve``. ``null`` is absent for every optional field, as there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from .._common import ShapeError

__all__ = [
    "at",
    "check_json",
    "invalid_value",
    "kind",
    "missing",
    "read_array",
    "read_bool",
    "read_enum",
    "read_int",
    "read_number",
    "read_object",
    "read_str",
    "wrong_type",
]


def at(path: str, key: str | int) -> str:
    """The path of ``key`` under ``path``: ``input[2]``, ``text.format``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def kind(value: Any) -> str:
    """A JSON value's type as OpenAI's messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return f"a {type(value).__name__}"


def missing(path: str) -> ShapeError:
    return ShapeError(f"Missing required parameter: '{path}'.", path, "missing_required_parameter")


def wrong_type(path: str, expected: str, value: Any) -> ShapeError:
    return ShapeError(
        f"Invalid type for '{path}': expected {expected}, but got {kind(value)} instead.", path, "invalid_type"
    )


def invalid_value(path: str, value: Any, supported: Iterable[str]) -> ShapeError:
    names = [f"'{name}'" for name in supported]
    listed = " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + f", and {names[-1]}"
    shown = value if isinstance(value, str) else _shown(value)
    return ShapeError(f"Invalid value: '{_clip(shown)}'. Supported values are: {listed}.", path, "invalid_value")


def _shown(value: Any) -> str:
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(value, default=str)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: The largest integer OpenAI's API reads (a JSON number beyond it is refused there too).
_INT64 = 2**63 - 1


def read_str(
    obj: Mapping[str, Any],
    key: str,
    path: str,
    *,
    required: bool = False,
    nonempty: bool = False,
    max_length: int | None = None,
) -> str | None:
    where = at(path, key)
    value = obj.get(key)
    if value is None:
        if required:
            raise missing(where)
        return None
    if not isinstance(value, str):
        raise wrong_type(where, "a string", value)
    if nonempty and not value:
        raise ShapeError(
            f"Invalid '{where}': empty string. Expected a string with minimum length 1, but got an empty string "
            "instead.",
            where,
            "empty_string",
        )
    if max_length is not None and len(value) > max_length:
        raise ShapeError(
            f"Invalid '{where}': string too long. Expected a string with maximum length {max_length}, but got a "
            f"string with length {len(value)} instead.",
            where,
            "string_above_max_length",
        )
    return value


def read_bool(obj: Mapping[str, Any], key: str, path: str = "") -> bool | None:
    where = at(path, key)
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise wrong_type(where, "a boolean", value)
    return value


def read_int(
    obj: Mapping[str, Any], key: str, path: str = "", *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    where = at(path, key)
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():  # JSON 16.0: an integer to OpenAI too
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(where, "an integer", value)
    _bounds(where, "integer", value, minimum, _INT64 if maximum is None else maximum)
    return value


def read_number(
    obj: Mapping[str, Any], key: str, path: str = "", *, minimum: float | None = None, maximum: float | None = None
) -> float | int | None:
    where = at(path, key)
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(where, "a decimal", value)
    if isinstance(value, float) and not math.isfinite(value):
        message = f"Invalid '{where}': expected a finite number, but got {value} instead."
        raise ShapeError(message, where, "invalid_value")
    _bounds(where, "decimal", value, minimum, maximum)
    return value


def _bounds(where: str, noun: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise ShapeError(
            f"Invalid '{where}': {noun} below minimum value. Expected a value >= {_num(minimum)}, but got "
            f"{_num(value)} instead.",
            where,
            f"{noun}_below_min_value",
        )
    if maximum is not None and value > maximum:
        raise ShapeError(
            f"Invalid '{where}': {noun} above maximum value. Expected a value <= {_num(maximum)}, but got "
            f"{_num(value)} instead.",
            where,
            f"{noun}_above_max_value",
        )


def _num(value: float) -> str:
    if isinstance(value, int):
        return _clip(str(value))
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def read_enum(obj: Mapping[str, Any], key: str, path: str, supported: Sequence[str]) -> str | None:
    where = at(path, key)
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise wrong_type(where, "a string", value)
    if value not in supported:
        raise invalid_value(where, value, supported)
    return value


def read_object(
    obj: Mapping[str, Any], key: str, path: str = "", *, required: bool = False
) -> Mapping[str, Any] | None:
    where = at(path, key)
    value = obj.get(key)
    if value is None:
        if required:
            raise missing(where)
        return None
    if not isinstance(value, Mapping):
        raise wrong_type(where, "an object", value)
    return value


def read_array(obj: Mapping[str, Any], key: str, path: str = "", *, nonempty: bool = False) -> list[Any] | None:
    where = at(path, key)
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise wrong_type(where, "an array", value)
    if nonempty and not value:
        raise ShapeError(
            f"Invalid '{where}': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            where,
            "empty_array",
        )
    return list(value)


def check_json(value: Any, path: str = "") -> None:
    """Refuse what no JSON body can hold and no deployment could be sent: text that
    cannot be UTF-8 (a lone surrogate, which a ``\\ud800`` escape can carry) and numbers
    that are not finite (a Python caller's NaN)."""
    try:
        orjson.dumps(value, default=str)
        strings = False  # one fast pass: every string is UTF-8
    except TypeError:
        strings = True
    _walk(value, path, strings)


def _walk(value: Any, path: str, strings: bool) -> None:
    if isinstance(value, str):
        if strings:
            _encodable(value, path)
    elif isinstance(value, float):
        if not math.isfinite(value):
            where = path or "body"
            message = f"Invalid '{where}': expected a finite number, but got {value} instead."
            raise ShapeError(message, path or None, "invalid_value")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            name = key if isinstance(key, str) else str(key)
            where = at(path, name.encode("utf-8", "backslashreplace").decode())  # a message that can be sent
            if strings:
                _encodable(name, where)
            _walk(item, where, strings)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _walk(item, at(path, i), strings)


def _encodable(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        where = path or "body"
        message = f"Invalid '{where}': the string is not valid Unicode (it holds a lone surrogate)."
        raise ShapeError(message, path or None, "invalid_value") from None
