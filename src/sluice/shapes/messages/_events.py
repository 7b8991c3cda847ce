"""Anthropic's Messages stream, written from sluice's deltas (raw_message_stream_event.py).

One answer is ``message_start`` (the message, empty, with the input usage), then content
blocks numbered 0, 1, ... in order, each ``content_block_start`` / ``content_block_delta``
(``text_delta``, or ``input_json_delta`` for a ``tool_use``) / ``content_block_stop``, then
``message_delta`` (stop reason, usage) and ``message_stop``. Only one block is open at a
time: a new tool call, or text after a tool call, closes the open block. A tool call's
arguments stream as they come (the client parses them at the block's end); its pieces must
arrive together, as every provider sluice speaks sends them, because a closed block
cannot take more.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ..._models import Usage
from ...providers._events import TextDelta, ToolCallDelta
from ._out import message_id as new_message_id
from ._out import stop_reason_for, tool_use_id, usage_from

__all__ = ["MessagesEvents", "sse_event"]


def sse_event(kind: str, data: Any) -> bytes:
    """One Server-Sent Event as Anthropic writes it: ``event: <type>`` and its JSON."""
    try:
        encoded = orjson.dumps(data)
    except TypeError:  # a lone surrogate (orjson refuses it): escaped, still valid JSON
        encoded = json.dumps(data, separators=(",", ":")).encode()
    return b"event: " + kind.encode() + b"\ndata: " + encoded + b"\n\n"


class MessagesEvents:
    """The bytes of one answer's stream; each method returns what to write next.

    Call :meth:`start` first, then :meth:`delta` for each delta (and :meth:`ping` to keep
    the connection alive), then :meth:`finish`, or :meth:`error` when the answer fails
    after the stream began. Raises ValueError when called out of that order.
    """

    __slots__ = ("_blocks", "_calls", "_done", "_open", "_open_call", "_started", "message_id")

    def __init__(self, message_id: str | None = None) -> None:
        #: ``msg_...``: the given id (made valid) or a fresh one.
        self.message_id = new_message_id(message_id)
        self._started = False
        self._done = False
        self._blocks = 0  # blocks begun, so the next one's index
        self._open: int | None = None  # the open block's index
        self._open_call: int | None = None  # the tool-call index of the open block (None: text)
        self._calls: set[int] = set()  # tool-call indexes begun

    def start(self, model: str, usage: Usage | None = None) -> bytes:
        """``message_start``: the message as it begins (``usage``: the input's, if known)."""
        if self._started:
            raise ValueError("the stream has already started")
        self._started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_from(usage or Usage()),
        }
        return sse_event("message_start", {"type": "message_start", "message": message})

    def delta(self, delta: TextDelta | ToolCallDelta) -> bytes:
        self._check()
        if isinstance(delta, TextDelta):
            if not delta.text:
                return b""
            out = b""
            if self._open is None or self._open_call is not None:
                out = self._close() + self._begin({"type": "text", "text": ""}, None)
            return out + self._piece({"type": "text_delta", "text": delta.text})
        out = b""
        if delta.index not in self._calls:
            self._calls.add(delta.index)
            block = {"type": "tool_use", "id": tool_use_id(delta.id), "name": delta.name or "", "input": {}}
            out = self._close() + self._begin(block, delta.index)
        elif delta.index != self._open_call:
            if not delta.arguments:
                return b""  # nothing more of it (a repeated id or name)
            raise ValueError(
                f"a piece of tool call {delta.index} came after a later block began; "
                "Anthropic's blocks cannot interleave"
            )
        if delta.arguments:
            out += self._piece({"type": "input_json_delta", "partial_json": delta.arguments})
        return out

    def ping(self) -> bytes:
        self._check()
        return sse_event("ping", {"type": "ping"})

    def finish(self, finish_reason: str | None, usage: Usage | None = None) -> bytes:
        """The open block's end, ``message_delta`` (the stop reason, from a chat finish
        reason, and the whole usage) and ``message_stop``."""
        self._check()
        out = self._close()
        self._done = True
        reason = stop_reason_for(finish_reason, tool_use=bool(self._calls))
        counts: dict[str, int] = usage_from(usage) if usage is not None else {"output_tokens": 0}
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None}, "usage": counts}
        return out + sse_event("message_delta", delta) + sse_event("message_stop", {"type": "message_stop"})

    def error(self, kind: str, message: str) -> bytes:
        """An ``error`` event (``kind``: Anthropic's error type, e.g. ``overloaded_error``);
        the stream ends with it."""
        if self._done:
            raise ValueError("the stream has already ended")
        self._done = True
        return sse_event("error", {"type": "error", "error": {"type": kind, "message": message}})

    def _check(self) -> None:
        if not self._started:
            raise ValueError("start() the stream first")
        if self._done:
            raise ValueError("the stream has already ended")

    def _begin(self, block: dict[str, Any], call: int | None) -> bytes:
        self._open, self._open_call = self._blocks, call
        self._blocks += 1
        start = {"type": "content_block_start", "index": self._open, "content_block": block}
        return sse_event("content_block_start", start)

    def _piece(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self._open, "delta": delta})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open, self._open_call = self._open, None, None
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
