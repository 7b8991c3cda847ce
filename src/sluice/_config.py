"""A job's configuration as values, and the one place an Engine is built from it.

``sluice.toml`` and the CLI's flags are read at the edges (:mod:`sluice.cli._config`);
what they make is a :class:`JobConfig`, which the batch job, ``sluice serve`` and
``sluice worker`` turn into an engine with :func:`engine_from`, each adding only what is
its own (a store, shared limits, a grace period).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ._models import Deployment, Usage
from ._retry import RetryPolicy
from ._router import Cooldown
from .structured import MAX_REASKS
from .tiers import BatchSettings, settle_parked_by, tier_deployments

if TYPE_CHECKING:
    from ._engine import Engine
    from ._spending import Spending
    from ._tracing import Tracing

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
    #: How requests are served: ``sync``, ``flex`` or ``batch`` (``--tier``; :mod:`sluice.tiers`).
    tier: str = "sync"
    #: How the batch tier submits and polls (``--poll-every``, ``--batch-size``).
    batch: BatchSettings = field(default_factory=BatchSettings)
    #: Re-asks of an answer that does not match its line's schema (``--max-reasks``).
    max_reasks: int = MAX_REASKS
    #: OpenTelemetry spans (``--otel``; :mod:`sluice.otel`); None: none.
    tracing: Tracing | None = None
    #: The prompt-cache planner (``--prompt-cache``; :mod:`sluice.caching`): ``auto`` or ``off``.
    prompt_cache: str = "auto"


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
        "max_reasks": config.max_reasks,
        "tracing": config.tracing,
        "prompt_cache": config.prompt_cache,
        **overrides,
    }
    deployments = arguments.pop("deployments", config.deployments)
    settle: list[Callable[[Deployment, str, Usage | None], None]] = []  # once the engine is made
    if config.tier != "sync":
        if config.tier == "auto":
            config = dataclasses.replace(config, batch=dataclasses.replace(config.batch, sync_rate=_sync_rate(config)))
        arguments.update(_tier_arguments(config, arguments, settle))
        deployments = tier_deployments(deployments, config.tier, arguments.get("store"), config.batch)
    engine = Engine(deployments, **arguments)
    if config.tier in ("batch", "auto"):  # parked lines' holds settle as their batches end
        settle.append(functools.partial(_settle_parked, engine.spending))
        settle_parked_by(engine.deployments, settle[0])
    return engine


def _settle_parked(spending: Spending, deployment: Deployment, custom_id: str, usage: Usage | None) -> None:
    """A parked line's batch is over: its hold settled at what the batch billed for it."""
    spending.settle_parked(custom_id, None if usage is None else spending.cost(deployment, usage) or 0.0)


def _sync_rate(config: JobConfig) -> float:
    """Requests a second the job's model can be sent synchronously, from the limits it was
    given (its deployments' ``rpm``, else ``--rpm`` for every model); 1/s when none says:
    a plan that cannot know the rate assumes a slow one, and moves to synchronous early."""
    model = config.model
    rates = [
        d.rpm / d.window
        for d in config.deployments
        if d.rpm is not None and (model is None or model in (d.model, d.label, f"openai/{d.model}"))
    ]
    if not rates and isinstance(config.defaults.get("rpm"), (int, float)):
        rates = [float(config.defaults["rpm"]) / float(config.defaults.get("window", 60.0))]
    return sum(rates) or 1.0


#: Lines in the engine at once in a job whose batch lines park (see ``_tier_arguments``).
_PARKING_ROOM = 4096
#: Seconds a flex request may take: OpenAI suggests 15 minutes (it queues for capacity).
_FLEX_TIMEOUT = 900.0


def _tier_arguments(
    config: JobConfig, arguments: Mapping[str, Any], settle: list[Callable[[Deployment, str, Usage | None], None]]
) -> dict[str, Any]:
    """What a tier changes in the engine: a batch line waits as long as its batch (no
    deadline; two batches' worth in flight); a flex one up to 15 minutes. ``settle``: how
    a batch tier settles its parked lines' holds (filled once the engine is made)."""
    journal = arguments.get("store")
    retry: RetryPolicy = arguments["retry"]

    def adapt(deployment: Deployment) -> Deployment:
        adapted = tier_deployments([deployment], config.tier, journal, config.batch)[0]
        if settle:
            settle_parked_by([adapted], settle[0])
        return adapted

    if config.tier == "flex":
        longer = dataclasses.replace(
            retry,
            attempt_timeout=max(retry.attempt_timeout or 0.0, _FLEX_TIMEOUT),
            idle_timeout=max(retry.idle_timeout or 0.0, _FLEX_TIMEOUT),
            deadline=None if retry.deadline is None else max(retry.deadline, 4 * _FLEX_TIMEOUT),
        )
        return {"retry": longer, "adapt_deployment": adapt}
    # a batch line's attempt is not timed (see Attempts.attempt); nor is a job's retrying
    untimed = dataclasses.replace(retry, deadline=None)
    # lines waiting in memory for their batches: two batches' worth, unless they park (they
    # leave the engine as they join a chunk: room for those waiting to join and those read again)
    waiting = 2 * config.batch.max_lines if config.batch.on_ended is None else _PARKING_ROOM
    return {
        "retry": untimed,
        "adapt_deployment": adapt,
        "concurrency": max(int(arguments["concurrency"]), waiting),
    }
