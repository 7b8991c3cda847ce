"""``POST /v1/chat/completions``: plain, and ``stream: true`` as OpenAI streams it.

A plain answer is the provider's own response body (the engine translates Anthropic's to
OpenAI's shape). A stream is Server-Sent Events exactly as OpenAI sends them: a
``chat.completion.chunk`` with the role, one per delta (text or tool-call pieces), one with
the ``finish_reason``, with ``stream_options.include_usage`` a last one with empty
``choices`` and the ``usage`` (and ``"usage": null`` on the others), then ``data: [DONE]``.
An error before the first delta is an ordinary error response (its status, OpenAI's JSON);
after it, OpenAI's way: ``data: {"error": {...}}`` and the stream ends without ``[DONE]``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ... import _json
from ..._errors import InvalidRequestError
from ..._models import Request, Result, Usage
from ..._streaming import Delta
from ...providers._events import TextDelta
from ...structured import schema_from_response_format
from ..core._context import CONTEXT, JSON_BODY, BadBody, ServeContext, client_of
from ..core._settings import cached_request
from ._cache import cache_id
from ._relay import complete, open_stream, relay

__all__ = ["cached", "chat_completions", "completion_of", "parse_chat", "unstreamed", "usage_of"]

#: Fields of the body that are the Request's own; the rest goes to the provider as ``params``.
_OWN = frozenset({"model", "messages", "max_tokens", "temperature", "stream", "stream_options"})


def parse_chat(body: Any, model: str, *, cache: str | None, validate: bool = False) -> tuple[Request, bool, bool]:
    """(the Request, stream?, include usage?) from a chat body; BadBody names a wrong field.

    ``cache``: the cache group whose answers it may be given (see ``_cache``); None: its
    own key, never answered from the state nor shared with a twin in flight.

    With ``validate`` a non-streamed request's ``response_format`` becomes its schema: the
    answer is validated and re-asked (see :mod:`sluice.structured`)."""
    if not isinstance(body, Mapping):
        raise BadBody("the request body must be a JSON object")
    messages = body.get("messages")
    if messages is None:
        raise BadBody("you must provide a messages parameter", "messages")
    if not isinstance(messages, list):
        raise BadBody(f"messages must be an array of message objects, got {_kind(messages)}", "messages")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadBody(f"stream must be a boolean, got {_kind(stream)}", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, Mapping):
            raise BadBody(f"stream_options must be an object, got {_kind(options)}", "stream_options")
        if not stream:
            raise BadBody("stream_options is only allowed when stream is true", "stream_options")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise BadBody("stream_options.include_usage must be a boolean", "stream_options.include_usage")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise BadBody(f"n must be an integer >= 1, got {_json.dumps_text(n)[:40]}", "n")
    if stream and n is not None and n > 1:
        raise BadBody("n > 1 is not supported with stream: true by sluice serve", "n")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise BadBody(f"{name} must be an integer >= 1, got {_json.dumps_text(value)[:40]}", name)
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))):
        raise BadBody(f"temperature must be a number, got {_kind(temperature)}", "temperature")
    params = {k: v for k, v in body.items() if k not in _OWN}
    schema = None
    # checked: one answer (n > 1 would be several), that cannot be a tool call
    checkable = not stream and n in (None, 1) and "tools" not in params and "functions" not in params
    if validate and checkable and "response_format" in params:
        try:
            schema = schema_from_response_format(params["response_format"])
        except InvalidRequestError as exc:
            raise BadBody(exc.message, "response_format") from None
        if schema is not None:
            del params["response_format"]
    try:
        request = Request(
            model=model,
            messages=messages,
            max_tokens=body.get("max_tokens"),
            temperature=temperature,
            params=params,
            schema=schema,
        )
    except InvalidRequestError as exc:
        message = exc.message.removeprefix("request: ")
        raise BadBody(message, message.split(" ", 1)[0].split("[", 1)[0] or None) from None
    unique = f"serve-{uuid.uuid4().hex}" if cache is None else cache_id(cache)
    request = dataclasses.replace(request, id=unique)
    return request, stream, include_usage


def unstreamed(body: Mapping[str, Any]) -> dict[str, Any]:
    """A chat body without what asks for a stream (a translated one says it; the handler streams)."""
    return {key: value for key, value in body.items() if key not in ("stream", "stream_options")}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    client = client_of(request)
    body = request[JSON_BODY]
    if not isinstance(body, Mapping):
        raise BadBody("the request body must be a JSON object")
    model = ctx.resolve(client, body.get("model"))
    chat, stream, include_usage = parse_chat(
        body, model, cache=cached(ctx, request, body), validate=ctx.settings.validate_json
    )
    if not stream:
        result = await complete(ctx, client, request, chat)
        if result.error is not None:
            return ctx.failure(client, result.error)
        return web.Response(body=_json.dumps(completion_of(result, body["model"])), content_type="application/json")
    opened = await open_stream(ctx, client, request, chat)
    return await relay(ctx, client, request, opened, _Chunks(body["model"], include_usage))


def cached(ctx: ServeContext, request: web.Request, body: Mapping[str, Any]) -> str | None:
    """The cache group whose answers this request may be given (``x-sluice-cache``,
    ``[serve] cache``, the client's ``cache_group``); None: it goes upstream."""
    try:
        asked = cached_request(ctx.settings.cache, request.headers.get("x-sluice-cache"), body.get("temperature"))
    except ValueError as exc:
        raise BadBody(str(exc), "x-sluice-cache") from None
    return client_of(request).group if asked else None


def completion_of(result: Result, model: str) -> dict[str, Any]:
    """The provider's body (the engine's OpenAI shape for other providers), or one made
    from the Result when there is none, or it is not a chat completion (the simulated
    provider's and a callable's notes)."""
    if result.raw is not None and isinstance(result.raw.get("choices"), list):
        body = dict(result.raw)
        body.pop("streamed", None)
        if body.get("id") is None:
            body["id"] = f"chatcmpl-{uuid.uuid4().hex}"
        return _validated(body, result)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": result.model or model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason or "stop",
            }
        ],
        "usage": usage_of(result.usage),
    }


