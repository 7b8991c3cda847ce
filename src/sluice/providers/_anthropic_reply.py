"""An Anthropic Messages reply read into the common (OpenAI) shape (see :mod:`._translate`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import MalformedResponseError
from .._models import Usage
from ._anthropic_names import FINISH_REASONS, JSON_TOOL_NAME
from ._base import Reply
from ._http import token_count

__all__ = ["anthropic_reply", "anthropic_usage", "openai_completion"]


def anthropic_reply(body: Mapping[str, Any], *, created: int) -> Reply:
    """A Messages reply in the common shape; ``raw`` is an OpenAI ``chat.completion`` body
    (``created`` is its timestamp: Anthropic's reply has none) holding Anthropic's own
    body under ``"provider_response"``. Raises MalformedResponseError for a body that is
    not a Messages reply."""
    content = body.get("content")
    if not isinstance(content, list) or (not content and body.get("stop_reason") != "end_turn"):
        raise MalformedResponseError("response has no content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    answer: str | None = None
    for block in content:
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            name, arguments = block.get("name"), block.get("input")
            if not isinstance(name, str) or not isinstance(arguments, Mapping):
                raise MalformedResponseError("a tool_use block without a name or an input object")
            encoded = json.dumps(arguments, ensure_ascii=False)
            if name == JSON_TOOL_NAME:
                answer = encoded  # JSON mode: the tool's input is the answer
            else:
                function = {"name": name, "arguments": encoded}
                calls.append({"id": str(block.get("id", "")), "type": "function", "function": function})
    stop = body.get("stop_reason")
    finish = FINISH_REASONS.get(stop, stop) if isinstance(stop, str) else None
    if answer is not None and not calls and finish == "tool_calls":
        finish = "stop"
    text = answer if answer is not None else "".join(texts) if texts else None
    usage = _usage(body.get("usage"))
    return Reply(
        text=text,
        usage=usage,
        raw=openai_completion(body, text=text, tool_calls=calls, finish_reason=finish, usage=usage, created=created),
        finish_reason=finish,
    )


def _usage(raw: Any) -> Usage:
    return anthropic_usage(raw if isinstance(raw, Mapping) else {})


def anthropic_usage(usage: Mapping[str, Any]) -> Usage:
    """A Messages ``usage`` in sluice's terms: ``input_tokens`` counts the cache's reads and
    writes too (Anthropic's leave them out; OpenAI's ``prompt_tokens`` include them), and the
    writes made for an hour (``cache_creation.ephemeral_1h_input_tokens``, billed at twice
    the input price) are told apart from the 5-minute ones."""
    cache_read = token_count(usage.get("cache_read_input_tokens"))
    cache_write = token_count(usage.get("cache_creation_input_tokens"))
    creation = usage.get("cache_creation")
    hour = token_count(creation.get("ephemeral_1h_input_tokens")) if isinstance(creation, Mapping) else 0
    return Usage(
        input_tokens=token_count(usage.get("input_tokens")) + cache_read + cache_write,
        output_tokens=token_count(usage.get("output_tokens")),
        cached_input_tokens=cache_read,
        cache_write_tokens=cache_write,
        cache_write_1h_tokens=min(hour, cache_write),
    )


def openai_completion(
    body: Mapping[str, Any],
    *,
    text: str | None,
    tool_calls: Sequence[Mapping[str, Any]],
    finish_reason: str | None,
    usage: Usage,
    created: int,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` body for an Anthropic reply, so a consumer of a
    fallback sees one shape; Anthropic's body is kept whole under ``provider_response``."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [dict(call) for call in tool_calls]
    return {
        "id": body.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": body.get("model"),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        },
        "provider_response": dict(body),
    }
