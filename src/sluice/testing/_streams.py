"""Streamed answers as the APIs send them: the SSE frames the fake writes.

OpenAI: ``chat.completion.chunk`` objects in ``data:`` lines, a last chunk with the usage
when ``stream_options.include_usage`` is set, then ``data: [DONE]``. Anthropic:
``message_start``, ``content_block_start``, ``ping``, ``content_block_delta``\\ s,
``content_block_stop``, ``message_delta`` (stop reason, output usage), ``message_stop``.
Responses: typed events each with its ``sequence_number``, ``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``\\ s, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, then
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it).

A streamed request whose ``tool_choice`` forces a tool (OpenAI ``"required"`` or a named
function; Anthropic ``any`` or a named tool) is answered with a call of that tool (the
first one for ``required``/``any``) whose arguments are ``{"echo": <the reply text>}``,
streamed in pieces; otherwise the reply text comes in pieces of whole words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from ._cache_usage import anthropic_usage, chat_details
from ._formats import Call, dumps
from ._responses import forced_function, output_item, output_text, response_object, response_skeleton

__all__ = ["Frames", "StreamMode", "error_frame", "pieces", "stream_frames", "stream_mode"]

_WORDS = re.compile(r"\s*\S+\s*")


class StreamMode(NamedTuple):
    """How a request asked to be streamed."""

    #: OpenAI: a last chunk with the usage (``stream_options.include_usage``); Anthropic always.
    usage: bool
    #: The tool a forced ``tool_choice`` names, answered with a call instead of text.
    tool: str | None


class Frames(NamedTuple):
    """An answer's frames: sent at once, spread over the latency, and after the last piece."""

    head: list[bytes]
    body: list[bytes]
    tail: list[bytes]


def stream_mode(body: Any, api: str) -> StreamMode | None:
    """The request's stream mode (``api``: a Format's), or None when it is not a streamed request."""
    if not isinstance(body, Mapping) or body.get("stream") is not True:
        return None
    if api == "responses":  # its stream always ends with the usage
        return StreamMode(True, forced_function(body))
    options = body.get("stream_options")
    anthropic = api == "anthropic"
    usage = anthropic or (isinstance(options, Mapping) and options.get("include_usage") is True)
    return StreamMode(usage, _forced_tool(body, anthropic))


def _forced_tool(body: Mapping[str, Any], anthropic: bool) -> str | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], Mapping):
        return None
    if anthropic:
        first = tools[0].get("name")
        if isinstance(choice, Mapping) and choice.get("type") == "tool":
            return str(choice.get("name"))
        return str(first) if isinstance(choice, Mapping) and choice.get("type") == "any" else None
    function = tools[0].get("function")
    first = function.get("name") if isinstance(function, Mapping) else None
    if choice == "required":
        return str(first)
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return str(choice["function"].get("name"))
    return None


def pieces(text: str, most: int) -> list[str]:
    """``text`` in at most ``most`` pieces of whole words (at least one piece)."""
    words = _WORDS.findall(text) or [text]
    size = -(-len(words) // max(1, most))
    return ["".join(words[i : i + size]) for i in range(0, len(words), size)]


def _chop(text: str, most: int) -> list[str]:
    """``text`` in at most ``most`` pieces of about equal length."""
    size = max(1, -(-len(text) // max(1, most)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stream_frames(
    api: str, n: int, call: Call, completion: int, cut: bool, created: int, mode: StreamMode, most: int
) -> Frames:
    """The frames of answer ``n`` (``cut``: ``max_tokens`` stopped it)."""
    if api == "anthropic":
        return _anthropic(n, call, completion, cut, mode, most)
    if api == "responses":
        return _responses(n, call, completion, cut, created, most)
    return _openai(n, call, completion, cut, created, mode, most)


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + dumps(data) + b"\n\n"


def _openai(n: int, call: Call, completion: int, cut: bool, created: int, mode: StreamMode, most: int) -> Frames:
    base: dict[str, Any] = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": created}
    base["model"] = call.model

    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        extra = {"usage": None} if mode.usage else {}
        return _sse({**base, "choices": [choice], **extra})

    head = [chunk({"role": "assistant", "content": "" if mode.tool is None else None})]
    if mode.tool is None:
        body = [chunk({"content": piece}) for piece in pieces(call.text, most)]
        finish = "length" if cut else "stop"
    else:
        start = {"index": 0, "id": f"call_{n}", "type": "function", "function": {"name": mode.tool, "arguments": ""}}
        head.append(chunk({"tool_calls": [start]}))
        arguments = _chop(json.dumps({"echo": call.text}), most)
        body = [chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}) for piece in arguments]
        finish = "length" if cut else "tool_calls"
    tail = [chunk({}, finish)]
    if mode.usage:
        usage: dict[str, Any] = {"prompt_tokens": call.prompt_tokens, "completion_tokens": completion}
        usage["total_tokens"] = call.prompt_tokens + completion
        if call.cache is not None:  # what the prompt cache served, as the body says it
            usage["prompt_tokens_details"] = chat_details(call.cache)
        tail.append(_sse({**base, "choices": [], "usage": usage}))
    tail.append(b"data: [DONE]\n\n")
    return Frames(head, body, tail)


