"""How each provider's prompt cache works, per model: what the planner builds to.

From the providers' documentation (checked 2025-2026), not from any fake:

* Anthropic (docs.anthropic.com/en/docs/build-with-claude/prompt-caching): a prefix is
  cached only where a ``cache_control`` breakpoint ends it, at most 4 per request, in the
  order tools -> system -> messages; the shortest cacheable prefix is 4,096 tokens on
  Claude Opus 4.5/4.6 and Haiku 4.5, 2,048 on Sonnet 4.6 and the Haiku 3 models, 1,024 on
  the rest (Sonnet 4/4.5, Opus 4/4.1, Sonnet 3.7); reads bill 0.1x the input price, writes
  1.25x (5 minutes) or 2x (``"ttl": "1h"``); an entry is readable once the answer that
  writes it has begun. Cache reads do not count against the input-tokens limit (ITPM) on
  current models; on Claude 3 Haiku, 3.5 Haiku and the older Claude 3 models they do
  (docs.anthropic.com/en/api/rate-limits, "Cache-aware ITPM").
* OpenAI (platform.openai.com/docs/guides/prompt-caching): automatic from 1,024 tokens,
  hits in 128-token steps; a request goes to a machine by a hash of its first ~256 tokens
  and its ``prompt_cache_key``, and past ~15 requests a minute for one (prefix, key) the
  rest spill to other machines; entries last 5-10 minutes idle. Cache reads still count
  against TPM. Prices (cache reads; writes on the models that bill them) are genai-prices'.

Providers sluice does not know cache nothing as far as the planner goes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._models import Deployment

__all__ = ["CacheRules", "reads_counted", "rules_for"]

#: The fewest tokens any provider caches: text boundaries before it are never split at.
LOWEST_MINIMUM = 1024
#: Anthropic: breakpoints per request.
MAX_BREAKPOINTS = 4
#: OpenAI: requests a minute one (prefix, key) is served from one machine (the docs' ~15),
#: with room for a retry.
KEY_RPM = 14
#: Seconds an entry lives unused: Anthropic's 5-minute and 1-hour lifetimes, OpenAI's
#: 5-10 minutes idle (the shorter).
TTL_5M = 300.0
TTL_1H = 3600.0

_ANTHROPIC_MINIMUMS = (
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
    ("claude-haiku-3", 2048),
)
#: Models whose cache reads count against ITPM (the older ones: "Cache-aware ITPM").
_READS_COUNTED = ("claude-3-5-haiku", "claude-3-haiku", "claude-3-opus", "claude-3-5-sonnet", "claude-3-sonnet")


@dataclass(frozen=True, slots=True)
class CacheRules:
    """One model's prompt cache, as the planner sees it."""

    #: ``anthropic`` (breakpoints) or ``openai`` (automatic, routed by key).
    kind: str
    #: The fewest tokens a cached prefix may have.
    minimum: int
    #: Cache reads are left out of the input-tokens limit (so a reservation leaves them out).
    reads_free: bool
    #: Seconds an entry lives unused (the shortest lifetime the planner asks for).
    ttl: float = TTL_5M
    #: The provider wants breakpoints (else it caches every prompt by itself).
    breakpoints: bool = False


def _match(name: str, table: tuple[tuple[str, int], ...], default: int) -> int:
    for prefix, value in table:
        if name.startswith(prefix):
            return value
    return default


@functools.lru_cache(maxsize=512)
def _rules(provider: str, model: str) -> CacheRules | None:
    name = model.rpartition("/")[2].removesuffix("@batch")
    if provider == "anthropic":
        minimum = _match(name, _ANTHROPIC_MINIMUMS, 1024)
        return CacheRules("anthropic", minimum, reads_free=not name.startswith(_READS_COUNTED), breakpoints=True)
    if provider in ("openai", "azure"):
        return CacheRules("openai", 1024, reads_free=False)
    return None


def rules_for(deployment: Deployment) -> CacheRules | None:
    """The cache rules of ``deployment``'s model; None: the planner leaves it alone (a
    provider sluice does not know to cache, a simulated or custom one). A batch tier's
    provider is the real provider's Batch API, whose lines are cached as its requests are."""
    own = isinstance(deployment.provider, str) or deployment.provider is None or deployment.tier == "batch"
    provider = deployment.provider_name if own else ""
    return _rules(provider, deployment.model_name)


def reads_counted(deployment: Deployment) -> bool:
    """Whether cache reads count against ``deployment``'s input-tokens limit: on Anthropic's
    older models (and wherever the planner knows no better: reads counted is the safe side
    only where a limit is of input tokens, which Anthropic's are)."""
    rules = rules_for(deployment)
    return rules is not None and rules.kind == "anthropic" and not rules.reads_free
