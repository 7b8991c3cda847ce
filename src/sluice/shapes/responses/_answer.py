"""A chat completion as a Responses API ``Response``, and what a response leaves to continue.

The object is the one OpenAI returns (``openai/types/responses/response.py``): its
``output`` items (a ``reasoning`` item when the deployment returned its reasoning text,
a ``message`` with ``output_text`` and ``refusal`` parts, then one ``function_call`` per
tool call), ``status`` (``incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` for finish reason ``length``, ``content_filter`` for
``content_filter``; the last item is then ``incomplete`` too), ``usage`` in Responses'
words, and the request's settings echoed with OpenAI's defaults where it gave none
(``temperature`` 1, ``top_p`` 1, ``tool_choice`` auto, ``truncation`` disabled, ``store``
true, ``metadata`` {}...). ``output_text`` is no field: the SDKs add it. A call of a
namespace's function is named as the client named it (``name``, ``namespace``). A function tool
without ``strict`` is echoed ``strict: false``: that is what a chat deployment does with it.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..._models import Usage
from ._tools import namespaced

__all__ = [
    "ERROR_CODES",
    "conversation_items",
    "incomplete_reason",
    "named_back",
    "new_id",
    "response_from_chat",
    "response_object",
    "usage_object",
]

#: The codes a Response's ``error`` may have (response_error.py); any other is ``server_error``.
ERROR_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "data_residency_mismatch",
        "bio_policy",
        "misalignment_policy_violation",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)
#: The tier a response shows for the one asked (OpenAI: auto is served as default, fast as priority).
_TIER_SHOWN: dict[Any, str] = {None: "default", "auto": "default", "fast": "priority"}
_INCOMPLETE = {"length": "max_output_tokens", "max_tokens": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    """An id in OpenAI's form: ``resp_...``, ``msg_...``, ``fc_...``, ``rs_...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def incomplete_reason(finish_reason: str | None) -> str | None:
    """Why an answer with this chat finish reason is ``incomplete``, or None: it is ``completed``."""
    return _INCOMPLETE.get(finish_reason or "")


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_input_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def response_object(
    request: Mapping[str, Any],
    *,
    response_id: str,
    created_at: float,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None = None,
    model: str | None = None,
    error: dict[str, Any] | None = None,
    incomplete: str | None = None,
    completed_at: float | None = None,
    service_tier: str | None = None,
) -> dict[str, Any]:
    """A Response with ``request``'s settings echoed as OpenAI echoes them."""
    reasoning = request.get("reasoning") or {}
    text = request.get("text") or {}
    tier = service_tier or request.get("service_tier")
    if status != "completed":
        completed_at = None
    elif completed_at is None:
        completed_at = int(time.time())
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"),
        "model": model or request.get("model"),
        "output": output,
        "parallel_tool_calls": _given(request.get("parallel_tool_calls"), True),
        "previous_response_id": request.get("previous_response_id"),
        "prompt_cache_key": request.get("prompt_cache_key"),
        "prompt_cache_retention": request.get("prompt_cache_retention"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": request.get("safety_identifier"),
        "service_tier": _TIER_SHOWN.get(tier, tier),
        "store": _given(request.get("store"), True),
        "temperature": _given(request.get("temperature"), 1.0),
        "text": {"format": _format(text.get("format")), "verbosity": text.get("verbosity") or "medium"},
        "tool_choice": _given(request.get("tool_choice"), "auto"),
        "tools": [_tool(tool) for tool in request.get("tools") or ()],
        "top_logprobs": _given(request.get("top_logprobs"), 0),
        "top_p": _given(request.get("top_p"), 1.0),
        "truncation": request.get("truncation") or "disabled",
        "usage": usage_object(usage) if usage is not None else None,
        "user": request.get("user"),
        "metadata": dict(request.get("metadata") or {}),
    }


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _format(format_: Any) -> dict[str, Any]:
    if not isinstance(format_, Mapping) or format_.get("type") not in ("json_schema", "json_object"):
        return {"type": "text"}
    if format_["type"] == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "name": format_.get("name"),
        "schema": format_.get("schema"),
        "description": format_.get("description"),
        "strict": bool(format_.get("strict")),
    }


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        return dict(tool)
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": bool(tool.get("strict")),
    }


