"""Adaptive concurrency (AIMD) for a server that does not say its limits.

Hosted APIs send ``x-ratelimit-*`` headers and the limiter learns from them. A
self-hosted server (vLLM, Ollama, TGI) sends none: sent too much it queues, latency
climbs, then it times out or fails. So a deployment with no configured limit starts with
a small in-flight cap and grows it while answers come back as fast as before and without
errors — doubling at first (slow start), then one more per round — and halves it when
latency rises well above the best seen or an attempt fails. The cap then hovers where
the server is driven at its capacity, not past it.

A round is as many answers as the cap allows in flight, so the cap moves at most once
per round trip. Latency is compared per output token when the usage says how many (an
answer twice as long is not congestion). Once the server's responses carry rate-limit
headers, the limiter knows its limits and this steps aside for good.
"""

from __future__ import annotations

import math

from ._limits import LocalLimiter

__all__ = ["Adaptive"]


class Adaptive:
    """AIMD on one deployment's in-flight cap (see the module docstring)."""

    __slots__ = (
        "_ceiling",
        "_congested",
        "_floor",
        "_floor_seconds",
        "_halved",
        "_on",
        "_samples",
        "_slow_start",
        "cap",
        "limiter",
    )

    #: Latency this many times the best seen counts as congestion.
    RISE = 2.0
    #: In slow start (doubling) a smaller rise already ends the doubling: one more doubling
    #: past the server's capacity would overshoot it twice over.
    SLOW_START_RISE = 1.3
    #: ...and this many seconds more than the best round, at least.
    SLACK = 0.05

    def __init__(self, limiter: LocalLimiter, *, start: int = 8, ceiling: int = 4096) -> None:
        self.limiter = limiter
        self.cap = float(start)
        self._ceiling = ceiling
        self._on = True
        self._slow_start = True
        self._congested = False
        self._halved = False
        self._samples: list[tuple[float, float]] = []
        #: The least median latency of any round: the server without a queue. Kept for good
        #: (a baseline that forgot it would drift up with the queue and stop seeing it).
        self._floor = math.inf
        self._floor_seconds = math.inf
        limiter.set_max_in_flight(start)

    def answered(self, latency: float, output_tokens: int) -> None:
        if self._still_active():
            samples = self._samples
            samples.append((latency / output_tokens if output_tokens > 0 else latency, latency))
            if len(samples) >= self.cap:  # here, not in _end_round_if_due: every answer comes here
                self._end_round()

    def failed(self) -> None:
        """A timeout, 5xx, 529, 429 or dropped connection: back off at once."""
        if not self._still_active():
            return
        if not self._halved:  # one halving per round, however many fail together
            self._halve()
        self._samples.append((math.nan, math.nan))
        self._end_round_if_due()

    def _end_round_if_due(self) -> None:
        if len(self._samples) >= self.cap:
            self._end_round()

    def _end_round(self) -> None:
        answered = [x for x in self._samples if not math.isnan(x[0])]
        self._samples = []
        if answered:
            per_token = sorted([x[0] for x in answered])[len(answered) // 2]  # lists: a generator resumes per item
            seconds = sorted([x[1] for x in answered])[len(answered) // 2]
            self._floor = min(self._floor, per_token)
            self._floor_seconds = min(self._floor_seconds, seconds)
            # a rise counts when it is large both relatively and in seconds: a fast server's
            # answers (a millisecond) double with any noise, without any queue behind them
            queued = seconds - self._floor_seconds
            if per_token > self.RISE * self._floor and queued > self.SLACK:  # answers come back slower
                self._congested = True
            elif self._slow_start and per_token > self.SLOW_START_RISE * self._floor and queued > self.SLACK / 2:
                self._slow_start = False  # near capacity: grow by one from here
        if self._congested and not self._halved:
            self._halve()
        elif not self._halved:
            self._set(min(self._ceiling, self.cap * 2.0 if self._slow_start else self.cap + 1.0))
        self._congested = self._halved = False

    def _halve(self) -> None:
        self._halved = True
        self._slow_start = False
        self._set(max(1.0, self.cap / 2.0))

    def _set(self, cap: float) -> None:
        self.cap = cap
        self.limiter.set_max_in_flight(max(1, int(cap)))

    def _still_active(self) -> bool:
        if self._on and self.limiter.learnt_limits:  # the server told us its limits: they pace it now
            self._on = False
            self.limiter.set_max_in_flight(None)
        return self._on

    def __repr__(self) -> str:
        phase = "off" if not self._on else "slow start" if self._slow_start else "AIMD"
        return f"<Adaptive cap={self.cap:.0f} {phase}>"
