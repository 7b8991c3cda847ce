"""Names the OpenAI <-> Anthropic translation shares between its request and reply sides."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["FINISH_REASONS", "JSON_TOOL_DESCRIPTION", "JSON_TOOL_NAME", "LEADING_USER_TEXT"]

#: JSON mode rides on a forced tool of this name (Anthropic's documented way to get JSON:
#: docs.anthropic.com/en/docs/build-with-claude/tool-use, "JSON mode"); a reply's call of
#: it comes back as ``message.content`` JSON text. A user tool may not take the name, so
#: a reply is never ambiguous.
JSON_TOOL_NAME = "sluice_json_output"
JSON_TOOL_DESCRIPTION = "Give the final answer as this tool's input: a JSON object."

#: The user turn put before a conversation that opens with an assistant message. Older
#: API versions refused that ("The first message must always use the user role"), the
#: current docs no longer say so; a one-word user turn is safe under both.
LEADING_USER_TEXT = "(continue)"

#: Anthropic ``stop_reason`` -> OpenAI ``finish_reason``; anything else (``pause_turn``)
#: passes through as it is, since Chat Completions has no word for it.
FINISH_REASONS: Mapping[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",  # OpenAI also says "length" at the window
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
