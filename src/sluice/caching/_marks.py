"""Marking a request for the cache it goes to: Anthropic breakpoints, OpenAI's cache key.

A mark is made on a copy of the request as it is sent, never on the request the caller
gave (nor the one stored: keys, records and the output are the caller's request's).
Anthropic: ``cache_control`` on the block a boundary ends (the last tool, the system
prompt, a message's content or one of its parts), a text split in two where the boundary
falls inside it; the translation to Messages (``providers._translate``) carries the marks
through. OpenAI: ``prompt_cache_key`` when the request has none of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._models import Native, Request
from ._fingerprint import Cut, marked_positions

if TYPE_CHECKING:
    from ._rules import CacheRules

__all__ = ["anthropic_view", "asks_an_hour", "native_marked", "with_breakpoints", "with_key"]

#: The blocks of a Messages body before its messages that a breakpoint may end.
_TEXT_BLOCKS = ("system", "tools")

_5M: Mapping[str, str] = {"type": "ephemeral"}
_1H: Mapping[str, str] = {"type": "ephemeral", "ttl": "1h"}


def _control(ttl: str) -> dict[str, str]:
    return dict(_1H if ttl == "1h" else _5M)


def legal_ttls(ours: Sequence[tuple[int, str]], theirs: Sequence[tuple[int, str]]) -> list[str]:
    """The TTLs our breakpoints ((place, wanted TTL), in order) may have beside the
    request's own: a 1-hour breakpoint never after a 5-minute one (the API refuses it), so
    one of ours before a 1-hour one of theirs lasts an hour, and one after a 5-minute one
    (theirs or ours) five minutes."""
    chosen: list[str] = []
    short_from = min((place for place, ttl in theirs if ttl == "5m"), default=None)
    for place, ttl in ours:
        if any(p > place and t == "1h" for p, t in theirs):
            ttl = "1h"
        elif (short_from is not None and short_from < place) or "5m" in chosen:
            ttl = "5m"
        chosen.append(ttl)
    return chosen


def with_breakpoints(request: Request, cuts: Sequence[tuple[Cut, str]]) -> Request:
    """``request`` with a breakpoint (``cache_control``, of the TTL given) at each cut, in
    the common (Chat Completions) shape that the Anthropic translation reads."""
    messages: list[Any] = list(request.messages)
    params: dict[str, Any] = dict(request.params)
    by_block: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for cut, ttl in cuts:
        by_block.setdefault((cut.message, cut.part), []).append((cut.offset, ttl))
    for (message, part), marks in by_block.items():
        if message == -2:
            tools = list(params["tools"])
            tools[-1] = {**tools[-1], "cache_control": _control(marks[-1][1])}
            params["tools"] = tools
        elif message == -1:
            params["system"] = _marked(params["system"], part, marks)
        else:
            entry = messages[message]
            messages[message] = {**entry, "content": _marked(entry["content"], part, marks)}
    return dataclasses.replace(request, messages=messages, params=params)


def _marked(content: Any, part: int, marks: list[tuple[int, str]]) -> list[Any]:
    """A content (a string, or a list of parts) with ``part`` (-1: the string) split at each
    mark's offset (-1: its end), each piece before a mark carrying it."""
    if part < 0:
        return _split(str(content), marks, {})
    parts = list(content)
    block = parts[part]
    if isinstance(block, str):
        block = {"type": "text", "text": block}
    if block.get("type") in ("text", "input_text") and isinstance(block.get("text"), str):
        extra = {k: v for k, v in block.items() if k not in ("type", "text")}
        parts[part : part + 1] = _split(block["text"], marks, extra)
    else:
        parts[part] = {**block, "cache_control": _control(marks[-1][1])}
    return parts


def _split(text: str, marks: list[tuple[int, str]], extra: Mapping[str, Any]) -> list[dict[str, Any]]:
    pieces: list[dict[str, Any]] = []
    taken = 0
    end_ttl = None
    for offset, ttl in sorted(marks, key=lambda m: len(text) if m[0] < 0 else m[0]):
        if offset < 0 or offset >= len(text):
            end_ttl = ttl
            continue
        pieces.append({"type": "text", "text": text[taken:offset], "cache_control": _control(ttl)})
        taken = offset
    last: dict[str, Any] = {**extra, "type": "text", "text": text[taken:]}
    if end_ttl is not None:
        last["cache_control"] = _control(end_ttl)
    elif "cache_control" in extra:
        last["cache_control"] = extra["cache_control"]
    pieces.append(last)
    return pieces


def with_key(request: Request, key: str) -> Request:
    """``request`` with ``prompt_cache_key`` (kept as it is when it has one)."""
    if request.params.get("prompt_cache_key") is not None:
        return request
    return dataclasses.replace(request, params={**request.params, "prompt_cache_key": key})


def asks_an_hour(request: Request) -> bool:
    """Whether ``request`` carries a breakpoint of ``"ttl": "1h"`` (a write billed at twice
    the input price: its worst case must say so)."""
    if not request.params and all(isinstance(m.get("content"), str) for m in request.messages):
        return False  # the common case: nothing can carry a mark
    return any(ttl == "1h" for _, ttl in marked_positions(request))


def anthropic_view(request: Request, rules: CacheRules) -> Request:
    """What the deployment is sent, as a Request the fingerprint reads: an Anthropic
    Messages body as written (an Anthropic deployment is sent it as it is), else the
    request's common fields."""
    native = request.native
    if native is None or native.api != "anthropic" or rules.kind != "anthropic":
        return request
    body = native.body
    messages = body.get("messages")
    params = {key: body[key] for key in _TEXT_BLOCKS if body.get(key)}
    return dataclasses.replace(request, messages=messages if isinstance(messages, list) else [], params=params)


def native_marked(request: Request, sent: Request) -> Request:
    """``request`` whose Messages body carries the marks made on its view (:func:`anthropic_view`)."""
    native = request.native
    assert native is not None
    body = {**native.body, "messages": list(sent.messages)}
    body.update({key: sent.params[key] for key in _TEXT_BLOCKS if key in sent.params})
    return dataclasses.replace(request, native=Native(native.api, body, native.lost))
