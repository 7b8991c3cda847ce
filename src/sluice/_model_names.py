"""What a model name in a request means, given the deployments configured.

The OpenAI and Anthropic SDKs (and files written for their batch APIs) name a model
without its provider (``gpt-4o-mini``, ``claude-haiku-4-5``). Such a bare name means the
configured deployment of that model: ``sluice serve`` maps the names a client may send,
and the engine (so ``sluice run`` and ``sluice estimate``) resolves a line's model the
same way, through :func:`bare_models`, rather than sending it to an OpenAI endpoint
with none of the configured limits or prices. A bare name that two configured models
share is refused, naming both.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._errors import ConfigError
from ._models import Deployment

__all__ = ["SDK_PREFIXES", "bare_models", "configured_model", "model_names"]

#: The providers whose SDKs send a model without its prefix.
SDK_PREFIXES = ("openai", "anthropic")


def bare_models(deployments: Iterable[Deployment]) -> dict[str, tuple[str, ...]]:
    """Each bare name -> the configured models it may mean (``claude-haiku-4-5`` ->
    ``("anthropic/claude-haiku-4-5",)``), in the order they were configured."""
    names: dict[str, tuple[str, ...]] = {}
    for d in deployments:
        prefix, sep, rest = d.model.partition("/")
        if sep and prefix in SDK_PREFIXES and rest and d.model not in names.get(rest, ()):
            names[rest] = (*names.get(rest, ()), d.model)
    return names


def model_names(deployments: Iterable[Deployment]) -> dict[str, str]:
    """Every name a request may use -> the engine's name: each deployment's model and name,
    and an OpenAI or Anthropic model without its prefix (``gpt-4o-mini``,
    ``claude-sonnet-4-5``), as the SDKs send it (the first configured, when two share it)."""
    deployments = list(deployments)
    names: dict[str, str] = {}
    for d in deployments:
        names.setdefault(d.model, d.model)
        names.setdefault(d.label, d.label)
    for bare, models in bare_models(deployments).items():
        names.setdefault(bare, models[0])
    return names


def configured_model(name: str, deployments: Iterable[Deployment]) -> str | None:
    """The configured model a request naming ``name`` goes to, or None when no deployment
    is configured for it (the engine then makes one, with the defaults).

    A model or deployment name is itself; a bare name is the one OpenAI or Anthropic
    model of that name configured. Raises :class:`~sluice.ConfigError` naming the
    choices when two are."""
    deployments = list(deployments)
    if any(name in (d.model, d.label) for d in deployments):
        return name
    if "/" in name:
        return None
    models = bare_models(deployments).get(name, ())
    if len(models) > 1:
        raise ConfigError(
            f"model {name!r} could be any of {', '.join(map(repr, models))} (each is configured); "
            "name one of them in full"
        )
    return models[0] if models else None
