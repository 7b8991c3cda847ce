"""OpenAI's Responses API as an upstream: a Response object, and its event stream, read
into a Reply and sluice's stream events.

A Response's answer is the ``output_text`` parts of its ``message`` output items; its
function calls are its ``function_call`` items (tool calls 0, 1, ... in the order they
come). Its ``status`` says how it ended: ``completed``, ``incomplete`` (with
``incomplete_details.reason``: ``max_output_tokens``, ``content_filter``) or ``failed``
(with an ``error``). These are read as Chat Completions' finish reasons (``stop``,
``tool_calls``, ``length``, ``content_filter``), which the rest of sluice speaks, while
``Reply.raw`` is the Response itself: a client of the Responses API gets it as it is.

The stream is typed SSE events, each with a ``sequence_number``: ``response.created``,
``response.output_item.added`` / ``.done``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, then ``response.completed``,
``response.incomplete`` or ``response.failed`` (each holding the whole Response), or an
``error`` event. Other event types (reasoning summaries, web search progress, those added
later) are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import BadRequestError, MalformedResponseError, ProviderError, RateLimitError, ServerError
from .._models import Usage
from ._base import Reply
from ._events import Finish, StreamEvent, StreamStart, TextDelta, ToolCallDelta, UsageUpdate
from ._http import token_count
from ._sse import SseError, SseEvent, typed_data

__all__ = ["ResponsesStreamDecoder", "responses_reply", "responses_usage"]

#: ``incomplete_details.reason`` as Chat Completions' finish reason (others as they are).
FINISH_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}

#: Error codes (and types) of a rate limit, retried as a 429 is.
_RATE_LIMITED = frozenset({"rate_limit_exceeded", "too_many_requests", "rate_limit_error"})
#: The codes of a failed Response's ``error`` that are the server's fault; its others
#: (``invalid_prompt``, the image errors, the policy refusals) are the request's.
_SERVER_SIDE = frozenset({"server_error", "vector_store_timeout"})


def responses_usage(usage: Mapping[str, Any]) -> Usage:
    """A Response's ``usage``: its input counts the cached and cache-written tokens."""
    input_details = usage.get("input_tokens_details") or {}
    output_details = usage.get("output_tokens_details") or {}
    return Usage(
        input_tokens=token_count(usage.get("input_tokens")),
        output_tokens=token_count(usage.get("output_tokens")),
        cached_input_tokens=token_count(input_details.get("cached_tokens")),
        reasoning_tokens=token_count(output_details.get("reasoning_tokens")),
        cache_write_tokens=token_count(input_details.get("cache_write_tokens")),
    )


def responses_reply(body: Mapping[str, Any]) -> Reply:
    """Text, usage and finish reason of a Response; ``raw`` the Response. A failed one
    raises its error; one still ``queued`` or ``in_progress`` (``background: true``)
    raises BadRequestError, since sluice needs the whole answer."""
    _check_ended(body)
    output = body.get("output")
    if not isinstance(output, list):
        raise MalformedResponseError("the response has no output list")
    texts: list[str] = []
    calls = 0
    for item in output:
        if not isinstance(item, Mapping):
            raise MalformedResponseError("the response has an output item that is not an object")
        if item.get("type") == "function_call":
            calls += 1
        elif item.get("type") == "message":
            parts = [part for part in item.get("content") or () if isinstance(part, Mapping)]
            texts += [p["text"] for p in parts if p.get("type") == "output_text" and isinstance(p.get("text"), str)]
    usage = body.get("usage")
    return Reply(
        text="".join(texts) if texts or not calls else None,
        usage=responses_usage(usage) if isinstance(usage, Mapping) else Usage(),
        raw=body,
        finish_reason=finish_reason(body, calls),
    )


def finish_reason(body: Mapping[str, Any], calls: int, *, incomplete: bool | None = None) -> str:
    """How a Response ended, in Chat Completions' words (``incomplete``: as its stream's
    last event said, whatever its ``status``)."""
    if incomplete is None:
        incomplete = body.get("status") == "incomplete"
    if incomplete:
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        return FINISH_REASONS.get(str(reason), str(reason)) if reason else "length"
    return "tool_calls" if calls else "stop"


def _check_ended(body: Mapping[str, Any]) -> None:
    status = body.get("status")
    if status == "failed":
        raise response_error(body.get("error"), "the response failed")
    if status not in ("completed", "incomplete", None):  # None: a compatible server that does not say
        raise BadRequestError(
            f"the response is {status!r}, not finished: sluice needs the whole answer "
            "(send the request without background: true)",
            maybe_billed=True,
        )


