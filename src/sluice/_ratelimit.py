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

from ._fastinit import fast_frozen_init, maker

__all__ = ["RateLimitSnapshot", "Reading", "make_snapshot", "per_window", "readings", "sane_snapshot"]


@fast_frozen_init
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


#: ``RateLimitSnapshot(...)`` without ``type.__call__``'s keyword dict (see
#: ``_fastinit.maker``): a server that sends the headers makes two an answer.
make_snapshot = maker(RateLimitSnapshot)


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
    # NaN fails both comparisons, inf the second
    return value if value is not None and minimum <= value < math.inf else None


def sane_snapshot(snapshot: RateLimitSnapshot) -> RateLimitSnapshot:
    """Drop header values that cannot be limits: 0, negatives ("unlimited"), NaN, inf,
    and every count whose window is not a positive number of seconds."""
    requests_ok = 0 < snapshot.requests_window < math.inf
    tokens_ok = 0 < snapshot.tokens_window < math.inf
    s = snapshot
    return make_snapshot(
        limit_requests=_keep(s.limit_requests, 1.0) if requests_ok else None,
        remaining_requests=_keep(s.remaining_requests, 0.0) if requests_ok else None,
        reset_requests=_keep(s.reset_requests, 0.0),
        limit_tokens=_keep(s.limit_tokens, 1.0) if tokens_ok else None,
        remaining_tokens=_keep(s.remaining_tokens, 0.0) if tokens_ok else None,
        reset_tokens=_keep(s.reset_tokens, 0.0),
        requests_window=s.requests_window if requests_ok else 60.0,
        tokens_window=s.tokens_window if tokens_ok else 60.0,
        limit_input_tokens=_keep(s.limit_input_tokens, 1.0) if tokens_ok else None,
        remaining_input_tokens=_keep(s.remaining_input_tokens, 0.0) if tokens_ok else None,
        reset_input_tokens=_keep(s.reset_input_tokens, 0.0),
        limit_output_tokens=_keep(s.limit_output_tokens, 1.0) if tokens_ok else None,
        remaining_output_tokens=_keep(s.remaining_output_tokens, 0.0) if tokens_ok else None,
        reset_output_tokens=_keep(s.reset_output_tokens, 0.0),
    )


def per_window(value: float | None, window: float, own: float) -> float | None:
    """``value`` per ``window`` seconds, as the same rate per ``own`` seconds."""
    return None if value is None else value * own / window
