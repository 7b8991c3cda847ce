"""OpenAI's Responses API as the fake speaks it: ``POST /v1/responses``.

The same deterministic answer as its Chat Completions for the same prompt (``echo:`` and
the start of the last user message), its prompt counted by the fake's own tokenizer
(``instructions`` and every input item included), the same limits, faults and errors
(OpenAI's JSON shape). The answer is a Response object: a ``message`` output item with
one ``output_text`` part, ``status`` ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` when ``max_output_tokens`` cut it; a ``function_call`` item instead
when ``tool_choice`` forces a function (``required``, or one by name), its arguments
``{"echo": <the text>}`` as the chat format's streamed call has them.

It refuses, as the API does, what it does not take: a missing or malformed ``input``,
parameters of other APIs (``messages``, ``response_format``...), Chat Completions' shapes
of tools and content parts, ``max_output_tokens`` below 16. It stores nothing, so a
request that needs stored state (``previous_response_id``, ``conversation``, an
``item_reference``, ``background``) is refused: a client must send the whole history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn

from ._cache_usage import responses_details
from ._formats import ApiError, Call, ErrorKind, OpenAIFormat, check_cache_fields, dumps, reply_text

__all__ = ["ResponsesFormat", "forced_function", "output_item", "output_text", "response_object", "response_skeleton"]

#: Every parameter of ``responses.create`` (openai-python's response_create_params.py).
_PARAMS = frozenset(
    {
        "access_programs",
        "background",
        "background_options",
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
#: Where Chat Completions' parameters went in the Responses API.
_MOVED = {
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
}
_ROLES = ("assistant", "system", "developer", "user")
#: The content parts of an input message, by role.
_INPUT_PARTS = ("input_text", "input_image", "input_file")
_OUTPUT_PARTS = ("output_text", "refusal")
#: The least ``max_output_tokens`` the API takes.
MIN_OUTPUT_TOKENS = 16


class Asked(NamedTuple):
    """What a Response echoes of its request (``Call.extra``), and the function it must call."""

    echo: dict[str, Any]
    tool: str | None


def _refuse(message: str, param: str | None = None, kind: ErrorKind = "invalid_request") -> NoReturn:
    raise ApiError(400, kind, message, param)


def _missing(param: str) -> NoReturn:
    _refuse(f"Missing required parameter: '{param}'.", param, "missing")


def _type_name(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array"}
    return "null" if value is None else names.get(type(value), "an object")


def _expect(value: Any, kinds: tuple[type, ...], param: str, what: str) -> None:
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        _refuse(
            f"Invalid type for '{param}': expected {what}, but got {_type_name(value)} instead.", param, "invalid_type"
        )


def _one_of(value: Any, allowed: tuple[str, ...], param: str) -> None:
    if value not in allowed:
        listed = ", ".join(f"'{a}'" for a in allowed[:-1]) + f", and '{allowed[-1]}'"
        shown = f"'{value}'" if isinstance(value, str) else json.dumps(value)
        _refuse(f"Invalid value: {shown}. Supported values are: {listed}.", param, "invalid_value")


class ResponsesFormat(OpenAIFormat):
    """OpenAI Responses (see the module): its errors, headers and auth are Chat Completions'."""

    api = "responses"

    def parse(self, body: Any, headers: Mapping[str, str]) -> Call:
        if not isinstance(body, dict):
            _refuse("The request body must be a JSON object.")
        for key in body:
            if key in _MOVED:
                _refuse(f"Unsupported parameter: '{key}'. In the Responses API, use '{_MOVED[key]}'.", key, "unknown")
            if key not in _PARAMS:
                _refuse(f"Unknown parameter: '{key}'.", key, "unknown")
        if not isinstance(body.get("model"), str) or not body["model"]:
            _missing("model")
        _check_stored(body)
        check_cache_fields(body)
        for name in ("stream", "store", "parallel_tool_calls"):
            if body.get(name) is not None:
                _expect(body[name], (bool,), name, "a boolean")
        if body.get("instructions") is not None:
            _expect(body["instructions"], (str,), "instructions", "a string")
        for name in ("temperature", "top_p"):
            if body.get(name) is not None:
                _expect(body[name], (int, float), name, "a number")
        limit = _output_limit(body.get("max_output_tokens"))
        _check_stream_options(body.get("stream_options"))
        items = _input_items(body)
        _check_tools(body.get("tools"), body.get("tool_choice"))
        _check_text(body.get("text"))
        messages = [item for item in items if item.get("type", "message") == "message"]
        text = reply_text(messages or [{"role": "user", "content": ""}])
        asked = Asked(_echo(body), forced_function(body))
        return Call(body["model"], limit or 1024, self.counter.responses(body), text, asked)

    def success(self, n: int, call: Call, completion: int, cut: bool, created: int) -> bytes:
        return dumps(response_object(n, call, completion, cut, created))

    def empty(self, n: int, model: str, created: int) -> bytes:
        body = response_skeleton(n, Call(model, 0, 0, "", Asked(_echo({}), None)), created, "completed")
        return dumps({**body, "usage": _usage(0, 0, None)})

    def too_long(self, prompt: int, limit: int, window: int) -> tuple[str, str]:
        return "Your input exceeds the context window of this model. Please adjust your input and try again.", "input"


