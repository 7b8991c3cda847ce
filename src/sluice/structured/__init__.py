"""Answers that parse: a request's required shape, asked for, validated and re-asked.

``Request(schema=...)`` (a JSON Schema dict or a Pydantic model class) asks each
provider in its own way (:mod:`._ask`), validates every answer with a well-kept
validator (jsonschema, Pydantic: :mod:`._check`), and re-asks an invalid one inside the
limits and the budget (:mod:`._loop`). ``Result.parsed`` is the valid answer; a line
still invalid after its re-asks ends as ``invalid_output`` with the last answer and the
validation errors.
"""

from __future__ import annotations

from .._schema import ASK_MODES, MAX_REASKS, Schema, schema_from_response_format, strict_compatible
from ._ask import ask_mode, sent_params, shaped
from ._check import Verdict, check
from ._load import load_schema

__all__ = [
    "ASK_MODES",
    "MAX_REASKS",
    "Schema",
    "Verdict",
    "ask_mode",
    "check",
    "load_schema",
    "schema_from_response_format",
    "sent_params",
    "shaped",
    "strict_compatible",
]
