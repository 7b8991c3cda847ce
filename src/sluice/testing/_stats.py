"""What the fake counts, so tests can assert on what a client really sent and got."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

__all__ = ["LedgerEntry", "LedgerKind", "ServerStats", "Tier"]


@dataclass(slots=True)
class ServerStats:
    """Counters since the server started or since :meth:`FakeServer.reset_stats`.

    A request's *key* is its ``Idempotency-Key`` header, else the SHA-256 of its body,
    so a retried request has the same key as its first attempt.
    """

    #: Requests that reached a handler, faulted or not.
    received: int = 0
    #: Real completions generated: answered with a 200, or finished after the client
    #: had gone (ledger kind ``"abandoned"``). Garbled or cut 200s from the ``malformed``
    #: and ``truncated`` faults are billed but not counted here: the client never got a
    #: usable answer, so sending the request again is right, not a duplicate.
    accepted: int = 0
    #: 429s sent, injected or because of a limit.
    rate_limited: int = 0
    #: 429s by the limit that refused: ``requests``, ``tokens``, ``input_tokens``,
    #: ``output_tokens`` (Anthropic's ITPM and OTPM), ``flex`` (no flex capacity) or
    #: ``injected`` (a fault).
    rate_limited_by: Counter[str] = field(default_factory=Counter)
    #: Status codes sent; 0 for ``reset``, ``hang`` and ``truncated``.
    by_status: Counter[int] = field(default_factory=Counter)
    #: Requests per key.
    by_key: Counter[str] = field(default_factory=Counter)
    #: Requests per endpoint (``/v1/chat/completions``, ``/v1/responses``...).
    by_path: Counter[str] = field(default_factory=Counter)
    #: Real completions per key (as :attr:`accepted` counts them).
    succeeded_keys: Counter[str] = field(default_factory=Counter)
    #: Completions for a key that had already succeeded: a client re-sent finished work
    #: (or work it gave up waiting for, which the provider finished and billed anyway).
    duplicate_successes: int = 0
    #: Billed answers the client did not get whole: ledger kinds ``"malformed"``,
    #: ``"truncated"`` and ``"abandoned"``.
    undelivered: int = 0
    #: The most requests being handled at the same time.
    max_in_flight: int = 0
    #: ``(loop.time(), reserved tokens)`` of each admitted request, in admission order.
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    #: Tokens of the real completions (:attr:`accepted`); the ledger has every bill.
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def summary(self) -> dict[str, Any]:
        """The counters as JSON-ready data (no per-request lists)."""
        return {
            "received": self.received,
            "accepted": self.accepted,
            "rate_limited": self.rate_limited,
            "rate_limited_by": dict(sorted(self.rate_limited_by.items())),
            "by_status": {str(code): n for code, n in sorted(self.by_status.items())},
            "by_path": dict(sorted(self.by_path.items())),
            "distinct_keys": len(self.by_key),
            "duplicate_successes": self.duplicate_successes,
            "undelivered": self.undelivered,
            "max_in_flight": self.max_in_flight,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


#: How a billed answer ended: sent whole; finished after the client went away (a
#: timeout); sent as a garbled 200 (``malformed``); cut off mid-body (``truncated``).
LedgerKind = Literal["delivered", "abandoned", "malformed", "truncated"]
Tier = Literal["sync", "flex", "batch"]


class LedgerEntry(NamedTuple):
    """What one generated answer was billed, and how it reached (or missed) the client.

    A real provider bills the work, not the delivery: an answer the client stopped
    waiting for, or whose body broke on the way, costs as much as one delivered.
    """

    key: str
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    kind: LedgerKind = "delivered"
    #: How it was served: a synchronous request, the flex tier, or a batch line (the
    #: last two billed at a discount).
    tier: Tier = "sync"
    #: Of ``input_tokens``, those read from the prompt cache and those written to it.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def delivered(self) -> bool:
        """Whether the client received this answer whole."""
        return self.kind == "delivered"
