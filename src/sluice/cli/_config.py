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
    max_in_flight = 64
    # price = { input_per_mtok = 0.15, output_per_mtok = 0.60 }   # for unlisted models

CLI flags (``--model``, ``--rpm``, ``--tpm``, ``--max-in-flight``, ``--concurrency``)
override the file. Keys are never printed: ``sluice config check`` says only where a key
comes from and whether it is set.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigError, SluiceError
from .._models import Deployment, Price, Secret
from .._retry import RetryPolicy

__all__ = ["JobConfig", "describe", "load_config"]

DEFAULT_FILE = "sluice.toml"
_TOP_KEYS = {"model", "concurrency", "budget_usd", "allow_unpriced", "retry", "deployment", "deployments"}
_DEPLOYMENT_KEYS = {f.name for f in dataclasses.fields(Deployment)}
_RETRY_KEYS = {f.name for f in dataclasses.fields(RetryPolicy)}
_KEY_ENV = {"openai": "OPENAI_API_KEY", "azure": "AZURE_OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


@dataclass(frozen=True, slots=True)
class JobConfig:
    deployments: tuple[Deployment, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    concurrency: int = 256
    model: str | None = None
    budget_usd: float | None = None
    allow_unpriced: bool = False
    source: Path | None = None


def load_config(path: Path | None) -> JobConfig:
    """Read ``path``, or ``./sluice.toml`` when it exists, or return the defaults."""
    if path is None:
        candidate = Path(DEFAULT_FILE)
        if not candidate.exists():
            return JobConfig()
        path = candidate
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return _parse(data, path)


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
    return JobConfig(deployments, retry, concurrency, model, budget, allow_unpriced, path)


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
    max_in_flight: int | None = None,
    concurrency: int | None = None,
    price: Price | None = None,
    budget_usd: float | None = None,
    allow_unpriced: bool = False,
) -> JobConfig:
    """The configuration with CLI flags applied on top."""
    target = model or config.model
    if target is None and len(config.deployments) == 1:
        target = config.deployments[0].model
    given: dict[str, Any] = {"rpm": rpm, "tpm": tpm, "max_in_flight": max_in_flight, "price": price}
    limits = {k: v for k, v in given.items() if v is not None}
    deployments = list(config.deployments)
    if limits and target is None:
        raise ConfigError("--rpm/--tpm/--max-in-flight/--price need --model to say which deployment they apply to")
    if target is not None:
        found = [i for i, d in enumerate(deployments) if target in (d.model, d.label)]
        if found:
            for i in found:
                deployments[i] = dataclasses.replace(deployments[i], **limits)
        elif model is not None or limits:
            deployments.append(Deployment(target, **limits))
    return dataclasses.replace(
        config,
        deployments=tuple(deployments),
        model=model or config.model,
        concurrency=concurrency or config.concurrency,
        budget_usd=config.budget_usd if budget_usd is None else budget_usd,
        allow_unpriced=allow_unpriced or config.allow_unpriced,
    )


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
    state = "set" if os.environ.get(env) else "NOT SET"
    return f"${env} ({state})"


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
                "base_url": d.base_url or "(provider default)",
                "key": key_source(d),
                "rpm": "-" if d.rpm is None else f"{d.rpm:g}",
                "tpm": "-" if d.tpm is None else f"{d.tpm:g}",
                "max_in_flight": "-" if d.max_in_flight is None else str(d.max_in_flight),
                "window": f"{d.window:g}s",
                "price": pricing.describe(d),
            }
        )
    return rows
