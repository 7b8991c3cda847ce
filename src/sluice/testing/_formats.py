"""Request checks and response bodies for the wire formats the fake speaks.

``OpenAIFormat`` is ``POST /v1/chat/completions``; ``AnthropicFormat`` is
``POST /v1/messages`` (``ResponsesFormat``, in :mod:`._responses`, is
``POST /v1/responses``). All produce the same deterministic reply from the same prompt,
and count its prompt tokens with the fake's own :class:`PromptCounter`, never with
sluice's estimator.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, NoReturn

from ._cache_blocks import Refused, anthropic_blocks, marked
from ._cache_usage import CacheUse, anthropic_usage, chat_details
from ._faults import Fault
from ._limits import LimitSnapshot, Rejection, openai_duration
from ._tokenizer import PromptCounter

__all__ = [
    "AnthropicFormat",
    "ApiError",
    "Call",
    "ErrorKind",
    "Format",
    "OpenAIFormat",
    "anthropic_output_usage",
    "check_cache_fields",
    "dumps",
    "loads",
    "reply_text",
]

ErrorKind = Literal[
    "invalid_request",
    "authentication",
    "not_found",
    "server",
    "overloaded",
    "context_length",
    # finer kinds of invalid request, as OpenAI's codes tell them apart (the Responses API's checks)
    "missing",
    "invalid_type",
    "invalid_value",
    "unknown",
    "below_minimum",
    "not_stored",
]


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # built once: json.dumps(...) is slower


def _stdlib_dumps(obj: Any) -> bytes:
    return _ENCODER.encode(obj).encode()


def _pick_json() -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """orjson when it is installed (it is optional), else the standard library."""
    try:
        orjson = importlib.import_module("orjson")
    except ImportError:
        return _stdlib_dumps, json.loads
    return orjson.dumps, orjson.loads


dumps, loads = _pick_json()
_quote = json.encoder.encode_basestring_ascii

# The 200 bodies are %-format templates rather than dicts run through json: this is the
# hot path of the benchmarks, and a template is several times faster.
_OPENAI_OK = (
    '{"id":"chatcmpl-%d","object":"chat.completion","created":%d,"model":%s,'
    '"choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"%s"}],'
    '"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,'
    '"prompt_tokens_details":%s,'
    '"completion_tokens_details":{"reasoning_tokens":0}}}'
)
_NOTHING_CACHED = '{"cached_tokens":0}'
_ANTHROPIC_OK = (
    '{"id":"msg_%d","type":"message","role":"assistant","model":%s,'
    '"content":[{"type":"text","text":%s}],"stop_reason":"%s","stop_sequence":null,"usage":%s}'
)
_ANTHROPIC_USAGE = '{"input_tokens":%d,"output_tokens":%d,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}'

#: The fault kinds answered with an ordinary error: (kind of error, message).
_FAULT_ERRORS: dict[Fault, tuple[ErrorKind, str]] = {
    Fault.SERVER_ERROR: ("server", "The server had an error processing your request."),
    Fault.BAD_GATEWAY: ("server", "Bad gateway."),
    Fault.SERVICE_UNAVAILABLE: ("server", "The service is temporarily unavailable."),
    Fault.OVERLOADED: ("overloaded", "Overloaded"),
    Fault.BAD_REQUEST: ("invalid_request", "Invalid request (injected fault)."),
    Fault.TOO_LARGE: ("invalid_request", "Request exceeds the maximum allowed size (injected fault)."),
    Fault.UNAUTHORIZED: ("authentication", "Incorrect API key provided (injected fault)."),
    Fault.NOT_FOUND: ("not_found", "The model does not exist (injected fault)."),
    Fault.NO_RETRY: ("server", "The server had an error; do not retry (injected fault)."),
}


class ApiError(Exception):
    """A request the fake refuses, with what the error body should say."""

    def __init__(self, status: int, kind: ErrorKind, text: str, param: str | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.kind = kind
        self.message = text
        self.param = param


class Call(NamedTuple):
    """A valid request, reduced to what the fake needs to answer and count it."""

    model: str
    max_tokens: int
    prompt_tokens: int
    text: str
    #: What a format needs beyond these for its answer (the inputs of an embeddings request).
    extra: Any = None
    #: What the prompt read from and wrote to the fake's prompt cache (None: not involved).
    cache: CacheUse | None = None


def _part_text(part: Any) -> str | None:
    if isinstance(part, dict):
        part = part.get("text")
    return part if isinstance(part, str) else None


def _text_of(content: Any) -> str:
    """The text of a message's content: a string or a list of parts (others: none)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(t for t in map(_part_text, content) if t is not None)
    return ""


