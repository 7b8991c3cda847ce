"""Lines of a batch's output and error files, in OpenAI's shape.

An answered request (``output_file_id``)::

    {"id": "batch_req_…", "custom_id": "…", "error": null,
     "response": {"status_code": 200, "request_id": "…", "body": {…the chat.completion…}}}

(the body of a ``/v1/responses`` line is a Response, of an embeddings line a list).

A failed one (``error_file_id``): ``response`` holds the provider's refusal when there was
one (``{"status_code": 4xx/5xx, "request_id", "body": {"error": {…}}}``), else null (a line
that was never a valid request, a connection that failed, a cancelled or expired batch);
``error`` is ``{"code", "message"}`` either way. The codes are OpenAI's where it has one
(``batch_cancelled``, ``batch_expired``, ``request_timeout``), else sluice's error kind
(``invalid_input``, ``rate_limited``, ``budget_exhausted``…).

Messages are scrubbed of URLs and of the deployments' hosts: a client of ``sluice serve``
never learns where its requests went, nor any key (the engine masks keys already).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..._models import Usage
from ...shapes.responses._api import response_from_chat
from ..core._errors import UPSTREAM_AUTH, upstream_auth_failed
from ..files._ctx import derived_id

__all__ = [
    "Scrubber",
    "batch_usage",
    "chat_body",
    "error_line",
    "not_run_line",
    "output_line",
    "response_body",
    "usage_of",
]

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_CODES = {"timeout": "request_timeout"}


class Scrubber:
    """Removes upstream URLs and hosts from messages bound for clients."""

    __slots__ = ("_hosts",)

    def __init__(self, base_urls: Iterable[str | None]) -> None:
        hosts: set[str] = set()
        for url in base_urls:
            if not url:
                continue
            parts = urlsplit(url)
            if parts.netloc:
                hosts.add(parts.netloc)
            if parts.hostname:
                hosts.add(parts.hostname)
        self._hosts = sorted(hosts, key=len, reverse=True)  # host:port before host

    def __call__(self, message: str) -> str:
        message = _URL.sub("[upstream]", message)
        for host in self._hosts:
            message = message.replace(host, "[upstream]")
        return message


def usage_of(record: Mapping[str, Any]) -> Usage:
    """The usage a stored result record holds (nothing for one with none)."""
    usage = record.get("usage")
    if not isinstance(usage, Mapping):
        return Usage()
    return Usage(**{k: int(v) for k, v in usage.items() if k in Usage.__dataclass_fields__ and isinstance(v, int)})


def batch_usage(usage: Usage) -> dict[str, Any]:
    """A finished batch's ``usage``, as OpenAI reports it: its answered requests' tokens."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def _request_id(batch_id: str, line: int) -> str:
    return derived_id("batch_req_", batch_id, str(line), nbytes=16)


def chat_body(record: Mapping[str, Any], created: int | None = None) -> dict[str, Any]:
    """The chat.completion a record stands for: the provider's own (OpenAI-shaped, also for
    Anthropic after translation), or one made from the text and usage (simulated and
    callable providers give no such body)."""
    raw = record.get("raw")
    if isinstance(raw, Mapping) and isinstance(raw.get("choices"), list):
        return dict(raw)
    usage = record.get("usage") or {}
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {
        "id": f"chatcmpl-{record.get('request_id') or 'sluice'}",
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": record.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": record.get("text"), "refusal": None},
                "logprobs": None,
                "finish_reason": record.get("finish_reason") or "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def response_body(record: Mapping[str, Any], request: Mapping[str, Any], response_id: str) -> dict[str, Any]:
    """The Response a record of a ``/v1/responses`` line stands for: the upstream's own
    when the deployment speaks Responses, else the chat completion as one (``request`` is
    the line's body, which a Response echoes)."""
    raw = record.get("raw")
    if isinstance(raw, Mapping) and raw.get("object") == "response":
        return dict(raw)
    created = int(time.time())
    completion = chat_body(record, created)
    return response_from_chat(
        completion, response_id=response_id, request=request, created_at=created, usage=usage_of(record)
    )


def output_line(
    batch_id: str, line: int, custom_id: str | None, body: Mapping[str, Any], request_id: str | None
) -> dict[str, Any]:
    return {
        "id": _request_id(batch_id, line),
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id or _request_id(batch_id, line), "body": body},
        "error": None,
    }


def error_line(
    batch_id: str, line: int, custom_id: str | None, error: Mapping[str, Any], scrub: Scrubber
) -> dict[str, Any]:
    """A failed request from its stored error record (``type``, ``message``, ``status``…)."""
    kind = str(error.get("type") or "error")
    message = scrub(str(error.get("message") or kind))
    status = error.get("status")
    if kind in UPSTREAM_AUTH:  # the server's own key refused: a gateway failure, never the provider's words
        kind, message, status = "upstream_auth_failed", upstream_auth_failed(status), 502
        error = {}
    response = None
    if isinstance(status, int) and 400 <= status <= 599:
        response = {
            "status_code": status,
            "request_id": error.get("request_id") or _request_id(batch_id, line),
            "body": {
                "error": {
                    "message": message,
                    "type": error.get("provider_type") or kind,
                    "param": None,
                    "code": error.get("provider_type") or kind,
                }
            },
        }
    return {
        "id": _request_id(batch_id, line),
        "custom_id": custom_id,
        "response": response,
        "error": {"code": _CODES.get(kind, kind), "message": message},
    }


def not_run_line(batch_id: str, line: int, custom_id: str | None, status: str) -> dict[str, Any]:
    """A request the batch never ran: it was cancelled, or its window ended first."""
    if status == "expired":
        code, message = "batch_expired", "the request was not run before the batch's completion window ended"
    else:
        code, message = "batch_cancelled", "the batch was cancelled before this request ran"
    return {
        "id": _request_id(batch_id, line),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
