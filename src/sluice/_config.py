"""A job's configuration as values, and the one place an Engine is built from it.

``sluice.toml`` and the CLI's flags are read at the edges (:mod:`sluice.cli._config`);
what they make is a :class:`JobConfig`, which the batch job, ``sluice serve`` and
``sluice worker`` turn into an engine with :func:`engine_from`, each adding only what is
its own (a store, shared limits, a grace period).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ._models import Deployment
from ._retry import RetryPolicy
from ._router import Cooldown

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["JobConfig", "TrustState", "engine_from"]

#: Whether a ``sluice.toml`` found in the working directory is the one the user trusted.
TrustState = Literal["trusted", "untrusted", "changed"]


@dataclass(frozen=True, slots=True)
class JobConfig:
    deployments: tuple[Deployment, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    concurrency: int = 256
    model: str | None = None
    budget_usd: float | None = None
    allow_unpriced: bool = False
    source: Path | None = None
    #: Deployment fields for every model that has no deployment here (``--rpm`` and the
    #: like without ``--model``): the engine serves such a model as ``Deployment(model, **defaults)``.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: For a file found in the working directory: whether the user trusted it (else None).
    trust: TrustState | None = None
    #: ``[fallbacks]``: for a model, the models to try next when it cannot take a request.
    fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: ``[cooldown]``: when a failing deployment of a group is taken out, and for how long.
    cooldown: Cooldown = field(default_factory=Cooldown)


def engine_from(config: JobConfig, **overrides: Any) -> Engine:
    """The Engine ``config`` describes: its deployments, retries, concurrency, budget,
    prices, defaults, fallbacks and cooldowns; ``overrides`` are ``Engine`` arguments a
    caller adds or replaces (``store=``, ``grace=``, ``limiter_factory=``, ...)."""
    from ._engine import Engine  # here: building one is the caller's choice (asyncio, aiohttp)

    arguments: dict[str, Any] = {
        "retry": config.retry,
        "concurrency": config.concurrency,
        "budget_usd": config.budget_usd,
        "allow_unpriced": config.allow_unpriced,
        "defaults": config.defaults,
        "fallbacks": config.fallbacks,
        "cooldown": config.cooldown,
        **overrides,
    }
    deployments = arguments.pop("deployments", config.deployments)
    return Engine(deployments, **arguments)
