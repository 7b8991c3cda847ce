"""Anthropic Messages: ``POST {base_url}/v1/messages`` with ``x-api-key`` and
``anthropic-version``; 529 means overloaded; limits come as ``anthropic-ratelimit-*``
headers whose resets are RFC 3339 timestamps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .._errors import ConfigError, MalformedResponseError
from .._limits import RateLimitSnapshot
from .._models import Deployment, Request, Usage
from ._base import Reply
from ._http import HttpProvider, header_number, resolve_key, token_count

__all__ = ["AnthropicProvider", "parse_rfc3339_reset"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
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


class AnthropicProvider(HttpProvider):
    name = "anthropic"
    request_id_header = "request-id"

    def endpoint(self, deployment: Deployment) -> tuple[str, dict[str, str]]:
        base = (deployment.base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        key = resolve_key(deployment, "ANTHROPIC_API_KEY")
        if not key:
            raise ConfigError(f"deployment {deployment.label!r}: no API key; set ANTHROPIC_API_KEY or give api_key_env")
        version = str(deployment.options.get("anthropic_version") or API_VERSION)
        return f"{base}/v1/messages", {"x-api-key": key.get(), "anthropic-version": version}

    def build_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        system: list[str] = []
        messages: list[Mapping[str, Any]] = []
        for message in request.messages:
            if message.get("role") == "system" and isinstance(message.get("content"), str):
                system.append(message["content"])
            else:
                messages.append(message)
        body: dict[str, Any] = {
            "model": deployment.model_name,
            "messages": messages,
            "max_tokens": request.max_tokens or deployment.default_max_tokens,
        }
        if system:
            body["system"] = "\n\n".join(system)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        body.update(request.params)
        return body

    def parse_reply(self, body: Mapping[str, Any]) -> Reply:
        content = body.get("content")
        if not isinstance(content, list) or (not content and body.get("stop_reason") != "end_turn"):
            raise MalformedResponseError("response has no content blocks")
        texts = [
            block.get("text", "") for block in content if isinstance(block, Mapping) and block.get("type") == "text"
        ]
        usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else {}
        assert isinstance(usage, Mapping)
        cache_read = token_count(usage.get("cache_read_input_tokens"))
        cache_write = token_count(usage.get("cache_creation_input_tokens"))
        return Reply(
            text="".join(texts) if texts else None,
            usage=Usage(
                input_tokens=token_count(usage.get("input_tokens")) + cache_read + cache_write,
                output_tokens=token_count(usage.get("output_tokens")),
                cached_input_tokens=cache_read,
                cache_write_tokens=cache_write,
            ),
            finish_reason=body.get("stop_reason"),
        )

    def parse_error(self, body: Any) -> tuple[str, str | None]:
        error = body.get("error") if isinstance(body, Mapping) else None
        if isinstance(error, Mapping):
            kind = error.get("type")
            return str(error.get("message") or "error"), str(kind) if kind else None
        return str(body)[:200], None

    def parse_ratelimit(self, headers: Mapping[str, str]) -> RateLimitSnapshot | None:
        prefix = "anthropic-ratelimit-"
        if prefix + "requests-remaining" not in headers and prefix + "tokens-remaining" not in headers:
            return None
        return RateLimitSnapshot(
            limit_requests=header_number(headers, prefix + "requests-limit"),
            remaining_requests=header_number(headers, prefix + "requests-remaining"),
            reset_requests=parse_rfc3339_reset(headers.get(prefix + "requests-reset")),
            limit_tokens=header_number(headers, prefix + "tokens-limit"),
            remaining_tokens=header_number(headers, prefix + "tokens-remaining"),
            reset_tokens=parse_rfc3339_reset(headers.get(prefix + "tokens-reset")),
            # Anthropic's limits are per minute (RPM, input and output TPM; the tokens
            # headers show the most restrictive); the limiter converts them into the
            # deployment's window.
            requests_window=60.0,
            tokens_window=60.0,
        )
