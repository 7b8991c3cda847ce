"""What a request costs: from the usage the provider reports, in US dollars.

Prices come from a deployment's own ``price`` (self-hosted or unlisted models) or from
the ``genai-prices`` package, whose data ships with it (no network at run time; it is
imported only when a price is first needed, and a process that finds today's answer in
the price cache, ``_price_cache``, does not import it at all). A model with no known
price costs ``None`` — never a silent zero.

genai-prices takes ~200 µs per calculation, too slow for a hot path at thousands of
requests a second, so each deployment's per-token rates are looked up once and the
arithmetic below is done in plain floats. Tiered prices (a rate that changes past a
context length) keep using the library's exact calculation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigError
from ._models import BATCH_SUFFIX, TIER_DISCOUNT, Deployment, Price, Usage
from ._price_cache import PriceCache, price_cache

__all__ = ["Price", "Pricing", "cost_of", "hour_write_rate", "worst_case_cost"]


def cost_of(price: Price, usage: Usage) -> float:
    """Dollars for ``usage``: cache reads and writes at their own rates (the input rate when
    unknown; an hour-long write at twice the input rate unless the price says otherwise);
    reasoning tokens are part of output."""
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    written = min(usage.cache_write_tokens, usage.input_tokens - cached)
    hour = min(usage.cache_write_1h_tokens, written)
    read_rate = price.input_per_mtok if price.cached_input_per_mtok is None else price.cached_input_per_mtok
    write_rate = price.input_per_mtok if price.cache_write_per_mtok is None else price.cache_write_per_mtok
    return (
        (usage.input_tokens - cached - written) * price.input_per_mtok
        + cached * read_rate
        + (written - hour) * write_rate
        + hour * hour_write_rate(price)
        + usage.output_tokens * price.output_per_mtok
    ) / 1_000_000


def hour_write_rate(price: Price) -> float:
    """USD per million tokens written to the cache for an hour: the price's own, else twice
    the input rate (Anthropic: "1-hour cache write tokens are 2 times the base input tokens
    price", docs.anthropic.com/en/docs/build-with-claude/prompt-caching#pricing)."""
    return 2.0 * price.input_per_mtok if price.cache_write_1h_per_mtok is None else price.cache_write_1h_per_mtok


def worst_case_cost(price: Price, prompt_tokens: int, max_output_tokens: int, *, hour: bool = False) -> float:
    """The most a request can cost: its whole prompt at the dearest input rate (a cache
    write, where that costs more; an hour-long one when ``hour``: the request asks for one)
    and every output token used."""
    input_rate = max(price.input_per_mtok, price.cache_write_per_mtok or 0.0)
    if hour:
        input_rate = max(input_rate, hour_write_rate(price))
    return (prompt_tokens * input_rate + max_output_tokens * price.output_per_mtok) / 1_000_000


_PROVIDER_IDS = {"openai": "openai", "azure": "azure", "anthropic": "anthropic"}


@dataclass(frozen=True, slots=True)
class _Known:
    """A deployment's price: flat rates, or the library's exact (tiered) calculation."""

    price: Price | None
    exact: Callable[[Usage], float] | None = None
    source: str = ""


class Pricing:
    """Prices per deployment, looked up once and cached."""

    def __init__(self, cache: PriceCache | None = None) -> None:
        self._cache: dict[int, tuple[Deployment, _Known | None]] = {}
        self._disk = cache

    def known(self, deployment: Deployment) -> _Known | None:
        entry = self._cache.get(id(deployment))
        if entry is None or entry[0] is not deployment:
            entry = (deployment, _look_up(deployment, self._disk or price_cache()))
            self._cache[id(deployment)] = entry
        return entry[1]

    def has_price(self, deployment: Deployment) -> bool:
        return self.known(deployment) is not None

    def cost(self, deployment: Deployment, usage: Usage) -> float | None:
        known = self.known(deployment)
        if known is None:
            return None
        if known.exact is not None:
            return known.exact(usage)
        assert known.price is not None
        return cost_of(known.price, usage)

    def worst_case(
        self, deployment: Deployment, prompt_tokens: int, max_output_tokens: int, *, hour: bool = False
    ) -> float | None:
        """The most a request can cost (see :func:`worst_case_cost`); ``hour``: it may write
        the cache for an hour."""
        known = self.known(deployment)
        if known is None:
            return None
        if known.exact is not None:  # every prompt token a cache write (an hour-long one), where that is dearer
            hours = prompt_tokens if hour else 0
            written = Usage(
                prompt_tokens, max_output_tokens, cache_write_tokens=prompt_tokens, cache_write_1h_tokens=hours
            )
            return max(known.exact(written), known.exact(Usage(prompt_tokens, max_output_tokens)))
        assert known.price is not None
        return worst_case_cost(known.price, prompt_tokens, max_output_tokens, hour=hour)

    def describe(self, deployment: Deployment) -> str:
        """Where the price comes from, for ``sluice config check``: configured, genai-prices
        (provider/model), or unknown and why."""
        known = self.known(deployment)
        if known is None:
            return f"unknown: {_why_unknown(deployment, self._disk or price_cache())}"
        if known.price is None:
            return f"tiered ({known.source})"
        p = known.price
        return f"${p.input_per_mtok:g} in / ${p.output_per_mtok:g} out per Mtok ({known.source})"


#: The variables each provider reads its endpoint from when a deployment names none
#: (see ``sluice.providers``): a price must follow the same endpoint the request does.
_BASE_URL_ENV = {"openai": "OPENAI_BASE_URL", "azure": "AZURE_OPENAI_ENDPOINT", "anthropic": "ANTHROPIC_BASE_URL"}


def effective_base_url(deployment: Deployment) -> str | None:
    """The URL requests go to: the deployment's ``base_url``, else the provider's variable;
    None means the provider's own default endpoint."""
    if deployment.base_url:
        return deployment.base_url
    env = _BASE_URL_ENV.get(deployment.provider_name)
    return (os.environ.get(env) or None) if env else None


def _route(deployment: Deployment, cache: PriceCache) -> tuple[dict[str, Any], str] | None:
    """How to ask genai-prices, and how to say it: a known provider's URL prices by that
    provider; any other server (vLLM, a proxy, a test server) by the provider prefix, so a
    model is priced the same whether its URL comes from the config or the environment."""
    url = effective_base_url(deployment)
    if url is not None and _known_url(url, cache):
        return {"provider_api_url": url}, _without_credentials(url)
    provider = _PROVIDER_IDS.get(deployment.provider_name)
    if provider is not None:
        return {"provider_id": provider}, provider
    if url is not None:
        return None  # an unknown provider on an unknown server: no honest guess
    return {}, "any provider"  # a custom provider: genai-prices matches by model name


def _without_credentials(url: str) -> str:
    """``url`` as it may be shown or kept on disk: no user, password or query (a key may be
    written in either)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None and not parts.query:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _known_url(url: str, cache: PriceCache) -> bool:
    """Does the URL belong to a provider genai-prices lists (its ``api_pattern``)?"""
    if cache.usable():
        known = cache.known_url(url)
        if known is not None:
            return known
    from genai_prices.data_snapshot import get_snapshot

    try:
        get_snapshot().find_provider(None, None, url)
    except LookupError:
        return False
    return True


def _why_unknown(deployment: Deployment, cache: PriceCache) -> str:
    if deployment.provider_name == "simulate":
        return "the simulated provider has no price (give one to rehearse a budget)"
    route = _route(deployment, cache)
    where = "an unlisted server" if route is None else route[1]
    return (
        f"genai-prices has no {deployment.model_name!r} for {where} "
        "(give price = {input_per_mtok = ..., output_per_mtok = ...} or --price IN,OUT)"
    )


def _look_up(deployment: Deployment, cache: PriceCache) -> _Known | None:
    """The deployment's price, at its tier's discount (flex and batch: half price)."""
    known = _sync_price(deployment, cache)
    if known is None or deployment.tier == "sync":
        return known
    share = tier_discount(deployment)
    if known.price is not None:
        p = known.price
        scaled = Price(
            p.input_per_mtok * share,
            p.output_per_mtok * share,
            None if p.cached_input_per_mtok is None else p.cached_input_per_mtok * share,
            None if p.cache_write_per_mtok is None else p.cache_write_per_mtok * share,
        )
        return _Known(scaled, source=f"{known.source}, {deployment.tier} tier x {share:g}")
    exact = known.exact
    assert exact is not None
    source = f"{known.source}, {deployment.tier} tier x {share:g}"
    return _Known(None, exact=lambda usage: exact(usage) * share, source=source)


def tier_discount(deployment: Deployment) -> float:
    """The share of the synchronous price the deployment's tier bills: the provider's
    published discount, or ``options[f"{tier}_discount"]``."""
    configured = deployment.options.get(f"{deployment.tier}_discount")
    if isinstance(configured, (int, float)) and not isinstance(configured, bool) and 0 < configured <= 1:
        return float(configured)
    return TIER_DISCOUNT.get(deployment.tier, 1.0)


def _sync_price(deployment: Deployment, cache: PriceCache) -> _Known | None:
    if deployment.price is not None:
        return _Known(deployment.price, source="configured")
    if deployment.provider_name == "simulate":
        return None  # a rehearsal has no real price unless the user gives one
    route = _route(deployment, cache)
    if route is None:
        return None
    name = deployment.model_name.removesuffix(BATCH_SUFFIX)  # a model's batch tier is priced as the model
    key = json.dumps([name, route[0]], sort_keys=True)
    url = route[0].get("provider_api_url")
    if url is not None and _without_credentials(url) != url:  # never a key on disk: looked up each time
        return _genai_price(name, route[0], None, cache)
    if cache.usable():
        found, known = _from_entry(cache.get(key))
        if found:
            return known
    return _genai_price(name, route[0], key, cache)


def _from_entry(entry: dict[str, Any] | None) -> tuple[bool, _Known | None]:
    """A cached answer, as (found, price): flat rates, or None for a model genai-prices
    does not know; not found for no entry, a tiered price or an entry that does not read."""
    if entry is None:
        return False, None
    if entry.get("unknown") is True:
        return True, None
    rates, source = entry.get("rates"), entry.get("source")
    if not (isinstance(rates, list) and len(rates) == 4 and isinstance(source, str)):
        return False, None
    try:
        return True, _Known(Price(*rates), source=source)
    except (ConfigError, TypeError):
        return False, None


def _genai_price(name: str, route: dict[str, Any], key: str | None, cache: PriceCache) -> _Known | None:
    """Ask genai-prices itself; an answer from its bundled data is kept in the cache (under
    ``key``; None: not kept)."""
    try:
        from genai_prices import Usage as PriceUsage
        from genai_prices import calc_price
        from genai_prices.data import providers as bundled
        from genai_prices.data_snapshot import get_snapshot
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    snapshot = get_snapshot()

    def keep(entry: dict[str, Any]) -> None:
        if key is not None and snapshot.providers is bundled:  # never one from a custom or updated snapshot
            cache.put(key, entry, [provider.api_pattern for provider in snapshot.providers])

    try:
        found = calc_price(PriceUsage(input_tokens=1, output_tokens=1), name, **route)
    except LookupError:
        keep({"unknown": True})
        return None
    source = f"genai-prices: {found.provider.id}/{found.model.id}"
    model_price = found.model_price
    rates = [
        _flat(r)
        for r in (
            model_price.input_mtok,
            model_price.output_mtok,
            model_price.cache_read_mtok,
            model_price.cache_write_mtok,
        )
    ]
    if all(r is not _TIERED for r in rates) and isinstance(rates[0], float):
        output, read, write = (r if isinstance(r, float) else None for r in rates[1:])
        price = Price(rates[0], output or 0.0, read, write)
        keep({"rates": [price.input_per_mtok, price.output_per_mtok, read, write], "source": source})
        return _Known(price, source=source)
    keep({"tiered": True})

    def exact(usage: Usage) -> float:
        hour = min(usage.cache_write_1h_tokens, usage.cache_write_tokens)

        def priced(of: Usage, plain: int = 0) -> float:
            calculated = model_price.calc_price(
                PriceUsage(
                    input_tokens=of.input_tokens - plain,
                    output_tokens=of.output_tokens,
                    cache_read_tokens=of.cached_input_tokens,
                    cache_write_tokens=of.cache_write_tokens - hour,
                )
            )
            return float(calculated["total_price"])

        if not hour:
            return priced(usage)
        # genai-prices has no hour-long write price: those tokens are priced as plain input
        # at the request's tier, and then again (twice the input rate, as Anthropic bills them)
        whole = priced(usage)
        return whole + (whole - priced(usage, plain=hour))

    return _Known(None, exact=exact, source=source)


_TIERED = object()


def _flat(value: object) -> float | object | None:
    """A flat per-Mtok rate as a float, None when absent, ``_TIERED`` for anything else."""
    from decimal import Decimal

    if value is None:
        return None
    if isinstance(value, (Decimal, int, float)):
        return float(value)
    return _TIERED
