"""Per-model prompt-cache rules, from the providers' documentation (not from sluice).

Anthropic (platform.claude.com/docs/en/build-with-claude/prompt-caching): the minimum
cacheable prompt is 4,096 tokens for Claude Opus 4.6 and 4.5 and Haiku 4.5, 2,048 for
Sonnet 4.6 and Haiku 3.5 and 3, 1,024 for Sonnet 4.5, Opus 4.1 and 4, Sonnet 4 and 3.7;
reads cost 0.1x the input price, 5-minute writes 1.25x, 1-hour writes 2x; on current
models cache reads do not count against ITPM (they do on Claude 3.5 Haiku and older
Claude 3 models, api/rate-limits "Cache-aware ITPM").

OpenAI (developers.openai.com/api/docs/guides/prompt-caching and the model pricing pages):
caching from 1,024 tokens on every model; cached input costs 0.5x on gpt-4o, gpt-4o-mini,
o1 and o3-mini, 0.25x on gpt-4.1, o3 and o4-mini, 0.1x on the gpt-5 family; writes are
free (billed as input) before GPT-5.6, which bills them at 1.25x, reports them as
``cache_write_tokens`` and keeps entries at least 30 minutes; ``prompt_cache_retention:
"24h"`` keeps entries a day on the gpt-5 family and gpt-4.1 (elsewhere: in memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CacheModel", "anthropic_model", "openai_model"]


@dataclass(frozen=True, slots=True)
class CacheModel:
    """How one model's prompt cache behaves and is billed."""

    #: The fewest tokens a cached prefix may have.
    minimum: int
    #: Multipliers of the input price: a read, a (5-minute) write, a 1-hour write.
    read: float
    write: float = 1.0
    write_1h: float = 2.0
    #: Writes billed apart from plain input (and, on OpenAI, reported as such).
    writes_priced: bool = False
    #: Anthropic: cache reads still count against the input-tokens limit (older models).
    reads_count_itpm: bool = False
    #: OpenAI: seconds an entry lives without ``prompt_cache_retention`` (None: the setting).
    ttl: float | None = None
    #: OpenAI: takes ``prompt_cache_retention: "24h"``.
    extended: bool = False


def _longest(table: Mapping[str, object], model: str) -> str | None:
    """The longest key of ``table`` that ``model`` (without a ``provider/`` part) starts with."""
    name = model.rpartition("/")[2]
    matches = [key for key in table if name.startswith(key)]
    return max(matches, key=len) if matches else None


_ANTHROPIC_MINIMUMS = {
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
    "claude-sonnet-4-6": 2048,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
    "claude-haiku-3": 2048,
}
_READS_COUNT_ITPM = {"claude-3-5-haiku": True, "claude-3-haiku": True, "claude-3-opus": True, "claude-3-5-sonnet": True}

_OPENAI_READS = {
    "gpt-4o": 0.5,
    "o1": 0.5,
    "o3-mini": 0.5,
    "gpt-4.1": 0.25,
    "o3": 0.25,
    "o4-mini": 0.25,
    "gpt-5": 0.1,
}
#: The families that bill cache writes (1.25x) and keep entries at least 30 minutes.
_OPENAI_WRITES = {"gpt-5.6": True, "gpt-5.7": True, "gpt-5.8": True, "gpt-5.9": True, "gpt-6": True}
_OPENAI_EXTENDED = {"gpt-5": True, "gpt-4.1": True}


def _minimum(overrides: Mapping[str, int], model: str, default: int) -> int:
    key = _longest(overrides, model)
    if key is not None:
        return overrides[key]
    return overrides.get("*", default)


def anthropic_model(model: str, overrides: Mapping[str, int]) -> CacheModel:
    """The rules of an Anthropic model (``overrides``: minimums by model prefix or ``"*"``)."""
    key = _longest(_ANTHROPIC_MINIMUMS, model)
    documented = _ANTHROPIC_MINIMUMS[key] if key is not None else 1024
    return CacheModel(
        minimum=_minimum(overrides, model, documented),
        read=0.1,
        write=1.25,
        write_1h=2.0,
        writes_priced=True,
        reads_count_itpm=_longest(_READS_COUNT_ITPM, model) is not None,
    )


def openai_model(model: str, overrides: Mapping[str, int], minimum: int) -> CacheModel:
    """The rules of an OpenAI model (``minimum``: the fake's setting, 1,024 as documented)."""
    key = _longest(_OPENAI_READS, model)
    writes = _longest(_OPENAI_WRITES, model) is not None
    return CacheModel(
        minimum=_minimum(overrides, model, minimum),
        read=_OPENAI_READS[key] if key is not None else 0.5,
        write=1.25 if writes else 1.0,
        write_1h=1.25 if writes else 1.0,
        writes_priced=writes,
        ttl=1800.0 if writes else None,
        extended=_longest(_OPENAI_EXTENDED, model) is not None,
    )
