"""Server-sent events (the ``text/event-stream`` both OpenAI and Anthropic stream in).

Written by hand because the libraries that parse SSE each bring their own HTTP client
(httpx-sse, aiohttp-sse-client, sseclient): sluice reads the bytes from its one pooled
aiohttp session, so it needs only the parser, which is forty lines of the WHATWG rules
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):
lines end in CRLF, LF or CR; ``field: value``; a blank line dispatches; ``:`` starts a
comment; ``data`` lines join with newlines.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import _json

__all__ = ["SseDecoder", "SseError", "SseEvent", "typed_data"]

_EOL = re.compile(r"\r\n|\r|\n")

#: The most one line or one event may hold before the stream counts as broken: a
#: misbehaving server must not grow the buffer without bound.
MAX_EVENT_CHARS = 16 * 1024 * 1024


class SseError(ValueError):
    """The bytes are not an event stream (an event or a line beyond any sane size)."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its type (``message`` unless the server named one) and data."""

    event: str
    data: str
    id: str | None = None


class SseDecoder:
    """Feed bytes as they arrive; get back the events they complete."""

    __slots__ = ("_buffer", "_data", "_decoder", "_event", "_id", "_limit", "_size", "_started")

    def __init__(self, *, limit: int = MAX_EVENT_CHARS) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._id: str | None = None
        self._limit = limit
        self._started = False

    def feed(self, chunk: bytes) -> list[SseEvent]:
        text = self._buffer + self._decoder.decode(chunk)
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        events: list[SseEvent] = []
        start = 0
        for match in _EOL.finditer(text):
            if match.group() == "\r" and match.end() == len(text):
                break  # maybe the first half of a CRLF split across chunks
            self._line(text[start : match.start()], events)
            start = match.end()
        self._buffer = text[start:]
        if len(self._buffer) > self._limit:
            raise SseError(f"an event-stream line longer than {self._limit} characters")
        return events

    def close(self) -> list[SseEvent]:
        """The stream ended: a last line without its end still counts; an event whose
        blank line never came does not (the spec drops it)."""
        events: list[SseEvent] = []
        rest = self._buffer + self._decoder.decode(b"", final=True)
        self._buffer = ""
        if rest:
            for line in _EOL.split(rest.removesuffix("\r")):
                self._line(line, events)
        return events

    def _line(self, line: str, events: list[SseEvent]) -> None:
        if not line:
            if self._data:
                events.append(SseEvent(self._event or "message", "\n".join(self._data), self._id))
            self._event = ""
            self._data = []
            self._size = 0
            return
        if line.startswith(":"):
            return  # a comment (keep-alive)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._size += len(value) + 1
            if self._size > self._limit:
                raise SseError(f"an event larger than {self._limit} characters")
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        # "retry" and unknown fields are ignored, as the spec says


def typed_data(sse: SseEvent) -> tuple[str, Mapping[str, Any]]:
    """(its type, its data) of an event of a typed stream (Anthropic's Messages, OpenAI's
    Responses: each event's JSON names its ``type``, else the SSE ``event`` line does);
    SseError when the data is not a JSON object."""
    try:
        data = _json.loads(sse.data)
    except ValueError:
        raise SseError(f"a {sse.event!r} event whose data is not JSON") from None
    if not isinstance(data, Mapping):
        raise SseError(f"a {sse.event!r} event whose data is not an object")
    return str(data.get("type") or sse.event), data
