"""Other APIs' request and answer shapes, as pure functions.

sluice's common request is OpenAI's Chat Completions shape (``Request.messages`` and
``Request.params``). ``sluice serve`` also speaks Anthropic's Messages API and OpenAI's
Responses API: a body in either shape is read into a :class:`~._common.ChatView` (the
common shape, and what of the body it cannot carry), and answers and streams are written
back in the client's shape. Nothing here does I/O.

One sub-package per API, ``messages/`` (Anthropic's) and ``responses/`` (OpenAI's), beside
what both share: ``_common`` (:class:`~._common.ChatView`, :class:`~._common.ShapeError`)
and ``_fields`` (one field checked for its type). Neither API imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._models import Request

__all__ = ["native_request"]

#: Fields of a translated body that are the Request's own (the rest go as ``params``).
_OWN = frozenset({"model", "messages", "max_tokens", "temperature", "stream", "stream_options"})


def native_request(body: Mapping[str, Any], api: str, *, model: str | None = None, id: str | None = None) -> Request:
    """A :class:`~sluice.Request` for a body written for another API: ``"anthropic"`` (a
    Messages body) or ``"responses"`` (a Responses body), checked as that API checks it.

    The request carries the body (``Request.native``: a deployment of that API is sent it
    as it is) and its Chat Completions translation (what any other is sent). ``model``
    is the one sluice routes by (default: the body's). Raises
    :class:`~sluice.InvalidRequestError` naming the field for a body its API would refuse.
    """
    from .._errors import InvalidRequestError
    from .._models import Native, Request
    from ._common import ShapeError

    if api == "anthropic":
        from .messages._in import chat_from_messages as read
    elif api == "responses":
        from .responses._request import chat_from_responses as read
    else:
        raise InvalidRequestError(f"api must be 'anthropic' or 'responses', got {api!r}")
    try:
        view = read(body)
    except ShapeError as exc:
        raise InvalidRequestError(f"a {api} body: {exc.message}") from None
    chat = view.body
    return Request(
        model=model or chat["model"],
        messages=chat["messages"],
        max_tokens=chat.get("max_tokens"),
        temperature=chat.get("temperature"),
        params={key: value for key, value in chat.items() if key not in _OWN},
        id=id,
        native=Native(api, dict(body), view.lost),
    )
