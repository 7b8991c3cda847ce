"""An Anthropic Messages request read into the common (Chat Completions) shape.

:func:`chat_from_messages` checks a ``/v1/messages`` body as Anthropic's API does,
raising :class:`ShapeError` (the field's path and why) where Anthropic answers 400, and
returns its :class:`ChatView`. :func:`check_count_tokens` does the same for a
``/v1/messages/count_tokens`` body (no ``max_tokens``).

Translated: ``system`` -> a first system message (text blocks joined by blank lines; a
``role: "system"`` message in the conversation stays where it is);
text, base64 and URL images, base64 PDFs (chat ``file`` parts), plain-text and content
documents (text parts); ``tool_use`` -> ``tool_calls``; ``tool_result`` -> ``role: "tool"``
messages (see :mod:`._content`); ``tools`` -> function tools, ``tool_choice``
(see :mod:`._tools`); ``stop_sequences`` -> ``stop``; ``metadata.user_id`` ->
``user`` (one longer than the 64 characters OpenAI takes as its SHA-256, still a stable
opaque id); ``temperature``, ``top_p`` and ``max_tokens`` as they are; ``stream``;
``output_config.format`` (structured output) -> ``response_format`` json_schema.

Dropped, because the answer means the same without them (the bar: a user of Claude Code
or the Anthropic SDK pointed at an OpenAI model gets the answer whenever it can be given):

* ``cache_control`` everywhere: a caching hint (OpenAI caches prompts by itself);
* ``thinking`` (checked, then dropped): whether and how long to think before answering,
  which a chat model decides by itself (``reasoning_effort`` is refused by models that do
  not reason, so it is not guessed); thinking blocks of earlier answers, which are signed
  for Claude only; ``output_config.effort`` likewise;
* ``top_k``: a sampling restriction Anthropic calls for "advanced use cases only";
* ``service_tier``, ``speed``, ``user_profile_id``, ``workspace_id``, ``diagnostics``:
  Anthropic capacity, accounting and observability;
* ``context_management``: server-side trimming of the history; without it the model
  reads the whole conversation (and a deployment whose window it exceeds says so);
* citations attached to an earlier answer's text (its words stay), ``strict`` and
  ``input_examples`` of a tool (the schema still shapes the call), an image's
  ``transformations``, a tool's ``cache_control``/``defer_loading``;
* ``is_error`` of a tool result is said in words ("Error: ..."), the only way a chat
  tool message can carry it; images and PDFs in a tool result follow in the user turn,
  since chat tool messages hold text only.

Lost (``ChatView.lost``: a chat deployment cannot be told it, so only a deployment that
speaks Messages may take the request, any other refuses it with these words): tools
Anthropic defines (web search and fetch, code execution, bash, text editor, computer,
memory, tool search) and blocks of server tools in the history, ``mcp_servers``,
``container``, ``search_result`` blocks, documents with ``citations`` enabled, files by
Anthropic ``file_id`` and PDFs by URL, images or documents in an assistant turn, a final
assistant message (a prefill: Claude continues it, a chat model answers it anew), more
than 4 stop sequences, a tool name longer than 64 characters, tools only Anthropic's code
execution may call and calls it made, ``inference_geo`` (a residency requirement), and
any field or block type sluice does not know.

Normalisations a round trip through :func:`sluice.providers._translate.anthropic_body`
shows: one text block becomes a plain string, system blocks one string, consecutive
messages of one role one message, tool results open their turn, tool inputs compact JSON.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from .._common import ChatView, ShapeError
from .._fields import compact_json, integer, number, obj, refuse, seq, shown, text
from ._content import chat_messages, text_part
from ._tools import ChatTools, chat_tool_choice, chat_tools, forces_a_tool

__all__ = ["MAX_STOP_SEQUENCES", "chat_from_messages", "check_count_tokens"]

#: Chat Completions' ``stop`` takes up to 4 sequences.
MAX_STOP_SEQUENCES = 4
_THINKING = ("enabled", "disabled", "adaptive", "between_tools")
_EFFORTS = ("low", "medium", "high", "xhigh", "max")
#: metadata_param.py / the API: an opaque id of at most 256 characters.
_MAX_USER_ID = 256
#: OpenAI refuses a ``user`` longer than 64 characters (Claude Code's ids are ~150).
_MAX_OPENAI_USER = 64
_TRANSLATED = frozenset(
    {"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "tools", "tool_choice"}
    | {"metadata", "output_config", "output_format", "stream", "thinking"}
)
#: Dropped fields and the check each gets first (None: any value).
_DROPPED: Mapping[str, tuple[str, ...] | None] = {
    "top_k": None,
    "service_tier": ("auto", "standard_only"),
    "speed": ("standard", "fast"),
    "cache_control": None,
    "context_management": None,
    "diagnostics": None,
    "user_profile_id": None,
    "workspace_id": None,
}
_LOST: Mapping[str, str] = {
    "mcp_servers": "MCP servers that Anthropic connects to",
    "container": "a container of Anthropic's code execution tool",
    "inference_geo": "where Anthropic must run the request",
}


def chat_from_messages(body: Any) -> ChatView:
    """A ``/v1/messages`` body as a Chat Completions body, and what of it is lost."""
    return _view(body, counting=False)


def check_count_tokens(body: Any) -> ChatView:
    """A ``/v1/messages/count_tokens`` body, checked as ``/v1/messages`` checks one (but
    ``max_tokens`` is not needed): the chat view the server counts the tokens of."""
    return _view(body, counting=True)


def _view(body: Any, *, counting: bool) -> ChatView:
    if not isinstance(body, Mapping):
        raise ShapeError("the request body must be a JSON object")
    lost: list[str] = []
    chat: dict[str, Any] = {"model": text(body.get("model"), "model", empty=False)}
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not counting:
        refuse("max_tokens", "Field required")
    if max_tokens is not None:
        max_tokens = integer(max_tokens, "max_tokens", low=1)
    if "messages" not in body:
        refuse("messages", "Field required")
    messages = chat_messages(body["messages"], lost)
    system = _system(body.get("system"))
    chat["messages"] = [{"role": "system", "content": system}, *messages] if system else messages
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = number(body[name], name, low=0.0, high=1.0)
    _stop(body.get("stop_sequences"), chat, lost)
    tools = chat_tools(body["tools"], lost) if body.get("tools") is not None else ChatTools([], frozenset())
    if tools.functions:
        chat["tools"] = tools.functions
    if body.get("tool_choice") is not None:
        chat.update(chat_tool_choice(body["tool_choice"], tools))
    _thinking(body.get("thinking"), max_tokens, body.get("tool_choice"))
    _output(body, chat)
    _metadata(body.get("metadata"), chat)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        refuse("stream", f"must be a boolean, got {shown(stream)}")
    if stream and not counting:
        chat["stream"] = True
    _others(body, lost)
    return ChatView(chat, tuple(lost))


def _system(value: Any) -> str:
    if value is None or isinstance(value, str):
        return text(value or "", "system")
    blocks = seq(value, "system")
    texts = []
    for number_, item in enumerate(blocks):
        where = f"system[{number_}]"
        block = obj(item, where)
        if block.get("type") != "text":
            refuse(f"{where}.type", f"system holds only text blocks, not {shown(block.get('type'))}")
        texts.append(str(text_part(block, where)["text"]))
    return "\n\n".join(texts)


def _stop(value: Any, chat: dict[str, Any], lost: list[str]) -> None:
    if value is None:
        return
    stops = [text(s, f"stop_sequences[{n}]", empty=False) for n, s in enumerate(seq(value, "stop_sequences"))]
    for n, stop in enumerate(stops):
        if not stop.strip():
            refuse(f"stop_sequences[{n}]", "stop sequences must contain non-whitespace characters")
    if len(stops) > MAX_STOP_SEQUENCES:
        lost.append(f"stop_sequences: {len(stops)} of them; Chat Completions takes at most {MAX_STOP_SEQUENCES}")
    elif stops:
        chat["stop"] = stops


def _thinking(value: Any, max_tokens: int | None, tool_choice: Any) -> None:
    """Checked as Anthropic checks it; then dropped (see the module's docstring)."""
    if value is None:
        return
    thinking = obj(value, "thinking")
    kind = thinking.get("type")
    if kind not in _THINKING:
        refuse("thinking.type", f"must be one of {', '.join(map(repr, _THINKING))}, got {shown(kind)}")
    if kind == "enabled":
        budget = integer(thinking.get("budget_tokens"), "thinking.budget_tokens", low=1024)
        if max_tokens is not None and budget >= max_tokens:
            refuse("thinking.budget_tokens", f"must be less than max_tokens ({max_tokens}), got {budget}")
        if forces_a_tool(tool_choice):
            refuse("tool_choice", "Thinking may not be enabled when tool_choice forces tool use.")
    display = thinking.get("display")
    if display not in (None, "summarized", "omitted"):
        refuse("thinking.display", f"must be 'summarized' or 'omitted', got {shown(display)}")


def _output(body: Mapping[str, Any], chat: dict[str, Any]) -> None:
    """``output_config`` (and the older beta ``output_format``): the format becomes a
    ``response_format`` json_schema, without ``strict`` (OpenAI's strict mode takes only a
    subset of JSON Schema; sluice can validate the answer against the schema instead)."""
    config = obj(body["output_config"], "output_config") if body.get("output_config") is not None else {}
    effort = config.get("effort")
    if effort is not None and effort not in _EFFORTS:
        refuse("output_config.effort", f"must be one of {', '.join(map(repr, _EFFORTS))}, got {shown(effort)}")
    where, spec = "output_config.format", config.get("format")
    if spec is None and body.get("output_format") is not None:
        where, spec = "output_format", body["output_format"]
    if spec is None:
        return
    spec = obj(spec, where)
    if spec.get("type") != "json_schema":
        refuse(f"{where}.type", f"must be 'json_schema', got {shown(spec.get('type'))}")
    schema = obj(spec.get("schema"), f"{where}.schema")
    compact_json(schema, f"{where}.schema")
    chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": dict(schema)}}


def _metadata(value: Any, chat: dict[str, Any]) -> None:
    if value is None:
        return
    user_id = obj(value, "metadata").get("user_id")
    if user_id is None:
        return
    user_id = text(user_id, "metadata.user_id")
    if len(user_id) > _MAX_USER_ID:
        refuse("metadata.user_id", f"must be at most {_MAX_USER_ID} characters, got {len(user_id)}")
    if len(user_id) > _MAX_OPENAI_USER:  # a stable opaque id still: what both fields are for
        user_id = hashlib.sha256(user_id.encode()).hexdigest()
    if user_id:
        chat["user"] = user_id


def _others(body: Mapping[str, Any], lost: list[str]) -> None:
    """The fields that are not translated: checked and dropped, lost, or unknown (lost)."""
    for name, value in body.items():
        if name in _TRANSLATED or value is None:
            continue
        if name in _DROPPED:
            allowed = _DROPPED[name]
            if allowed is not None and value not in allowed:
                refuse(name, f"must be one of {', '.join(map(repr, allowed))}, got {shown(value)}")
            if name == "top_k":
                integer(value, name, low=0)
        elif name in _LOST:
            if value not in ([], {}, ""):
                lost.append(f"{name}: {_LOST[name]}; a Chat Completions deployment cannot be told it")
        else:
            lost.append(f"{shown(name)}: a field sluice does not know; a Chat Completions deployment cannot be told it")