def reply_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """``echo:`` and the start of the last user message, so answers are reproducible."""
    chosen = messages[-1]
    for message in reversed(messages):
        if message.get("role") == "user":
            chosen = message
            break
    return "echo: " + _text_of(chosen.get("content"))[:200]


def _check_messages(messages: Any) -> list[Mapping[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "invalid_request", "'messages' must be a non-empty array", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(
                400,
                "invalid_request",
                f"'messages[{index}]' must be an object with a string 'role'",
                f"messages[{index}]",
            )
    return messages


def _check_positive_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, "invalid_request", f"'{name}' must be a positive integer", name)
    return value


def _check_common(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ApiError(400, "invalid_request", "you must provide a model parameter", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "invalid_request", "'stream' must be a boolean", "stream")
    return body


class Format(ABC):
    """What differs between the APIs: checks, bodies, headers."""

    request_id_header = "x-request-id"
    #: Which API it is (how its streams, structured asks and tool choices read).
    api = "chat"

    def __init__(self, counter: PromptCounter | None = None) -> None:
        #: How the fake counts a prompt's tokens (its own tokenizer, not sluice's).
        self.counter = counter or PromptCounter()

    @abstractmethod
    def check_auth(self, headers: Mapping[str, str], api_key: str | None, *, echo: bool = False) -> None:
        """Raise a 401 unless the request carries ``api_key`` (when one is required); with
        ``echo``, the message quotes the key it was given, as some servers do."""

    @abstractmethod
    def parse(self, body: Any, headers: Mapping[str, str]) -> Call:
        """Validate a decoded body; raise :class:`ApiError` for a 400."""

    @abstractmethod
    def success(self, n: int, call: Call, completion: int, cut: bool, created: int) -> bytes:
        """The 200 body for request ``n``; ``cut`` when ``max_tokens`` stopped the reply."""

    @abstractmethod
    def empty(self, n: int, model: str, created: int) -> bytes:
        """A 200 body with no choices or content (the ``empty_choices`` fault)."""

    @abstractmethod
    def error(self, kind: ErrorKind, message: str, param: str | None = None) -> bytes:
        """An error body in this API's shape."""

    @abstractmethod
    def rate_limited(self, rejection: Rejection) -> bytes:
        """The body of a 429 for ``rejection``."""

    @abstractmethod
    def limit_headers(self, snapshot: LimitSnapshot, wall_now: float) -> dict[str, str]:
        """This API's rate-limit headers for ``snapshot``."""

    def too_long(self, prompt: int, limit: int, window: int) -> tuple[str, str]:
        """(message, param) of the 400 for a prompt and output limit past the context window."""
        return (
            f"This model's maximum context length is {window} tokens. However, you requested {prompt + limit} tokens "
            f"({prompt} in the messages, {limit} in the completion). Please reduce the length of the messages or "
            "completion.",
            "messages",
        )

    def fault_error(self, fault: Fault) -> bytes:
        """The error body for a status-code fault (not 429)."""
        kind, message = _FAULT_ERRORS[fault]
        return self.error(kind, message)


_OPENAI_ERRORS: dict[ErrorKind, tuple[str, str | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "not_found": ("invalid_request_error", "model_not_found"),
    "server": ("server_error", None),
    "overloaded": ("server_error", "overloaded"),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "missing": ("invalid_request_error", "missing_required_parameter"),
    "invalid_type": ("invalid_request_error", "invalid_type"),
    "invalid_value": ("invalid_request_error", "invalid_value"),
    "unknown": ("invalid_request_error", "unknown_parameter"),
    "below_minimum": ("invalid_request_error", "integer_below_min_value"),
    "not_stored": ("invalid_request_error", "previous_response_not_found"),
}


class OpenAIFormat(Format):
    """OpenAI Chat Completions."""

    request_id_header = "x-request-id"

    def check_auth(self, headers: Mapping[str, str], api_key: str | None, *, echo: bool = False) -> None:
        given = headers.get("Authorization")
        if api_key is not None and given != f"Bearer {api_key}":
            said = f": {given.removeprefix('Bearer ')}" if echo and given else ""
            raise ApiError(401, "authentication", f"Incorrect API key provided{said}.")

    def parse(self, body: Any, headers: Mapping[str, str]) -> Call:
        body = _check_common(body)
        messages = _check_messages(body.get("messages"))
        limit = _check_positive_int(body, "max_completion_tokens")
        if limit is None:
            limit = _check_positive_int(body, "max_tokens") or 1024
        check_cache_fields(body)
        prompt = self.counter.openai(body)
        return Call(body["model"], limit, prompt, reply_text(messages))

    def success(self, n: int, call: Call, completion: int, cut: bool, created: int) -> bytes:
        prompt = call.prompt_tokens
        finish = "length" if cut else "stop"
        values = (n, created, _quote(call.model), _quote(call.text), finish)
        details = _NOTHING_CACHED if call.cache is None else dumps(chat_details(call.cache)).decode()
        return (_OPENAI_OK % (*values, prompt, completion, prompt + completion, details)).encode()

    def empty(self, n: int, model: str, created: int) -> bytes:
        return dumps(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        )

    def error(self, kind: ErrorKind, message: str, param: str | None = None) -> bytes:
        error_type, code = _OPENAI_ERRORS[kind]
        return _openai_error(message, error_type, param, code)

    def rate_limited(self, rejection: Rejection) -> bytes:
        return _openai_error(rejection.message, rejection.kind, None, "rate_limit_exceeded")

    def limit_headers(self, snapshot: LimitSnapshot, wall_now: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        reset = openai_duration(snapshot.reset)
        if snapshot.request_limit is not None:
            headers["x-ratelimit-limit-requests"] = str(snapshot.request_limit)
            headers["x-ratelimit-remaining-requests"] = str(snapshot.requests_remaining)
            headers["x-ratelimit-reset-requests"] = reset
        if snapshot.tokens_limit is not None:
            headers["x-ratelimit-limit-tokens"] = str(snapshot.tokens_limit)
            headers["x-ratelimit-remaining-tokens"] = str(snapshot.tokens_remaining)
            headers["x-ratelimit-reset-tokens"] = reset
        return headers


def check_cache_fields(body: Mapping[str, Any]) -> None:
    """``prompt_cache_key`` and ``prompt_cache_retention``, refused as OpenAI refuses them."""
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        kind = {bool: "a boolean", int: "an integer", float: "a number", list: "an array"}.get(type(key), "an object")
        message = f"Invalid type for 'prompt_cache_key': expected a string, but got {kind} instead."
        raise ApiError(400, "invalid_type", message, "prompt_cache_key")
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention not in ("in_memory", "24h"):
        shown = f"'{retention}'" if isinstance(retention, str) else json.dumps(retention)
        message = f"Invalid value: {shown}. Supported values are: 'in_memory' and '24h'."
        raise ApiError(400, "invalid_value", message, "prompt_cache_retention")


def _openai_error(message: str, error_type: str, param: str | None, code: str | None) -> bytes:
    return dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


_ANTHROPIC_ERRORS: dict[ErrorKind, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "server": "api_error",
    "overloaded": "overloaded_error",
    "context_length": "invalid_request_error",
    "missing": "invalid_request_error",
    "invalid_type": "invalid_request_error",
    "invalid_value": "invalid_request_error",
    "unknown": "invalid_request_error",
    "below_minimum": "invalid_request_error",
    "not_stored": "invalid_request_error",
}


class AnthropicFormat(Format):
    """Anthropic Messages."""

    request_id_header = "request-id"
    api = "anthropic"

    def too_long(self, prompt: int, limit: int, window: int) -> tuple[str, str]:
        return f"prompt is too long: {prompt + limit} tokens > {window} maximum", "messages"

    def check_auth(self, headers: Mapping[str, str], api_key: str | None, *, echo: bool = False) -> None:
        given = headers.get("x-api-key")
        if api_key is not None and given != api_key:
            raise ApiError(401, "authentication", f"invalid x-api-key{f': {given}' if echo and given else ''}")

    def parse(self, body: Any, headers: Mapping[str, str]) -> Call:
        if not headers.get("anthropic-version"):
            raise ApiError(400, "invalid_request", "anthropic-version: header is required")
        body = _check_common(body)
        limit = _check_positive_int(body, "max_tokens")
        if limit is None:
            raise ApiError(400, "invalid_request", "max_tokens: Field required", "max_tokens")
        messages = _check_messages(body.get("messages"))
        system = body.get("system")
        if system is not None and not isinstance(system, str | list):
            raise ApiError(400, "invalid_request", "system: must be a string or a list", "system")
        _check_anthropic_body(body, messages)
        if marked(body):
            try:
                anthropic_blocks(None, body)  # the breakpoints, checked (not counted)
            except Refused as exc:
                raise ApiError(400, "invalid_request", str(exc)) from None
        prompt = self.counter.anthropic(body)
        return Call(body["model"], limit, prompt, reply_text(messages))

    def success(self, n: int, call: Call, completion: int, cut: bool, created: int) -> bytes:
        stop = "max_tokens" if cut else "end_turn"
        if call.cache is None:
            usage = _ANTHROPIC_USAGE % (call.prompt_tokens, completion)
        else:
            usage = dumps(anthropic_output_usage(call, completion)).decode()
        return (_ANTHROPIC_OK % (n, _quote(call.model), _quote(call.text), stop, usage)).encode()

    def empty(self, n: int, model: str, created: int) -> bytes:
        return dumps(
            {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
        )

    def error(self, kind: ErrorKind, message: str, param: str | None = None) -> bytes:
        return _anthropic_error(_ANTHROPIC_ERRORS[kind], message)

    def rate_limited(self, rejection: Rejection) -> bytes:
        return _anthropic_error("rate_limit_error", rejection.message)

    def limit_headers(self, snapshot: LimitSnapshot, wall_now: float) -> dict[str, str]:
        """``anthropic-ratelimit-*``: requests, input tokens and output tokens, and
        ``tokens`` (the fake's own ``tpm`` when it has one, else the more restrictive of
        input and output, as Anthropic reports it); resets are RFC 3339 timestamps."""
        s = snapshot
        figures = {
            "requests": (s.request_limit, s.requests_remaining, s.reset),
            "input-tokens": (s.input_limit, s.input_remaining, s.input_reset),
            "output-tokens": (s.output_limit, s.output_remaining, s.output_reset),
            "tokens": (s.tokens_limit, s.tokens_remaining, s.reset),
        }
        if s.tokens_limit is None:
            split = [figures[kind] for kind in ("input-tokens", "output-tokens") if figures[kind][0] is not None]
            if split:
                figures["tokens"] = min(split, key=lambda f: (f[1], f[0]))
        headers: dict[str, str] = {}
        for kind, (limit, remaining, reset) in figures.items():
            if limit is not None:
                headers[f"anthropic-ratelimit-{kind}-limit"] = str(limit)
                headers[f"anthropic-ratelimit-{kind}-remaining"] = str(remaining)
                headers[f"anthropic-ratelimit-{kind}-reset"] = rfc3339(wall_now + reset)
        return headers


# -- what the Messages API refuses ----------------------------------------------------------
# As strict as the real API where an OpenAI-shaped body would slip through, so a client
# that forgets to translate gets the 400 Anthropic would send. The messages quote the
# API's own (as reported in anthropics/claude-code and anthropic-sdk-python issues).
# The API merges consecutive same-role turns itself (message_create_params.py), so
# those are accepted, and checked after merging.

#: Chat Completions fields the Messages API does not have ("Extra inputs are not permitted").
_OPENAI_ONLY = frozenset(
    {
        "n",
        "stop",
        "response_format",
        "parallel_tool_calls",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "user",
        "audio",
        "modalities",
        "functions",
        "function_call",
        "stream_options",
        "store",
        "reasoning_effort",
        "prediction",
        "web_search_options",
        "safety_identifier",
        "prompt_cache_key",
        "verbosity",
    }
)
#: Content block types of Messages requests (anthropic-sdk-python, types/content_block_param.py).
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
_IMAGE_SOURCES: dict[str, tuple[str, ...]] = {"base64": ("media_type", "data"), "url": ("url",), "file": ("file_id",)}
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_DOCUMENT_SOURCES = frozenset({"base64", "text", "url", "content", "file"})


def _refuse(message: str, param: str | None = None) -> NoReturn:
    raise ApiError(400, "invalid_request", message, param)


def _check_anthropic_body(body: Mapping[str, Any], messages: list[Mapping[str, Any]]) -> None:
    for key in sorted(_OPENAI_ONLY & body.keys()):
        _refuse(f"{key}: Extra inputs are not permitted", key)
    system = body.get("system")
    if isinstance(system, list) and not all(isinstance(b, dict) and b.get("type") == "text" for b in system):
        _refuse("system: must be a string or a list of text blocks", "system")
    temperature = body.get("temperature")
    if temperature is not None and not (isinstance(temperature, int | float) and 0 <= temperature <= 1):
        _refuse("temperature: Input should be between 0 and 1", "temperature")
    stops = body.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) and s.strip() for s in stops)):
        _refuse("stop_sequences: each must be a string that is not only whitespace", "stop_sequences")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and set(metadata) <= {"user_id"}):
        _refuse("metadata: only user_id is permitted", "metadata")
    _check_anthropic_tools(body.get("tools"), body.get("tool_choice"))
    for index, message in enumerate(messages):
        _check_anthropic_message(index, message, last=index == len(messages) - 1)
    _check_tool_pairing(messages)


def _check_anthropic_tools(tools: Any, choice: Any) -> None:
    if tools is not None:
        if not isinstance(tools, list):
            _refuse("tools: Input should be a valid list", "tools")
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") == "function" or not isinstance(tool.get("name"), str):
                _refuse(f"tools.{index}: a tool needs a 'name' (OpenAI's 'function' form is not accepted)", "tools")
            schema = tool.get("input_schema")
            if tool.get("type") in (None, "custom") and not (
                isinstance(schema, dict) and schema.get("type") == "object"
            ):
                _refuse(f"tools.{index}.input_schema: Field required (a JSON schema of type object)", "tools")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none") or (kind == "tool" and not isinstance(choice.get("name"), str)):
            _refuse("tool_choice: Input should be an object of type auto, any, tool or none", "tool_choice")


def _check_anthropic_message(index: int, message: Mapping[str, Any], *, last: bool) -> None:
    where = f"messages.{index}"
    role = message["role"]
    if role not in ("user", "assistant"):
        _refuse(f"{where}.role: Input should be 'user' or 'assistant'", where)
    for key in sorted(set(message) - {"role", "content"}):
        _refuse(f"{where}.{key}: Extra inputs are not permitted", where)
    content = message.get("content")
    if not isinstance(content, str | list):
        _refuse(f"{where}.content: Input should be a valid string or list", where)
    if not content and not (last and role == "assistant"):
        _refuse(f"{where}: all messages must have non-empty content except for the optional final assistant message")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    for number, block in enumerate(blocks):
        _check_anthropic_block(f"{where}.content.{number}", block, role)
    if last and role == "assistant" and blocks:
        final = blocks[-1]
        if final.get("type") == "text" and final.get("text", "") != final.get("text", "").rstrip():
            _refuse("final assistant content cannot end with trailing whitespace", where)


def _check_anthropic_block(where: str, block: Any, role: str) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in _ANTHROPIC_BLOCKS:
        _refuse(f"{where}.type: Input tag {kind!r} found using 'type' does not match any of the expected tags", where)
    if kind == "text" and not (isinstance(block.get("text"), str) and block["text"]):
        _refuse("messages: text content blocks must be non-empty", where)
    elif kind == "image":
        source = block.get("source")
        needed = _IMAGE_SOURCES.get(str(source.get("type"))) if isinstance(source, dict) else None
        if needed is None or not all(isinstance(source.get(k), str) for k in needed):
            _refuse(f"{where}.source: an image source is base64 (media_type, data), url or file", where)
        if source.get("type") == "base64" and source.get("media_type") not in _IMAGE_TYPES:
            _refuse(f"{where}.source.media_type: Input should be one of {', '.join(_IMAGE_TYPES)}", where)
    elif kind == "document":
        source = block.get("source")
        if not isinstance(source, dict) or source.get("type") not in _DOCUMENT_SOURCES:
            _refuse(f"{where}.source: a document source is base64, text, url, content or file", where)
    elif kind == "tool_use":
        if role != "assistant":
            _refuse(f"{where}: tool_use blocks may only appear in assistant messages", where)
        if not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)):
            _refuse(f"{where}: a tool_use block needs a string id and name", where)
        if not isinstance(block.get("input"), dict):
            _refuse(f"{where}.input: Input should be a valid dictionary", where)
    elif kind == "tool_result":
        if role != "user":
            _refuse(f"{where}: tool_result blocks may only appear in user messages", where)
        if not isinstance(block.get("tool_use_id"), str):
            _refuse(f"{where}.tool_use_id: Field required", where)
        inner = block.get("content")
        if isinstance(inner, list):
            for number, part in enumerate(inner):
                _check_anthropic_block(f"{where}.content.{number}", part, role)


