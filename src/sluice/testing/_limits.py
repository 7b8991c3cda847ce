"""The fake's rate limiter: sliding windows for requests and tokens, plus even slicing,
and token buckets for input and output tokens (Anthropic's ITPM and OTPM, see
:mod:`._buckets`).

It mirrors how providers count: a request reserves ``prompt + max_tokens`` tokens when it
is admitted and is settled to its real usage when answered (its input is known at once;
its output is taken at ``max_tokens`` and settled to the real output); rejected requests
count for nothing. Times are plain floats from the event loop's monotonic clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ._buckets import TokenBucket

__all__ = [
    "Entry",
    "LimitSnapshot",
    "Limiter",
    "Rejection",
    "openai_duration",
    "retry_after_headers",
]


@dataclass(slots=True)
class Entry:
    """One admitted request: when it arrived, how many tokens it counts for now, and how
    many it holds of the output bucket."""

    at: float
    cost: int
    counted: bool = True
    output: int = 0


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused and how long until it would fit (None: it never will)."""

    kind: str  # "requests" or "tokens", OpenAI's error ``type`` for a 429
    wait: float | None
    message: str
    #: The limit that refused it: requests, tokens, input_tokens, output_tokens (or injected).
    limit: str = "requests"


@dataclass(frozen=True, slots=True)
class LimitSnapshot:
    """What the rate-limit headers report at one instant (per minute, as providers say)."""

    request_limit: int | None
    requests_remaining: int
    tokens_limit: int | None
    tokens_remaining: int
    reset: float  # seconds until the oldest counted entry leaves the window
    #: The input and output buckets: limit, tokens that could go now, seconds until full.
    input_limit: int | None = None
    input_remaining: int = 0
    input_reset: float = 0.0
    output_limit: int | None = None
    output_remaining: int = 0
    output_reset: float = 0.0


