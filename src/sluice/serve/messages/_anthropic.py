"""What makes ``sluice serve`` look like Anthropic's API to an Anthropic client.

A request is an Anthropic client's when it goes to ``/v1/messages...`` or carries an
``anthropic-version`` header (the anthropic SDK always sends one; no OpenAI client does).
Its key may come as ``x-api-key`` (or ``Authorization: Bearer``), and every error it gets
is Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, with
Anthropic's status codes: the server's refusals are written once, in OpenAI's shape, and
:func:`anthropic_shaped` rewrites them on the way out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ... import _json
from ...shapes.messages._errors import anthropic_error_body, error_type_for

__all__ = ["anthropic_error", "anthropic_model", "anthropic_shaped", "from_anthropic_client"]

#: Headers kept when an error is rewritten (Retry-After tells the SDK when to retry).
_KEPT = ("retry-after", "retry-after-ms", "x-request-id")


def from_anthropic_client(request: web.BaseRequest) -> bool:
    return request.path.startswith("/v1/messages") or "anthropic-version" in request.headers


def anthropic_error(
    status: int, message: str, *, kind: str | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An Anthropic-shaped error response; ``kind`` defaults to the status's type."""
    body = anthropic_error_body(kind or error_type_for(status), message)
    return web.Response(body=_json.dumps(body), status=status, content_type="application/json", headers=headers)


def anthropic_shaped(response: web.StreamResponse) -> web.StreamResponse:
    """An OpenAI-shaped error response as Anthropic would send it (anything else as it is).

    The status moves where Anthropic's differs: a spent budget is a 402 ``billing_error``
    (OpenAI's 429 ``insufficient_quota`` would be retried by the SDK), sluice's 503 (it
    cannot take the request now) is Anthropic's 529 ``overloaded_error``."""
    if not isinstance(response, web.Response) or response.status < 400 or not isinstance(response.body, bytes):
        return response
    try:
        payload = _json.loads(response.body)
    except ValueError:
        return response
    error = payload.get("error") if isinstance(payload, Mapping) else None
    if not isinstance(error, Mapping) or payload.get("type") == "error":
        return response
    status = response.status
    kind: str | None = None
    if error.get("code") == "insufficient_quota":
        status = 402
    elif status == 503:
        status = 529
    elif status == 408:
        kind = "timeout_error"
    headers = {name: response.headers[name] for name in _KEPT if name in response.headers}
    shaped = anthropic_error(status, str(error.get("message") or "error"), kind=kind, headers=headers)
    if response.keep_alive is False:
        shaped.force_close()
    return shaped


def anthropic_model(name: str) -> dict[str, Any]:
    """A model as Anthropic's ``GET /v1/models`` lists it."""
    return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
