"""Errors as OpenAI sends them: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the server returns goes through :func:`openai_error`, so clients written
for OpenAI (the official SDKs map status codes to exception classes and read
``error.message``/``error.code``) understand sluice's refusals and passed-on upstream
failures alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

__all__ = ["openai_error"]


def openai_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",  # OpenAI's field name
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An OpenAI-shaped error response. ``message`` must hold no key or upstream URL."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)
