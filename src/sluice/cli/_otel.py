"""``--otel`` on ``sluice run``, ``serve`` and ``worker``: spans through the standard OTLP
exporter, configured by the standard ``OTEL_*`` variables (see :mod:`sluice.otel`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .._config import JobConfig
from .._errors import ConfigError

__all__ = ["otel_option", "with_otel"]

F = TypeVar("F", bound=Callable[..., Any])


def otel_option(fn: F) -> F:
    return click.option(
        "--otel",
        is_flag=True,
        help="Send an OpenTelemetry span per request and per attempt (GenAI conventions) through OTLP, "
        "configured by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT...). Needs the otel extra.",
    )(fn)


def with_otel(config: JobConfig, enabled: bool) -> JobConfig:
    """``config`` tracing through OTLP when ``--otel`` was given (a ConfigError, exit 2,
    when the otel extra is missing or a variable is wrong)."""
    if not enabled:
        return config
    try:
        from ..otel import tracing_from_env
    except ImportError as exc:
        raise ConfigError(f"--otel needs the otel extra: pip install 'llm-sluice[otel]' ({exc})") from None
    return dataclasses.replace(config, tracing=tracing_from_env())