def response_from_chat(
    completion: Mapping[str, Any],
    *,
    response_id: str,
    request: Mapping[str, Any],
    created_at: float,
    usage: Usage | None = None,
    completed_at: float | None = None,
) -> dict[str, Any]:
    """The Response for a ``chat.completion`` body answering ``request`` (a Responses body).

    ``usage``, when given, is used instead of the completion's (sluice's Result counts
    every ask of a validated answer)."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    message = choice.get("message")
    if not isinstance(message, Mapping):
        message = {}
    finish = choice.get("finish_reason")
    reason = incomplete_reason(finish if isinstance(finish, str) else None)
    output = _output(message, choice.get("logprobs"), namespaced(request))
    if reason is not None and output:
        output[-1]["status"] = "incomplete"
    model = completion.get("model")
    tier = completion.get("service_tier")
    return response_object(
        request,
        response_id=response_id,
        created_at=created_at,
        status="completed" if reason is None else "incomplete",
        output=output,
        usage=usage if usage is not None else _chat_usage(completion.get("usage")),
        model=model if isinstance(model, str) and model else None,
        incomplete=reason,
        completed_at=completed_at,
        service_tier=tier if isinstance(tier, str) else None,
    )


def _output(message: Mapping[str, Any], logprobs: Any, names: Mapping[str, tuple[str, str]]) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    thought = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thought, str) and thought:
        output.append(
            {
                "id": new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": thought}],
                "status": "completed",
            }
        )
    text = _text(message.get("content"))
    refusal = message.get("refusal")
    calls = [call for call in message.get("tool_calls") or () if isinstance(call, Mapping)]
    parts: list[dict[str, Any]] = []
    if text or not (calls or refusal):
        parts.append({"type": "output_text", "text": text, "annotations": [], "logprobs": _logprobs(logprobs)})
    if isinstance(refusal, str) and refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    if parts:
        item = {"id": new_id("msg"), "type": "message", "status": "completed", "role": "assistant", "content": parts}
        output.append(item)
    for call in calls:
        function = call.get("function")
        if not isinstance(function, Mapping):
            function = {}
        name, arguments, call_id = function.get("name"), function.get("arguments"), call.get("id")
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "completed",
            "arguments": arguments if isinstance(arguments, str) else "",
            "call_id": call_id if isinstance(call_id, str) and call_id else new_id("call"),
            "name": name if isinstance(name, str) else "",
        }
        output.append(named_back(item, names))
    return output


def named_back(item: dict[str, Any], names: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """A ``function_call`` item of a namespace's function named as the client named it
    (``name`` and ``namespace``), not as it was sent flat; any other as it is."""
    found = names.get(item["name"])
    if found is not None:
        item["namespace"], item["name"] = found
    return item


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers answer in parts
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _logprobs(logprobs: Any) -> list[dict[str, Any]]:
    """Chat's ``logprobs.content`` in Responses' shape (the same tokens, ``bytes`` never null)."""
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not isinstance(content, list):
        return []
    out = []
    for token in content:
        if not isinstance(token, Mapping):
            continue
        top = [_token(t) for t in token.get("top_logprobs") or () if isinstance(t, Mapping)]
        out.append({**_token(token), "top_logprobs": top})
    return out


def _token(token: Mapping[str, Any]) -> dict[str, Any]:
    logprob = token.get("logprob")
    return {
        "token": str(token.get("token", "")),
        "bytes": list(token.get("bytes") or []),
        "logprob": float(logprob) if isinstance(logprob, (int, float)) else 0.0,
    }


def _chat_usage(raw: Any) -> Usage:
    usage = raw if isinstance(raw, Mapping) else {}
    prompt = usage.get("prompt_tokens_details")
    completion = usage.get("completion_tokens_details")
    prompt = prompt if isinstance(prompt, Mapping) else {}
    completion = completion if isinstance(completion, Mapping) else {}
    return Usage(
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
        cached_input_tokens=_count(prompt.get("cached_tokens")),
        reasoning_tokens=_count(completion.get("reasoning_tokens")),
        cache_write_tokens=_count(prompt.get("cache_write_tokens")),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def conversation_items(
    request_body: Mapping[str, Any], response: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """What to keep under a response's id so a later request can continue from it
    (``previous_response_id``): ``history`` (the stored items it continued), its input
    items (a string input as a user message, a message's string content as one text
    part) and its output items. ``instructions`` are not kept: OpenAI does not carry them
    over either. ``request_body`` must be one :func:`chat_from_responses` accepted."""
    items = [copy.deepcopy(dict(item)) for item in history]
    given = request_body.get("input")
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    for item in given or ():
        items.append(_normal(item))
    items.extend(copy.deepcopy(dict(item)) for item in response.get("output") or ())
    return items


def _normal(item: Mapping[str, Any]) -> dict[str, Any]:
    if item.get("type", "message" if "role" in item else None) != "message":
        return copy.deepcopy(dict(item))
    role, content = item["role"], item["content"]
    if isinstance(content, str):
        if role == "assistant":
            content = [{"type": "output_text", "text": content, "annotations": []}]
        else:
            content = [{"type": "input_text", "text": content}]
    return {"type": "message", "role": role, "content": copy.deepcopy(list(content))}
