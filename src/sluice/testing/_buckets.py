"""The fake's input and output token limits, as Anthropic enforces ITPM and OTPM.

Anthropic documents a token bucket for each: capacity is "continuously replenished up to
your maximum limit, rather than being reset at fixed intervals". So a bucket holds at
most ``limit`` tokens and refills at ``limit / window`` a second. Input is counted at
admission (the prompt's tokens, less those read from the prompt cache on models where
reads do not count, see :mod:`._prompt_cache`); output is taken at ``max_tokens`` when a
request is admitted and the unused part put back when its answer is done (OTPM "is
estimated from max_tokens at the start and adjusted to the actual output at the end").

Written apart from sluice's limiter on purpose (nothing here imports from ``sluice``
outside ``sluice.testing``), with its own clock: the loop's monotonic time, passed in.
"""

from __future__ import annotations

import math

__all__ = ["TokenBucket"]


class TokenBucket:
    """``limit`` tokens per ``window`` seconds, refilled continuously (see the module docstring).

    ``jitter`` seconds of early arrival are forgiven, as the fake's request slices do: a
    request that would fit that much later is let in (the bucket owes the difference).
    """

    __slots__ = ("_last", "jitter", "level", "limit", "rate", "window")

    def __init__(self, limit: float, window: float, jitter: float = 0.02) -> None:
        if not limit > 0:
            raise ValueError("a token limit must be positive (or None for no limit)")
        self.limit = float(limit)
        self.window = window
        self.rate = self.limit / window
        self.jitter = jitter
        self.level = self.limit
        self._last: float | None = None

    def reset(self) -> None:
        """Full again, as if nothing had been sent."""
        self.level = self.limit
        self._last = None

    def wait(self, now: float, amount: int) -> float | None:
        """Seconds until ``amount`` fits (0: now; None: never, it is more than the bucket holds)."""
        if amount > self.limit:
            return None
        self._refill(now)
        short = amount - self.level - self.jitter * self.rate
        return short / self.rate if short > 0 else 0.0

    def take(self, amount: int) -> None:
        """Admit ``amount`` (after :meth:`wait` said 0, at the same instant)."""
        self.level -= amount

    def give_back(self, now: float, amount: int) -> None:
        """Put back ``amount`` taken but not used (an output shorter than ``max_tokens``);
        a negative amount takes more (an output longer than what was taken)."""
        self._refill(now)
        self.level = min(self.limit, self.level + amount)

    def remaining(self, now: float) -> int:
        """Tokens that could be taken now (what the ``*-remaining`` header says)."""
        self._refill(now)
        return max(0, math.floor(self.level))

    def full_in(self, now: float) -> float:
        """Seconds until the bucket is full again (what the ``*-reset`` header says)."""
        self._refill(now)
        return max(0.0, (self.limit - self.level) / self.rate)

    def _refill(self, now: float) -> None:
        if self._last is not None and now > self._last:
            self.level = min(self.limit, self.level + (now - self._last) * self.rate)
        if self._last is None or now > self._last:
            self._last = now
