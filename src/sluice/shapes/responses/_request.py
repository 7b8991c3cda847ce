"""A Responses API create body (``POST /v1/responses``) as a Chat Completions body.

:func:`chat_from_responses` checks the body as OpenAI's API does (a field OpenAI would
refuse with a 400 raises :class:`ShapeError` naming it, in OpenAI's words; see
``openai/types/responses/response_create_params.py``) and translates it. Each field is
either translated, dropped (it does not change the answer), lost (a chat deployment
cannot be told it: :attr:`ChatView.lost` says so and such a request may only go to a
deployment that speaks Responses) or refused:

- Translated: ``model``; ``instructions`` -> a leading ``system`` message (not carried
  over from earlier responses, as OpenAI does not); the stored ``history`` then
  ``input`` -> ``messages`` (see :mod:`._items`); ``max_output_tokens`` ->
  ``max_tokens``; ``temperature``, ``top_p``, ``service_tier``, ``prompt_cache_key``,
  ``parallel_tool_calls`` as they are; ``user`` (else ``safety_identifier``) -> ``user``;
  ``reasoning.effort`` -> ``reasoning_effort``; ``stream`` -> ``stream`` with
  ``stream_options.include_usage``; ``include: ["message.output_text.logprobs"]`` ->
  ``logprobs`` (and ``top_logprobs`` with it); tools, ``tool_choice`` and ``text`` (see
  :mod:`._tools`).
- Dropped: ``store``, ``metadata`` and ``previous_response_id`` (sluice keeps and echoes
  them; the caller resolves the previous response into ``history``), ``client_metadata``
  (what a client says of itself, as OpenAI's Codex CLI sends on every request), ``truncation``
  (a chat deployment behaves as ``disabled``: a conversation too long is refused, not
  cut; one that fits is answered alike), ``stream_options`` (obfuscation), ``background:
  false``, ``max_tool_calls`` (it counts built-in tools' calls only), the prompt-cache
  settings but its key (``prompt_cache_retention``, ``prompt_cache_options``), ``image``
  (context compression), ``reasoning.summary``/``generate_summary``/``context`` (a chat
  deployment gives no reasoning items), ``top_logprobs`` without logprobs included, and
  ``include`` values about reasoning, images or built-in tools' items.
- Lost: ``background: true``, ``conversation``, ``prompt`` (a template OpenAI keeps),
  ``moderation``, ``context_management``, ``access_programs``, ``reasoning.mode`` other
  than ``standard``, logprobs in a stream (sluice's stream deltas carry none), and what
  the items and tools modules say.
- Refused: a body that is not an object; a field of the wrong type or out of range
  (``temperature`` 0-2, ``top_p`` 0-1, ``max_output_tokens`` >= 16, ``top_logprobs``
  0-20, ``metadata`` at most 16 keys of 64 characters with string values of 512,
  ``safety_identifier`` 128, integers within 64 bits); a field or enum value OpenAI does
  not have (as the openai SDK of the test extra knows them: a newer field is refused
  until added here); text that is not valid Unicode, a number that is not finite; no
  input at all; ``stream_options`` without ``stream``; ``previous_response_id`` with
  ``conversation``; ``tool_choice`` naming no given tool, or ``required`` with no tools;
  ``json_object`` when no message says "json"; and the item errors of
  :mod:`._items` (an output with no call, a call with no output...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._common import ChatView, ShapeError
from ._fields import (
    at,
    check_json,
    invalid_value,
    missing,
    read_array,
    read_bool,
    read_enum,
    read_int,
    read_number,
    read_object,
    read_str,
    wrong_type,
)
from ._items import Conversation
from ._tools import chat_text_format, chat_tool_choice, chat_tools

__all__ = ["INCLUDABLE", "KNOWN_FIELDS", "chat_from_responses"]

#: Every field of a create body (ResponseCreateParamsBase, and ``stream``).
KNOWN_FIELDS = frozenset(
    {
        "access_programs",
        "background",
        "background_options",
        "client_metadata",
        "context_management",
        "conversation",
        "image",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "moderation",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
    }
)
#: response_includable.py
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)
_LOGPROBS = "message.output_text.logprobs"
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SUMMARIES = ("auto", "concise", "detailed")
_TIERS = ("auto", "default", "flex", "scale", "priority", "fast", "ultrafast")
#: Fields a chat deployment has nothing for, whenever they are set.
_LOST = {
    "conversation": "conversation (a conversation OpenAI keeps)",
    "prompt": "prompt (a prompt template OpenAI keeps)",
    "moderation": "moderation (OpenAI's moderation of the input and the answer)",
    "context_management": "context_management (OpenAI's compaction of a long context)",
    "access_programs": "access_programs (OpenAI's access programs)",
}


def chat_from_responses(body: Any, history: Sequence[Mapping[str, Any]] = ()) -> ChatView:
    """The Chat Completions body for a Responses create ``body``, after ``history``: the
    stored items of the earlier responses (:func:`conversation_items`), which the caller
    found from ``previous_response_id``. Raises :class:`ShapeError` for what OpenAI refuses."""
    if not isinstance(body, Mapping):
        raise ShapeError("The request body must be a JSON object.", None, "invalid_type")
    check_json(body)
    lost: list[str] = []
    for key in body:  # newer than sluice: a Responses deployment is sent it, any other refuses it
        if key not in KNOWN_FIELDS:
            name = key if isinstance(key, str) else repr(key)
            lost.append(f"{name} (a parameter sluice does not know, so cannot translate)")
    model = read_str(body, "model", "", required=True, nonempty=True)
    chat: dict[str, Any] = {"model": model, "messages": _messages(body, history, lost)}
    _sampling(body, chat)
    _identity(body, chat)
    _reasoning(body, chat, lost)
    tools = chat_tools(body, lost)
    choice = chat_tool_choice(body, tools, lost)
    parallel = read_bool(body, "parallel_tool_calls")
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    chat_text_format(body, chat)
    stream = read_bool(body, "stream") or False
    if read_object(body, "stream_options") is not None and not stream:
        raise ShapeError(
            "Invalid 'stream_options': stream_options is only allowed when 'stream' is true.",
            "stream_options",
            "invalid_value",
        )
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    _include(body, chat, stream, lost)
    _kept(body, lost)
    return ChatView(body=chat, lost=tuple(lost))


def _messages(body: Mapping[str, Any], history: Sequence[Mapping[str, Any]], lost: list[str]) -> list[dict[str, Any]]:
    conversation = Conversation()
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise ShapeError("The stored conversation of 'previous_response_id' is not a list of items.", "history")
    for i, item in enumerate(history):
        conversation.add(item, at("history", i))
    given = body.get("input")
    if isinstance(given, str):
        conversation.add({"type": "message", "role": "user", "content": given}, "input")
    elif isinstance(given, (list, tuple)):
        for i, item in enumerate(given):
            conversation.add(item, at("input", i))
    elif given is not None:
        raise wrong_type("input", "one of a string or array of input items", given)
    messages = conversation.messages()
    lost.extend(conversation.lost)
    instructions = read_str(body, "instructions", "")
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": instructions})
    if not messages:
        if given is None:
            raise missing("input")
        raise ShapeError(
            "Invalid 'input': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            "input",
            "empty_array",
        )
    return messages


def _sampling(body: Mapping[str, Any], chat: dict[str, Any]) -> None:
    max_tokens = read_int(body, "max_output_tokens", minimum=16)
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    temperature = read_number(body, "temperature", minimum=0, maximum=2)
    if temperature is not None:
        chat["temperature"] = temperature
    top_p = read_number(body, "top_p", minimum=0, maximum=1)
    if top_p is not None:
        chat["top_p"] = top_p
    read_int(body, "max_tool_calls", minimum=1)  # dropped: built-in tools' calls only
    read_int(body, "top_logprobs", minimum=0, maximum=20)


def _identity(body: Mapping[str, Any], chat: dict[str, Any]) -> None:
    """Who asks, and how OpenAI should serve it (fields Chat Completions shares)."""
    user = read_str(body, "user", "")
    safety = read_str(body, "safety_identifier", "", max_length=128)
    if user is not None or safety is not None:
        chat["user"] = user if user is not None else safety
    tier = read_enum(body, "service_tier", "", _TIERS)
    if tier is not None:
        chat["service_tier"] = tier
    key = read_str(body, "prompt_cache_key", "")
    if key is not None:
        chat["prompt_cache_key"] = key


def _reasoning(body: Mapping[str, Any], chat: dict[str, Any], lost: list[str]) -> None:
    reasoning = read_object(body, "reasoning")
    if reasoning is None:
        return
    effort = read_enum(reasoning, "effort", "reasoning", _EFFORTS)
    if effort is not None:
        chat["reasoning_effort"] = effort
    read_enum(reasoning, "summary", "reasoning", _SUMMARIES)
    read_enum(reasoning, "generate_summary", "reasoning", _SUMMARIES)
    read_enum(reasoning, "context", "reasoning", ("auto", "current_turn", "all_turns"))
    mode = read_str(reasoning, "mode", "reasoning")
    if mode not in (None, "standard"):
        lost.append(f"reasoning.mode {mode!r} (a mode of OpenAI's reasoning models)")


def _include(body: Mapping[str, Any], chat: dict[str, Any], stream: bool, lost: list[str]) -> None:
    include = read_array(body, "include") or []
    for i, value in enumerate(include):
        if not isinstance(value, str):
            raise wrong_type(at("include", i), "a string", value)
        if value not in INCLUDABLE:
            raise invalid_value(at("include", i), value, INCLUDABLE)
    if _LOGPROBS not in include:
        return
    if stream:
        lost.append("include message.output_text.logprobs with stream (sluice's stream deltas carry no logprobs)")
        return
    chat["logprobs"] = True
    top = read_int(body, "top_logprobs", minimum=0, maximum=20)
    if top:
        chat["top_logprobs"] = top


def _kept(body: Mapping[str, Any], lost: list[str]) -> None:
    """Fields sluice keeps or drops: checked, not sent; and the ones that are lost."""
    read_bool(body, "store")
    read_str(body, "previous_response_id", "", nonempty=True)
    read_enum(body, "truncation", "", ("auto", "disabled"))
    read_enum(body, "prompt_cache_retention", "", ("in_memory", "24h"))
    read_object(body, "prompt_cache_options")
    read_object(body, "image")
    read_object(body, "client_metadata")
    _metadata(body)
    if read_bool(body, "background"):
        lost.append("background (a response OpenAI runs in the background, to be polled)")
    else:
        read_object(body, "background_options")
    if body.get("conversation") is not None:
        if not isinstance(body["conversation"], (str, Mapping)):
            raise wrong_type("conversation", "one of a string or object", body["conversation"])
        if body.get("previous_response_id") is not None:
            raise ShapeError(
                "Invalid 'conversation': it cannot be used together with 'previous_response_id'.",
                "conversation",
                "invalid_value",
            )
    for name, words in _LOST.items():
        if body.get(name) is not None:
            lost.append(words)


def _metadata(body: Mapping[str, Any]) -> None:
    metadata = read_object(body, "metadata")
    if metadata is None:
        return
    if len(metadata) > 16:
        raise ShapeError(
            "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an "
            f"object with {len(metadata)} properties instead.",
            "metadata",
            "object_above_max_properties",
        )
    for key in metadata:
        if not isinstance(key, str):
            raise wrong_type("metadata", "an object with string keys", metadata)
        if len(key) > 64:
            raise ShapeError(
                "Invalid 'metadata': a key is too long. Expected keys of at most 64 characters, but got a key of "
                f"{len(key)} characters instead.",
                "metadata",
                "string_above_max_length",
            )
        read_str(metadata, key, "metadata", max_length=512)
        if metadata[key] is None:
            raise wrong_type(at("metadata", key), "a string", None)
