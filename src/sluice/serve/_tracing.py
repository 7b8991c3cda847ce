"""``sluice serve --otel``: a SERVER span per API request, parent of the engine's spans.

The span continues the caller's trace when the request carries W3C ``traceparent`` (the
propagators of ``OTEL_PROPAGATORS``, tracecontext and baggage by default), and is current
while the handler runs: the engine's request and attempt spans (:mod:`sluice.otel`) become
its children, since the engine's task copies the handler's context (for chat and
embeddings; a batch's lines are traces of their own). Only ``/v1/...`` is traced: a load
balancer's ``/health`` and the dashboard's polls would drown the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import __version__
from .._tracing import Tracing
from ._keys import CLIENT

__all__ = ["server_spans"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The routes whose engine work is done inside the request (its spans are the request's children).
_ANSWERED_HERE = frozenset({"/v1/chat/completions", "/v1/embeddings"})


def server_spans(tracing: Tracing) -> Middleware:
    """The middleware (outermost, so that it sees every answer, errors included)."""
    tracer = trace.get_tracer("sluice", __version__, tracer_provider=tracing.provider)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "other"  # never the raw path: low cardinality
        attributes: dict[str, Any] = {
            "http.request.method": request.method,
            "http.route": route,
            "url.path": request.path[:200],
            "url.scheme": request.scheme,
        }
        if request.remote:
            attributes["client.address"] = request.remote
        parent = propagate.extract(request.headers)
        span = tracer.start_span(
            f"{request.method} {route}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        # current only where the engine answers within the request: a batch's lines (which
        # run on for hours in a task the create handler starts) are traces of their own
        token = context.attach(trace.set_span_in_context(span, parent)) if route in _ANSWERED_HERE else None
        try:
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_attribute("error.type", str(response.status))
                span.set_status(Status(StatusCode.ERROR))
            return response
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
            raise
        finally:
            client = request.get(CLIENT)
            if client is not None:
                span.set_attribute("sluice.client", client.name)
            if token is not None:
                context.detach(token)
            span.end()

    return middleware
