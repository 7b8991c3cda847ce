"""What a response's rate-limit headers said, made safe to learn from.

Providers report each limit as a limit, a remaining count and a reset, per their own
window (a minute, for OpenAI and Anthropic). A :class:`RateLimitSnapshot` holds them as
read; :func:`sane_snapshot` drops figures that cannot be limits; :func:`readings` gives
them in the order of a limiter's meters (requests, tokens, input tokens, output tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["RateLimitSnapshot", "Reading", "per_window", "readings", "sane_snapshot"]


@dataclass(frozen=True, slots=True)
class RateLimitSnapshot:
    """What a response's rate-limit headers said (None where a header was absent).

    Limits and remaining counts are per ``requests_window`` / ``tokens_window`` seconds:
    the provider's unit, not the deployment's (OpenAI and Anthropic count per minute;
    some OpenAI-compatible servers count requests per day). Resets are seconds from now.
    ``*_input_tokens`` and ``*_output_tokens`` are limits of their own (Anthropic's ITPM
    and OTPM), counted per ``tokens_window`` like ``*_tokens``.
    """

    limit_requests: float | None = None
    remaining_requests: float | None = None
    reset_requests: float | None = None
    limit_tokens: float | None = None
    remaining_tokens: float | None = None
    reset_tokens: float | None = None
    requests_window: float = 60.0
    tokens_window: float = 60.0
    limit_input_tokens: float | None = None
    remaining_input_tokens: float | None = None
    reset_input_tokens: float | None = None
    limit_output_tokens: float | None = None
    remaining_output_tokens: float | None = None
    reset_output_tokens: float | None = None


class Reading(NamedTuple):
    """One limit's figures from a snapshot, in the provider's unit (per ``window`` seconds)."""

    limit: float | None
    remaining: float | None
    reset: float | None
    window: float


def readings(snapshot: RateLimitSnapshot) -> tuple[Reading, Reading, Reading, Reading]:
    """The requests, tokens, input-token and output-token figures of ``snapshot``."""
    s = snapshot
    return (
        Reading(s.limit_requests, s.remaining_requests, s.reset_requests, s.requests_window),
        Reading(s.limit_tokens, s.remaining_tokens, s.reset_tokens, s.tokens_window),
        Reading(s.limit_input_tokens, s.remaining_input_tokens, s.reset_input_tokens, s.tokens_window),
        Reading(s.limit_output_tokens, s.remaining_output_tokens, s.reset_output_tokens, s.tokens_window),
    )


def _keep(value: float | None, minimum: float) -> float | None:
    return value if value is not None and math.isfinite(value) and value >= minimum else None


def sane_snapshot(snapshot: RateLimitSnapshot) -> RateLimitSnapshot:
    """Drop header values that cannot be limits: 0, negatives ("unlimited"), NaN, inf,
    and every count whose window is not a positive number of seconds."""
    requests_ok = math.isfinite(snapshot.requests_window) and snapshot.requests_window > 0
    tokens_ok = math.isfinite(snapshot.tokens_window) and snapshot.tokens_window > 0

    def limit(value: float | None, ok: bool) -> float | None:
        return _keep(value, 1.0) if ok else None

    def remaining(value: float | None, ok: bool) -> float | None:
        return _keep(value, 0.0) if ok else None

    s = snapshot
    return RateLimitSnapshot(
        limit_requests=limit(s.limit_requests, requests_ok),
        remaining_requests=remaining(s.remaining_requests, requests_ok),
        reset_requests=_keep(s.reset_requests, 0.0),
        limit_tokens=limit(s.limit_tokens, tokens_ok),
        remaining_tokens=remaining(s.remaining_tokens, tokens_ok),
        reset_tokens=_keep(s.reset_tokens, 0.0),
        requests_window=s.requests_window if requests_ok else 60.0,
        tokens_window=s.tokens_window if tokens_ok else 60.0,
        limit_input_tokens=limit(s.limit_input_tokens, tokens_ok),
        remaining_input_tokens=remaining(s.remaining_input_tokens, tokens_ok),
        reset_input_tokens=_keep(s.reset_input_tokens, 0.0),
        limit_output_tokens=limit(s.limit_output_tokens, tokens_ok),
        remaining_output_tokens=remaining(s.remaining_output_tokens, tokens_ok),
        reset_output_tokens=_keep(s.reset_output_tokens, 0.0),
    )


def per_window(value: float | None, window: float, own: float) -> float | None:
    """``value`` per ``window`` seconds, as the same rate per ``own`` seconds."""
    return None if value is None else value * own / window
