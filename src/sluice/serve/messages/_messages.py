"""Anthropic's Messages API on ``sluice serve``: ``POST /v1/messages`` (plain and
``stream: true``) and ``POST /v1/messages/count_tokens``.

A Messages body is read into the common (Chat Completions) shape by
:mod:`sluice.shapes` and kept as it was written (``Request.native``): an Anthropic
deployment is sent it as it is (thinking, cache control, documents and server tools
reach it), any other is sent the translation, or refuses, with a 400 naming what cannot
be told, when the translation lost something. The answer comes back in Anthropic's
shape: an Anthropic deployment's own body, or the translation of a chat completion;
a stream is Anthropic's event sequence. Admission, budgets, limits and the store are the
chat endpoint's (:mod:`sluice.serve.chat._relay`); errors are Anthropic's (:mod:`._anthropic`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ... import _json
from ..._errors import NotFoundError, ProviderError, RateLimitError
from ..._models import Native, Request, Result
from ..._streaming import Delta
from ..._tokens import estimate_message_tokens
from ...providers._anthropic import AnthropicProvider
from ...shapes._common import ShapeError
from ...shapes.messages._errors import error_type_for
from ...shapes.messages._events import MessagesEvents
from ...shapes.messages._in import chat_from_messages, check_count_tokens
from ...shapes.messages._out import message_from_chat
from ..chat._chat import cached, completion_of, parse_chat, unstreamed
from ..chat._relay import complete, open_stream, relay
from ..core._context import CONTEXT, JSON_BODY, BadBody, client_of

if TYPE_CHECKING:
    from ..._router import Route

__all__ = ["count_tokens", "messages"]

#: What an upstream without ``/v1/messages/count_tokens`` answers it (besides a 404).
_NO_ENDPOINT = (405, 501)


def _body(request: web.Request) -> Mapping[str, Any]:
    body = request[JSON_BODY]
    if not isinstance(body, Mapping):
        raise BadBody("the request body must be a JSON object")
    return body


def request_of(body: Mapping[str, Any], model: str, *, cache: str | None) -> Request:
    """The engine's request for a Messages body: its translation, carrying the body."""
    try:
        view = chat_from_messages(body)
    except ShapeError as exc:
        raise BadBody(exc.message, exc.param) from None
    chat, _, _ = parse_chat(unstreamed(view.body), model, cache=cache)
    return dataclasses.replace(chat, native=Native("anthropic", dict(body), view.lost))


async def messages(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    client = client_of(request)
    body = _body(request)
    model = ctx.resolve(client, body.get("model"))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadBody("stream: Input should be a valid boolean", "stream")
    asked = request_of(body, model, cache=cached(ctx, request, body))
    if not stream:
        result = await complete(ctx, client, request, asked)
        if result.error is not None:
            return ctx.failure(client, result.error)
        return web.Response(body=_json.dumps(message_of(result, body["model"])), content_type="application/json")
    opened = await open_stream(ctx, client, request, asked)
    return await relay(ctx, client, request, opened, _Events(MessagesEvents(), body["model"]))


def message_of(result: Result, model: str) -> dict[str, Any]:
    """The answer as an Anthropic Message: an Anthropic deployment's own body (kept in the
    completion as ``provider_response``), else the chat completion translated."""
    return message_from_chat(completion_of(result, model), model=model, usage=result.usage)


class _Events:
    """Anthropic's stream events as the relay's :class:`~sluice.serve.chat._relay.Encoder`."""

    __slots__ = ("_events", "_model")

    def __init__(self, events: MessagesEvents, model: str) -> None:
        self._events = events
        self._model = model

    def begin(self) -> bytes:
        return self._events.start(self._model) + self._events.ping()

    def delta(self, delta: Delta) -> bytes:
        return self._events.delta(delta)

    def end(self, result: Result) -> bytes:
        return self._events.finish(result.finish_reason, result.usage)

    def failed(self, error: web.Response) -> bytes:
        assert isinstance(error.body, bytes)
        message = _json.loads(error.body)["error"]["message"]
        return self._events.error(error_type_for(error.status), message)


async def count_tokens(request: web.Request) -> web.Response:
    """The input tokens of a Messages body: the provider's own count for an Anthropic
    deployment (through that deployment's limiter, one request and no tokens; sluice's
    estimate when the upstream has no such endpoint), else sluice's estimate (what the
    limiter reserves for it). A count is one request of the client's rpm, none of its tpm."""
    ctx = request.app[CONTEXT]
    client = client_of(request)
    body = _body(request)
    try:
        view = check_count_tokens(body)
    except ShapeError as exc:
        raise BadBody(exc.message, exc.param) from None
    model = ctx.resolve(client, body.get("model"))
    routes = [route for group in ctx.engine.router.chain(model)[:1] for route in group.routes]
    upstream = routes[0] if routes and isinstance(routes[0].provider, AnthropicProvider) else None

    counted: int | None = None
    if upstream is None:
        await ctx.admit_client(client, request)  # nothing is sent: the client's rpm only
    else:
        try:
            counted = await ctx.admit(client, request, 0, [upstream.limiter], lambda: _upstream_count(upstream, body))
        except ProviderError as exc:
            return ctx.failure(client, exc)
    if counted is None:
        params = {k: v for k, v in view.body.items() if k not in ("model", "messages")}
        counted = estimate_message_tokens(view.body["messages"], params)
    return web.json_response({"input_tokens": counted})


async def _upstream_count(route: Route, body: Mapping[str, Any]) -> int | None:
    """The provider's count, sent when the deployment's limiter lets one request go (a 429
    pauses the deployment as a send's would); None when the upstream has no count endpoint."""
    provider = route.provider
    assert isinstance(provider, AnthropicProvider)
    grant = await route.limiter.acquire(0)
    try:
        return await provider.count_tokens(body, route.deployment)
    except RateLimitError as exc:
        route.limiter.penalize(exc.retry_after if exc.retry_after is not None else 1.0)
        raise
    except ProviderError as exc:
        if isinstance(exc, NotFoundError) or exc.status in _NO_ENDPOINT:
            return None  # an Anthropic-compatible server without count_tokens: sluice's estimate
        raise
    finally:
        grant.done()
