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

from .._config import JobConfig
from .._model_names import configured_model
from .._models import Deployment, Usage
from .._pricing import Pricing
from .._tokens import estimate_message_tokens, estimate_text_tokens
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

    def seconds(self, tokens: int, output: int = 0) -> float | None:
        """The shortest time the limits allow for ``tokens`` in all, ``output`` of them
        output tokens (the rest input), or None without limits."""
        d = self.deployment
        bounds = []
        for limit, amount in ((d.rpm, self.requests), (d.tpm, tokens), (d.itpm, tokens - output), (d.otpm, output)):
            if limit is not None:
                bounds.append(amount / limit * d.window)
        return max(bounds) if bounds else None


@dataclass(slots=True)
class Estimate:
    records: int = 0
    invalid: int = 0
    tallies: dict[str, _Tally] = field(default_factory=dict)
    examples_of_bad: list[str] = field(default_factory=list)
    pricing: Pricing = field(default_factory=Pricing)
    expected_output: int | None = None

    def _cost(self, tally: _Tally, tier: str = "sync") -> str:
        """From prompts only to every output token used: the true cost lies between."""
        deployment = tally.deployment if tier == "sync" else dataclasses.replace(tally.deployment, tier=tier)
        low = self.pricing.cost(deployment, Usage(input_tokens=tally.prompt_tokens))
        high = self.pricing.cost(
            deployment, Usage(input_tokens=tally.prompt_tokens, output_tokens=tally.max_output_tokens)
        )
        if low is None or high is None:
            return "unknown: no price for this model (give --price IN,OUT)"
        expected = ""
        if self.expected_output is not None:
            mid = self.pricing.cost(
                deployment,
                Usage(input_tokens=tally.prompt_tokens, output_tokens=self.expected_output * tally.requests),
            )
            expected = f", ~${mid:,.4f} at {self.expected_output} output tokens each"
        return f"${low:,.4f} (prompts only) .. ${high:,.4f} (every max_tokens used){expected}"

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
            rows.append(("  cost", self._cost(tally)))
            provider = tally.deployment.provider_name
            if provider in ("openai", "anthropic"):  # the tiers this model could use instead
                rows.append(("  cost, --tier batch", f"{self._cost(tally, 'batch')}; within 24 h (the batch window)"))
            if provider == "openai":
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


def estimate_job(
    path: Path, config: JobConfig, options: InputOptions, *, expected_output: int | None = None
) -> Estimate:
    from ._preflight import check_input

    check_input(path, options)  # no record can be sent: say so, rather than estimate nothing
    routes = {key: d for d in config.deployments for key in (d.model, d.label)}
    result = Estimate(expected_output=expected_output)
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
            deployment = routes[request.model] = Deployment(request.model, **config.defaults)
        tally = result.tallies.get(deployment.label)
        if tally is None:
            tally = result.tallies[deployment.label] = _Tally(deployment)
        tally.requests += 1
        reserved = estimate_request_tokens(request, deployment)
        prompt = estimate_message_tokens(request.messages, sent_params(request))
        tally.prompt_tokens += prompt
        tally.reserved_tokens += reserved
        tally.max_output_tokens += reserved - prompt
    return result


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
