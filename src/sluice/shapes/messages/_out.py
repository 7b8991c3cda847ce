"""A Chat Completions answer written as an Anthropic Message (message.py, usage.py).

:func:`message_from_chat` takes the ``chat.completion`` that ``Result.raw`` holds. When
that answer came from an Anthropic deployment, its own body is kept there under
``provider_response``, and that is returned as it is (with the model renamed): the
exact blocks, ``stop_sequence`` and cache counts. Otherwise it is built:

* ``content``: a text block with the answer's text, then one ``tool_use`` block per tool
  call. A call's ``arguments`` are parsed: empty is ``{}``; text that is not a JSON object
  (a model's broken or cut-off JSON) comes as ``{"_unparsed_arguments": "<text>"}``:
  Anthropic's ``input`` is always an object, and the client's tool then refuses it in
  words the model reads, as it would an invalid input, without the text being lost;
* a ``refusal`` is the answer's text, and its stop reason ``refusal``;
* ``stop_reason``: stop -> end_turn, length -> max_tokens, tool_calls/function_call ->
  tool_use (also when a provider says "stop" but called tools), content_filter ->
  refusal. A chat answer does not say which stop sequence ended it, so ``stop_sequence``
  is null and a stop there reads as end_turn;
* ``usage``: Anthropic's ``input_tokens`` leave out the cached ones, OpenAI's include them.

Tool-use ids are made valid for Anthropic (``^[a-zA-Z0-9_-]+$``): a client sends them
back in its next request, which must pass Anthropic's own check (:mod:`._in`)
and may even go to a Claude deployment.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from ..._models import Usage
from ...providers._anthropic_names import JSON_TOOL_NAME

__all__ = [
    "UNPARSED_ARGUMENTS",
    "message_from_chat",
    "message_id",
    "stop_reason_for",
    "tool_input",
    "tool_use_id",
    "usage_from",
]

UNPARSED_ARGUMENTS = "_unparsed_arguments"
_NOT_ID = re.compile(r"[^a-zA-Z0-9_-]")
_STOP_REASONS: Mapping[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
#: stop_reason.py
_ANTHROPIC_REASONS = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", "model_context_window_exceeded"}
)


def message_from_chat(completion: Mapping[str, Any], *, model: str, usage: Usage | None = None) -> dict[str, Any]:
    """An Anthropic Message for a ``chat.completion`` dict. ``usage``, when given (a
    Result's), is the count used: it knows cache writes, which the chat body does not."""
    native = completion.get("provider_response")
    if _is_message(native):
        assert isinstance(native, Mapping)
        message = dict(native)
        message["model"] = model
        message["id"] = message_id(native.get("id"))
        if usage is not None:
            message["usage"] = usage_from(usage)
        return message
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    said = choice.get("message")
    said = said if isinstance(said, Mapping) else {}
    content: list[dict[str, Any]] = []
    words = _text(said.get("content"))
    refusal = said.get("refusal") if isinstance(said.get("refusal"), str) else None
    if words or refusal:
        content.append({"type": "text", "text": words or refusal})
    calls = said.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        block = _tool_use(call.get("function") if isinstance(call, Mapping) else None, call)
        if block is not None:
            content.append(block)
    if isinstance(said.get("function_call"), Mapping):  # the deprecated form: one call, no id
        block = _tool_use(said["function_call"], {})
        if block is not None:
            content.append(block)
    called = any(block["type"] == "tool_use" for block in content)
    reason = "refusal" if refusal and not words else stop_reason_for(choice.get("finish_reason"), tool_use=called)
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": None,
        "usage": usage_from(usage if usage is not None else _chat_usage(completion.get("usage"))),
    }


def usage_from(usage: Usage) -> dict[str, int]:
    """sluice's Usage (input counts the cached tokens) in Anthropic's shape (it does not)."""
    cached = max(usage.cached_input_tokens, 0)
    written = max(usage.cache_write_tokens, 0)
    return {
        "input_tokens": max(usage.input_tokens - cached - written, 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "output_tokens": max(usage.output_tokens, 0),
    }


def stop_reason_for(finish_reason: Any, *, tool_use: bool) -> str:
    """Anthropic's ``stop_reason`` for a chat ``finish_reason`` (one of Anthropic's own,
    such as ``pause_turn``, is kept); ``tool_use``: the answer called tools."""
    reason = _STOP_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None
    if reason is None:
        reason = finish_reason if finish_reason in _ANTHROPIC_REASONS else "end_turn"
    return "tool_use" if tool_use and reason == "end_turn" else str(reason)


def message_id(value: Any) -> str:
    """``msg_...`` from a completion's id (kept recognisable), or a fresh one."""
    if isinstance(value, str) and value:
        cleaned = _NOT_ID.sub("_", value)
        return cleaned if cleaned.startswith("msg_") else f"msg_{cleaned}"
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id(value: Any) -> str:
    """A tool call's id as Anthropic takes one (``^[a-zA-Z0-9_-]+$``), or a fresh one."""
    if isinstance(value, str) and value:
        return _NOT_ID.sub("_", value)
    return f"toolu_{uuid.uuid4().hex[:24]}"


def _is_message(body: Any) -> bool:
    """An Anthropic Message whose content means what it says to the client (not one that
    answered through JSON mode's tool, which the client never defined)."""
    if not isinstance(body, Mapping) or body.get("type") != "message" or not isinstance(body.get("content"), list):
        return False
    blocks = body["content"]
    return all(isinstance(b, Mapping) for b in blocks) and not any(b.get("name") == JSON_TOOL_NAME for b in blocks)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some providers answer with text parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def _tool_use(function: Any, call: Any) -> dict[str, Any] | None:
    if not isinstance(function, Mapping) or not isinstance(call, Mapping):
        return None
    name = function.get("name")
    arguments = function.get("arguments")
    return {
        "type": "tool_use",
        "id": tool_use_id(call.get("id")),
        "name": name if isinstance(name, str) else "",
        "input": tool_input(arguments),
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A call's ``arguments`` as Anthropic's ``input`` object (see the module's docstring)."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        parsed = None
    return parsed if isinstance(parsed, dict) else {UNPARSED_ARGUMENTS: arguments}


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def _chat_usage(raw: Any) -> Usage:
    usage = raw if isinstance(raw, Mapping) else {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, Mapping) else {}
    return Usage(
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
        cached_input_tokens=_count(details.get("cached_tokens")),
        cache_write_tokens=_count(details.get("cache_write_tokens")),
    )