def _anthropic(n: int, call: Call, completion: int, cut: bool, mode: StreamMode, most: int) -> Frames:
    given = anthropic_usage(call.prompt_tokens, call.cache)
    usage = {"input_tokens": given.pop("input_tokens"), "output_tokens": 1, **given}
    message: dict[str, Any] = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": call.model}
    message["content"] = []
    message |= {"stop_reason": None, "stop_sequence": None, "usage": usage}
    head = [_sse({"type": "message_start", "message": message}, "message_start")]
    if mode.tool is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in pieces(call.text, most)]
        stop = "max_tokens" if cut else "end_turn"
    else:
        block = {"type": "tool_use", "id": f"toolu_{n}", "name": mode.tool, "input": {}}
        arguments = _chop(json.dumps({"echo": call.text}), most)
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in arguments]
        stop = "max_tokens" if cut else "tool_use"
    head.append(_sse({"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start"))
    head.append(_sse({"type": "ping"}, "ping"))
    body = [_sse({"type": "content_block_delta", "index": 0, "delta": d}, "content_block_delta") for d in deltas]
    end = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
    tail = [
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse({**end, "usage": {"output_tokens": completion}}, "message_delta"),
        _sse({"type": "message_stop"}, "message_stop"),
    ]
    return Frames(head, body, tail)


def error_frame(api: str, sequence_number: int = 0) -> bytes:
    """The error an API sends mid-stream when the server fails (Anthropic: overloaded;
    Responses: an ``error`` event, its details nested as OpenAI sends them, numbered
    ``sequence_number``)."""
    if api == "anthropic":
        return _sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error")
    message = "The server had an error while processing your request. Sorry about that!"
    error = {"message": message, "type": "server_error", "param": None, "code": None}
    if api == "responses":
        error["code"] = "server_error"
        return _sse({"type": "error", "sequence_number": sequence_number, "error": error}, "error")
    return _sse({"error": error})


def _responses(n: int, call: Call, completion: int, cut: bool, created: int, most: int) -> Frames:
    item = output_item(n, call, cut)
    place: dict[str, Any] = {"item_id": item["id"], "output_index": 0}
    text = {**place, "content_index": 0}
    head: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_skeleton(n, call, created, "in_progress")},
        {"type": "response.in_progress", "response": response_skeleton(n, call, created, "in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": output_item(n, call, cut, done=False)},
    ]
    if item["type"] == "function_call":
        arguments = item["arguments"]
        body = [{"type": "response.function_call_arguments.delta", **place, "delta": p} for p in _chop(arguments, most)]
        tail = [{"type": "response.function_call_arguments.done", **place, "arguments": arguments}]
    else:
        head.append({"type": "response.content_part.added", **text, "part": output_text("")})
        body = [
            {"type": "response.output_text.delta", **text, "delta": piece, "logprobs": []}
            for piece in pieces(call.text, most)
        ]
        tail = [
            {"type": "response.output_text.done", **text, "text": call.text, "logprobs": []},
            {"type": "response.content_part.done", **text, "part": output_text(call.text)},
        ]
    tail.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    end = "response.incomplete" if cut else "response.completed"
    tail.append({"type": end, "response": response_object(n, call, completion, cut, created)})
    events = [*head, *body, *tail]
    frames = [_sse({**event, "sequence_number": number}, event["type"]) for number, event in enumerate(events)]
    middle = len(head) + len(body)
    return Frames(frames[: len(head)], frames[len(head) : middle], frames[middle:])
