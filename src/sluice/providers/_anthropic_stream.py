"""Anthropic Messages streaming: typed SSE events.

``message_start`` (the input usage), ``content_block_start`` / ``content_block_delta`` /
``content_block_stop`` (``text_delta``; ``input_json_delta`` for a ``tool_use`` block),
``message_delta`` (the stop reason and the output usage so far), ``message_stop``,
``ping``, and ``error`` (e.g. ``overloaded_error`` mid-stream). Event types the API adds
later are ignored, as its documentation asks; so are ``thinking`` deltas (not text).

Read into the common (OpenAI) shape as :func:`._translate.anthropic_reply` reads a whole
reply: stop reasons become OpenAI finish reasons; tool calls are numbered 0, 1, ... in
the order their blocks start; the input of JSON mode's tool (``JSON_TOOL_NAME``) is the
answer's text, so it streams as text deltas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._errors import MalformedResponseError, ProviderError, error_for_status
from ._anthropic_names import FINISH_REASONS, JSON_TOOL_NAME
from ._anthropic_reply import anthropic_usage
from ._events import Finish, StreamEvent, StreamStart, TextDelta, ToolCallDelta, UsageUpdate
from ._http import token_count
from ._sse import SseError, SseEvent, typed_data

__all__ = ["ERROR_STATUS", "AnthropicStreamDecoder"]

#: The error types of Anthropic's ``error`` event, as the status the same error has
#: when it comes as a response (so it is classified, and retried, the same way).
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class AnthropicStreamDecoder:
    """Events in, sluice's stream events out; ``close()`` checks the stream really ended."""

    __slots__ = ("_answer_block", "_blocks", "_label", "_request_id", "_usage", "done")

    def __init__(self, label: str, request_id: str | None) -> None:
        self._label = label
        self._request_id = request_id
        self._usage: dict[str, Any] = {}
        #: Content block index -> tool-call number, for the ``tool_use`` blocks.
        self._blocks: dict[int, int] = {}
        #: The content block index of JSON mode's tool, whose input is the answer's text.
        self._answer_block: int | None = None
        #: ``message_stop`` arrived.
        self.done = False

    def feed(self, sse: SseEvent) -> list[StreamEvent]:
        if self.done or sse.event == "ping":
            return []
        try:
            kind, data = typed_data(sse)
        except SseError as exc:
            raise self._malformed(str(exc)) from None
        try:
            return self._event(kind, data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # an event of the wrong shape
            raise self._malformed(f"an unexpected {kind!r} event ({type(exc).__name__}: {exc})") from None

    def close(self) -> list[StreamEvent]:
        if not self.done:
            raise self._malformed("a stream that ended before message_stop")
        return []

    def _event(self, kind: str, data: Mapping[str, Any]) -> list[StreamEvent]:
        if kind == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                return [TextDelta(delta["text"])] if delta["text"] else []
            if delta["type"] == "input_json_delta":
                if data["index"] == self._answer_block:
                    return [TextDelta(delta["partial_json"])] if delta["partial_json"] else []
                return [ToolCallDelta(self._blocks[data["index"]], arguments=delta["partial_json"])]
            return []
        if kind == "content_block_start":
            block = data["content_block"]
            if block["type"] == "tool_use" and block.get("name") == JSON_TOOL_NAME:
                self._answer_block = data["index"]
                return []
            if block["type"] == "tool_use":
                number = self._blocks[data["index"]] = len(self._blocks)
                given = block.get("input")
                arguments = json.dumps(given) if given else ""  # streamed tool input starts as {}
                return [ToolCallDelta(number, id=block.get("id"), name=block.get("name"), arguments=arguments)]
            if block["type"] == "text" and block.get("text"):
                return [TextDelta(block["text"])]
            return []
        if kind == "message_start":
            message = data["message"]
            answer_id, model = message.get("id"), message.get("model")
            start = StreamStart(
                id=answer_id if isinstance(answer_id, str) else None, model=model if isinstance(model, str) else None
            )
            return [start, *self._usage_from(message.get("usage"))]
        if kind == "message_delta":
            events = self._usage_from(data.get("usage"))
            reason = data["delta"].get("stop_reason")
            if isinstance(reason, str) and reason:
                finish = FINISH_REASONS.get(reason, reason)
                if finish == "tool_calls" and not self._blocks:  # only JSON mode's tool: an answer
                    finish = "stop"
                events.append(Finish(finish))
            return events
        if kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise self._error(data.get("error"))
        return []  # content_block_stop, and event types added after this was written

    def _usage_from(self, usage: Any) -> list[StreamEvent]:
        """The usage so far: ``message_delta`` counts are cumulative and may repeat the input's."""
        if not isinstance(usage, Mapping):
            return []
        for name in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            if name in usage and usage[name] is not None:
                self._usage[name] = token_count(usage[name])
        creation = usage.get("cache_creation")
        if isinstance(creation, Mapping) and creation.get("ephemeral_1h_input_tokens") is not None:
            self._usage["cache_creation"] = {"ephemeral_1h_input_tokens": creation["ephemeral_1h_input_tokens"]}
        # as AnthropicProvider.parse_reply counts it: input includes the cached parts
        return [UsageUpdate(anthropic_usage(self._usage))]

    def _malformed(self, what: str) -> MalformedResponseError:
        return MalformedResponseError(f"{self._label} streamed {what}", request_id=self._request_id)

    def _error(self, error: Any) -> ProviderError:
        """An ``error`` event (status 200 already gone): classified as the same error would
        be as a response; the work may have been billed."""
        kind = str(error.get("type")) if isinstance(error, Mapping) and error.get("type") else None
        message = str(error.get("message") or "error") if isinstance(error, Mapping) else "error"
        cls = error_for_status(ERROR_STATUS.get(kind or "", 500))
        return cls(
            f"{self._label} sent an error mid-stream: {message}",
            request_id=self._request_id,
            provider_type=kind,
            maybe_billed=True,
        )
