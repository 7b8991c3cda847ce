"""``--otel``: a TracerProvider made from the standard ``OTEL_*`` environment variables.

The SDK and the OTLP exporters read most variables themselves (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``_HEADERS``, ``_TIMEOUT``, ``_COMPRESSION``,
``_CERTIFICATE``); what is chosen here is what the SDK leaves to a distro:

* ``OTEL_TRACES_EXPORTER``: ``otlp`` (the default), ``console``, ``none``, or several
  separated by commas;
* ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``:
  ``http/protobuf`` (the specification's default, port 4318) or ``grpc`` (port 4317);
* ``OTEL_SDK_DISABLED=true`` turns tracing off;
* ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` records prompts and answers.

The provider is sluice's own (not made global) and is shut down at exit, which sends the
spans still batched.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from .._errors import ConfigError
from .._tracing import Tracing

__all__ = ["capture_content_from_env", "tracing_from_env"]

_TRUE = ("true", "1", "yes", "on", "span_only", "span_and_event")
#: How long the exit waits for the last spans to reach the collector.
_FLUSH_MS = 5000


def capture_content_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` opts into content."""
    env = os.environ if environ is None else environ
    return env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower() in _TRUE


def tracing_from_env(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """The commands' tracing, or None when the environment turns it off. Raises
    ConfigError for an exporter or protocol it does not know."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    exporters = [_exporter(name, env) for name in names if name != "none"]
    if not exporters:
        return None
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "sluice"}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    atexit.register(_shut_down, provider)
    return Tracing(provider, capture_content=capture_content_from_env(env))


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: sluice exports to otlp, console or none, not {name!r}")
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    protocol = protocol.strip().lower() or "http/protobuf"
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError as exc:
            raise ConfigError(f"OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc ({exc})") from None
        return GrpcExporter()
    raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf or grpc, got {protocol!r}")


def _shut_down(provider: TracerProvider) -> None:
    provider.force_flush(_FLUSH_MS)
    provider.shutdown()
