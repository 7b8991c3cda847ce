"""A provider batch's result line read once into the answer it holds.

The Batch API's own reader (``BatchAPI.reply``) turns a line into a Reply or the typed
error of a failed request, and on the way encodes the answer's body again to hand it to
the provider's reader, which decodes it again: three JSON passes a line. Here a line is
decoded once and the provider's ``parse_reply`` reads the body as it is; a line that is
not a plain answer (a failure, an odd shape) gives None, for the full reader to explain.
Both give the same Reply for the same line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _json
from .providers._base import make_reply

if TYPE_CHECKING:
    from .providers import HttpProvider, Reply

__all__ = ["item_reply", "plain_reply"]


def plain_reply(api: str, line: bytes, provider: HttpProvider) -> Reply | None:
    """The answer in ``line`` of ``api``'s (``openai``: Files + Batches; ``anthropic``:
    Message Batches) batch results, or None when it holds none that reads plainly."""
    try:
        item = _json.loads(line)
    except ValueError:
        return None
    return item_reply(api, item, provider)


def item_reply(api: str, item: Any, provider: HttpProvider) -> Reply | None:
    """:func:`plain_reply` of a result line decoded already (``item``)."""
    if not isinstance(item, Mapping):
        return None
    if api == "anthropic":
        result = item.get("result")
        if not isinstance(result, Mapping) or result.get("type") != "succeeded":
            return None
        return _read(provider, result.get("message") or {}, None)
    response = item.get("response")
    if not isinstance(response, Mapping) or response.get("status_code") != 200:
        return None
    request_id = response.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        return None
    return _read(provider, response.get("body") or {}, request_id)


def _read(provider: HttpProvider, body: Any, request_id: str | None) -> Reply | None:
    if not isinstance(body, Mapping):
        return None
    try:
        reply = provider.parse_reply(body)
    except (AttributeError, KeyError, TypeError, ValueError):  # a body of the wrong shape
        return None
    raw = body if reply.raw is None else reply.raw
    return make_reply(
        text=reply.text, usage=reply.usage, raw=raw, finish_reason=reply.finish_reason, request_id=request_id
    )
