"""What a streamed answer is made of, as every provider reports it to the engine.

A provider's ``stream()`` yields these in order: one :class:`StreamStart` when the
response began (its request id and rate-limit headers), then deltas of text and of tool
calls, usage whenever the provider tells it, and the finish reason. Wire formats differ
(OpenAI's ``chat.completion.chunk``, Anthropic's typed SSE events); these do not, so the
engine assembles one way for all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .._limits import RateLimitSnapshot
from .._models import Deployment, Request, Usage
from ._base import Reply

__all__ = [
    "Finish",
    "StreamEvent",
    "StreamStart",
    "StreamingProvider",
    "TextDelta",
    "ToolCallDelta",
    "UsageUpdate",
    "reply_events",
]


@dataclass(frozen=True, slots=True)
class StreamStart:
    """The response began (status 200): what its headers said. It may come again once
    the body names the answer's id and model; the fields given later fill in the first's."""

    request_id: str | None = None
    ratelimit: RateLimitSnapshot | None = None
    #: The provider's id for the answer (``chatcmpl-...``, ``msg_...``) and the model it names.
    id: str | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More of the answer's text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of the ``index``-th tool call: its id and name when it starts, then
    fragments of its JSON ``arguments`` (joined in order they form the whole)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class UsageUpdate:
    """The usage so far, whole (not an increment): the last one seen is the answer's."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class Finish:
    """Why the answer ended, in the provider's own words (``stop``, ``end_turn``, ...)."""

    reason: str | None
    #: The whole answer, when the stream's last event holds it (a Response, whose client
    #: is handed it as it is): then ``Result.raw``, not the engine's chat.completion.
    raw: Mapping[str, Any] | None = None


StreamEvent = StreamStart | TextDelta | ToolCallDelta | UsageUpdate | Finish


@runtime_checkable
class StreamingProvider(Protocol):
    """A provider that can send a request as a stream (every built-in one can).

    A provider without ``stream`` still serves ``Engine.stream()``: its ``send()`` reply
    arrives as a single delta.
    """

    def stream(
        self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The events of one attempt. Raises a ProviderError subclass on failure, before the
        first event (as ``send`` would) or during the stream. The caller closes the iterator
        (``aclose()``) when it stops early, which must close the connection."""
        ...


def reply_events(reply: Reply) -> list[StreamEvent]:
    """A whole reply as the events of a stream that delivered it in one piece."""
    events: list[StreamEvent] = [StreamStart(reply.request_id, reply.ratelimit)]
    if reply.text:
        events.append(TextDelta(reply.text))
    events.append(UsageUpdate(reply.usage))
    events.append(Finish(reply.finish_reason))
    return events
