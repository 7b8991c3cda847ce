"""What every chat-like endpoint does with its request once it is read, whatever the API
shape the client speaks (Chat Completions, Messages, Responses): admit it through the
client's own limits and the bounded queue, run it on the engine, settle the client's
account, and relay a stream to the client as it arrives.

Each endpoint brings its own :class:`Encoder` (its API's events); the rules are the same
for all: an error before the first delta is an ordinary error response (its status, the
client API's JSON), after it an error event in the client's API, and the engine's stream
is always closed and its result settled, whatever the client did. A client that leaves
(before its first byte or part-way) does not end the upstream answer, which the provider
bills whole: it is read to its end and settled at its real usage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from aiohttp import web

from ..._models import Request, Result
from ..._streaming import Delta, Stream
from ...caching._served import Ticket
from ..core._clients import Client
from ..core._context import ServeContext
from ._cache import fits_budget

__all__ = ["Encoder", "Opened", "complete", "open_stream", "relay", "settled"]

_SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


class Encoder(Protocol):
    """One stream's events in the client's API, as bytes to write."""

    def begin(self) -> bytes:
        """What goes before the first delta (a role chunk, ``message_start``...)."""
        ...

    def delta(self, delta: Delta) -> bytes:
        """One delta of text or of a tool call."""
        ...

    def end(self, result: Result) -> bytes:
        """What closes a stream that succeeded (finish reason, usage, the end marker)."""
        ...

    def failed(self, error: web.Response) -> bytes:
        """What tells the client the stream failed after it began: ``error`` is the response
        it would have had before (its status and the API's error JSON)."""
        ...


def used(result: Result) -> int | None:
    """Tokens a result took from its client's tpm (None: nothing was sent)."""
    if not result.attempts or result.cached:
        return None
    return result.usage.total_tokens


def _estimate(ctx: ServeContext, request: Request, deployment: Any) -> int:
    route = ctx.engine.router.route_named(deployment.label)
    if route is None:
        return 0
    return int(route.provider.estimate_tokens(request, deployment))


def settled(ctx: ServeContext, client: Client, result: Result, ticket: Ticket | None = None) -> None:
    """A finished request counted for /metrics (and its prompt-cache plan told), and the
    clients' spend written when it matters."""
    ctx.metrics.result(client.name, result)
    if ctx.prompt_cache is not None:
        ctx.prompt_cache.done(client.name, ticket, result)
    if client.budget is not None or ctx.clients.engine_budget is not None:
        ctx.clients.save()


async def complete(ctx: ServeContext, client: Client, http: web.Request, request: Request) -> Result:
    """``request`` run to its result through the client's limits and the queue (a Refused
    when it cannot be admitted in time), settled."""
    engine = ctx.engine
    request, ticket = _marked(ctx, client, request)
    tokens, limiters = ctx.estimated_tokens(request.model, lambda d: _estimate(ctx, request, d))

    async def run() -> Result:
        await fits_budget(engine, request, client.budget)  # a hit is free, but only to a client that could pay
        return await engine.complete(request, budget=client.budget)

    try:
        result = await ctx.admit(client, http, tokens, limiters, run, used)
    except BaseException:
        _never_sent(ctx, client, ticket)
        raise
    settled(ctx, client, result, ticket)
    return result


def _marked(ctx: ServeContext, client: Client, request: Request) -> tuple[Request, Ticket | None]:
    """``request`` as it goes upstream: marked for the providers' prompt caches (``[serve] prompt_cache``)."""
    if ctx.prompt_cache is None:
        return request, None
    return ctx.prompt_cache.mark(client.name, request)


def _never_sent(ctx: ServeContext, client: Client, ticket: Ticket | None) -> None:
    if ticket is not None and ctx.prompt_cache is not None:
        ctx.prompt_cache.done(client.name, ticket, None)


class Opened:
    """A stream entered, and its first delta (None: it ended before one came)."""

    __slots__ = ("deltas", "first", "stream", "ticket")

    def __init__(self, stream: Stream, deltas: AsyncIterator[Delta], first: Delta | None) -> None:
        self.stream = stream
        self.deltas = deltas
        self.first = first
        #: Its prompt-cache plan's ticket (None: sent as it came).
        self.ticket: Ticket | None = None


async def _open(stream: Stream) -> Opened:
    """Enter the stream and wait for its first delta (the wait for capacity is in here)."""
    await stream.__aenter__()
    try:
        deltas = stream.events()
        first = await anext(deltas, None)
    except BaseException as exc:
        await stream.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    return Opened(stream, deltas, first)


async def open_stream(ctx: ServeContext, client: Client, http: web.Request, request: Request) -> Opened:
    """``request`` streamed, admitted like :func:`complete`, up to its first delta."""
    engine = ctx.engine
    request, ticket = _marked(ctx, client, request)
    tokens, limiters = ctx.estimated_tokens(request.model, lambda d: _estimate(ctx, request, d))

    async def run() -> Opened:
        await fits_budget(engine, request, client.budget)
        return await _open(engine.stream(request, budget=client.budget))

    try:
        opened = await ctx.admit(client, http, tokens, limiters, run)
    except BaseException:
        _never_sent(ctx, client, ticket)
        raise
    opened.ticket = ticket
    return opened


async def _write(
    ctx: ServeContext, client: Client, http: web.Request, opened: Opened, encoder: Encoder, response: web.StreamResponse
) -> None:
    await response.prepare(http)
    await response.write(encoder.begin())
    delta = opened.first
    while delta is not None:
        await response.write(encoder.delta(delta))
        delta = await anext(opened.deltas, None)
    result = opened.stream.result
    if result.error is not None:
        await response.write(encoder.failed(ctx.failure(client, result.error)))
    else:
        await response.write(encoder.end(result))
    await response.write_eof()


async def relay(
    ctx: ServeContext, client: Client, http: web.Request, opened: Opened, encoder: Encoder
) -> web.StreamResponse:
    """The stream written to the client in ``encoder``'s API as its deltas arrive."""
    stream = opened.stream
    try:
        if opened.first is None:  # ended before any delta: an error is an ordinary error response
            result = stream.result
            if result.error is not None:
                return ctx.failure(client, result.error)
        response = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            await _write(ctx, client, http, opened, encoder, response)
        except ConnectionError:
            # The client left (before its first byte or part-way). The provider goes on
            # generating and bills the whole answer: read it to its end, so the client is
            # charged (and the store keeps) what was billed, not the worst case.
            await stream.collect()
        return response
    finally:
        await stream.__aexit__(None, None, None)
        if stream.done:
            settled(ctx, client, stream.result, opened.ticket)
        else:
            _never_sent(ctx, client, opened.ticket)
