"""Input lines written for other APIs: Anthropic's Messages and OpenAI's Responses.

A Batch API line with ``"url": "/v1/messages"`` or ``"/v1/responses"`` (OpenAI's Batch
API takes Responses lines), an Anthropic Message Batches request (``{"custom_id",
"params"}``), or a bare body in either shape runs like a chat line: the body is read
into the common shape by :mod:`sluice.shapes` and kept as written (``Request.native``),
so a deployment of its API is sent it as it is and any other its translation. The job's
flags apply to both: ``--max-tokens`` and ``--temperature`` set the body's own fields,
``--system`` goes before its system prompt (``system``, ``instructions``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._errors import InvalidInputError
from .._models import Native, Request
from ..shapes._common import ChatView, ShapeError
from ..shapes.messages._in import chat_from_messages
from ..shapes.responses._api import chat_from_responses

__all__ = ["NATIVE_URLS", "native_api_of", "native_view", "with_native"]

#: A Batch API line's url -> the API its body is written for.
NATIVE_URLS = {
    "/v1/messages": "anthropic",
    "/messages": "anthropic",
    "/v1/responses": "responses",
    "/responses": "responses",
}

#: Content block types only Anthropic's Messages API has (a bare line holding one is Anthropic's).
_ANTHROPIC_ONLY = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "document", "image"})

#: Each API's output cap.
_CAP = {"anthropic": "max_tokens", "responses": "max_output_tokens"}


def native_api_of(record: Mapping[str, Any]) -> str | None:
    """The API a bare body (no Batch API wrapper) is written for, when it is not Chat
    Completions: Responses for ``input`` without ``messages``; Messages for a top-level
    ``system`` or a content block only Anthropic has."""
    if "input" in record and "messages" not in record:
        return "responses"
    if "messages" not in record:
        return None
    if "system" in record:
        return "anthropic"
    messages = record.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, Mapping) and block.get("type") in _ANTHROPIC_ONLY and "image_url" not in block:
                return "anthropic"
    return None


def native_view(
    body: Mapping[str, Any], api: str, where: str, *, schema: bool, max_tokens: int | None = None
) -> ChatView:
    """The body in the common shape (``--max-tokens`` set in it); an InvalidInputError
    naming the line and field (a Messages body without ``max_tokens`` and no
    ``--max-tokens`` is one, as Anthropic refuses it)."""
    if schema:
        raise InvalidInputError(
            f"{where}: --schema cannot go with a line written for another API; "
            "give its answer's shape in the line itself (text.format, or a tool)"
        )
    if body.get("stream"):
        raise InvalidInputError(f"{where}: 'stream' is not supported in a batch job; remove it")
    if max_tokens is not None:
        body = {**body, _CAP[api]: max_tokens}
    try:
        return chat_from_messages(body) if api == "anthropic" else chat_from_responses(body)
    except ShapeError as exc:
        field = f" ({exc.param})" if exc.param and exc.param not in exc.message else ""
        raise InvalidInputError(f"{where}: {exc.message}{field}") from None


def with_native(
    request: Request,
    body: Mapping[str, Any],
    api: str,
    view: ChatView,
    *,
    max_tokens: int | None,
    temperature: float | None,
    system: str | None,
) -> Request:
    """``request`` (the translation, the job's flags applied) carrying the body, the same
    flags applied to it."""
    native = dict(body)
    if max_tokens is not None:
        native[_CAP[api]] = max_tokens
    if temperature is not None:
        native["temperature"] = temperature
    if system is not None:
        native.update(_with_system(native, api, system))
    return dataclasses.replace(request, native=Native(api, native, view.lost))


def _with_system(body: Mapping[str, Any], api: str, system: str) -> dict[str, Any]:
    if api == "responses":
        given = body.get("instructions")
        return {"instructions": f"{system}\n\n{given}" if isinstance(given, str) and given else system}
    given = body.get("system")
    if isinstance(given, list):
        return {"system": [{"type": "text", "text": system}, *given]}
    return {"system": f"{system}\n\n{given}" if isinstance(given, str) and given else system}
