"""When to try again and how long to wait: pure functions and one policy object.

The order of the server's hints follows the official OpenAI SDK: ``retry-after-ms``,
then ``retry-after`` in seconds, then ``retry-after`` as an HTTP date; an explicit
``x-should-retry`` header wins over the status code. A hint longer than
``RetryPolicy.max_retry_after`` is not obeyed: one 429 saying "come back tomorrow" must
not pause a deployment past every job's deadline.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ._errors import ConfigError, ProviderError, SluiceError

__all__ = ["RetryPolicy", "backoff_ceiling", "backoff_delay", "parse_retry_after", "parse_should_retry"]


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    hint: float | None = None,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 1).

    Exponential with full jitter: uniform in ``[0, min(cap, base * 2**(attempt-1)))``,
    which spreads a crowd of retries instead of waking them together. A server hint
    (``Retry-After``) wins and is used as given: the server knows when it will have room.
    """
    if hint is not None and hint >= 0:
        return hint
    return backoff_ceiling(attempt, base=base, cap=cap) * rand()


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """The un-jittered backoff after attempt ``attempt``: ``min(cap, base * 2**(attempt-1))``."""
    # The exponent is bounded as the SDKs bound it: 2.0**1024 would overflow.
    return min(cap, base * 2.0 ** min(1000, max(0, attempt - 1)))


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The server's wait hint in seconds, or None. ``now`` is wall-clock (for HTTP dates)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        import email.utils  # rare path; keeps import time down

        try:
            parsed = email.utils.parsedate_to_datetime(raw) if raw.strip() else None
        except (TypeError, ValueError):
            return None
        if parsed is None or parsed.tzinfo is None:
            return None
        import time

        current = time.time() if now is None else now
        return max(0.0, parsed.timestamp() - current)
    return value if math.isfinite(value) and value >= 0 else None


def parse_should_retry(headers: Mapping[str, str]) -> bool | None:
    """The ``x-should-retry`` verdict: True, False, or None when absent."""
    value = headers.get("x-should-retry")
    if value == "true":
        return True
    if value == "false":
        return False
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries: attempts, a total deadline and a per-attempt timeout.

    Retried: 408, 409, 429, 5xx, 529, timeouts, connection errors, malformed or
    truncated bodies. Never retried: 400, 401, 403, 404, 422 and invalid requests.
    """

    max_attempts: int = 6
    base_delay: float = 0.5
    max_delay: float = 60.0
    #: Seconds from a job's first attempt after which no new attempt starts.
    deadline: float | None = 900.0
    #: Seconds one attempt may take before it counts as a timeout.
    attempt_timeout: float | None = 600.0
    #: Seconds an attempt may go without receiving a byte (before its answer starts, or
    #: between the chunks of a stream) before it counts as a timeout, however long
    #: ``attempt_timeout`` is: a connection gone silent is not waited on for ten minutes.
    #: A non-streamed answer sends nothing until it is complete, so this also bounds how
    #: long one may take to generate; raise it for very long generations.
    idle_timeout: float | None = 300.0
    #: The longest server hint (``Retry-After``) obeyed, in seconds. A longer one is
    #: treated as no hint at all: capped exponential backoff with jitter instead, as the
    #: official OpenAI and Anthropic SDKs do beyond 60 s. ``math.inf`` obeys any hint.
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        for name in ("base_delay", "max_delay", "max_retry_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ConfigError(f"RetryPolicy.{name} must be a number >= 0, got {value!r}")
        for name in ("deadline", "attempt_timeout", "idle_timeout"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"RetryPolicy.{name} must be a positive number or None, got {value!r}")

    def should_retry(self, error: SluiceError, attempt: int) -> bool:
        """Whether ``error`` after attempt number ``attempt`` deserves another attempt."""
        if attempt >= self.max_attempts or not isinstance(error, ProviderError):
            return False
        if error.should_retry is not None:
            return error.should_retry
        return error.retryable

    def hint(self, error: SluiceError) -> float | None:
        """The server's wait hint for ``error`` if it is one to obey, else None.

        Like the official SDKs, a hint is obeyed only up to a bound: openai-python's and
        anthropic-sdk-python's ``_calculate_retry_timeout`` return ``retry_after`` only
        when ``0 < retry_after <= 60`` and otherwise fall back to capped exponential
        backoff with jitter (newer openai-python releases give up instead past two
        minutes). Here the bound is ``max_retry_after``; a hint of 0 means "now".
        """
        value = error.retry_after if isinstance(error, ProviderError) else None
        if value is None or not math.isfinite(value) or not 0 <= value <= self.max_retry_after:
            return None
        return value

    def delay(self, error: SluiceError, attempt: int) -> float:
        """Seconds before the attempt after ``attempt``: the hint within the cap, else
        capped exponential backoff with full jitter."""
        return backoff_delay(attempt, base=self.base_delay, cap=self.max_delay, hint=self.hint(error))

    def pause(self, error: SluiceError, attempt: int) -> float:
        """How long the whole deployment should pause after ``error`` (a 429) on attempt
        ``attempt``: the hint within the cap, else the un-jittered backoff. Un-jittered,
        because the pause is one shared deadline, not a crowd of retries to spread."""
        hint = self.hint(error)
        if hint is not None:
            return hint
        return backoff_ceiling(attempt, base=self.base_delay, cap=self.max_delay)
