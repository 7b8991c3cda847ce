"""What one request got from the fake's prompt cache, and how each API reports and bills it.

``CacheUse`` rides on the request's ``Call`` from admission to the answer, so the answer's
usage (a body, a stream's usage event, a batch line) and the ledger's bill say the same
thing. The shapes are the providers':

* Chat Completions: ``usage.prompt_tokens_details.cached_tokens`` (and, on models that
  price cache writes, ``cache_write_tokens``); ``prompt_tokens`` is the whole prompt.
* Responses: ``usage.input_tokens_details.cached_tokens`` and ``cache_write_tokens``.
* Anthropic Messages: ``input_tokens`` are the tokens neither read from nor written to the
  cache; ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and its split by TTL,
  ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CacheUse", "anthropic_usage", "billed_usd", "chat_details", "responses_details"]


@dataclass(frozen=True, slots=True)
class CacheUse:
    """Tokens of one prompt read from the cache and written to it, and the multipliers of
    the input price they are billed at."""

    read: int = 0
    #: Written with a 5-minute lifetime (Anthropic), or written at all (OpenAI).
    written: int = 0
    #: Written with ``"ttl": "1h"`` (Anthropic).
    written_1h: int = 0
    #: Whether writes are billed apart (Anthropic; OpenAI from GPT-5.6) and reported so on
    #: OpenAI (``cache_write_tokens``); otherwise a write is billed as plain input.
    writes_priced: bool = False
    read_rate: float = 1.0
    write_rate: float = 1.0
    write_1h_rate: float = 1.0

    @property
    def writes(self) -> int:
        """Every token written, whatever its lifetime."""
        return self.written + self.written_1h


def chat_details(use: CacheUse | None) -> dict[str, int]:
    """``usage.prompt_tokens_details`` of a chat completion."""
    if use is None:
        return {"cached_tokens": 0}
    details = {"cached_tokens": use.read}
    if use.writes_priced:
        details["cache_write_tokens"] = use.writes
    return details


def responses_details(use: CacheUse | None) -> dict[str, int]:
    """``usage.input_tokens_details`` of a Response."""
    if use is None:
        return {"cached_tokens": 0, "cache_write_tokens": 0}
    return {"cached_tokens": use.read, "cache_write_tokens": use.writes if use.writes_priced else 0}


def anthropic_usage(prompt: int, use: CacheUse | None) -> dict[str, Any]:
    """The input part of an Anthropic ``usage`` object for a prompt of ``prompt`` tokens."""
    if use is None:
        return {"input_tokens": prompt, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    return {
        "input_tokens": prompt - use.read - use.writes,
        "cache_read_input_tokens": use.read,
        "cache_creation_input_tokens": use.writes,
        "cache_creation": {"ephemeral_5m_input_tokens": use.written, "ephemeral_1h_input_tokens": use.written_1h},
    }


def billed_usd(
    prices: Mapping[str, tuple[float, ...]], model: str, prompt: int, completion: int, use: CacheUse | None
) -> float:
    """The price of an answer: ``prices`` maps a model (or ``"*"``) to USD per million
    input and output tokens, and optionally cache reads and (5-minute) cache writes; without
    those two, reads and writes cost the input price times the model's documented
    multipliers (``use``). A 1-hour write is always its multiplier of the input price."""
    price = prices.get(model) or prices.get("*")
    if price is None:
        return 0.0
    given, taken = price[0], price[1]
    if use is None:
        return (prompt * given + completion * taken) / 1_000_000
    read_rate = price[2] if len(price) > 2 else given * use.read_rate
    if not use.writes_priced:
        return ((prompt - use.read) * given + use.read * read_rate + completion * taken) / 1_000_000
    write_rate = price[3] if len(price) > 3 else given * use.write_rate
    plain = prompt - use.read - use.writes
    cost = plain * given + use.read * read_rate + use.written * write_rate + use.written_1h * given * use.write_1h_rate
    return (cost + completion * taken) / 1_000_000
