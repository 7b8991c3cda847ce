"""OpenAI-compatible streaming: ``chat.completion.chunk`` objects in SSE ``data:`` lines,
ended by ``data: [DONE]``; with ``stream_options.include_usage`` a last chunk with empty
``choices`` carries the usage. Only choice 0 is read (a stream with ``n`` > 1 gives the
first answer). An ``error`` object in a chunk ends the stream with that error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _json
from .._errors import BadRequestError, MalformedResponseError, ProviderError, ServerError
from .._models import Usage
from ._events import Finish, StreamEvent, StreamStart, TextDelta, ToolCallDelta, UsageUpdate
from ._http import token_count
from ._sse import SseEvent

__all__ = ["OpenAIStreamDecoder", "openai_usage"]


def openai_usage(usage: Mapping[str, Any]) -> Usage:
    """A ``usage`` object of a chat completion (or of its last chunk) as a Usage. Raises
    AttributeError for details that are not objects (the caller's malformed response)."""
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    return Usage(
        token_count(usage.get("prompt_tokens")),
        token_count(usage.get("completion_tokens")),
        token_count(prompt_details.get("cached_tokens")) if prompt_details else 0,
        token_count(completion_details.get("reasoning_tokens")) if completion_details else 0,
        token_count(prompt_details.get("cache_write_tokens")) if prompt_details else 0,  # GPT-5.6 on: billed
    )


class OpenAIStreamDecoder:
    """Chunks in, events out; ``close()`` checks the stream really ended."""

    __slots__ = ("_label", "_named", "_request_id", "done")

    def __init__(self, label: str, request_id: str | None) -> None:
        self._label = label
        self._request_id = request_id
        self._named = False
        #: ``[DONE]`` arrived.
        self.done = False

    def feed(self, sse: SseEvent) -> list[StreamEvent]:
        if self.done:
            return []
        data = sse.data.strip()
        if data == "[DONE]":
            self.done = True
            return []
        try:
            chunk = _json.loads(data)
        except ValueError:
            raise self._malformed(f"a chunk that is not JSON ({len(data)} characters)") from None
        if not isinstance(chunk, Mapping):
            raise self._malformed("a chunk that is not a JSON object")
        if sse.event == "error" or chunk.get("error") is not None:
            raise self._error(chunk.get("error", chunk))
        try:
            return self._chunk(chunk)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a chunk of the wrong shape
            raise self._malformed(f"an unexpected chunk ({type(exc).__name__}: {exc})") from None

    def _chunk(self, chunk: Mapping[str, Any]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if not self._named:
            self._named = True
            answer_id, model = chunk.get("id"), chunk.get("model")
            events.append(StreamStart(id=_text(answer_id), model=_text(model)))
        choices = chunk.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise self._malformed("a chunk whose choices are not a list")
        for choice in choices or ():
            if not isinstance(choice, Mapping):
                raise self._malformed("a chunk with a choice that is not an object")
            if choice.get("index", 0) == 0:
                self._choice(choice, events)
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            events.append(UsageUpdate(openai_usage(usage)))
        return events

    def close(self) -> list[StreamEvent]:
        if not self.done:
            raise self._malformed("a stream that ended before data: [DONE]")
        return []

    def _choice(self, choice: Mapping[str, Any], events: list[StreamEvent]) -> None:
        delta = choice.get("delta") or {}
        if not isinstance(delta, Mapping):
            raise self._malformed("a chunk whose delta is not an object")
        content = delta.get("content")
        if isinstance(content, str) and content:
            events.append(TextDelta(content))
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, Mapping) or not isinstance(call.get("index", 0), int):
                raise self._malformed("a tool-call delta that is not an object with an integer index")
            function = call.get("function") or {}
            name = function.get("name") if isinstance(function, Mapping) else None
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
            events.append(
                ToolCallDelta(
                    index=call.get("index", 0),
                    id=_text(call.get("id")),
                    name=_text(name),
                    arguments=arguments if isinstance(arguments, str) else "",
                )
            )
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            events.append(Finish(finish))

    def _malformed(self, what: str) -> MalformedResponseError:
        return MalformedResponseError(f"{self._label} streamed {what}", request_id=self._request_id)

    def _error(self, error: Any) -> ProviderError:
        """An error sent mid-stream (status 200 already gone): the work may have been billed."""
        message = str(error.get("message") or "error") if isinstance(error, Mapping) else str(error)[:200]
        kind = (error.get("code") or error.get("type")) if isinstance(error, Mapping) else None
        rejected = isinstance(error, Mapping) and error.get("type") == "invalid_request_error"
        cls = BadRequestError if rejected else ServerError
        return cls(
            f"{self._label} sent an error mid-stream: {message}",
            request_id=self._request_id,
            provider_type=str(kind) if kind else None,
            maybe_billed=True,
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