def _check_stored(body: Mapping[str, Any]) -> None:
    """What would need a stored response or conversation: the fake stores nothing."""
    previous = body.get("previous_response_id")
    if previous is not None:
        message = f"Previous response with id {previous!r} not found (the fake provider stores no responses)."
        _refuse(message, "previous_response_id", "not_stored")
    if body.get("conversation") is not None:
        _refuse("Conversation not found (the fake provider stores no conversations).", "conversation")
    if body.get("background"):
        _refuse("background: the fake provider answers at once and stores nothing to poll.", "background")


def _output_limit(value: Any) -> int | None:
    if value is None:
        return None
    _expect(value, (int,), "max_output_tokens", "an integer")
    if value < MIN_OUTPUT_TOKENS:
        message = (
            "Invalid 'max_output_tokens': integer below minimum value. "
            f"Expected a value >= {MIN_OUTPUT_TOKENS}, but got {value} instead."
        )
        _refuse(message, "max_output_tokens", "below_minimum")
    return int(value)


def _check_stream_options(options: Any) -> None:
    if options is None:
        return
    _expect(options, (dict,), "stream_options", "an object")
    for key in options:
        if key != "include_obfuscation":
            _refuse(f"Unknown parameter: 'stream_options.{key}'.", f"stream_options.{key}", "unknown")


