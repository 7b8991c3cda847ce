"""The run command's flags that need more than click's types: ``--tier`` and its batch
settings, ``--schema``, durations; and :func:`fail`, the one way a command refuses its
flags (``sluice: error: ...``, exit 2)."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import click

from .._config import JobConfig
from .._errors import ConfigError
from ..batch._inputs import InputOptions
from ..structured import Schema, load_schema

__all__ = [
    "check_tier_providers",
    "distributed_flags",
    "duration",
    "estimate_tier_option",
    "fail",
    "prompt_cache_option",
    "schema_flag",
    "with_tier",
]


estimate_tier_option = click.option(
    "--tier",
    type=click.Choice(["sync", "flex", "batch"]),
    default="sync",
    show_default=True,
    help="Price the lines (and plan the prompt cache) as `sluice run --tier` would send them.",
)
prompt_cache_option = click.option(
    "--prompt-cache",
    type=click.Choice(["auto", "off"]),
    default="auto",
    show_default=True,
    help="auto: lines that share a long prefix are grouped, one sent first to write the provider's "
    "prompt cache and the rest once it has answered, marked (Anthropic breakpoints, OpenAI cache keys) "
    "and limited by what they will be counted for; off: every line as it is written.",
)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"sluice: error: {message}", err=True)
    sys.exit(code)


def schema_flag(spec: str | None, inputs: InputOptions, config: JobConfig) -> Schema | None:
    """``--schema``: the Schema it names, or a clear refusal (exit 2) before anything runs."""
    if spec is None:
        return None
    if inputs.embed_field is not None:
        fail("--schema shapes chat answers; --embed makes vectors, which have none")
    try:
        schema = load_schema(spec)
    except ConfigError as exc:
        fail(exc.message)
        return None
    model = inputs.model or config.model
    anthropic = model is not None and (
        model.startswith("anthropic/")
        or any(d.provider_name == "anthropic" for d in config.deployments if model in (d.model, d.label))
    )
    if anthropic and not schema.object_rooted:
        fail(
            f"--schema {spec}: {model} answers JSON as a tool's input, which is an object; give a schema "
            'whose top level is {"type": "object", ...} (wrap a list or a value in one)'
        )
    return schema


def with_tier(config: JobConfig, flags: dict[str, Any]) -> JobConfig:
    """``--tier`` and the batch tier's settings on the job's config."""
    from ..tiers import BatchSettings

    tier = flags.pop("tier")
    poll_every, batch_size, deadline = flags.pop("poll_every"), flags.pop("batch_size"), flags.pop("deadline")
    check_tier_providers(config, tier)
    if tier == "auto" and deadline is None:
        fail("--tier auto plans against a deadline: add --deadline DURATION (e.g. --deadline 6h)")
    if tier != "auto" and deadline is not None:
        fail("--deadline applies to --tier auto only")
    if tier not in ("batch", "auto"):
        source = click.get_current_context().get_parameter_source
        for name in ("poll_every", "batch_size"):
            if source(name) is click.core.ParameterSource.COMMANDLINE:
                fail(f"--{name.replace('_', '-')} applies to --tier batch or auto only")
        return dataclasses.replace(config, tier=tier)
    if flags["redis_url"] is not None:
        fail(f"--tier {tier} runs in one process: drop --redis (the provider's batch queue does the spreading)")
    linger = min(2.0, max(1.0, poll_every))  # a partial chunk goes once lines stop coming
    settings = BatchSettings(
        poll_every=poll_every,
        max_lines=batch_size,
        linger=linger,
        deadline=None if deadline is None else time.time() + deadline,
    )
    return dataclasses.replace(config, tier=tier, batch=settings)


def check_tier_providers(config: JobConfig, tier: str) -> None:
    """A tier the job's deployments cannot be served in is refused now, before any file is
    made: flex is OpenAI's; the batch tiers speak OpenAI's and Anthropic's Batch APIs."""
    if tier == "sync":
        return
    from .._models import Deployment

    served = list(config.deployments)
    if config.model is not None and not any(config.model in (d.model, d.label) for d in served):
        served.append(Deployment(config.model, **config.defaults))
    allowed = ("openai",) if tier == "flex" else ("openai", "anthropic")
    for d in served:
        if d.provider_name not in allowed:
            fail(
                f"--tier {tier}: {d.label} is served by {d.provider_name!r}, which has no "
                f"{'flex tier' if tier == 'flex' else 'Batch API'}; {tier} takes {' or '.join(allowed)} models"
            )


def duration(text: str, flag: str) -> float:
    """``45s``, ``30m``, ``6h``, ``1d`` or plain seconds, as seconds."""
    value = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}.get(value[-1:])
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a duration; write 45s, 30m, 6h or 1d", param_hint=flag) from None
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise click.BadParameter(f"{text!r}: a duration must be positive", param_hint=flag)
    return seconds


def distributed_flags(flags: dict[str, Any]) -> Any:
    """``--redis`` and its options, or None for a job run in this process."""
    from ..batch._job import Distributed

    url = flags["redis_url"]
    if url is None:
        for flag in ("redis_fail_open", "no_local_worker"):
            if flags[flag]:
                fail(f"--{flag.replace('_', '-')} needs --redis URL")
        return None
    if flags["ordered"]:
        fail("--ordered is not available with --redis: records are written as the workers answer")
    from ._worker import require_redis

    require_redis()
    return Distributed(
        url,
        fail_open=flags["redis_fail_open"],
        local_worker=not flags["no_local_worker"],
        claim_after=flags["claim_after"],
        max_deliveries=flags["max_deliveries"],
    )
