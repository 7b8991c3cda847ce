"""Request checks and response bodies for the two wire formats the fake speaks.

``OpenAIFormat`` is ``POST /v1/chat/completions``; ``AnthropicFormat`` is
``POST /v1/messages``. Both produce the same deterministic reply from the same prompt,
and count its prompt tokens with the fake's own :class:`PromptCounter`, never with
sluice's estimator.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

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
    "dumps",
    "loads",
]

ErrorKind = Literal["invalid_request", "authentication", "not_found", "server", "overloaded"]


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
    '"prompt_tokens_details":{"cached_tokens":0},'
    '"completion_tokens_details":{"reasoning_tokens":0}}}'
)
_ANTHROPIC_OK = (
    '{"id":"msg_%d","type":"message","role":"assistant","model":%s,'
    '"content":[{"type":"text","text":%s}],"stop_reason":"%s","stop_sequence":null,'
    '"usage":{"input_tokens":%d,"output_tokens":%d,'
    '"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}'
)

#: The fault kinds answered with an ordinary error: (kind of error, message).
_FAULT_ERRORS: dict[Fault, tuple[ErrorKind, str]] = {
    Fault.SERVER_ERROR: ("server", "The server had an error processing your request."),
    Fault.BAD_GATEWAY: ("server", "Bad gateway."),
    Fault.SERVICE_UNAVAILABLE: ("server", "The service is temporarily unavailable."),
    Fault.OVERLOADED: ("overloaded", "Overloaded"),
    Fault.BAD_REQUEST: ("invalid_request", "Invalid request (injected fault)."),
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
    if body.get("stream"):
        raise ApiError(400, "invalid_request", "the fake server does not stream", "stream")
    return body


class Format(ABC):
    """What differs between the two APIs: checks, bodies, headers."""

    request_id_header = "x-request-id"

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
        prompt = self.counter.openai(body)
        return Call(body["model"], limit, prompt, reply_text(messages))

    def success(self, n: int, call: Call, completion: int, cut: bool, created: int) -> bytes:
        prompt = call.prompt_tokens
        finish = "length" if cut else "stop"
        values = (n, created, _quote(call.model), _quote(call.text), finish)
        return (_OPENAI_OK % (*values, prompt, completion, prompt + completion)).encode()

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


def _openai_error(message: str, error_type: str, param: str | None, code: str | None) -> bytes:
    return dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


_ANTHROPIC_ERRORS: dict[ErrorKind, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "server": "api_error",
    "overloaded": "overloaded_error",
}


class AnthropicFormat(Format):
    """Anthropic Messages."""

    request_id_header = "request-id"

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
        prompt = self.counter.anthropic(body)
        return Call(body["model"], limit, prompt, reply_text(messages))

    def success(self, n: int, call: Call, completion: int, cut: bool, created: int) -> bytes:
        stop = "max_tokens" if cut else "end_turn"
        values = (n, _quote(call.model), _quote(call.text), stop, call.prompt_tokens, completion)
        return (_ANTHROPIC_OK % values).encode()

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
        headers: dict[str, str] = {}
        reset = rfc3339(wall_now + snapshot.reset)
        if snapshot.request_limit is not None:
            headers["anthropic-ratelimit-requests-limit"] = str(snapshot.request_limit)
            headers["anthropic-ratelimit-requests-remaining"] = str(snapshot.requests_remaining)
            headers["anthropic-ratelimit-requests-reset"] = reset
        if snapshot.tokens_limit is not None:
            headers["anthropic-ratelimit-tokens-limit"] = str(snapshot.tokens_limit)
            headers["anthropic-ratelimit-tokens-remaining"] = str(snapshot.tokens_remaining)
            headers["anthropic-ratelimit-tokens-reset"] = reset
        return headers


def _anthropic_error(error_type: str, message: str) -> bytes:
    return dumps({"type": "error", "error": {"type": error_type, "message": message}})


def rfc3339(timestamp: float) -> str:
    """A UTC RFC 3339 timestamp with milliseconds, as in ``anthropic-ratelimit-*-reset``."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
