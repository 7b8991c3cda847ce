"""``sluice estimate``: what a job would send and how long its limits make it take.

Nothing is sent. Time is bounded below by each deployment's limits: requests / rpm,
tokens / tpm, prompt tokens / itpm and output tokens / otpm, per window; a model without
a deployment of its own gets the limits of ``JobConfig.defaults``, as the engine gives
it. Tokens are counted twice over: prompts only (the least the provider will count once
outputs are settled) and prompts + max_tokens (what it reserves up front), so the
shortest time is given as a range.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._config import JobConfig
from .._model_names import configured_model
from .._models import Deployment, Usage
from .._pricing import Pricing
from .._tokens import estimate_message_tokens, estimate_text_tokens
from ..caching._forecast import Forecast, Foreseen
from ..providers import estimate_request_tokens
from ..structured import sent_params
from ._embed_inputs import EmbeddingInput
from ._inputs import InputOptions, read_inputs

__all__ = ["Estimate", "estimate_job"]


@dataclass(slots=True)
class _Tally:
    deployment: Deployment
    requests: int = 0
    prompt_tokens: int = 0
    reserved_tokens: int = 0
    max_output_tokens: int = 0
    #: Texts to embed (embedding lines are packed many texts to a request).
    texts: int = 0
    #: The prompt-cache plan: prompt tokens it expects read from the cache and written to
    #: it, and the lines in a group (``--prompt-cache off``: none).
    read_tokens: int = 0
    written_tokens: int = 0
    grouped: int = 0
    #: Dollars, line by line (a tiered price is per request): as planned, and uncached;
    #: None once a line's price is unknown.
    planned_usd: float | None = 0.0
    plain_usd: float | None = 0.0
    #: Per tier (its own, and the ones it could use instead), uncached, line by line: the
    #: prompts only, every max_tokens used, and the expected output (None: unknown).
    spans: dict[str, list[float | None]] = field(default_factory=dict)

    def price(self, pricing: Pricing, prompt: int, most: int, expected: int | None, foreseen: Foreseen) -> None:
        """Add one line's cost (``most`` output tokens at most, ``expected`` if said), as
        planned and uncached; prices are per request (a long-context tier applies to a
        request's prompt, not the job's), so they are summed line by line."""
        read, written = foreseen.read, foreseen.written
        hour = written if foreseen.hour else 0
        output = most if expected is None else expected
        planned = pricing.cost(
            self.deployment, Usage(prompt, output, read, cache_write_tokens=written, cache_write_1h_tokens=hour)
        )
        self.planned_usd = _plus(self.planned_usd, planned)
        self.plain_usd = _plus(self.plain_usd, pricing.cost(self.deployment, Usage(prompt, output)))
        for tier, deployment in self._tiers():
            span = self.spans.setdefault(tier, [0.0, 0.0, 0.0])
            for number, tokens in enumerate((0, most, output)):
                span[number] = _plus(span[number], pricing.cost(deployment, Usage(prompt, tokens)))

    def _tiers(self) -> list[tuple[str, Deployment]]:
        own = self.deployment
        tiers = [(own.tier, own)]
        if own.tier == "sync" and own.provider_name in ("openai", "anthropic"):
            tiers.append(("batch", dataclasses.replace(own, tier="batch")))
        if own.tier == "sync" and own.provider_name == "openai":
            tiers.append(("flex", dataclasses.replace(own, tier="flex")))
        return tiers

    def seconds(self, tokens: int, output: int = 0) -> float | None:
        """The shortest time the limits allow for ``tokens`` in all, ``output`` of them
        output tokens (the rest input), or None without limits."""
        d = self.deployment
        bounds = []
        for limit, amount in ((d.rpm, self.requests), (d.tpm, tokens), (d.itpm, tokens - output), (d.otpm, output)):
            if limit is not None:
                bounds.append(amount / limit * d.window)
        return max(bounds) if bounds else None


def _plus(total: float | None, amount: float | None) -> float | None:
    return None if total is None or amount is None else total + amount


@dataclass(slots=True)
class Estimate:
    records: int = 0
    invalid: int = 0
    tallies: dict[str, _Tally] = field(default_factory=dict)
    examples_of_bad: list[str] = field(default_factory=list)
    pricing: Pricing = field(default_factory=Pricing)
    expected_output: int | None = None
    #: Groups of lines the prompt-cache plan found (None: the plan was off).
    groups: int | None = None
    #: The tier the lines are priced and planned on (``--tier``: sync, flex or batch).
    tier: str = "sync"

    def _planned(self, tally: _Tally, cached: bool) -> float | None:
        """Dollars of the tally's requests: prompts as planned (``cached``) or all uncached,
        and ``expected_output`` tokens each (else every max_tokens used)."""
        return tally.planned_usd if cached else tally.plain_usd

    def as_json(self) -> dict[str, Any]:
        """The figures as data (``sluice estimate --json``): requests, prompt tokens, the cost
        as planned and without the prompt cache, per deployment and in all."""
        by_deployment = {}
        for label, tally in self.tallies.items():
            planned, plain = self._planned(tally, True), self._planned(tally, False)
            prompt = tally.prompt_tokens
            by_deployment[label] = {
                "requests": tally.requests,
                "input_tokens": prompt,
                "cache_read_tokens": tally.read_tokens,
                "cache_write_tokens": tally.written_tokens,
                "expected_hit_rate": round(tally.read_tokens / prompt, 4) if prompt else 0.0,
                "cost_usd": None if planned is None else round(planned, 6),
                "cost_usd_without_cache": None if plain is None else round(plain, 6),
            }
        figures = list(by_deployment.values())
        costs: list[float | None] = [f["cost_usd"] for f in figures]
        plains: list[float | None] = [f["cost_usd_without_cache"] for f in figures]
        return {
            "records": self.records,
            "invalid": self.invalid,
            "tier": self.tier,
            "requests": sum(f["requests"] for f in figures),
            "input_tokens": sum(f["input_tokens"] for f in figures),
            "cost_usd": _total(costs),
            "cost_usd_without_cache": _total(plains),
            "prompt_cache": None if self.groups is None else {"groups": self.groups},
            "by_deployment": by_deployment,
        }

    def _cost(self, tally: _Tally, tier: str | None = None) -> str:
        """From prompts only to every output token used: the true cost lies between."""
        tier = tier or tally.deployment.tier
        span = tally.spans.get(tier)
        if span is not None:  # chat lines, priced one by one
            low, high, mid = span
        else:  # embeddings: packed many to a request, priced on their tokens
            on = tally.deployment if tier == tally.deployment.tier else dataclasses.replace(tally.deployment, tier=tier)
            low = high = mid = self.pricing.cost(on, Usage(input_tokens=tally.prompt_tokens))
        if low is None or high is None or mid is None:
            return "unknown: no price for this model (give --price IN,OUT)"
        expected = ""
        if self.expected_output is not None:
            expected = f", ~${mid:,.4f} at {self.expected_output} output tokens each"
        return f"${low:,.4f} (prompts only) .. ${high:,.4f} (every max_tokens used){expected}"

    def _cache_line(self, tally: _Tally) -> str:
        share = tally.read_tokens / tally.prompt_tokens if tally.prompt_tokens else 0.0
        planned, plain = self._planned(tally, True), self._planned(tally, False)
        money = "" if planned is None or plain is None else f"; ~${planned:,.4f} against ~${plain:,.4f} uncached"
        return (
            f"{tally.grouped:,} lines in {self.groups or 0:,} groups; ~{tally.read_tokens:,} tokens read "
            f"({share:.0%} of the prompts), ~{tally.written_tokens:,} written{money}"
        )

    def rows(self) -> list[tuple[str, str]]:
        from .._format import format_duration

        rows = [
            ("records", f"{self.records:,}"),
            ("invalid records", f"{self.invalid:,} (would be recorded as errors)"),
        ]
        slowest: tuple[float, float] | None = None
        for label, tally in self.tallies.items():
            texts = f" ({tally.texts:,} texts to embed)" if tally.texts else ""
            rows.append((label, f"{tally.requests:,} requests{texts}"))
            rows.append(("  prompt tokens (est.)", f"{tally.prompt_tokens:,}"))
            rows.append(("  reserved tokens", f"{tally.reserved_tokens:,} (prompt + max_tokens)"))
            rows.append(("  cost" if self.tier == "sync" else f"  cost, --tier {self.tier}", self._cost(tally)))
            if tally.read_tokens or tally.written_tokens:
                rows.append(("  prompt cache (planned)", self._cache_line(tally)))
            provider = tally.deployment.provider_name
            if self.tier == "sync" and provider in ("openai", "anthropic"):  # the tiers it could use instead
                batch = f"{self._cost(tally, 'batch')}; within 24 h (the batch window); uncached: --tier batch plans it"
                rows.append(("  cost, --tier batch", batch))
            if self.tier == "sync" and provider == "openai":
                rows.append(("  cost, --tier flex", f"{self._cost(tally, 'flex')}; slower, may wait for capacity"))
            low = tally.seconds(tally.prompt_tokens)
            high = tally.seconds(tally.reserved_tokens, tally.max_output_tokens)
            if low is None or high is None:
                rows.append(("  shortest time", "no limits configured: bound by latency and concurrency"))
                continue
            rows.append(("  shortest time", f"{format_duration(low)} .. {format_duration(high)} under its limits"))
            slowest = (max(low, slowest[0]), max(high, slowest[1])) if slowest else (low, high)
        if slowest is not None and len(self.tallies) > 1:
            rows.append(("whole job", f"{format_duration(slowest[0])} .. {format_duration(slowest[1])}"))
        return rows


def _total(costs: list[float | None]) -> float | None:
    """The sum of known costs; None when one is unknown (no price: never a silent zero)."""
    known = [cost for cost in costs if cost is not None]
    return round(sum(known), 6) if len(known) == len(costs) else None


def estimate_job(
    path: Path, config: JobConfig, options: InputOptions, *, expected_output: int | None = None, tier: str = "sync"
) -> Estimate:
    """The job's figures; ``tier``: priced (and the prompt cache planned) on that tier."""
    from ._preflight import check_input

    check_input(path, options)  # no record can be sent: say so, rather than estimate nothing
    routes = {key: _on_tier(d, tier) for d in config.deployments for key in (d.model, d.label)}
    result = Estimate(expected_output=expected_output, tier=tier)
    forecast = _forecast(path, options, result, config)
    for item in read_inputs(path, options):
        result.records += 1
        if item.embedding is not None:
            _count_embedding(result, item.embedding, routes, config)
            continue
        if item.request is None:
            result.invalid += 1
            if item.error is not None and len(result.examples_of_bad) < 5:
                result.examples_of_bad.append(item.error.message)
            continue
        request = item.request
        deployment = routes.get(request.model)
        if deployment is None and "/" not in request.model:  # a bare name: the configured model, else OpenAI's
            deployment = routes.get(configured_model(request.model, config.deployments) or f"openai/{request.model}")
        if deployment is None:  # as the engine serves a model the config does not name
            deployment = routes[request.model] = _on_tier(Deployment(request.model, **config.defaults), tier)
        tally = result.tallies.get(deployment.label)
        if tally is None:
            tally = result.tallies[deployment.label] = _Tally(deployment)
        tally.requests += 1
        reserved = estimate_request_tokens(request, deployment)
        prompt = estimate_message_tokens(request.messages, sent_params(request))
        tally.prompt_tokens += prompt
        tally.reserved_tokens += reserved
        tally.max_output_tokens += reserved - prompt
        foreseen = forecast.line(request, deployment, prompt) if forecast is not None else Foreseen()
        tally.read_tokens += foreseen.read
        tally.written_tokens += foreseen.written
        tally.grouped += foreseen.group is not None
        tally.price(result.pricing, prompt, reserved - prompt, expected_output, foreseen)
    if forecast is not None:
        result.groups = forecast.groups
    return result


