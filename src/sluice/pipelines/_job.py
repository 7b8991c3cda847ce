"""What a pipeline's workers are told: one frozen, picklable value, checked where it is made.

Ray builds ``Completions(**kwargs)`` in each actor; Dask pickles the callable to each task.
Either way the arguments are checked here first, so a wrong one is a
:class:`~sluice.ConfigError` naming it, raised at once (in the driver for Dask, when the
actor pool starts for Ray), and never a row's error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._errors import ConfigError, SluiceError
from .._models import Price

if TYPE_CHECKING:
    from .._config import JobConfig

__all__ = ["RowJob", "row_job"]

_DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class RowJob:
    """A pipeline's sluice job: every worker with the same ``job`` shares its limits (on
    the deployment's fingerprint, as ``--redis`` does), its budget and its answers."""

    redis: str
    job: str
    model: str | None = None
    rpm: float | None = None
    tpm: float | None = None
    itpm: float | None = None
    otpm: float | None = None
    window: float = 60.0
    max_in_flight: int | None = None
    budget_usd: float | None = None
    #: A sluice.toml (deployments, router, fallbacks, retries), read on each worker.
    config: str | None = None
    #: The answer's JSON Schema (a dict) or Pydantic model, for rows that give none.
    schema: Any = None
    max_tokens: int | None = None
    temperature: float | None = None
    system: str | None = None
    #: Requests one worker has in flight at most (the shared limits bound them all).
    concurrency: int = 64
    base_url: str | None = None
    api_key_env: str | None = None
    #: USD per million tokens (in, out) for a model genai-prices does not know.
    price: tuple[float, float] | None = None
    allow_unpriced: bool = False
    #: Where answers are kept for resume: "redis" (a hash per job, expiring ``ttl_days``
    #: after its last write) or a directory on storage every worker mounts.
    store: str = "redis"
    ttl_days: float = 7.0
    namespace: str = "sluice"
    #: Embeddings instead of chat completions (``sluice.ray.Embeddings``).
    embeddings: bool = False
    dimensions: int | None = None
    #: The row column holding the text to embed.
    text_column: str = "text"

    @property
    def ttl_seconds(self) -> int:
        return max(1, int(self.ttl_days * _DAY))

    def job_config(self) -> JobConfig:
        """The configuration this worker's Engine is built from: the config file's, with
        the arguments on top (as ``sluice run``'s flags go on top of its file)."""
        from ..cli._config import load_config, with_overrides  # the config file's reader; an edge, like the CLI

        base = load_config(Path(self.config)) if self.config is not None else None
        try:
            config = with_overrides(
                base if base is not None else _default_config(),
                model=self.model,
                rpm=self.rpm,
                tpm=self.tpm,
                itpm=self.itpm,
                otpm=self.otpm,
                max_in_flight=self.max_in_flight,
                concurrency=self.concurrency,
                price=Price(*self.price) if self.price is not None else None,
                budget_usd=self.budget_usd,
                allow_unpriced=self.allow_unpriced,
            )
        except SluiceError as exc:
            raise ConfigError(f"sluice: {exc.message}") from None
        fields = {"window": self.window, "base_url": self.base_url, "api_key_env": self.api_key_env}
        given: dict[str, Any] = {k: v for k, v in fields.items() if v is not None and not (k == "window" and v == 60.0)}
        if given and self.model is not None:
            deployments = tuple(
                dataclasses.replace(d, **given) if self.model in (d.model, d.label) else d for d in config.deployments
            )
            config = dataclasses.replace(config, deployments=deployments)
        elif given:
            config = dataclasses.replace(config, defaults={**config.defaults, **given})
        return config


def _default_config() -> JobConfig:
    from .._config import JobConfig

    return JobConfig()


def _positive(name: str, value: Any, *, integer: bool = False, zero: bool = False) -> None:
    if value is None:
        return
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    ok = not isinstance(value, bool) and isinstance(value, kinds)
    if ok:
        ok = math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        what = "an integer" if integer else "a number"
        raise ConfigError(f"{name}= must be {what} {'>= 0' if zero else '> 0'}, got {value!r}")


def _redis_url(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError("redis= is required: the URL of the Redis every worker shares (redis://host:6379/0)")
    scheme = urlsplit(value).scheme
    if scheme not in ("redis", "rediss", "unix"):
        # never the URL itself: it may hold a password
        raise ConfigError(f"redis= is not a Redis URL (scheme {scheme!r}); expected redis://, rediss:// or unix://")


def row_job(owner: str, kwargs: Mapping[str, Any], *, embeddings: bool = False) -> RowJob:
    """``kwargs`` (a constructor's) as a :class:`RowJob`; ``owner`` names the class in errors."""
    known = {f.name for f in dataclasses.fields(RowJob)} - {"embeddings"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(f"{owner}: unknown argument {unknown[0]}=; known: {', '.join(sorted(known))}")
    _redis_url(kwargs.get("redis"))
    job = kwargs.get("job")
    if not isinstance(job, str) or not job.strip() or any(c.isspace() or c in "{}" for c in job):
        raise ConfigError(
            f"{owner}: job= must name the job (limits, budget and resume are keyed by it): "
            f"a non-empty string without spaces or braces, got {job!r}"
        )
    model = kwargs.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ConfigError(f"{owner}: model= must be a model name such as 'openai/gpt-4o-mini', got {model!r}")
    if model is None and kwargs.get("config") is None:
        raise ConfigError(f"{owner}: give model= (or config=, a sluice.toml that names the model)")
    for name in ("rpm", "tpm", "itpm", "otpm", "window"):
        _positive(name, kwargs.get(name))
    for name in ("max_in_flight", "concurrency", "max_tokens", "dimensions"):
        _positive(name, kwargs.get(name), integer=True)
    for name in ("budget_usd", "temperature", "ttl_days"):
        _positive(name, kwargs.get(name), zero=name != "ttl_days")
    config = kwargs.get("config")
    if config is not None:
        if not isinstance(config, (str, Path)) or not Path(config).is_file():
            raise ConfigError(f"{owner}: config= must be the path of a sluice.toml, and {config!r} is not a file")
        kwargs = {**kwargs, "config": str(config)}
    price = kwargs.get("price")
    if price is not None:
        try:
            Price(*price)
        except (TypeError, SluiceError) as exc:
            raise ConfigError(f"{owner}: price= must be (input, output) USD per million tokens: {exc}") from None
        kwargs = {**kwargs, "price": tuple(price)}
    store = kwargs.get("store", "redis")
    if not isinstance(store, (str, Path)) or not str(store):
        raise ConfigError(f"{owner}: store= is 'redis' or a directory every worker mounts, got {store!r}")
    if str(store) != "redis":
        kwargs = {**kwargs, "store": str(store)}
    if kwargs.get("schema") is not None:
        from ..structured import Schema

        try:
            Schema.of(kwargs["schema"])
        except SluiceError as exc:
            raise ConfigError(f"{owner}: schema=: {exc.message}") from None
        if embeddings:
            raise ConfigError(f"{owner}: schema= shapes chat answers; embeddings have none")
    try:
        made = RowJob(**kwargs, embeddings=embeddings)
    except TypeError as exc:
        raise ConfigError(f"{owner}: {exc}") from None
    made.job_config()  # a bad config file or limit is said here, once, not per row
    return made
