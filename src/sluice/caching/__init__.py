"""The prompt-cache plan: prefix index, groups, priming, breakpoints and cache keys.

A job's lines often share long prefixes (one set of instructions, a document asked
several questions, a tool list); the providers serve a repeated prefix from their prompt
caches at a fraction of the price, and Anthropic leaves cache reads out of its input
limit. The planner (:class:`PromptCache`, ``Engine(prompt_cache="auto")``) finds what the
lines share (:mod:`._fingerprint`, :mod:`._index`), groups them by it and decides per
group whether caching pays (:mod:`._plan`), sends one line of a group first and the rest
once its answer has begun (:mod:`._priming`), and marks what is sent: Anthropic
breakpoints, OpenAI cache keys (:mod:`._marks`), per the providers' rules
(:mod:`._rules`). The attempt core asks it; it never calls back up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if TYPE_CHECKING:
    from ._plan import Planned, PromptCache
    from ._priming import Priming
    from ._rules import CacheRules, reads_counted, rules_for

__all__ = ["CacheRules", "Planned", "Priming", "PromptCache", "reads_counted", "rules_for"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "Planned": "._plan",
        "PromptCache": "._plan",
        "Priming": "._priming",
        "CacheRules": "._rules",
        "reads_counted": "._rules",
        "rules_for": "._rules",
    },
    globals(),
)
