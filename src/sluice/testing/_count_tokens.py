"""``POST /v1/messages/count_tokens``, as Anthropic answers it: ``{"input_tokens": N}``
for a Messages body without its ``max_tokens``, counted by the fake's own tokenizer
(the same count a ``/v1/messages`` request of that body is billed). Not rate limited:
Anthropic limits token counting apart from messages. :class:`CountTokens` (``server.count_tokens``)
keeps when each call came, and may be turned off (``served = False``: a 404, as an
Anthropic-compatible server without the endpoint answers)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from ._formats import AnthropicFormat, ApiError, decode_body
from ._tokenizer import PromptCounter

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["CountTokens", "count_tokens"]


class CountTokens:
    """The fake's count endpoint: served or not, and the loop time of each call it answered."""

    def __init__(self) -> None:
        self.served = True
        self.calls: list[float] = []

    async def answer(
        self, request: web.BaseRequest, counter: PromptCounter, api_key: str | None, *, echo: bool = False
    ) -> web.Response:
        self.calls.append(asyncio.get_running_loop().time())
        return await count_tokens(request, counter, api_key, echo=echo)


async def count_tokens(
    request: web.BaseRequest, counter: PromptCounter, api_key: str | None, *, echo: bool = False
) -> web.Response:
    fmt = AnthropicFormat(counter)
    headers: Mapping[str, str] = request.headers
    try:
        fmt.check_auth(headers, api_key, echo=echo)
        body = decode_body(await request.read())
        if isinstance(body, dict) and "max_tokens" in body:
            raise ApiError(400, "invalid_request", "max_tokens: Extra inputs are not permitted", "max_tokens")
        call = fmt.parse({**body, "max_tokens": 1} if isinstance(body, dict) else body, headers)
    except ApiError as exc:
        return web.Response(
            status=exc.status, body=fmt.error(exc.kind, exc.message, exc.param), content_type="application/json"
        )
    return web.json_response({"input_tokens": call.prompt_tokens})
