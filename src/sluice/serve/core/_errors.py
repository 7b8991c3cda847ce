"""Errors as OpenAI sends them: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the server returns goes through :func:`openai_error`, so clients written
for OpenAI (the official SDKs map status codes to exception classes and read
``error.message``/``error.code``) understand sluice's refusals and passed-on upstream
failures alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

__all__ = ["UPSTREAM_AUTH", "openai_error", "plain", "upstream_auth_failed"]

#: Unicode's bidirectional controls (embeddings, overrides, isolates, marks): in a name a
#: client sent, they would reorder the server's own words around it wherever it is shown.
_BIDI = dict.fromkeys(map(ord, "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"))

#: The engine's error kinds for a provider refusing the server's own key (401, 403).
UPSTREAM_AUTH = frozenset({"authentication_error", "permission_denied"})


def openai_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",  # OpenAI's field name
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An OpenAI-shaped error response. ``message`` must hold no key or upstream URL (its
    bidi controls are taken out here)."""
    body = {"error": {"message": plain(message), "type": type, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def upstream_auth_failed(status: int | None) -> str:
    """What a client is told when the provider refused the server's own key: never the
    provider's words, which may quote part of that key (they go to the operator's log)."""
    said = f" (HTTP {status})" if status else ""
    return (
        f"upstream refused the server's own credentials for this deployment{said}; "
        "the server's operator must fix the deployment's key"
    )


def plain(text: str) -> str:
    """``text`` without bidirectional control characters."""
    return text.translate(_BIDI)
