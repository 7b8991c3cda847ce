"""``sluice.toml``: deployments, retries and defaults, validated with messages that say where.

::

    model = "openai/gpt-4o-mini"      # the default for records that name no model
    concurrency = 128
    budget_usd = 5.00                 # never spend more than this on the job

    [retry]
    max_attempts = 6

    [[deployment]]
    model = "openai/gpt-4o-mini"
    api_key_env = "OPENAI_API_KEY"    # the key itself stays in the environment
    rpm = 500
    tpm = 200000
    # itpm = 400000; otpm = 80000     # input and output tokens apart (Anthropic's limits)
    max_in_flight = 64
    # price = { input_per_mtok = 0.15, output_per_mtok = 0.60 }   # for unlisted models

CLI flags (``--model``, ``--rpm``, ``--tpm``, ``--itpm``, ``--otpm``, ``--max-in-flight``,
``--burst``, ``--concurrency``) override the file. Limits given with ``--model`` apply to that model's
deployment; without it, to the one deployment the file configures, or else (as
:attr:`JobConfig.defaults`) to every model that has no deployment of its own.

A ``sluice.toml`` found in the working directory is used only once the user trusted it
(``sluice config trust``, see :mod:`._trust`): it could send API keys anywhere. Keys are
never printed: ``sluice config check`` says only where a key comes from and whether it is
set.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._config import JobConfig, TrustState
from .._errors import ConfigError, SluiceError
from .._models import Deployment, Price, Secret
from .._pricing import effective_base_url
from .._retry import RetryPolicy
from .._router import Cooldown
from ._trust import check_trust

__all__ = [
    "DEFAULT_FILE",
    "JobConfig",
    "config_from_bytes",
    "describe",
    "describe_defaults",
    "key_source",
    "load_config",
    "missing_keys",
    "read_config_file",
    "untrusted_message",
    "with_overrides",
]

DEFAULT_FILE = "sluice.toml"
_TOP_KEYS = {
    "model",
    "concurrency",
    "budget_usd",
    "allow_unpriced",
    "retry",
    "deployment",
    "deployments",
    "fallbacks",
    "cooldown",
    "client",  # [[client]] and [serve]: read by sluice.serve.core._settings
    "serve",
}
_COOLDOWN_KEYS = {f.name for f in dataclasses.fields(Cooldown)}
_DEPLOYMENT_KEYS = {f.name for f in dataclasses.fields(Deployment)}
_RETRY_KEYS = {f.name for f in dataclasses.fields(RetryPolicy)}
_KEY_ENV = {"openai": "OPENAI_API_KEY", "azure": "AZURE_OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def load_config(path: Path | None, *, require_trust: bool = True) -> JobConfig:
    """Read ``path``, or ``./sluice.toml`` when it exists and is trusted, or return the defaults.

    A file given as ``path`` is the user's explicit choice. A file merely found in the
    working directory may have come with a cloned repository, so unless the user trusted
    these exact bytes it is refused (``require_trust=False`` reads it anyway, for
    ``sluice config check`` to show what it would do; nothing is sent then).
    """
    trust: TrustState | None = None
    if path is None:
        candidate = Path(DEFAULT_FILE)
        if not candidate.is_file():
            return JobConfig()
        path = candidate
        raw = read_config_file(path)
        check = check_trust(path, raw)  # the very bytes parsed below: no swap in between
        trust = check.state
        if trust != "trusted" and require_trust:
            raise ConfigError(untrusted_message(check.path, trust))
    else:
        raw = read_config_file(path)
    return dataclasses.replace(config_from_bytes(raw, path), trust=trust)


def config_from_bytes(raw: bytes, path: Path) -> JobConfig:
    """Parse the bytes read from ``path`` (``sluice config trust`` validates exactly the
    bytes it records)."""
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return _parse(data, path)


def read_config_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None


def untrusted_message(path: Path, state: TrustState) -> str:
    why = "has changed since you trusted it" if state == "changed" else "was found in this directory but is not trusted"
    return (
        f"{path} {why}; a config file could send your API keys to any server. "
        f"Read it, then run `sluice config trust` to trust it, or give it explicitly with --config ./{DEFAULT_FILE}"
    )


def _unknown(where: str, given: Mapping[str, Any], known: set[str]) -> None:
    extra = sorted(set(given) - known)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {extra}; known: {sorted(known)}")


def _parse(data: Mapping[str, Any], path: Path) -> JobConfig:
    _unknown(str(path), data, _TOP_KEYS)
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ConfigError(f"{path}: model must be a non-empty string, got {model!r}")
    concurrency = data.get("concurrency", 256)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"{path}: concurrency must be a positive integer, got {concurrency!r}")
    retry_table = data.get("retry", {})
    if not isinstance(retry_table, dict):
        raise ConfigError(f"{path}: [retry] must be a table")
    _unknown(f"{path}: [retry]", retry_table, _RETRY_KEYS)
    try:
        retry = RetryPolicy(**retry_table)
    except SluiceError as exc:
        raise ConfigError(f"{path}: [retry]: {exc.message}") from None
    budget = data.get("budget_usd")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0):
        raise ConfigError(f"{path}: budget_usd must be a number of US dollars >= 0, got {budget!r}")
    allow_unpriced = data.get("allow_unpriced", False)
    if not isinstance(allow_unpriced, bool):
        raise ConfigError(f"{path}: allow_unpriced must be true or false, got {allow_unpriced!r}")
    tables = data.get("deployment", data.get("deployments", []))
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: deployments are [[deployment]] tables")
    deployments = tuple(_deployment(t, f"{path}: [[deployment]] #{i + 1}") for i, t in enumerate(tables))
    labels = [d.label for d in deployments]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(
            f"{path}: several [[deployment]] tables answer to {twice[0]!r}; give each deployment of a model "
            'its own name = "..." (they then share the model\'s requests)'
        )
    return JobConfig(
        deployments,
        retry,
        concurrency,
        model,
        budget,
        allow_unpriced,
        path,
        fallbacks=_fallbacks(data.get("fallbacks", {}), path),
        cooldown=_cooldown(data.get("cooldown", {}), path),
    )


def _fallbacks(table: Any, path: Path) -> dict[str, tuple[str, ...]]:
    if not isinstance(table, dict):
        raise ConfigError(f'{path}: [fallbacks] must be a table of "model" = ["fallback", ...]')
    chains: dict[str, tuple[str, ...]] = {}
    for model, chain in table.items():
        if not isinstance(chain, list) or not chain or not all(isinstance(m, str) and m for m in chain):
            raise ConfigError(f"{path}: [fallbacks] {model!r} must be a non-empty list of model names, got {chain!r}")
        if model in chain:
            raise ConfigError(f"{path}: [fallbacks] {model!r} names the model itself")
        chains[model] = tuple(chain)
    return chains


def _cooldown(table: Any, path: Path) -> Cooldown:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [cooldown] must be a table")
    _unknown(f"{path}: [cooldown]", table, _COOLDOWN_KEYS)
    try:
        return Cooldown(**table)
    except SluiceError as exc:
        raise ConfigError(f"{path}: [cooldown]: {exc.message}") from None


def _deployment(table: Mapping[str, Any], where: str) -> Deployment:
    _unknown(where, table, _DEPLOYMENT_KEYS)
    if "model" not in table:
        raise ConfigError(f"{where}: needs a model")
    for name in ("headers", "options", "price"):
        if name in table and not isinstance(table[name], dict):
            raise ConfigError(f"{where}: {name} must be a table")
    if "provider" in table and not isinstance(table["provider"], str):
        raise ConfigError(f"{where}: provider must be a string")
    try:
        return Deployment(**table)
    except SluiceError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def with_overrides(
    config: JobConfig,
    *,
    model: str | None = None,
    rpm: float | None = None,
    tpm: float | None = None,
    itpm: float | None = None,
    otpm: float | None = None,
    max_in_flight: int | None = None,
    burst_requests: float | None = None,
    burst_tokens: float | None = None,
    concurrency: int | None = None,
    price: Price | None = None,
    budget_usd: float | None = None,
    allow_unpriced: bool = False,
) -> JobConfig:
    """The configuration with CLI flags applied on top.

    Limits (and ``price``) go to ``model``'s deployment when ``model`` is given (one is
    made if the file has none); else to the file's only deployment when it has exactly
    one (and the file's default model, if any, is that one); else into
    :attr:`JobConfig.defaults`, for every model without a deployment of its own.
    """
    given: dict[str, Any] = {
        "rpm": rpm,
        "tpm": tpm,
        "itpm": itpm,
        "otpm": otpm,
        "max_in_flight": max_in_flight,
        "burst_requests": burst_requests,
        "burst_tokens": burst_tokens,
        "price": price,
    }
    limits = {k: v for k, v in given.items() if v is not None}
    deployments = list(config.deployments)
    defaults = dict(config.defaults)
    if model is not None:
        found = [i for i, d in enumerate(deployments) if model in (d.model, d.label)]
        for i in found:
            deployments[i] = _with(deployments[i], limits)
        if not found:
            deployments.append(Deployment(model, **limits))
    elif limits and len(deployments) == 1 and config.model in (None, deployments[0].model, deployments[0].label):
        deployments[0] = _with(deployments[0], limits)
    elif limits:
        defaults.update(limits)
        _with(Deployment("openai/any-model"), defaults)  # a bad combination fails here, not mid-job
    return dataclasses.replace(
        config,
        deployments=tuple(deployments),
        defaults=defaults,
        model=model or config.model,
        concurrency=concurrency or config.concurrency,
        budget_usd=config.budget_usd if budget_usd is None else budget_usd,
        allow_unpriced=allow_unpriced or config.allow_unpriced,
    )


def _with(deployment: Deployment, fields: Mapping[str, Any]) -> Deployment:
    try:
        return dataclasses.replace(deployment, **fields)
    except SluiceError as exc:
        raise ConfigError(exc.message) from None


def key_source(deployment: Deployment) -> str:
    """Where a deployment's key comes from, and whether it is there: never the key itself."""
    provider = deployment.provider_name
    if provider == "simulate" or not isinstance(deployment.provider, (str, type(None))):
        return "no key needed"
    if isinstance(deployment.api_key, Secret) and deployment.api_key:
        return "api_key in the config file (****)"
    env = deployment.api_key_env or _KEY_ENV.get(provider)
    if env is None:
        return "none"
    return f"${env} (set)" if os.environ.get(env) else f"${env} (NOT SET)"


def missing_keys(config: JobConfig) -> list[str]:
    """One line per deployment that cannot be called as configured (its API key is not
    set), each saying what to set: the check the engine makes before sending anything."""
    from ..providers import check_deployment

    problems = []
    for d in config.deployments:
        try:
            check_deployment(d)
        except ConfigError as exc:
            problems.append(exc.message)
    return problems


def _limits(d: Deployment) -> list[tuple[str, str]]:
    return [
        ("rpm", "-" if d.rpm is None else f"{d.rpm:g}"),
        ("tpm", "-" if d.tpm is None else f"{d.tpm:g}"),
        ("itpm", "-" if d.itpm is None else f"{d.itpm:g}"),
        ("otpm", "-" if d.otpm is None else f"{d.otpm:g}"),
        ("max_in_flight", "-" if d.max_in_flight is None else str(d.max_in_flight)),
        ("burst", f"{d.burst_requests:g} requests, {d.burst_tokens:g} tokens"),
        ("window", f"{d.window:g}s"),
    ]


def _where(d: Deployment) -> str:
    url = effective_base_url(d)
    if url is None:
        return "(provider default)"
    return url if d.base_url else f"{url} (from the environment)"


def describe(config: JobConfig) -> list[dict[str, str]]:
    """One row per deployment, for ``sluice config check``: keys masked."""
    from .._pricing import Pricing

    pricing = Pricing()
    rows = []
    for d in config.deployments:
        rows.append(
            {
                "deployment": d.label,
                "provider": d.provider_name,
                "model": d.model_name,
                "base_url": _where(d),
                "key": key_source(d),
                **dict(_limits(d)),
                "price": pricing.describe(d),
            }
        )
    return rows


def describe_defaults(config: JobConfig) -> str | None:
    """The one line ``sluice config check`` prints for models without a deployment, or
    None when the flags set nothing for them."""
    if not config.defaults:
        return None
    from .._pricing import Pricing

    shown = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in config.defaults.items() if k != "price"
    )
    configured = {m for d in config.deployments for m in (d.model, d.label)}
    if config.model is not None and config.model not in configured:
        price = Pricing().describe(Deployment(config.model, **config.defaults))
        price = f"price of the default model {config.model}: {price}"
    elif config.defaults.get("price") is not None:
        price = f"price: {Pricing().describe(Deployment('openai/any-model', **config.defaults))}"
    else:
        price = "price: looked up per model in genai-prices (unknown when unlisted)"
    return f"models without a deployment: {shown or 'no limits'}; {price}"
