"""Providers: how a request reaches a model, and how its answer is read.

Built in: ``openai`` (and every OpenAI-compatible server), ``azure``, ``anthropic``,
``simulate`` (no network), and :class:`CallableProvider` for any async function.
Each can stream (``stream()``: the events in :mod:`._events`).
A model is named ``provider/model``; a bare name means the OpenAI-compatible provider.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._errors import ConfigError
from .._lazy import lazy_attributes
from .._models import Deployment
from ._base import Provider, Reply, estimate_request_tokens, max_output_tokens
from ._events import Finish, StreamEvent, StreamingProvider, StreamStart, TextDelta, ToolCallDelta, UsageUpdate
from ._http import HttpProvider, HttpTransport
from ._openai import AzureOpenAIProvider, OpenAIProvider

if TYPE_CHECKING:
    from ._anthropic import AnthropicProvider
    from ._callable import CallableProvider
    from ._simulated import SimulatedProvider

#: Imported on first use (a third of the engine's import time, compiled from source, is
#: providers most jobs never call): the module of each.
_LAZY = {"AnthropicProvider": "._anthropic", "CallableProvider": "._callable", "SimulatedProvider": "._simulated"}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())


__all__ = [
    "AnthropicProvider",
    "AzureOpenAIProvider",
    "CallableProvider",
    "Finish",
    "HttpProvider",
    "HttpTransport",
    "OpenAIProvider",
    "Provider",
    "ProviderSet",
    "Reply",
    "SimulatedProvider",
    "StreamEvent",
    "StreamStart",
    "StreamingProvider",
    "TextDelta",
    "ToolCallDelta",
    "UsageUpdate",
    "check_deployment",
    "estimate_request_tokens",
    "max_output_tokens",
]

_FACTORIES: dict[str, Callable[[HttpTransport], Provider]] = {
    "openai": OpenAIProvider,
    "azure": AzureOpenAIProvider,
    "anthropic": lambda transport: __getattr__("AnthropicProvider")(transport),
    "simulate": lambda _transport: __getattr__("SimulatedProvider")(),
}

KNOWN = tuple(sorted(_FACTORIES))


class ProviderSet:
    """The providers of one engine, created on first use and sharing one HTTP transport."""

    def __init__(self, *, idle_timeout: float | None = None) -> None:
        self.transport = HttpTransport(idle_timeout=idle_timeout)
        self._by_name: dict[str, Provider] = {}

    def for_deployment(self, deployment: Deployment) -> Provider:
        if deployment.provider is not None and not isinstance(deployment.provider, str):
            return deployment.provider
        name = deployment.provider_name
        provider = self._by_name.get(name)
        if provider is None:
            factory = _FACTORIES.get(name)
            if factory is None:
                raise ConfigError(
                    f"deployment {deployment.label!r}: unknown provider {name!r}; known: "
                    f"{', '.join(KNOWN)} (or pass provider=CallableProvider(fn))"
                )
            provider = self._by_name[name] = factory(self.transport)
        return provider

    async def aclose(self) -> None:
        for provider in self._by_name.values():
            await provider.aclose()
        await self.transport.aclose()


def check_deployment(deployment: Deployment) -> None:
    """Raise :class:`ConfigError` if ``deployment`` cannot be called as configured (an
    unknown provider, an API key that is not set), without sending or opening anything:
    the check :meth:`Engine.start` makes, for callers that must refuse before starting."""
    provider = ProviderSet().for_deployment(deployment)
    if isinstance(provider, HttpProvider):
        provider.check(deployment)
