"""An answer checked against its :class:`~._schema.Schema`: the parsed value, or what is wrong.

What is tolerated is only what cannot change the answer's meaning: whitespace, and one
markdown code fence around the JSON (```json ... ```), which models add even when told
not to. Anything else that does not parse or validate is an invalid answer, to be
re-asked (see :mod:`._reask`).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .._schema import Schema

__all__ = ["Verdict", "check"]

#: One fence around the whole answer, with or without a language tag.
_FENCE = re.compile(r"\A```[ \t]*(?:[A-Za-z0-9_+-]+)?[ \t]*\r?\n(?P<body>.*?)\r?\n?```\Z", re.DOTALL)

#: At most this many validation errors are kept (a wrong answer can have hundreds).
_MAX_ERRORS = 8


class Verdict(NamedTuple):
    """What checking an answer found. ``errors`` is empty for a valid answer; ``truncated``
    says the answer was cut at ``max_tokens`` before its JSON ended."""

    parsed: Any
    errors: tuple[str, ...]
    truncated: bool = False
    fenced: bool = False
    #: The schema, not the answer, could not be checked (a model's validator raised): asking
    #: again cannot help.
    broken: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def check(schema: Schema, text: str | None, finish_reason: str | None) -> Verdict:
    """Parse and validate ``text`` (see the module docstring)."""
    if text is None or not text.strip():
        return Verdict(None, ("the answer is empty: it holds no JSON",), truncated=finish_reason == "length")
    body = text.strip()
    fence = _FENCE.match(body)
    if fence is not None:
        body = fence.group("body").strip()
    try:
        value = json.loads(body, parse_constant=_no_constant, object_pairs_hook=_no_twice)
    except RecursionError:
        return Verdict(None, ("the answer is JSON nested too deep to read",))
    except ValueError as exc:
        if finish_reason == "length":
            why = "the answer was cut off at max_tokens (finish_reason 'length') before its JSON ended"
            return Verdict(None, (why,), truncated=True)
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        return Verdict(None, (f"the answer is not valid JSON{where}: {_reason(exc)}",))
    try:
        parsed, errors = _model_check(schema, value) if schema.model is not None else _schema_check(schema, value)
    except RecursionError:
        return Verdict(None, ("the answer is nested too deep to validate",))
    except Exception as exc:  # the schema's own code (a model's validator) failed on it
        why = f"validating the answer raised {type(exc).__name__}: {exc}"
        return Verdict(None, (why,), broken=why)
    # cut at max_tokens and invalid (a tool input cut short is still an object): more room, not a correction
    return Verdict(parsed, errors, truncated=bool(errors) and finish_reason == "length", fenced=fence is not None)


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (Python's parser takes them; a record could not hold them)."""
    raise ValueError(f"{name} is not a JSON number")


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object that names a key twice: which value was meant cannot be known."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return value


def _reason(exc: ValueError) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def _schema_check(schema: Schema, value: Any) -> tuple[Any, tuple[str, ...]]:
    found = sorted(schema.validator().iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if not found:
        return value, ()
    return None, tuple(f"{error.json_path}: {error.message}" for error in found[:_MAX_ERRORS])


def _model_check(schema: Schema, value: Any) -> tuple[Any, tuple[str, ...]]:
    from pydantic import ValidationError

    assert schema.model is not None
    try:
        return schema.model.model_validate(value), ()
    except ValidationError as exc:
        return None, tuple(
            f"$.{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" if error["loc"] else f"$: {error['msg']}"
            for error in exc.errors()[:_MAX_ERRORS]
        )
