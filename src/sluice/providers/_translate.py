"""OpenAI Chat Completions <-> Anthropic Messages, as pure functions.

sluice's common request shape is OpenAI's (``Request.messages`` and ``Request.params``
as Chat Completions takes them), so a fallback from OpenAI to Anthropic only works if
the body is translated. :func:`anthropic_body` does that, or raises
:class:`~sluice.InvalidRequestError` naming the field and why, before anything is sent:
an untranslatable request is that request's error, never an upstream 400. What is
already Anthropic (content blocks, tools with ``input_schema``, ``tool_choice``
objects, ``system``, ``stop_sequences``, ``thinking``...) passes through unchanged, and
so does any parameter that is not one of Chat Completions' own.

:func:`anthropic_reply` (:mod:`._anthropic_reply`) reads a Messages reply into the common
shape: text, OpenAI ``tool_calls``, OpenAI finish reasons, and an OpenAI
``chat.completion`` body as ``Reply.raw`` with Anthropic's own body under
``"provider_response"``.

Sources relied on (Anthropic's OpenAPI-generated types in anthropic-sdk-python,
``src/anthropic/types/``: ``message_create_params.py``, ``content_block_param.py``,
``document_block_param.py``, ``base64_image_source_param.py``, ``tool_result_block_param.py``,
``metadata_param.py``, ``stop_reason.py``, ``tool_choice_*``; the API's own 400 messages
as quoted in anthropics/claude-code and anthropic-sdk-python issues #494, #849; and
LiteLLM's ``litellm/llms/anthropic/chat/transformation.py`` and
``prompt_templates/factory.py`` for the same mapping done elsewhere). The decisions
where the two APIs differ are written beside the code that makes them.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .._errors import InvalidRequestError
from .._models import Request
from ._anthropic_names import FINISH_REASONS, JSON_TOOL_DESCRIPTION, JSON_TOOL_NAME, LEADING_USER_TEXT
from ._anthropic_reply import anthropic_reply, openai_completion

__all__ = [
    "FINISH_REASONS",
    "JSON_TOOL_NAME",
    "LEADING_USER_TEXT",
    "anthropic_body",
    "anthropic_reply",
    "openai_completion",
]

#: Content block types Anthropic takes in ``messages`` (content_block_param.py): passed through.
_ANTHROPIC_BLOCKS = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
        "mid_conv_system",
        "mcp_tool_use",
        "mcp_tool_result",
    }
)
#: base64_image_source_param.py: the only image types Anthropic decodes.
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_TOOL_CHOICES = frozenset({"auto", "any", "tool", "none"})

# No library in our dependencies parses RFC 2397 data URLs, and only the base64 form
# matters here (it is what OpenAI's image_url and file_data carry): one regular expression.
_DATA_URL = re.compile(r"data:(?P<media>[^;,]*)(?P<params>(?:;[^;,]*)*?);base64,(?P<data>.*)", re.DOTALL)
# metadata_param.py: user_id must not identify a person (no email, no phone number).
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_PHONE = re.compile(r"\+?[\d\s().-]{7,}")


def _refuse(where: str, why: str) -> NoReturn:
    raise InvalidRequestError(f"cannot translate to Anthropic Messages: {where}: {why}")


# -- the request -------------------------------------------------------------------------


@dataclass(slots=True)
class _Turn:
    """One Anthropic turn: consecutive messages of one role merged (Anthropic combines
    consecutive same-role turns anyway, message_create_params.py; merging here keeps
    tool results first in their turn, which it requires)."""

    role: str
    blocks: list[dict[str, Any]]
    index: int  # the first message it came from, for error messages
    string: bool  # one message whose content was a plain string: sent back as a string


@dataclass(slots=True)
class _Params:
    """``Request.params`` with each key taken out as it is translated; what is left over
    is not Chat Completions' and passes through."""

    rest: dict[str, Any] = field(default_factory=dict)

    def take(self, name: str) -> Any:
        return self.rest.pop(name, None)


def anthropic_body(request: Request, *, model: str, default_max_tokens: int) -> dict[str, Any]:
    """The Messages body for an OpenAI-shaped (or already Anthropic-shaped) request.

    Raises :class:`~sluice.InvalidRequestError` for anything Anthropic cannot be told.
    """
    params = _Params(dict(request.params))
    system, turns = _messages(request.messages)
    body: dict[str, Any] = {"model": model, "messages": turns}
    native_system = params.take("system")
    if native_system is not None:
        system = _native_system(native_system) + system
    if system:
        body["system"] = _system_value(system)
    body["max_tokens"] = _max_tokens(request, params, default_max_tokens)
    _sampling(request, params, body)
    _tools(params, body)
    _user(params, body)
    _refused_or_dropped(params)
    body.update(params.rest)  # Anthropic's own (thinking, top_k, service_tier...) and newer ones
    _check_thinking(body)
    return body


def _messages(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system text blocks, Anthropic messages)."""
    system: list[dict[str, Any]] = []
    turns: list[_Turn] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        if role in ("system", "developer"):
            # Anthropic has only a top-level system prompt. A system message after the
            # first turn is lifted there too, in order (as LiteLLM does): its words reach
            # the model as instructions, its position is lost. (The newest API has a
            # ``mid_conv_system`` block; not every model takes it, so it is not used.)
            system.extend(_system_blocks(message.get("content"), where))
            continue
        if role == "user":
            turn_role, blocks = "user", _content_blocks(message.get("content"), where, "user")
        elif role == "assistant":
            turn_role, blocks = "assistant", _assistant_blocks(message, where)
        elif role == "tool":
            turn_role, blocks = "user", [_tool_result(message, where)]
        elif role == "function":
            _refuse(where, "role 'function' (the deprecated function-calling form) has no call id; use tools")
        else:
            _refuse(where, f"role {role!r} has no Anthropic equivalent (user, assistant, system, developer, tool)")
        string = isinstance(message.get("content"), str) and role != "tool" and not message.get("tool_calls")
        if turns and turns[-1].role == turn_role:
            turns[-1].blocks.extend(blocks)
            turns[-1].string = False
        else:
            turns.append(_Turn(turn_role, blocks, index, string))
    return system, _finish_turns(turns)


def _finish_turns(turns: list[_Turn]) -> list[dict[str, Any]]:
    if not turns:
        _refuse("messages", "there is no user or assistant message; Anthropic needs at least one")
    if turns[0].role == "assistant":
        turns.insert(0, _Turn("user", [{"type": "text", "text": LEADING_USER_TEXT}], 0, True))
    last = turns[-1]
    if last.role == "assistant" and last.blocks and last.blocks[-1].get("type") == "text":
        # Anthropic refuses a final assistant turn (a prefill) that ends in whitespace
        text = str(last.blocks[-1]["text"]).rstrip()
        if text:
            last.blocks[-1] = {**last.blocks[-1], "text": text}
        else:
            del last.blocks[-1]
    if last.role == "assistant" and not last.blocks:
        turns.pop()  # an empty prefill says nothing
    out = []
    for turn in turns:
        if not turn.blocks:
            _refuse(
                f"messages[{turn.index}]",
                "the message is empty; Anthropic requires content in every message but a final assistant one",
            )
        if turn.role == "user":  # tool results must open the turn that answers a tool use
            turn.blocks.sort(key=lambda block: block.get("type") != "tool_result")
        if turn.string and len(turn.blocks) == 1:
            out.append({"role": turn.role, "content": turn.blocks[0]["text"]})
        else:
            out.append({"role": turn.role, "content": turn.blocks})
    return out


def _system_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        _refuse(where, "a system message's content must be a string or a list of text parts")
    blocks = []
    for number, part in enumerate(content):
        block = _content_part(part, f"{where}.content[{number}]", "system")
        if block is not None:
            blocks.append(block)
    return blocks


def _native_system(value: Any) -> list[dict[str, Any]]:
    """An Anthropic ``system`` given in params (a string or text blocks)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else []
    if isinstance(value, list) and all(isinstance(b, Mapping) and b.get("type") == "text" for b in value):
        return [dict(b) for b in value]
    _refuse("params.system", "must be a string or a list of text blocks")


def _system_value(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One string (texts joined by blank lines) unless a block carries more than its text
    (``cache_control``, ``citations``): then the blocks, which Anthropic also takes."""
    if all(set(block) == {"type", "text"} for block in blocks):
        return "\n\n".join(str(block["text"]) for block in blocks)
    return blocks


def _content_blocks(content: Any, where: str, role: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    if not isinstance(content, list):
        _refuse(f"{where}.content", "must be a string or a list of content parts")
    blocks = []
    for number, part in enumerate(content):
        block = _content_part(part, f"{where}.content[{number}]", role)
        if block is not None:
            blocks.append(block)
    return blocks


def _content_part(part: Any, where: str, role: str) -> dict[str, Any] | None:
    """One OpenAI content part as an Anthropic block (None: an empty or whitespace-only
    text, dropped: Anthropic refuses such text blocks, "text content blocks must contain
    non-whitespace text"). A tool message may hold images and files too: Anthropic's
    tool results do (tool_result_block_param.py)."""
    if isinstance(part, str):
        part = {"type": "text", "text": part}
    if not isinstance(part, Mapping):
        _refuse(where, f"a content part must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            _refuse(where, "a text part needs a string 'text'")
        extra = {k: part[k] for k in ("cache_control", "citations") if part.get(k) is not None}
        return {"type": "text", "text": text, **extra} if text.strip() else None
    if role == "system":
        _refuse(where, f"a system message may hold only text parts, not {kind!r}")
    if kind == "refusal" and role == "assistant":
        refusal = part.get("refusal")
        return {"type": "text", "text": refusal} if isinstance(refusal, str) and refusal else None
    if kind == "image_url" and role in ("user", "tool"):
        return _image(part, where)
    if kind == "file" and role in ("user", "tool"):
        return _file(part, where)
    if kind == "input_audio":
        _refuse(where, "Anthropic takes no audio input ('input_audio'); transcribe it or use another model")
    if kind in _ANTHROPIC_BLOCKS:
        return dict(part)  # already Anthropic
    _refuse(where, f"content part type {kind!r} has no Anthropic equivalent in a message of role {role!r}")


def _data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a ``data:...;base64,...`` URL, else None."""
    match = _DATA_URL.fullmatch(url.strip())
    if match is None:
        return None
    return match["media"].strip().lower(), match["data"]


def _image(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    inner = part.get("image_url")
    url = inner.get("url") if isinstance(inner, Mapping) else inner
    if not isinstance(url, str) or not url:
        _refuse(where, "an image_url part needs image_url.url")
    # image_url.detail is dropped: Anthropic has no detail levels (it scales images itself)
    if url.startswith("data:"):
        parsed = _data_url(url)
        if parsed is None:
            _refuse(where, "an image data URL must be base64 (data:image/png;base64,...)")
        media, data = parsed
        if media not in _IMAGE_TYPES:
            _refuse(where, f"Anthropic takes JPEG, PNG, GIF and WebP images, not {media or 'an untyped image'!r}")
        source: dict[str, Any] = {"type": "base64", "media_type": media, "data": data}
    elif url.startswith(("https://", "http://")):
        source = {"type": "url", "url": url}
    else:
        _refuse(where, "an image URL must be https://... or a base64 data URL")
    block: dict[str, Any] = {"type": "image", "source": source}
    if part.get("cache_control") is not None:
        block["cache_control"] = part["cache_control"]
    return block


def _file(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An OpenAI ``file`` part: a PDF becomes a ``document`` (document_block_param.py), a
    plain-text file a text document, an image an image; a ``file_id`` (an OpenAI upload)
    means nothing to Anthropic."""
    inner = part.get("file")
    if not isinstance(inner, Mapping):
        _refuse(where, "a file part needs a 'file' object")
    data_url = inner.get("file_data")
    if not isinstance(data_url, str):
        if inner.get("file_id"):
            _refuse(where, "an OpenAI file_id cannot be read by Anthropic; send the file's bytes as file_data")
        _refuse(where, "a file part needs file.file_data")
    parsed = _data_url(data_url)
    if parsed is None:
        _refuse(where, "file.file_data must be a base64 data URL (data:application/pdf;base64,...)")
    media, data = parsed
    block: dict[str, Any]
    if media == "application/pdf":
        block = {"type": "document", "source": {"type": "base64", "media_type": media, "data": data}}
    elif media == "text/plain":
        try:
            text = base64.b64decode(data, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            _refuse(where, "file.file_data is not base64 of UTF-8 text")
        block = {"type": "document", "source": {"type": "text", "media_type": media, "data": text}}
    elif media in _IMAGE_TYPES:
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    else:
        _refuse(where, f"Anthropic reads PDF and plain-text documents, not {media or 'an untyped file'!r}")
    if isinstance(inner.get("filename"), str) and inner["filename"]:
        block["title"] = inner["filename"]
    return block


def _assistant_blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    for key, why in (("function_call", "the deprecated function_call; use tool_calls"), ("audio", "audio output")):
        if message.get(key) is not None:
            _refuse(f"{where}.{key}", f"Anthropic has no equivalent of {why}")
    blocks = _content_blocks(message.get("content"), where, "assistant")
    refusal = message.get("refusal")
    if not blocks and isinstance(refusal, str) and refusal:
        blocks.append({"type": "text", "text": refusal})  # what the assistant said
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        _refuse(f"{where}.tool_calls", "must be a list")
    blocks.extend(_tool_use(call, f"{where}.tool_calls[{n}]") for n, call in enumerate(calls))
    # a message's "name" (a participant name) is dropped: Anthropic has no field for it
    return blocks


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, Mapping) or call.get("type", "function") != "function":
        _refuse(where, "only function tool calls translate")
    function = call.get("function")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id or not isinstance(function, Mapping):
        _refuse(where, "a tool call needs an 'id' and a 'function'")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        _refuse(where, "a tool call needs function.name")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            _refuse(f"{where}.function.arguments", "is not valid JSON; Anthropic needs the input as an object")
    if not isinstance(arguments, Mapping):
        _refuse(f"{where}.function.arguments", "must be a JSON object; Anthropic's tool input is an object")
    return {"type": "tool_use", "id": call_id, "name": name, "input": dict(arguments)}


def _tool_result(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        _refuse(where, "a tool message needs a 'tool_call_id'")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    content = message.get("content")
    if isinstance(content, str):
        if content.strip():
            block["content"] = content
    else:
        parts = _content_blocks(content, where, "tool")
        if parts:
            block["content"] = parts
    return block


def _max_tokens(request: Request, params: _Params, default: int) -> int:
    """Anthropic requires ``max_tokens``. ``params`` win over ``Request.max_tokens`` (as they
    do for OpenAI); the newer ``max_completion_tokens`` wins over ``max_tokens``."""
    caps = [params.take(name) for name in ("max_completion_tokens", "max_tokens", "max_output_tokens")]
    for name, value in zip(("max_completion_tokens", "max_tokens", "max_output_tokens"), caps, strict=True):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            _refuse(f"params.{name}", f"must be a positive integer, got {value!r}")
    chosen = next((cap for cap in caps if cap is not None), None)
    return int(chosen or request.max_tokens or default)


def _sampling(request: Request, params: _Params, body: dict[str, Any]) -> None:
    temperature = params.take("temperature")
    if temperature is None:
        temperature = request.temperature
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature < math.inf:
            _refuse("temperature", f"must be a number >= 0, got {temperature!r}")
        # OpenAI's range is 0..2, Anthropic's 0..1 (message_create_params.py). Above 1 is
        # clamped to 1, the most random Anthropic allows: the nearest behaviour, where
        # scaling would change every ordinary value (0.7 -> 0.35) and refusing would fail
        # a fallback over a sampling hint.
        body["temperature"] = min(float(temperature), 1.0)
    top_p = params.take("top_p")
    # Claude Opus 4.1, Sonnet 4.5 and later refuse both ("temperature and top_p cannot both
    # be specified for this model", LiteLLM issue #15097), and which model takes both is not
    # knowable here: with a temperature, top_p is dropped (temperature is the main knob;
    # refusing would fail ordinary OpenAI requests, which often set both). Its default, 1,
    # samples from everything and says nothing either way.
    if top_p is not None and top_p != 1 and "temperature" not in body:
        body["top_p"] = top_p
    stop = params.take("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            _refuse("params.stop", "must be a string or a list of strings")
        for s in stops:
            if not s.strip():  # the API refuses them (LiteLLM's transformation notes it too)
                _refuse("params.stop", f"Anthropic refuses stop sequences that are only whitespace ({s!r})")
        native = params.take("stop_sequences") or []
        if stops or native:
            body["stop_sequences"] = [*native, *stops]


def _tools(params: _Params, body: dict[str, Any]) -> None:
    given = params.take("tools") or []
    if not isinstance(given, list):
        _refuse("params.tools", "must be a list")
    tools = [_tool(tool, f"params.tools[{n}]") for n, tool in enumerate(given)]
    choice = _tool_choice(params.take("tool_choice"), bool(tools))
    parallel = params.take("parallel_tool_calls")
    json_tool = _json_tool(params.take("response_format"))
    if json_tool is not None:
        choice = _json_choice(choice, bool(tools))
        tools.append(json_tool)
    if not tools:
        return
    body["tools"] = tools
    if parallel is False and (choice is None or choice["type"] != "none"):
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None:
        body["tool_choice"] = choice


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        _refuse(where, "a tool must be an object")
    if "name" in tool and tool.get("type") != "function":
        if tool.get("name") == JSON_TOOL_NAME:
            _refuse(where, f"the tool name {JSON_TOOL_NAME!r} is reserved for JSON mode")
        return dict(tool)  # already Anthropic: a custom tool with input_schema, or a server tool
    if tool.get("type") != "function" or not isinstance(tool.get("function"), Mapping):
        _refuse(where, f"only function tools translate, not {tool.get('type')!r}")
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        _refuse(where, "a function tool needs function.name")
    if name == JSON_TOOL_NAME:
        _refuse(where, f"the tool name {JSON_TOOL_NAME!r} is reserved for JSON mode")
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        _refuse(f"{where}.function.parameters", "must be a JSON schema of type object (Anthropic's input_schema)")
    out: dict[str, Any] = {"name": name, "input_schema": {"type": "object", **schema}}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    # function.strict is dropped: the schema still shapes the call, without OpenAI's guarantee
    if tool.get("cache_control") is not None:
        out["cache_control"] = tool["cache_control"]
    return out


def _tool_choice(choice: Any, has_tools: bool) -> dict[str, Any] | None:
    if choice is None:
        return None
    named = choice in ("auto", "none", "required") or isinstance(choice, Mapping)
    if not named:
        _refuse("params.tool_choice", f"must be 'auto', 'none', 'required' or an object, got {choice!r}")
    kind = choice.get("type") if isinstance(choice, Mapping) else choice
    if kind in ("auto", "none") and not has_tools:
        return None  # nothing to choose from: nothing to say
    if choice in ("auto", "none"):
        return {"type": choice}
    if not has_tools:
        _refuse("params.tool_choice", "asks for a tool call but the request defines no tools")
    if choice == "required":
        return {"type": "any"}
    assert isinstance(choice, Mapping)
    if choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            _refuse("params.tool_choice", "a function choice needs function.name")
        return {"type": "tool", "name": name}
    if choice.get("type") in _TOOL_CHOICES:
        return dict(choice)  # already Anthropic
    _refuse("params.tool_choice", f"type {choice.get('type')!r} has no Anthropic equivalent")


def _json_tool(response_format: Any) -> dict[str, Any] | None:
    """JSON mode as a forced tool whose input is the answer (the way Anthropic documents
    it; LiteLLM does the same). A system instruction would only ask for JSON; a tool
    input is always a JSON object, and a ``json_schema`` becomes its input_schema."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        schema: Mapping[str, Any] = {"type": "object", "additionalProperties": True}
        description = JSON_TOOL_DESCRIPTION
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None  # type: ignore[assignment]
        if not isinstance(schema, Mapping):
            _refuse("params.response_format", "json_schema needs json_schema.schema")
        if schema.get("type", "object") != "object":
            _refuse("params.response_format", "a schema whose top level is not an object cannot be a tool input")
        assert isinstance(spec, Mapping)
        description = str(spec.get("description") or JSON_TOOL_DESCRIPTION)
    else:
        _refuse("params.response_format", f"type {kind!r} has no Anthropic equivalent")
    return {"name": JSON_TOOL_NAME, "description": description, "input_schema": {"type": "object", **schema}}


def _json_choice(choice: dict[str, Any] | None, has_tools: bool) -> dict[str, Any]:
    """The tool choice under JSON mode: the JSON tool is forced unless the request's own
    tools may be called; then some tool must be (its answer is a call of the JSON tool)."""
    if not has_tools or (choice is not None and choice["type"] == "none"):
        return {"type": "tool", "name": JSON_TOOL_NAME}
    if choice is None or choice["type"] == "auto":  # with tools, OpenAI's default is auto
        return {"type": "any"}
    return choice  # "any", or one named tool: as asked


def _user(params: _Params, body: dict[str, Any]) -> None:
    """``user`` (or its successor ``safety_identifier``) -> ``metadata.user_id``. An id that
    looks like an email or phone number is dropped: Anthropic forbids identifying data
    there (metadata_param.py) and refuses it; it only serves abuse tracking."""
    safety, user = params.take("safety_identifier"), params.take("user")
    user = safety or user
    metadata = params.take("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    # OpenAI's own metadata (tags for stored completions) has no meaning to Anthropic
    if user_id is None and isinstance(user, str) and not (_EMAIL.fullmatch(user) or _PHONE.fullmatch(user)):
        user_id = user
    if user_id is not None:
        body["metadata"] = {"user_id": user_id}


#: Chat Completions parameters Anthropic has no equivalent of: refused when set to anything
#: but their default, because each changes what comes back.
_UNTRANSLATABLE: Mapping[str, str] = {
    "n": "Anthropic returns one choice per request; send n separate requests",
    "logprobs": "Anthropic returns no log probabilities",
    "top_logprobs": "Anthropic returns no log probabilities",
    "logit_bias": "Anthropic has no logit bias",
    "presence_penalty": "Anthropic has no presence penalty",
    "frequency_penalty": "Anthropic has no frequency penalty",
    "audio": "Anthropic produces no audio",
    "modalities": "Anthropic answers in text only",
    "functions": "the deprecated functions form is not translated; use tools",
    "function_call": "the deprecated function_call form is not translated; use tool_choice",
    "reasoning_effort": "effort levels are not Anthropic thinking budgets, and not every Claude model thinks; "
    "pass Anthropic's own 'thinking' instead",
    "verbosity": "Anthropic has no verbosity setting",
    "web_search_options": "Anthropic's web search is a server tool enabled per organisation; pass it in tools",
}
_DEFAULTS: Mapping[str, tuple[Any, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "modalities": (["text"],),
    "functions": ([],),
    "verbosity": ("medium",),
}
#: Harmless to drop: they change neither the answer nor its shape. ``seed`` is best effort
#: on OpenAI itself; ``store``/``prompt_cache_key``/``prediction`` are OpenAI-side storage,
#: routing and latency hints; ``stream_options`` only shapes OpenAI's stream.
_DROPPED = ("seed", "store", "prompt_cache_key", "prediction", "stream_options")
#: OpenAI's processing tiers -> Anthropic's (message_create_params.py: auto, standard_only).
_SERVICE_TIERS: Mapping[str, str] = {"auto": "auto", "standard_only": "standard_only", "default": "standard_only"}


def _refused_or_dropped(params: _Params) -> None:
    for name, why in _UNTRANSLATABLE.items():
        value = params.take(name)
        if value is not None and not _default(name, value):
            _refuse(f"params.{name}", f"{value!r}: {why}")
    for name in _DROPPED:
        params.take(name)
    tier = params.take("service_tier")
    if tier is not None and tier in _SERVICE_TIERS:
        params.rest["service_tier"] = _SERVICE_TIERS[tier]
    # another OpenAI tier (flex, priority, scale) prices OpenAI's capacity: no equivalent, dropped


def _default(name: str, value: Any) -> bool:
    """Whether an untranslatable parameter is at its default, where sending nothing is
    the same request (``True`` is not ``1`` here, nor ``False`` ``0``)."""
    return any(type(value) is type(default) and value == default for default in _DEFAULTS.get(name, ()))


def _check_thinking(body: Mapping[str, Any]) -> None:
    """Anthropic's extended thinking cannot be combined with a forced tool (the API
    refuses ``tool_choice`` any/tool with thinking on), which JSON mode and
    ``tool_choice: required`` translate to."""
    thinking = body.get("thinking")
    choice = body.get("tool_choice")
    enabled = isinstance(thinking, Mapping) and thinking.get("type") not in (None, "disabled")
    if enabled and isinstance(choice, Mapping) and choice.get("type") in ("any", "tool"):
        _refuse(
            "params.thinking",
            "extended thinking cannot be combined with a forced tool (JSON mode, "
            "tool_choice 'required' or a named tool)",
        )
