"""A tiny OTLP/HTTP trace receiver on loopback: what a collector would get from sluice.

It takes ``POST /v1/traces`` (protobuf, as the standard exporter sends with
``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf``), decodes it with ``opentelemetry-proto`` and
keeps every span as a plain :class:`ReceivedSpan`.
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["OtlpReceiver", "ReceivedSpan"]

#: OTLP's span kinds (``Span.SpanKind``), by number.
KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class ReceivedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


class OtlpReceiver:
    """``async with OtlpReceiver() as receiver``: ``receiver.url`` is the OTLP endpoint."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""
        self._changed = asyncio.Event()

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def until(self, count: int, name: str | None = None, timeout: float = 30.0) -> list[ReceivedSpan]:  # noqa: ASYNC109
        """Once at least ``count`` spans (named ``name``) arrived, those spans."""
        async with asyncio.timeout(timeout):
            while len(found := [s for s in self.spans if name is None or s.name == name]) < count:
                self._changed.clear()
                await self._changed.wait()
        return found

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        self.headers.append(dict(request.headers))
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status=span.status.code,
                            resource=resource,
                        )
                    )
        self._changed.set()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )
