"""Running statistics of an engine: counts, tokens, retries, 429s, latency percentiles.

Latencies go into a log-bucketed histogram (2 % wide buckets): memory stays constant
over a ten-million-request job and percentiles are within 2 %.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._models import Result, Usage

if TYPE_CHECKING:
    from ._embeddings import EmbeddingResult
    from ._errors import SluiceError

__all__ = ["LatencyHistogram", "Stats"]

_LOG_BASE = math.log(1.02)


class LatencyHistogram:
    __slots__ = ("_buckets", "count", "total")

    def __init__(self) -> None:
        self._buckets: Counter[int] = Counter()
        self.count = 0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self._buckets[math.floor(math.log(max(seconds, 1e-6)) / _LOG_BASE)] += 1
        self.count += 1
        self.total += seconds

    def __repr__(self) -> str:
        if not self.count:
            return "LatencyHistogram(count=0)"
        p50, p99 = self.percentile(50), self.percentile(99)
        return f"LatencyHistogram(count={self.count}, p50={p50:.3g}s, p99={p99:.3g}s)"

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100) as the upper edge of its bucket."""
        if not self.count:
            return None
        rank = max(1, math.ceil(self.count * q / 100.0))
        seen = 0
        for bucket in sorted(self._buckets):
            seen += self._buckets[bucket]
            if seen >= rank:
                return math.exp((bucket + 1) * _LOG_BASE)
        return None  # pragma: no cover - rank never exceeds count


@dataclass(slots=True)
class Stats:
    """What an engine has done so far. Read it any time; ``snapshot()`` for a plain dict."""

    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    cached: int = 0
    attempts: int = 0
    retries: int = 0
    rate_limited: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: Dollars for answers, at the usage the provider reported (this engine's run only).
    cost_usd: float = 0.0
    #: Dollars for failed attempts the provider may have billed (timeouts, resets after
    #: sending, garbled 200s), at their worst case.
    maybe_billed_usd: float = 0.0
    #: Answers from models with no known price: their cost is unknown, not zero.
    unpriced: int = 0
    #: Times an ``on_result`` / ``on_retry`` hook raised (logged; the result was kept).
    hook_errors: int = 0
    #: Requests moved to the next model of their fallback list.
    fallbacks: int = 0
    #: Requests with a schema (this run's answers): valid, of those valid after re-asks,
    #: the re-asks made (valid or not in the end) and what they cost.
    valid: int = 0
    reasked: int = 0
    reasks: int = 0
    reask_cost_usd: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def total_cost_usd(self) -> float:
        """Answers and possibly-billed failures together: what this run may have cost."""
        return self.cost_usd + self.maybe_billed_usd

    def charge(self, dollars: float, *, answered: bool) -> None:
        """One attempt's cost, counted as it settles (so a failed request's bill counts too)."""
        if answered:
            self.cost_usd += dollars
        else:
            self.maybe_billed_usd += dollars

    def record(self, result: Result) -> None:
        """Count a request's Result (a parked one is not one yet: it is counted when asked again)."""
        if result.error is not None and result.error.kind == "parked":
            return
        # a batch line's "latency" is its batch's wait (or 0, read back from the state): not measured
        latency = None if result.tier == "batch" else result.timings.latency
        self._count(result.ok, result.cached, result.error, result.usage, latency, result.cost_usd)
        request = result.request
        cut = result.error is not None and result.error.kind == "cancelled"  # redone by the rerun
        if request is not None and request.schema is not None and not result.cached and not cut:
            self.valid += result.ok
            if result.reasks:
                self.reasked += result.ok
                self.reasks += result.reasks
                self.reask_cost_usd += result.reask_cost_usd or 0.0

    def record_embedding(self, result: EmbeddingResult) -> None:
        """Count one text's embedding as a Result is counted."""
        self._count(result.ok, result.cached, result.error, result.usage, result.latency, result.cost_usd)

    def _count(
        self, ok: bool, cached: bool, error: SluiceError | None, usage: Usage, latency: float | None, cost: float | None
    ) -> None:
        if cached:
            self.cached += 1
        if ok:
            self.succeeded += 1
            if not cached:  # tokens and latency of this run only
                self.input_tokens += usage.input_tokens
                self.output_tokens += usage.output_tokens
                if latency is not None:
                    self.latency.add(latency)
                if cost is None:
                    self.unpriced += 1
        elif error is not None and error.kind == "cancelled":
            self.cancelled += 1
        else:
            self.failed += 1
            kind = error.kind if error is not None else "error"
            self.errors[kind] += 1
            if kind == "invalid_output" and not cached:  # answered (and billed), just not valid
                self.input_tokens += usage.input_tokens
                self.output_tokens += usage.output_tokens

    def snapshot(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "cached": self.cached,
            "attempts": self.attempts,
            "retries": self.retries,
            "rate_limited": self.rate_limited,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "maybe_billed_usd": self.maybe_billed_usd,
            "unpriced": self.unpriced,
            "hook_errors": self.hook_errors,
            "fallbacks": self.fallbacks,
            "valid": self.valid,
            "reasked": self.reasked,
            "reasks": self.reasks,
            "reask_cost_usd": self.reask_cost_usd,
            "errors": dict(self.errors),
            "latency_p50": self.latency.percentile(50),
            "latency_p90": self.latency.percentile(90),
            "latency_p99": self.latency.percentile(99),
        }
