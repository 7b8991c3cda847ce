"""Faults the fake can answer with instead of a completion, queued or drawn at random."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["STATUS_OF", "STREAM_FAULTS", "Fault", "FaultPlan", "FaultSpec"]


class Fault(StrEnum):
    """Every kind of fault; plain strings such as ``"503"`` or ``"reset"`` work too."""

    SERVER_ERROR = "500"
    BAD_GATEWAY = "502"
    SERVICE_UNAVAILABLE = "503"
    OVERLOADED = "529"
    RATE_LIMIT = "429"
    BAD_REQUEST = "400"
    #: The body is larger than the provider takes (a 413, as a gateway's body limit sends it).
    TOO_LARGE = "413"
    UNAUTHORIZED = "401"
    NOT_FOUND = "404"
    #: Close the TCP connection without sending anything.
    RESET = "reset"
    #: Never answer; ends when the client disconnects or the server stops.
    HANG = "hang"
    #: 200 whose body is not JSON.
    MALFORMED = "malformed"
    #: 200 whose Content-Length promises more than is sent before the connection closes.
    TRUNCATED = "truncated"
    #: A 200 answer whose body comes slowly: ``after`` spaces, ``every`` seconds apart (the
    #: keep-alive whitespace some gateways send before a long answer), then the JSON.
    TRICKLE = "trickle"
    #: 200 JSON with ``choices: []`` (OpenAI) or ``content: []`` (Anthropic).
    EMPTY_CHOICES = "empty_choices"
    #: A 500 carrying ``x-should-retry: false``.
    NO_RETRY = "x_should_retry_false"
    #: A streamed answer whose connection drops after ``after`` pieces (billed, as the
    #: provider generated it); a request that is not streamed gets ``truncated`` instead.
    STREAM_CUT = "stream_cut"
    #: A streamed answer that sends an ``error`` event after ``after`` pieces (Anthropic's
    #: ``overloaded_error``, OpenAI's ``server_error``); billed. Not streamed: a 500.
    STREAM_ERROR = "stream_error"
    #: No fault in the answer: the request reaches the server's limits ``delay`` seconds
    #: after it arrived (a slow network, a server that stalled), is counted then and
    #: answered as usual.
    LATE = "late"


#: The HTTP status of the faults that answer with an ordinary error response.
STATUS_OF: dict[Fault, int] = {
    Fault.SERVER_ERROR: 500,
    Fault.BAD_GATEWAY: 502,
    Fault.SERVICE_UNAVAILABLE: 503,
    Fault.OVERLOADED: 529,
    Fault.RATE_LIMIT: 429,
    Fault.BAD_REQUEST: 400,
    Fault.TOO_LARGE: 413,
    Fault.UNAUTHORIZED: 401,
    Fault.NOT_FOUND: 404,
    Fault.NO_RETRY: 500,
}


#: The faults that break a streamed answer part-way.
STREAM_FAULTS = frozenset({Fault.STREAM_CUT, Fault.STREAM_ERROR})


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One fault to apply, with its options."""

    kind: Fault
    #: Seconds for ``retry-after``/``retry-after-ms`` (a 429 defaults to 1.0).
    retry_after: float | None = None
    #: Extra response headers.
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Seconds to wait before answering with the fault.
    delay: float = 0.0
    #: For the stream faults: how many pieces of the answer go out before it breaks; for
    #: ``trickle``, how many spaces go before the JSON.
    after: int = 1
    #: For ``trickle``: seconds between two pieces of the body.
    every: float = 0.0


@dataclass(slots=True)
class _Queued:
    spec: FaultSpec
    remaining: int


class FaultPlan:
    """Injected faults for the next requests, then random ones at the configured rates."""

    def __init__(self, rates: Mapping[str, float] | None = None, seed: int | None = None) -> None:
        self._queue: deque[_Queued] = deque()
        self._rng = random.Random(seed)
        self._rates: list[tuple[float, FaultSpec]] = []
        self.set_rates(rates or {})

    @property
    def rates(self) -> dict[Fault, float]:
        """The probability of each random fault, per request."""
        rates: dict[Fault, float] = {}
        previous = 0.0
        for bound, spec in self._rates:
            rates[spec.kind] = bound - previous
            previous = bound
        return rates

    def set_rates(self, rates: Mapping[str, float]) -> None:
        """Replace the random fault rates (probabilities per request, summing to <= 1)."""
        table: list[tuple[float, FaultSpec]] = []
        total = 0.0
        for kind, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"fault rate for {kind!r} must be within [0, 1], got {rate}")
            if rate:
                total += rate
                table.append((total, FaultSpec(Fault(kind))))
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total:g}, more than 1")
        self._rates = table

    def inject(self, spec: FaultSpec, times: int) -> None:
        """Apply ``spec`` to the next ``times`` requests, after those already queued."""
        if times < 1:
            raise ValueError("times must be at least 1")
        self._queue.append(_Queued(spec, times))

    @property
    def pending(self) -> int:
        """How many requests still have an injected fault waiting for them."""
        return sum(item.remaining for item in self._queue)

    def clear(self) -> None:
        """Drop every queued fault (random rates stay)."""
        self._queue.clear()

    def draw(self) -> FaultSpec | None:
        """The fault for the request arriving now, if any."""
        queue = self._queue
        if queue:
            head = queue[0]
            head.remaining -= 1
            if head.remaining <= 0:
                queue.popleft()
            return head.spec
        if not self._rates:
            return None
        roll = self._rng.random()
        for bound, spec in self._rates:
            if roll < bound:
                return spec
        return None