def _input_items(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The input as items (a string is one user message), each checked."""
    given = body.get("input")
    if given is None:
        _missing("input")
    _expect(given, (str, list), "input", "a string or an array of input items")
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    for index, item in enumerate(given):
        where = f"input[{index}]"
        _expect(item, (dict,), where, "an object")
        kind = item.get("type", "message")
        if kind == "message":
            _check_message(where, item)
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    _missing(f"{where}.{name}")
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                _missing(f"{where}.call_id")
            _expect(item.get("output"), (str, list), f"{where}.output", "a string or an array")
        elif kind == "item_reference":
            _refuse(f"Item with id {item.get('id')!r} not found (the fake provider stores no items).", where)
    return list(given)


def _check_message(where: str, item: Mapping[str, Any]) -> None:
    if "role" not in item:
        _missing(f"{where}.role")
    _one_of(item["role"], _ROLES, f"{where}.role")
    content = item.get("content")
    if content is None:
        _missing(f"{where}.content")
    _expect(content, (str, list), f"{where}.content", "a string or an array of content parts")
    allowed = _OUTPUT_PARTS if item["role"] == "assistant" else _INPUT_PARTS
    for number, part in enumerate(content if isinstance(content, list) else ()):
        param = f"{where}.content[{number}]"
        _expect(part, (dict,), param, "an object")
        _one_of(part.get("type"), allowed, f"{param}.type")
        if part["type"] in ("input_text", "output_text") and not isinstance(part.get("text"), str):
            _missing(f"{param}.text")


def _check_tools(tools: Any, choice: Any) -> None:
    if tools is not None:
        _expect(tools, (list,), "tools", "an array")
        for index, tool in enumerate(tools):
            _expect(tool, (dict,), f"tools[{index}]", "an object")
            if tool.get("type") == "function" and not isinstance(tool.get("name"), str):  # not chat's {"function": ...}
                _missing(f"tools[{index}].name")
    if isinstance(choice, dict) and choice.get("type") == "function" and not isinstance(choice.get("name"), str):
        _missing("tool_choice.name")
    if choice is not None and not isinstance(choice, dict):
        _one_of(choice, ("none", "auto", "required"), "tool_choice")


def _check_text(text: Any) -> None:
    if text is None:
        return
    _expect(text, (dict,), "text", "an object")
    spec = text.get("format")
    if spec is None:
        return
    _expect(spec, (dict,), "text.format", "an object")
    _one_of(spec.get("type"), ("text", "json_schema", "json_object"), "text.format.type")
    if spec["type"] == "json_schema":
        if not isinstance(spec.get("name"), str):  # chat's {"json_schema": {"name": ...}} has none here
            _missing("text.format.name")
        _expect(spec.get("schema"), (dict,), "text.format.schema", "an object")


def forced_function(body: Mapping[str, Any]) -> str | None:
    """The function ``tool_choice`` makes the answer call: ``required`` (the first one) or
    one by name; None when the model may answer in text."""
    choice, tools = body.get("tool_choice"), body.get("tools")
    functions = [t for t in tools or () if isinstance(t, Mapping) and t.get("type") == "function"]
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return str(choice.get("name"))
    if choice == "required" and functions:
        return str(functions[0].get("name"))
    return None


def _echo(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's settings, as a Response repeats them."""
    text = body.get("text") or {}
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}, **text},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "user": body.get("user"),
    }


def _usage(prompt: int, completion: int, call: Call | None) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": responses_details(None if call is None else call.cache),
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_skeleton(n: int, call: Call, created: int, status: str) -> dict[str, Any]:
    """Response ``n`` without its output and usage (as ``response.created`` shows it)."""
    echo = call.extra.echo if isinstance(call.extra, Asked) else {}
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": call.model,
        "output": [],
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "usage": None,
        **echo,
    }


def output_item(n: int, call: Call, cut: bool, *, done: bool = True) -> dict[str, Any]:
    """The answer's output item: as the Response holds it (``done``), or as
    ``response.output_item.added`` shows it beginning."""
    tool = call.extra.tool if isinstance(call.extra, Asked) else None
    status = "in_progress" if not done else "incomplete" if cut else "completed"
    if tool is not None:
        arguments = json.dumps({"echo": call.text}) if done else ""
        item = {"id": f"fc_{n}", "type": "function_call", "status": status, "arguments": arguments}
        return {**item, "call_id": f"call_{n}", "name": tool}
    content = [output_text(call.text)] if done else []
    return {"id": f"msg_{n}", "type": "message", "status": status, "role": "assistant", "content": content}


def output_text(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_object(n: int, call: Call, completion: int, cut: bool, created: int) -> dict[str, Any]:
    """The whole Response ``n`` (``cut``: ``max_output_tokens`` stopped it)."""
    body = response_skeleton(n, call, created, "incomplete" if cut else "completed")
    body["output"] = [output_item(n, call, cut)]
    body["usage"] = _usage(call.prompt_tokens, completion, call)
    if cut:
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        body["completed_at"] = created
    return body