def _on_tier(deployment: Deployment, tier: str) -> Deployment:
    return deployment if tier == "sync" else dataclasses.replace(deployment, tier=tier)


def _forecast(path: Path, options: InputOptions, result: Estimate, config: JobConfig) -> Forecast | None:
    """The prompt-cache plan's foresight over the input (None: ``--prompt-cache off``, or
    an input the plan does not read)."""
    if config.prompt_cache == "off":
        return None
    from ._cache_plan import plan_file
    from ._output import DoneLines

    plan = plan_file(path, options, DoneLines(), reorder=False)
    return None if plan is None else Forecast(plan.index, result.pricing)


#: Inputs per embeddings request at most (OpenAI's limit; sluice packs up to it).
_EMBED_PER_REQUEST = 2048


def _count_embedding(result: Estimate, asked: EmbeddingInput, routes: dict[str, Deployment], config: JobConfig) -> None:
    """An embedding line: its texts, packed many to a request (as ``sluice run`` sends them)."""
    deployment = routes.get(asked.model) or routes.setdefault(asked.model, Deployment(asked.model, **config.defaults))
    tally = result.tallies.get(deployment.label)
    if tally is None:
        tally = result.tallies[deployment.label] = _Tally(deployment)
    packs_before = -(-tally.texts // _EMBED_PER_REQUEST)
    tally.texts += len(asked.texts)
    tally.requests += -(-tally.texts // _EMBED_PER_REQUEST) - packs_before
    tokens = sum(estimate_text_tokens(text) for text in asked.texts)
    tally.prompt_tokens += tokens
    tally.reserved_tokens += tokens
