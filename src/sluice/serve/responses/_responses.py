"""OpenAI's Responses API on ``sluice serve``: ``POST /v1/responses`` (plain and
``stream: true``), ``GET`` and ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``.

A Responses body is read into the common (Chat Completions) shape by
:mod:`sluice.shapes` and kept as written (``Request.native``): a deployment that speaks
Responses (OpenAI's, Azure's) is sent it as it is, so reasoning and the provider's own
features work; any other is sent the translation, or refuses what it lost with a 400.

sluice keeps the conversation itself: a response is stored (``store``, true unless the
client says false) per client in the state dir (:mod:`._db`) under sluice's own
id, and ``previous_response_id`` is answered by putting the stored turns before the new
input, so a conversation may move between deployments and providers. Upstream is never
asked to store (``store: false``) nor given a previous id it could not know.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from ... import _json
from ..._models import Native, Request, Result
from ..._streaming import Delta
from ...shapes._common import ShapeError
from ...shapes.responses._api import ResponsesEvents, chat_from_responses, conversation_items, response_from_chat
from ..chat._chat import cached, completion_of, parse_chat, unstreamed
from ..chat._relay import complete, open_stream, relay
from ..core._context import CONTEXT, JSON_BODY, BadBody, client_of
from ..core._errors import openai_error
from ..core._replicas import REPLICAS
from ._db import RESPONSES_DB, ResponsesDB

__all__ = ["add_responses_routes"]

_log = logging.getLogger("sluice.serve")

#: What sluice answers itself and never forwards.
_OURS = ("previous_response_id", "store", "stream")


def add_responses_routes(app: web.Application, db: ResponsesDB, json_handler: Any) -> None:
    app[RESPONSES_DB] = db
    app.router.add_post("/v1/responses", json_handler(create_response))
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)


def _input_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The body's input as items (a string is one user message)."""
    given = body.get("input")
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    return [dict(item) for item in given] if isinstance(given, list) else []


def _replayable(items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Earlier turns as an upstream that stores nothing can be sent them: a reasoning item
    without its encrypted content names state only the upstream kept, so it is left out
    (the model goes on without its earlier reasoning)."""
    return [item for item in items if item.get("type") != "reasoning" or item.get("encrypted_content")]


class _Asked:
    """One Responses request as the handler runs it."""

    def __init__(self, body: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> None:
        self.body = body
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.store = body.get("store") is not False
        self.previous = body.get("previous_response_id")
        self.history = list(history)

    def request(self, model: str, *, cache: str | None) -> Request:
        try:
            view = chat_from_responses(self.body, self.history)
        except ShapeError as exc:
            raise BadBody(exc.message, exc.param) from None
        chat, _, _ = parse_chat(unstreamed(view.body), model, cache=cache)
        upstream = {key: value for key, value in self.body.items() if key not in _OURS}
        upstream["input"] = [*_replayable(self.history), *_input_items(self.body)]
        upstream["store"] = False
        return dataclasses.replace(chat, native=Native("responses", upstream, view.lost))

    def response(self, result: Result, model: str) -> dict[str, Any]:
        """The answer as a Response under sluice's id: an upstream Response as it came
        (its echo of what sluice sent put back to what the client asked), else the chat
        completion translated."""
        raw = result.raw
        if raw is not None and raw.get("object") == "response":
            response = dict(raw)
        else:
            response = response_from_chat(
                completion_of(result, model),
                response_id=self.id,
                request=self.body,
                created_at=self.created_at,
                usage=result.usage,
            )
        response.update(id=self.id, created_at=self.created_at, previous_response_id=self.previous, store=self.store)
        return response

    async def keep(self, app: web.Application, client: str, response: Mapping[str, Any]) -> None:
        """Store the response (``store``), and with ``--redis`` say that this replica holds it."""
        if not self.store:
            return
        asked = conversation_items(self.body, {"output": []})
        answered = response.get("output") or []
        db = app[RESPONSES_DB]
        if not await asyncio.to_thread(db.put, client, response, asked, answered, self.previous):
            _log.info("sluice serve: a response of client %r is larger than responses_mb_per_client: not kept", client)
            return
        replicas = app.get(REPLICAS)
        if replicas is not None:
            await replicas.own([str(response["id"])], client)


async def create_response(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    db = request.app[RESPONSES_DB]
    client = client_of(request)
    body = request[JSON_BODY]
    if not isinstance(body, Mapping):
        raise BadBody("the request body must be a JSON object")
    model = ctx.resolve(client, body.get("model"))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadBody("stream must be a boolean", "stream")
    for unsupported in ("background", "conversation"):
        if body.get(unsupported):
            raise BadBody(f"{unsupported} is not supported by sluice serve", unsupported)
    previous = body.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous is not None:
        if not isinstance(previous, str) or not previous:
            raise BadBody("previous_response_id must be a response id", "previous_response_id")
        found = await asyncio.to_thread(db.conversation, client.name, previous)
        if found is None:
            return openai_error(
                404,
                f"Previous response with id '{previous[:100]}' not found.",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        history = found
    asked = _Asked(body, history)
    chat = asked.request(model, cache=cached(ctx, request, body))
    if not stream:
        result = await complete(ctx, client, request, chat)
        if result.error is not None:
            return ctx.failure(client, result.error)
        response = asked.response(result, body["model"])
        await asked.keep(request.app, client.name, response)
        return web.Response(body=_json.dumps(response), content_type="application/json")
    opened = await open_stream(ctx, client, request, chat)
    events = ResponsesEvents(body, response_id=asked.id, created_at=asked.created_at, model=body["model"])
    encoder = _Events(events, asked)
    answer = await relay(ctx, client, request, opened, encoder)
    if encoder.final is not None:
        await asked.keep(request.app, client.name, encoder.final)
    return answer


class _Events:
    """The Responses event stream as the relay's :class:`~sluice.serve.chat._relay.Encoder`; ``final`` is
    the completed Response, once written (what is stored)."""

    __slots__ = ("_asked", "_events", "final")

    def __init__(self, events: ResponsesEvents, asked: _Asked) -> None:
        self._events = events
        self._asked = asked
        self.final: dict[str, Any] | None = None

    def begin(self) -> bytes:
        return self._events.start()

    def delta(self, delta: Delta) -> bytes:
        return self._events.delta(delta)

    def end(self, result: Result) -> bytes:
        data = self._events.finish(result.finish_reason, result.usage)
        self.final = self._events.response
        return data

    def failed(self, error: web.Response) -> bytes:
        assert isinstance(error.body, bytes)
        payload = _json.loads(error.body)["error"]
        return self._events.failed(str(payload.get("code") or payload.get("type")), str(payload["message"]))


def _not_found(response_id: str) -> web.Response:
    return openai_error(404, f"Response with id '{response_id[:100]}' not found.", param="response_id")


async def retrieve_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    found = await asyncio.to_thread(request.app[RESPONSES_DB].response, client_of(request).name, response_id)
    return _not_found(response_id) if found is None else web.json_response(found)


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    deleted = await asyncio.to_thread(request.app[RESPONSES_DB].delete, client_of(request).name, response_id)
    if not deleted:
        return _not_found(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    items = await asyncio.to_thread(request.app[RESPONSES_DB].input_items, client_of(request).name, response_id)
    if items is None:
        return _not_found(response_id)
    first = items[0].get("id") if items else None
    last = items[-1].get("id") if items else None
    return web.json_response({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": False})
