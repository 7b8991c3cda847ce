"""Service tiers: how a job's requests are served, and at what price.

* ``sync``: plain requests (the default).
* ``flex``: OpenAI's flex processing (``service_tier: "flex"``): half price, slower, and
  refused with a 429 when there is no capacity for a request (``FlexUnavailableError``:
  that request is retried after its own backoff; the deployment does not pause).
* ``batch``: the provider's Batch API (:mod:`._batch_tier`: OpenAI's Files + Batches and
  Anthropic's Message Batches): half price, answered within the completion window;
  every line still goes through the engine's budget, store and retries.

A tier is a property of a deployment (``Deployment.tier``): :func:`tier_deployments`
turns a job's deployments into those of its tier.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Container, Sequence

from .._errors import ConfigError
from .._models import BATCH_SUFFIX, Deployment, Request, Usage, asked_as
from ._batch_tier import BatchTier
from ._settings import BatchJournal, BatchSettings

__all__ = [
    "TIER_CHOICES",
    "BatchJournal",
    "BatchSettings",
    "BatchTier",
    "batch_report",
    "batch_request",
    "close_tiers",
    "settle_parked_by",
    "tier_deployments",
]

#: What ``sluice run --tier`` takes: ``auto`` plans against a deadline (batch first, then
#: synchronous requests for what the batch would not finish in time).
TIER_CHOICES = ("sync", "flex", "batch", "auto")


def batch_request(request: Request) -> Request:
    """``--tier auto``: the request for its model's batch tier (which falls back to the model)."""
    if request.model.endswith(BATCH_SUFFIX):
        return request
    return asked_as(request, request.model + BATCH_SUFFIX)  # the same key: any tier's rerun finds it


def tier_deployments(
    deployments: Sequence[Deployment],
    tier: str,
    journal: BatchJournal | None,
    settings: BatchSettings,
    *,
    model: str | None = None,
) -> list[Deployment]:
    """The deployments of ``tier``: flex ones send ``service_tier: "flex"``; batch ones go
    through the deployment's Batch API: no rate limits of their own (the batch queue has
    its own), and two batches' worth of lines waiting at once (a fixed cap: adaptive
    concurrency would read a batch's hours as congestion)."""
    if tier == "sync":
        return list(deployments)
    out = []
    for d in deployments:
        if tier == "auto":  # the model as it is, and its batch tier (``model@batch``) beside it
            if d.model.endswith(BATCH_SUFFIX):
                real = dataclasses.replace(d, model=d.model.removesuffix(BATCH_SUFFIX))
                out.extend(tier_deployments([real], "batch", journal, settings, model=d.model))
            else:
                out.append(d)
                out.extend(tier_deployments([d], "batch", journal, settings, model=d.model + BATCH_SUFFIX))
            continue
        if tier == "flex" and d.provider_name != "openai":
            raise ConfigError(
                f"deployment {d.label!r}: --tier flex is OpenAI's (openai/...), not {d.provider_name!r}'s"
            )
        if tier == "flex":
            out.append(dataclasses.replace(d, tier="flex"))
            continue
        if journal is None:
            raise ConfigError("--tier batch needs a state file (it journals what it submits)")
        out.append(
            dataclasses.replace(
                d,
                model=model or d.model,  # auto: beside the model, as ``model@batch``
                name=None if d.name is None or model is None else d.name + BATCH_SUFFIX,
                tier="batch",
                rpm=None,
                tpm=None,
                itpm=None,
                otpm=None,
                max_in_flight=2 * settings.max_lines,
                provider=BatchTier(d, journal, settings),
            )
        )
    return out


def batch_report(deployments: Sequence[Deployment], answered_sync: Container[str] = ()) -> tuple[dict[str, str], int]:
    """The batches the tiers followed (id -> last status), and the lines answered twice:
    by a batch after the deadline moved them to synchronous requests, and there too
    (``answered_sync``: the custom ids of the lines answered synchronously)."""
    batches: dict[str, str] = {}
    twice = 0
    for d in deployments:
        if isinstance(d.provider, BatchTier):
            batches.update(d.provider.batches)
            twice += sum(1 for custom_id in d.provider.answered_after_move if custom_id in answered_sync)
    return batches, twice


def settle_parked_by(
    deployments: Sequence[Deployment], settle: Callable[[Deployment, str, Usage | None], None]
) -> None:
    """Have each batch tier of ``deployments`` settle a parked line's budget hold as soon as
    its batch is over: ``settle(deployment, custom_id, usage)`` (None: not answered there)."""
    for d in deployments:
        if isinstance(d.provider, BatchTier):
            d.provider.on_settled = functools.partial(settle, d)


async def close_tiers(deployments: Sequence[Deployment]) -> None:
    """Stop the batch tiers' polling (their batches keep running at the provider)."""
    for d in deployments:
        if isinstance(d.provider, BatchTier):
            await d.provider.aclose()
