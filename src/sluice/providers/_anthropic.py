"""Anthropic Messages: ``POST {base_url}/v1/messages`` with ``x-api-key`` and
``anthropic-version``; 529 means overloaded; limits come as ``anthropic-ratelimit-*``
headers whose resets are RFC 3339 timestamps. Requests arrive in the common (OpenAI)
shape and are translated both ways by :mod:`._translate`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .. import _json
from .._errors import ConfigError, MalformedResponseError
from .._limits import RateLimitSnapshot
from .._models import Deployment, Request
from .._ratelimit import make_snapshot
from ._anthropic_stream import AnthropicStreamDecoder
from ._base import Reply
from ._http import HttpProvider, header_number, missing_key_message, resolve_key, token_count
from ._translate import anthropic_body, anthropic_reply

__all__ = ["AnthropicProvider", "parse_rfc3339_reset"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
#: What ``count_tokens`` takes of a Messages body (it refuses the rest: max_tokens, stream...).
_COUNTED = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers"})
API_VERSION = "2023-06-01"


def parse_rfc3339_reset(value: str | None, now: float | None = None) -> float | None:
    """Seconds from ``now`` (wall clock) until an RFC 3339 timestamp; None if unreadable."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, moment.timestamp() - current)


#: What ``anthropic-ratelimit-{kind}-{limit,remaining,reset}`` headers come in.
_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


def _figures(headers: Mapping[str, str], kind: str) -> tuple[float | None, float | None, float | None]:
    """(limit, remaining, seconds to reset) of one kind of ``anthropic-ratelimit-*`` header."""
    prefix = f"anthropic-ratelimit-{kind}-"
    return (
        header_number(headers, prefix + "limit"),
        header_number(headers, prefix + "remaining"),
        parse_rfc3339_reset(headers.get(prefix + "reset")),
    )


class AnthropicProvider(HttpProvider):
    name = "anthropic"
    request_id_header = "request-id"

    def endpoint(self, deployment: Deployment) -> tuple[str, dict[str, str]]:
        base = (deployment.base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        key = resolve_key(deployment, "ANTHROPIC_API_KEY")
        if not key:
            raise ConfigError(missing_key_message(deployment, "ANTHROPIC_API_KEY"))
        version = str(deployment.options.get("anthropic_version") or API_VERSION)
        return f"{base}/v1/messages", {"x-api-key": key.get(), "anthropic-version": version}

    def speaks(self, deployment: Deployment) -> str:
        """A Messages body (``Request.native``) is sent as the client wrote it."""
        return "anthropic"

    def build_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        """The request translated from the common (OpenAI) shape; raises
        InvalidRequestError, before anything is sent, for what Anthropic cannot be told."""
        return anthropic_body(request, model=deployment.model_name, default_max_tokens=deployment.default_max_tokens)

    def parse_reply(self, body: Mapping[str, Any]) -> Reply:
        """Text, OpenAI tool calls and finish reason; ``raw`` an OpenAI chat.completion
        holding Anthropic's body under ``provider_response``."""
        return anthropic_reply(body, created=int(time.time()))

    def parse_error(self, body: Any) -> tuple[str, str | None]:
        error = body.get("error") if isinstance(body, Mapping) else None
        if isinstance(error, Mapping):
            kind = error.get("type")
            return str(error.get("message") or "error"), str(kind) if kind else None
        return str(body)[:200], None

    def parse_ratelimit(self, headers: Mapping[str, str]) -> RateLimitSnapshot | None:
        """The ``anthropic-ratelimit-*`` headers, per minute (the limiter converts them
        into the deployment's window). ``input-tokens-*`` and ``output-tokens-*`` are
        ITPM and OTPM, each a limit of its own; ``tokens-*`` is only the more restrictive
        of the two at the moment, so where those are given it is not read as a limit on
        all tokens (input and output together would then be held to the smaller one)."""
        figures = {kind: _figures(headers, kind) for kind in _KINDS}
        if all(remaining is None and limit is None for limit, remaining, _ in figures.values()):
            return None
        split = any(value is not None for kind in ("input-tokens", "output-tokens") for value in figures[kind][:2])
        requests, given, output = figures["requests"], figures["input-tokens"], figures["output-tokens"]
        tokens = (None, None, None) if split else figures["tokens"]
        return make_snapshot(
            *requests,
            *tokens,
            requests_window=60.0,
            tokens_window=60.0,
            limit_input_tokens=given[0],
            remaining_input_tokens=given[1],
            reset_input_tokens=given[2],
            limit_output_tokens=output[0],
            remaining_output_tokens=output[1],
            reset_output_tokens=output[2],
        )

    async def count_tokens(self, body: Mapping[str, Any], deployment: Deployment) -> int:
        """Anthropic's own count of a Messages body's input tokens
        (``POST /v1/messages/count_tokens``; its model name put in). Raises the
        ProviderError of a refusal, as a send would."""
        url = self.url_for(deployment) + "/count_tokens"
        asked = {key: value for key, value in body.items() if key in _COUNTED}
        asked["model"] = deployment.model_name
        payload, request_id, _ = await self.post(deployment, self._encode(asked), url=url)
        try:
            answer = _json.loads(payload)
            return token_count(answer["input_tokens"]) if isinstance(answer, Mapping) else 0
        except (KeyError, ValueError):
            raise MalformedResponseError(
                f"{deployment.label} answered count_tokens with an unexpected body", request_id=request_id
            ) from None

    def stream_decoder(self, deployment: Deployment, request_id: str | None) -> AnthropicStreamDecoder:
        """Messages' SSE events read into the common shape (see :mod:`._anthropic_stream`)."""
        return AnthropicStreamDecoder(deployment.label, request_id)
