"""The Responses API's stream (Server-Sent Events) written from sluice's stream deltas.

Each event is ``event: <type>`` and ``data: <json>`` with that ``type`` and a
``sequence_number`` counting from 0, as OpenAI sends them (see
``openai/types/responses/response_stream_event.py``): ``response.created`` and
``response.in_progress``; for a message ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``... then
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``; for a function call ``response.output_item.added``
(``arguments: ""``), ``response.function_call_arguments.delta``... then
``response.function_call_arguments.done`` and ``response.output_item.done``. An item is
done when the next one starts, or at the end; the end is ``response.completed`` (or
``response.incomplete``) with the whole Response, the one :func:`response_from_chat`
makes, its items' ids those of the events. There is no ``[DONE]`` line: OpenAI sends none.

A failure is an ``error`` event (``code``, ``message``, ``param`` at its top: OpenAI's
reference and the SDK's ``ResponseErrorEvent``; OpenAI's servers have been seen nesting
them under ``error``, which makes the Python SDK raise before it reads
``response.failed``) then ``response.failed``, whose ``error.code`` is one of the codes a
Response may carry (``server_error`` for any other). ``delta``, ``finish`` and ``failed``
write the start first if it was not written: the SDK reads nothing before
``response.created``. A fragment of a
call that arrives after a later item began (providers send calls one after another, so
this should not happen) still goes into that call: its delta is sent, and the final
Response holds the whole arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from ..._models import Usage
from ...providers._events import TextDelta, ToolCallDelta
from ._answer import ERROR_CODES, incomplete_reason, named_back, new_id, response_object
from ._tools import namespaced

__all__ = ["ResponsesEvents"]


def _json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # a lone surrogate in a model's text: escaped, still valid JSON
        return json.dumps(value, separators=(",", ":")).encode()


class ResponsesEvents:
    """One Responses stream's events, as SSE bytes: ``start()``, ``delta()`` per delta, then
    ``finish()`` or ``failed()``. ``request`` is the Responses body (for its echoed settings)."""

    __slots__ = (
        "_calls",
        "_created_at",
        "_id",
        "_items",
        "_model",
        "_names",
        "_open",
        "_request",
        "_seq",
        "_started",
        "response",
    )

    def __init__(
        self, request: Mapping[str, Any], *, response_id: str, created_at: float, model: str | None = None
    ) -> None:
        self._request = request
        self._id = response_id
        self._created_at = created_at
        self._model = model
        self._seq = 0
        self._started = False
        self._items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        #: Chat tool-call index -> its function_call item
        self._calls: dict[int, dict[str, Any]] = {}
        #: A namespace's functions as sent flat -> (namespace, name), as the client named them.
        self._names = namespaced(request)
        #: The final Response, once ``finish()`` or ``failed()`` wrote it.
        self.response: dict[str, Any] | None = None

    # -- public -----------------------------------------------------------------------------

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress`` (written once; later calls add nothing)."""
        if self._started:
            return b""
        self._started = True
        snapshot = self._snapshot("in_progress", [])
        created = self._event("response.created", response=snapshot)
        return created + self._event("response.in_progress", response=snapshot)

    def delta(self, delta: TextDelta | ToolCallDelta) -> bytes:
        self._check_open()
        out = self.start()
        if isinstance(delta, TextDelta):
            return out + self._text(delta.text)
        return out + self._call(delta)

    def finish(self, finish_reason: str | None, usage: Usage | None) -> bytes:
        """Close what is open and write ``response.completed`` (``response.incomplete`` for a
        ``length`` or ``content_filter`` finish) with the whole Response."""
        self._check_open()
        out = self.start()
        if not self._items:  # no delta at all: an empty message, as response_from_chat makes
            out += self._text("", force=True)
        reason = incomplete_reason(finish_reason)
        out += self._close("incomplete" if reason is not None else "completed")
        status = "completed" if reason is None else "incomplete"
        self.response = self._snapshot(status, self._items, usage=usage, incomplete=reason)
        return out + self._event(f"response.{status}", response=self.response)

    def failed(self, code: str | None, message: str) -> bytes:
        """An ``error`` event, then ``response.failed`` with what was written so far."""
        self._check_open()
        out = self.start()
        if self._open is not None:
            self._open["status"] = "incomplete"
            self._open = None
        code = code or "server_error"
        out += self._event("error", code=code, message=message, param=None)
        error = {"code": code if code in ERROR_CODES else "server_error", "message": message}
        self.response = self._snapshot("failed", self._items, error=error)
        return out + self._event("response.failed", response=self.response)

    # -- items ------------------------------------------------------------------------------

    def _text(self, text: str, *, force: bool = False) -> bytes:
        if not text and not force:
            return b""
        out = b""
        item = self._open
        if item is None or item["type"] != "message":
            out += self._close("completed")
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            out += self._add(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            index = self._index()
            out += self._event(
                "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
            )
            item["content"].append(part)
        item["content"][0]["text"] += text
        if text:
            out += self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._index(),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        return out

    def _call(self, delta: ToolCallDelta) -> bytes:
        out = b""
        item = self._calls.get(delta.index)
        if item is None:
            out += self._close("completed")
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": delta.id or new_id("call"),
                "name": delta.name or "",
            }
            named_back(item, self._names)
            self._calls[delta.index] = item
            out += self._add(item)
        elif delta.name and not item["name"]:
            item["name"] = delta.name
            named_back(item, self._names)
        if delta.arguments:
            item["arguments"] += delta.arguments
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=self._items.index(item),
                delta=delta.arguments,
            )
        return out

    def _add(self, item: dict[str, Any]) -> bytes:
        self._items.append(item)
        self._open = item
        return self._event("response.output_item.added", output_index=self._index(), item=_copy(item))

    def _close(self, status: str) -> bytes:
        """Done events for the item being written, if any, which ends ``status``."""
        item, self._open = self._open, None
        if item is None:
            return b""
        index = self._items.index(item)
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            out += self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            out += self._event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=_copy(part)
            )
        else:
            out += self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        item["status"] = status
        return out + self._event("response.output_item.done", output_index=index, item=_copy(item))

    def _index(self) -> int:
        return len(self._items) - 1

    # -- framing ----------------------------------------------------------------------------

    def _snapshot(self, status: str, output: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return response_object(
            self._request,
            response_id=self._id,
            created_at=self._created_at,
            status=status,
            output=[_copy(item) for item in output],
            model=self._model,
            **fields,
        )

    def _event(self, type_: str, **fields: Any) -> bytes:
        data = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + type_.encode() + b"\ndata: " + _json(data) + b"\n\n"

    def _check_open(self) -> None:
        if self.response is not None:
            raise RuntimeError("this Responses stream has ended (finish() or failed() was called)")


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """An item as it stands (an event must not change when the item grows later)."""
    copied = dict(item)
    if "content" in copied:
        copied["content"] = [dict(part) for part in copied["content"]]
    return copied
