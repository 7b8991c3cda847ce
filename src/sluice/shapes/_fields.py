"""One field of a body checked for its type, or a :class:`ShapeError` naming it.

A body arrives from any client: every value is checked before it is used, so a wrong
type is the caller's 400 with the field's path, never a TypeError of ours. Text must be
valid Unicode (a lone surrogate cannot be sent on as UTF-8) and numbers finite.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn

from ._common import ShapeError

__all__ = ["compact_json", "integer", "kind", "number", "obj", "refuse", "seq", "shown", "text", "valid_text"]


def refuse(where: str, why: str) -> NoReturn:
    raise ShapeError(f"{where}: {why}", where)


def kind(value: Any) -> str:
    """A JSON value's type in JSON's words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def shown(value: Any) -> str:
    """A value as a message quotes it: its repr, cut short (a body may hold megabytes)."""
    quoted = repr(value)
    return quoted if len(quoted) <= 60 else quoted[:57] + "..."


def valid_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text(value: Any, where: str, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        refuse(where, f"must be a string, got {kind(value)}")
    if not empty and not value:
        refuse(where, "must be a non-empty string")
    if not valid_text(value):
        refuse(where, "is not valid Unicode text (it holds a lone surrogate)")
    return value


def obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        refuse(where, f"must be an object, got {kind(value)}")
    return value


def seq(value: Any, where: str, *, empty: bool = True) -> list[Any]:
    if not isinstance(value, list | tuple):
        refuse(where, f"must be an array, got {kind(value)}")
    if not empty and not value:
        refuse(where, "must be a non-empty array")
    return list(value)


def integer(value: Any, where: str, *, low: int, high: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        refuse(where, f"must be an integer, got {kind(value)}")
    if not low <= value <= high:
        refuse(where, f"must be an integer from {low} to {high}, got {value}")
    return value


def number(value: Any, where: str, *, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        refuse(where, f"must be a number, got {kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        refuse(where, f"must be a finite number, got {value}")
    if not low <= value <= high:
        refuse(where, f"must be a number from {low:g} to {high:g}, got {value}")
    return float(value) if isinstance(value, float) else value


def compact_json(value: Any, where: str) -> str:
    """``value`` as compact JSON text (how a tool call's ``arguments`` are written),
    refusing what JSON cannot hold (NaN, lone surrogates, non-JSON types, cycles)."""
    try:
        encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        encoded.encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        refuse(where, "is not a JSON value (it holds NaN, an infinity, a lone surrogate or a non-JSON type)")
    return encoded
