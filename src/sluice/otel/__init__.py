"""OpenTelemetry traces of sluice's requests (``pip install 'llm-sluice[otel]'``).

* In the library: ``Engine(..., tracing=True)`` traces through the global
  ``TracerProvider`` (or ``tracing=sluice.Tracing(provider=..., capture_content=...)``):
  a span per request, in the GenAI semantic conventions, and a child per attempt (see
  :mod:`._spans`).
* In the commands: ``sluice run --otel`` and ``sluice serve --otel`` build the provider from
  the standard ``OTEL_*`` environment variables (:func:`tracing_from_env`) and export
  through the standard OTLP exporter; ``sluice serve`` also makes a SERVER span per HTTP
  request, continuing the caller's trace (``traceparent``).

Nothing here is imported by ``import sluice``: only by ``Engine(tracing=...)`` and ``--otel``.
"""

from __future__ import annotations

from ._setup import capture_content_from_env, tracing_from_env

__all__ = ["capture_content_from_env", "tracing_from_env"]