class Limiter:
    """Requests-per-window, tokens-per-window and an evenly sliced request bucket; input
    and output token buckets (``itpm``, ``otpm`` per window)."""

    def __init__(
        self,
        rpm: float | None,
        tpm: float | None,
        window: float = 60.0,
        slice_: float | None = 1.0,
        jitter: float = 0.02,
        *,
        itpm: float | None = None,
        otpm: float | None = None,
    ) -> None:
        if rpm is not None and rpm < 1:
            raise ValueError("rpm must be at least 1 (or None for no request limit)")
        if tpm is not None and tpm <= 0:
            raise ValueError("tpm must be positive (or None for no token limit)")
        for name, value in (("itpm", itpm), ("otpm", otpm)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive (or None for no {name[0]}nput/output limit)")
        if window <= 0:
            raise ValueError("window must be positive")
        self.input = TokenBucket(itpm, window, jitter) if itpm is not None else None
        self.output = TokenBucket(otpm, window, jitter) if otpm is not None else None
        self.rpm = rpm
        self.tpm = tpm
        self.window = window
        self.jitter = jitter
        self._entries: deque[Entry] = deque()
        self._tokens = 0
        self._rate = 0.0 if rpm is None else rpm / window
        self._capacity = 0.0
        if rpm is not None and slice_ is not None and slice_ > 0:
            self._capacity = max(1.0, rpm * slice_ / window)
        self._level = self._capacity
        self._last: float | None = None

    def reset(self) -> None:
        """Forget every counted request, as if the server had just started."""
        for entry in self._entries:
            entry.counted = False
        self._entries.clear()
        self._tokens = 0
        self._level = self._capacity
        self._last = None
        for bucket in (self.input, self.output):
            if bucket is not None:
                bucket.reset()

    def admit(self, now: float, cost: int, input_tokens: int = 0, output_tokens: int = 0) -> Entry | Rejection:
        """Count a request costing ``cost`` tokens (``input_tokens`` of prompt and up to
        ``output_tokens`` of output, for the buckets), or say why it does not fit now."""
        self._prune(now)
        bucket_wait = self._refill(now)
        worst = _worse(self._check_requests(now), self._check_bucket(bucket_wait))
        worst = _worse(worst, self._check_tokens(now, cost))
        worst = _worse(worst, _check_io(self.input, now, input_tokens, "input"))
        worst = _worse(worst, _check_io(self.output, now, output_tokens, "output"))
        if worst is not None:
            return worst
        if self._capacity:
            self._level -= 1.0
        entry = Entry(now, cost)
        if self.input is not None:
            self.input.take(input_tokens)
        if self.output is not None:
            self.output.take(output_tokens)
            entry.output = output_tokens
        self._entries.append(entry)
        self._tokens += cost
        return entry

    def settle(self, entry: Entry, cost: int, *, output: int | None = None, now: float | None = None) -> None:
        """Correct an admitted entry to the tokens the request really used (and, at ``now``,
        the output bucket to the ``output`` it wrote)."""
        if entry.counted:
            self._tokens += cost - entry.cost
        entry.cost = cost
        if output is not None and self.output is not None and now is not None:
            self.output.give_back(now, entry.output - output)
            entry.output = output

    def snapshot(self, now: float, per: float | None = None) -> LimitSnapshot:
        """Limits, remaining capacity and reset delay for the rate-limit headers, per
        ``per`` seconds (default: the window). Real providers' headers count per minute
        whatever they enforce, so the fake's may too: its figures times ``per / window``,
        rounded down (a client that reads them is never told it has more than it has)."""
        self._prune(now)
        entries = self._entries
        reset = entries[0].at + self.window - now if entries else 0.0
        rpm, tpm = self.rpm, self.tpm
        scale = 1.0 if per is None else per / self.window

        def scaled(value: float) -> int:
            return int(value * scale + 1e-9)

        given, output = self.input, self.output
        return LimitSnapshot(
            request_limit=None if rpm is None else scaled(int(rpm)),
            requests_remaining=0 if rpm is None else scaled(max(0, int(rpm) - len(entries))),
            tokens_limit=None if tpm is None else scaled(int(tpm)),
            tokens_remaining=0 if tpm is None else scaled(max(0, int(tpm - self._tokens))),
            reset=max(0.0, reset),
            input_limit=None if given is None else scaled(int(given.limit)),
            input_remaining=0 if given is None else scaled(given.remaining(now)),
            input_reset=0.0 if given is None else given.full_in(now),
            output_limit=None if output is None else scaled(int(output.limit)),
            output_remaining=0 if output is None else scaled(output.remaining(now)),
            output_reset=0.0 if output is None else output.full_in(now),
        )

    def _prune(self, now: float) -> None:
        horizon = now - self.window
        entries = self._entries
        while entries and entries[0].at <= horizon:
            entry = entries.popleft()
            entry.counted = False
            self._tokens -= entry.cost

    def _refill(self, now: float) -> float:
        """Top the slice bucket up to ``now``; return how long until one request fits."""
        if not self._capacity:
            return 0.0
        if self._last is not None:
            self._level = min(self._capacity, self._level + (now - self._last) * self._rate)
        self._last = now
        short = 1.0 - self._level - self.jitter * self._rate
        return short / self._rate if short > 0 else 0.0

    def _check_requests(self, now: float) -> Rejection | None:
        rpm = self.rpm
        entries = self._entries
        if rpm is None or len(entries) + 1 <= rpm:
            return None
        leaving = entries[len(entries) - int(rpm)]
        wait = leaving.at + self.window - now
        return Rejection("requests", wait, self._requests_message(wait, len(entries)))

    def _check_bucket(self, wait: float) -> Rejection | None:
        if wait <= 0:
            return None
        per_second = self._rate
        message = (
            f"Rate limit reached for requests: the limit of {self.rpm:g} per {self.window:g}s "
            f"is enforced evenly ({per_second:g}/s). Please try again in "
            f"{openai_duration(wait)}."
        )
        return Rejection("requests", wait, message)

    def _check_tokens(self, now: float, cost: int) -> Rejection | None:
        tpm = self.tpm
        if tpm is None or self._tokens + cost <= tpm:
            return None
        if cost > tpm:
            message = (
                f"Request too large for tokens per {self.window:g}s (TPM): Limit {tpm:g}, "
                f"Requested {cost}. The input or output tokens must be reduced in order to "
                "run successfully."
            )
            return Rejection("tokens", None, message, "tokens")
        needed = self._tokens + cost - tpm
        freed = 0
        wait = 0.0
        for entry in self._entries:
            freed += entry.cost
            if freed >= needed:
                wait = entry.at + self.window - now
                break
        message = (
            f"Rate limit reached for tokens per {self.window:g}s (TPM): Limit {tpm:g}, "
            f"Used {self._tokens}, Requested {cost}. Please try again in "
            f"{openai_duration(wait)}."
        )
        return Rejection("tokens", wait, message, "tokens")

    def _requests_message(self, wait: float, used: int) -> str:
        return (
            f"Rate limit reached for requests per {self.window:g}s (RPM): Limit {self.rpm:g}, "
            f"Used {used}, Requested 1. Please try again in {openai_duration(wait)}."
        )


def _check_io(bucket: TokenBucket | None, now: float, amount: int, which: str) -> Rejection | None:
    """Whether ``amount`` input (or output) tokens fit their bucket now, as Anthropic words it."""
    if bucket is None or amount <= 0:
        return None
    wait = bucket.wait(now, amount)
    if wait == 0:
        return None
    name = f"{which} tokens per {bucket.window:g}s ({which[0].upper()}TPM)"
    if wait is None:
        message = (
            f"This request would exceed the rate limit of {bucket.limit:g} {name}: it needs {amount} {which} "
            "tokens on its own. Reduce the prompt or max_tokens."
        )
    else:
        message = (
            f"This request would exceed the rate limit of {bucket.limit:g} {name}. "
            f"Please try again in {openai_duration(wait)}."
        )
    return Rejection("tokens", wait, message, f"{which}_tokens")


def _worse(current: Rejection | None, other: Rejection | None) -> Rejection | None:
    """The rejection with the longer wait; one that never fits beats any wait."""
    if other is None:
        return current
    if current is None:
        return other
    if current.wait is None:
        return current
    if other.wait is None or other.wait > current.wait:
        return other
    return current


def _number(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def openai_duration(seconds: float) -> str:
    """Format a delay the way OpenAI's ``x-ratelimit-reset-*`` headers do: ``6m0s``."""
    if seconds <= 0:
        return "0s"
    millis = round(seconds * 1000, 3)
    if millis < 1000:
        return f"{_number(millis)}ms"
    whole_minutes, rest = divmod(seconds, 60.0)
    hours, minutes = divmod(int(whole_minutes), 60)
    secs = _number(rest)
    if secs == "60":  # rounding carried over
        minutes, secs = minutes + 1, "0"
    prefix = f"{hours}h" if hours else ""
    if hours or minutes:
        prefix += f"{minutes}m"
    return f"{prefix}{secs}s"


def retry_after_headers(wait: float) -> dict[str, str]:
    """``retry-after`` (whole seconds, at least 1) and ``retry-after-ms`` for a 429."""
    return {
        "retry-after": str(max(1, math.ceil(wait))),
        "retry-after-ms": str(max(1, math.ceil(wait * 1000))),
    }