def _validated(body: dict[str, Any], result: Result) -> dict[str, Any]:
    """A validated answer's body: its content the JSON itself (a fence the model put round
    it taken off), its usage every ask's (the client was charged for its re-asks too)."""
    schema = result.request.schema if result.request is not None else None
    if schema is None or not body["choices"] or not isinstance(body["choices"][0], Mapping):
        return body
    choice = dict(body["choices"][0])
    message = dict(choice.get("message") or {})
    message["content"] = _json.dumps_text(schema.to_json(result.parsed))
    choice["message"] = message
    body["choices"] = [choice, *body["choices"][1:]]
    body["usage"] = usage_of(result.usage)
    return body


def usage_of(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


# -- streaming --------------------------------------------------------------------------------


class _Chunks:
    """``chat.completion.chunk`` events of one stream, as SSE bytes (an :class:`Encoder`)."""

    __slots__ = ("_base", "_include_usage")

    def __init__(self, model: str, include_usage: bool) -> None:
        self._include_usage = include_usage
        self._base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": None,
        }

    def _event(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        chunk: dict[str, Any] = {**self._base, "choices": choices}
        if self._include_usage:
            chunk["usage"] = usage
        return b"data: " + _json.dumps(chunk) + b"\n\n"

    def _choice(self, delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    def begin(self) -> bytes:
        return self._event(self._choice({"role": "assistant", "content": "", "refusal": None}))

    def delta(self, delta: Delta) -> bytes:
        if isinstance(delta, TextDelta):
            return self._event(self._choice({"content": delta.text}))
        call: dict[str, Any] = {"index": delta.index}
        if delta.id is not None:
            call["id"] = delta.id
            call["type"] = "function"
        function: dict[str, Any] = {"arguments": delta.arguments}
        if delta.name is not None:
            function["name"] = delta.name
        call["function"] = function
        return self._event(self._choice({"tool_calls": [call]}))

    def end(self, result: Result) -> bytes:
        finish = self._event(self._choice({}, result.finish_reason or "stop"))
        usage = self._event([], usage_of(result.usage)) if self._include_usage else b""
        return finish + usage + b"data: [DONE]\n\n"

    def failed(self, error: web.Response) -> bytes:
        """OpenAI's way: ``data: {"error": {...}}``, and the stream ends without ``[DONE]``."""
        assert isinstance(error.body, bytes)
        payload = _json.loads(error.body)["error"]
        fields = {"message": payload["message"], "type": payload["type"], "param": None, "code": payload["code"]}
        return b"data: " + _json.dumps({"error": fields}) + b"\n\n"
