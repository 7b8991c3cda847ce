"""Anthropic's errors: the body (``{"type": "error", "error": {"type", "message"}}``) and
the HTTP status of each error type, as Anthropic documents them (docs.claude.com/en/api/errors:
400 invalid_request_error, 401 authentication_error, 402 billing_error, 403
permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500
api_error, 504 timeout_error, 529 overloaded_error; "we may also use [invalid_request_error]
for other 4XX status codes")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...providers._anthropic_stream import ERROR_STATUS

__all__ = ["ERROR_TYPES", "anthropic_error_body", "error_type_for", "lost_message", "status_for"]

#: HTTP status -> Anthropic's error type (the inverse of the stream decoder's table).
ERROR_TYPES: Mapping[int, str] = {status: kind for kind, status in ERROR_STATUS.items()}


def anthropic_error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_type_for(status: int) -> str:
    """The error type for an HTTP status: the documented one, else invalid_request_error
    for a 4xx, overloaded_error for a 503 (unavailable for now, retried as a 529 is) and
    api_error for anything else."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    if 400 <= status < 500:
        return "invalid_request_error"
    return "overloaded_error" if status == 503 else "api_error"


def status_for(kind: str) -> int:
    """The HTTP status of an error type (500 for a type Anthropic does not document)."""
    return ERROR_STATUS.get(kind, 500)


def lost_message(lost: Sequence[str]) -> str:
    """The 400's message for a request a Chat Completions deployment cannot be told."""
    return "this request cannot be sent to a Chat Completions model: " + "; ".join(lost)
