"""``Engine(prompt_cache=...)``: the planner an engine gets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import ConfigError

if TYPE_CHECKING:
    from .._pricing import Pricing
    from ._plan import PromptCache

__all__ = ["MODES", "prompt_cache_of"]

MODES = ("auto", "off")


def prompt_cache_of(setting: object, pricing: Pricing) -> PromptCache | None:
    """The planner ``setting`` asks for: ``"auto"`` a new one, ``"off"`` (or None) none, or
    a :class:`PromptCache` given (shared by several engines, or set up by hand)."""
    from ._plan import PromptCache  # here: an engine that plans nothing never loads the planner

    if isinstance(setting, PromptCache):
        return setting
    if setting is None or setting == "off" or setting is False:
        return None
    if setting == "auto" or setting is True:
        return PromptCache(pricing)
    raise ConfigError(f"prompt_cache must be one of {', '.join(MODES)} (or a PromptCache), got {setting!r}")