def _check_tool_pairing(messages: list[Mapping[str, Any]]) -> None:
    """Every tool_use is answered by a tool_result at the start of the next turn, and
    every tool_result answers a tool_use of the turn before (turns merged by role)."""
    turns: list[tuple[str, list[Any]]] = []
    for message in messages:
        content = message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if turns and turns[-1][0] == message["role"]:
            turns[-1][1].extend(blocks)
        else:
            turns.append((message["role"], list(blocks)))
    asked: list[str] = []
    for index, (role, blocks) in enumerate(turns):
        kinds = [b.get("type") for b in blocks]
        answered = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if answered and kinds[: len(answered)] != ["tool_result"] * len(answered):
            _refuse(
                f"messages.{index}: Did not find {len(answered)} tool_result block(s) at the beginning of this "
                "message. Messages following tool_use blocks must begin with a matching number of tool_result blocks."
            )
        unexpected = [i for i in answered if i not in asked]
        if unexpected:
            _refuse(
                f"messages.{index}: unexpected tool_use_id found in tool_result blocks: {unexpected[0]}. Each "
                "tool_result block must have a corresponding tool_use block in the previous message."
            )
        missing = [i for i in asked if i not in answered]
        if missing:
            _refuse(
                f"messages.{index - 1}: tool_use ids were found without tool_result blocks immediately after: "
                f"{', '.join(missing)}. Each tool_use block must have a corresponding tool_result block in the next "
                "message."
            )
        asked = [b.get("id") for b in blocks if b.get("type") == "tool_use"] if role == "assistant" else []


def anthropic_output_usage(call: Call, completion: int) -> dict[str, Any]:
    """An Anthropic answer's ``usage``: its input (split by the prompt cache) and output."""
    usage = anthropic_usage(call.prompt_tokens, call.cache)
    return {"input_tokens": usage.pop("input_tokens"), "output_tokens": completion, **usage}


def _anthropic_error(error_type: str, message: str) -> bytes:
    return dumps({"type": "error", "error": {"type": error_type, "message": message}})


def rfc3339(timestamp: float) -> str:
    """A UTC RFC 3339 timestamp with milliseconds, as in ``anthropic-ratelimit-*-reset``."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_BAD_JSON = "We could not parse the JSON body of your request."


def decode_body(raw: bytes) -> Any:
    try:
        return loads(raw)
    except ValueError:
        raise ApiError(400, "invalid_request", _BAD_JSON) from None


def model_of(raw: bytes) -> str:
    with contextlib.suppress(ValueError):
        body = loads(raw)
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            return str(body["model"])
    return "unknown"


def openai_error_body(message: str, code: str) -> bytes:
    return dumps({"error": {"message": message, "type": code, "param": None, "code": code}})