def response_error(error: Any, what: str, request_id: str | None = None) -> ProviderError:
    """The ProviderError for an ``error`` (of a failed Response, or an ``error`` event),
    classified as the same error would be as a response: a rate limit retried as a 429
    is, the request's fault not retried, the server's retried. The work may have been
    billed."""
    error = error if isinstance(error, Mapping) else {}
    kind, code = error.get("type"), error.get("code")
    if kind in _RATE_LIMITED or code in _RATE_LIMITED:
        cls: type[ProviderError] = RateLimitError
    elif kind == "invalid_request_error" or (kind is None and code is not None and code not in _SERVER_SIDE):
        cls = BadRequestError
    else:
        cls = ServerError
    name = code or kind
    return cls(
        f"{what}: {error.get('message') or 'error'}",
        request_id=request_id,
        provider_type=str(name) if name else None,
        maybe_billed=True,
    )


class ResponsesStreamDecoder:
    """Events in, sluice's stream events out; ``close()`` checks the stream really ended."""

    __slots__ = ("_argued", "_calls", "_label", "_request_id", "done")

    def __init__(self, label: str, request_id: str | None) -> None:
        self._label = label
        self._request_id = request_id
        #: Output index -> tool-call number, for the ``function_call`` items.
        self._calls: dict[int, int] = {}
        #: The tool calls whose arguments have come (a server may give them only when done).
        self._argued: set[int] = set()
        #: ``response.completed`` or ``response.incomplete`` arrived.
        self.done = False

    def feed(self, sse: SseEvent) -> list[StreamEvent]:
        if self.done or sse.data.strip() == "[DONE]":  # a compatible server's end marker, after the end
            return []
        try:
            kind, data = typed_data(sse)
        except SseError as exc:
            raise self._malformed(str(exc)) from None
        try:
            return self._event(kind, data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # an event of the wrong shape
            raise self._malformed(f"an unexpected {kind!r} event ({type(exc).__name__}: {exc})") from None

    def close(self) -> list[StreamEvent]:
        if not self.done:
            raise self._malformed("a stream that ended before response.completed")
        return []

    def _event(self, kind: str, data: Mapping[str, Any]) -> list[StreamEvent]:
        if kind == "response.output_text.delta":
            return [TextDelta(data["delta"])] if data["delta"] else []
        if kind == "response.function_call_arguments.delta":
            number = self._calls[data["output_index"]]
            self._argued.add(number)
            return [ToolCallDelta(number, arguments=data["delta"])] if data["delta"] else []
        if kind in ("response.output_item.added", "response.output_item.done"):
            return self._item(data["output_index"], data["item"])
        if kind == "response.created":
            response = data["response"]
            return [StreamStart(id=_text(response.get("id")), model=_text(response.get("model")))]
        if kind in ("response.completed", "response.incomplete"):
            response = data["response"]
            self.done = True
            usage = response.get("usage")
            events: list[StreamEvent] = [UsageUpdate(responses_usage(usage))] if isinstance(usage, Mapping) else []
            reason = finish_reason(response, len(self._calls), incomplete=kind == "response.incomplete")
            events.append(Finish(reason, raw=response))
            return events
        if kind == "response.failed":
            self.done = True
            raise response_error(data["response"].get("error"), self._mid_stream, self._request_id)
        if kind == "error":
            nested = data.get("error")  # as OpenAI sends it; its reference puts the fields at the top
            raise response_error(nested if isinstance(nested, Mapping) else data, self._mid_stream, self._request_id)
        return []

    def _item(self, index: int, item: Mapping[str, Any]) -> list[StreamEvent]:
        """A function call begins (its id and name), or ends: its arguments, if none came."""
        if item["type"] != "function_call":
            return []
        number = self._calls.get(index)
        if number is None:
            number = self._calls[index] = len(self._calls)
            arguments = item.get("arguments") or ""
            if arguments:
                self._argued.add(number)
            call_id, name = _text(item.get("call_id")), _text(item.get("name"))
            return [ToolCallDelta(number, id=call_id, name=name, arguments=arguments)]
        if number not in self._argued and item.get("arguments"):
            self._argued.add(number)
            return [ToolCallDelta(number, arguments=item["arguments"])]
        return []

    @property
    def _mid_stream(self) -> str:
        return f"{self._label} sent an error mid-stream"

    def _malformed(self, what: str) -> MalformedResponseError:
        return MalformedResponseError(f"{self._label} streamed {what}", request_id=self._request_id)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
