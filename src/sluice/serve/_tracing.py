"""``sluice serve --otel``: a SERVER span per API request, parent of the engine's spans.

The span continues the caller's trace when the request carries W3C ``traceparent`` (the
propagators of ``OTEL_PROPAGATORS``, tracecontext and baggage by default), and is current
while the handler runs: the engine's request and attempt spans (:mod:`sluice.otel`) become
its children, since the engine's task copies the handler's context (for chat and
embeddings; a batch's lines are traces of their own). Only ``/v1/...`` is traced: a load
balancer's ``/health`` and the dashboard's polls would drown the rest.

Two middlewares make it: one outermost, which sees every answer (the errors middleware's
included) and ends the span, and one after authentication, which starts it. A caller
refused as unauthenticated (401) thus gets no span and its trace context is never read:
anyone on the network could otherwise fill the collector with spans in traces of their
choosing. Like the engine's, these calls never raise into a request (see
:func:`~sluice._tracing.tracing_failed`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .. import __version__
from .._tracing import Tracing, tracing_failed
from .core._keys import CLIENT

__all__ = ["server_spans"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The routes whose engine work is done inside the request (its spans are the request's children).
_ANSWERED_HERE = frozenset({"/v1/chat/completions", "/v1/embeddings"})
#: When the outer middleware saw the request (the span's start), and the span once authenticated.
_ARRIVED: web.RequestKey[int] = web.RequestKey("sluice.otel.arrived")
_SPAN: web.RequestKey[Span] = web.RequestKey("sluice.otel.span")


def server_spans(tracing: Tracing) -> tuple[Middleware, Middleware]:
    """The middlewares: the first goes outermost, the second right after authentication."""
    tracer = trace.get_tracer("sluice", __version__, tracer_provider=tracing.provider)

    @web.middleware
    async def answered(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        request[_ARRIVED] = time.time_ns()
        status: int | None = None
        failure: str | None = None
        try:
            response = await handler(request)
            status = response.status
            return response
        except BaseException as exc:
            failure = type(exc).__qualname__
            raise
        finally:
            span = request.get(_SPAN)
            if span is not None:
                _end(span, request, status, failure)

    @web.middleware
    async def authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
        arrived = request.get(_ARRIVED)
        if arrived is None:  # not /v1
            return await handler(request)
        route = _route(request)
        token: object = None
        try:
            parent = propagate.extract(request.headers)
            span = tracer.start_span(
                f"{request.method} {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes=_attributes(request, route),
                start_time=arrived,
            )
            request[_SPAN] = span
            # current only where the engine answers within the request: a batch's lines (which
            # run on for hours in a task the create handler starts) are traces of their own
            if route in _ANSWERED_HERE:
                token = context.attach(trace.set_span_in_context(span, parent))
        except Exception:
            tracing_failed("starting a server span")
        try:
            return await handler(request)
        finally:
            if token is not None:
                try:
                    context.detach(token)  # type: ignore[arg-type]  # the token attach() made
                except Exception:
                    tracing_failed("leaving a server span")

    return answered, authenticated


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "other"  # never the raw path: low cardinality


def _attributes(request: web.Request, route: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": request.method,
        "http.route": route,
        "url.path": request.path[:200],
        "url.scheme": request.scheme,
    }
    if request.remote:
        attributes["client.address"] = request.remote
    return attributes


def _end(span: Span, request: web.Request, status: int | None, failure: str | None) -> None:
    try:
        if status is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))
        if failure is not None:
            span.set_attribute("error.type", failure)
            span.set_status(Status(StatusCode.ERROR))
        client = request.get(CLIENT)
        if client is not None:
            span.set_attribute("sluice.client", client.name)
        span.end()
    except Exception:
        tracing_failed("ending a server span")
