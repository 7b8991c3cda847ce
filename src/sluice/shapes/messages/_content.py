"""Anthropic ``messages`` -> Chat Completions messages (the decisions: :mod:`._in`).

Consecutive messages of one role are one turn, as Anthropic combines them, and each turn
becomes one chat message: the assistant's text and ``tool_calls`` together (Chat
Completions wants a call's answers right after the message that made it), a user turn's
``tool_result`` blocks as ``role: "tool"`` messages in order, then the rest of that turn
as one user message. Tool uses and results are paired as Anthropic pairs them, and
refused as it refuses them (a use without a result in the next turn, a result whose use
is not in the turn before), since a chat deployment refuses the same.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._fields import compact_json, obj, refuse, seq, shown, text

__all__ = ["MAX_MESSAGES", "chat_messages", "text_part", "text_parts"]

#: message_create_params.py: "There is a limit of 100,000 messages in a single request."
MAX_MESSAGES = 100_000
_ID = re.compile(r"[a-zA-Z0-9_-]+")
#: base64_image_source_param.py
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
#: Blocks of Anthropic's server tools (content_block_param.py): what ran on Anthropic's side.
_SERVER_BLOCKS = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    }
)
_THINKING = frozenset({"thinking", "redacted_thinking"})
_NO_CHAT = "a Chat Completions deployment cannot be told it"


@dataclass(slots=True)
class _Turn:
    role: str
    first: int  # its first message's index, for messages
    parts: list[dict[str, Any]] = field(default_factory=list)  # text (and, for a user, image/file) parts
    calls: list[dict[str, Any]] = field(default_factory=list)  # an assistant's tool_calls
    results: list[dict[str, Any]] = field(default_factory=list)  # a user's tool messages
    attachments: list[dict[str, Any]] = field(default_factory=list)  # images/PDFs of tool results
    result_ids: list[tuple[str, str]] = field(default_factory=list)  # (tool_use_id, where)


@dataclass(slots=True)
class _Reading:
    lost: list[str]
    seen_ids: set[str] = field(default_factory=set)


def chat_messages(value: Any, lost: list[str]) -> list[dict[str, Any]]:
    """The chat messages of Anthropic's ``messages``; what cannot be said is added to ``lost``."""
    items = seq(value, "messages", empty=False)
    if len(items) > MAX_MESSAGES:
        refuse("messages", f"there is a limit of {MAX_MESSAGES:,} messages in a single request")
    reading = _Reading(lost)
    turns: list[_Turn] = []
    for index, item in enumerate(items):
        where = f"messages[{index}]"
        message = obj(item, where)
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            refuse(f"{where}.role", f"must be 'user', 'assistant' or 'system', got {shown(role)}")
        if "content" not in message:
            refuse(f"{where}.content", "is required")
        blocks = _blocks(message["content"], f"{where}.content")
        final = index == len(items) - 1 and role == "assistant"
        if not blocks and not final:
            refuse(where, "all messages must have non-empty content except for an optional final assistant message")
        if role == "system" or not turns or turns[-1].role != role:
            turns.append(_Turn(role, index))
        for block, at in blocks:
            _block(block, at, turns[-1], reading)
        if final and blocks:
            block, at = blocks[-1]
            if block.get("type") == "text" and block["text"] != block["text"].rstrip():
                refuse(at, "final assistant content cannot end with trailing whitespace")
    _check_pairs(turns)
    last = turns[-1]
    if last.role == "assistant" and (last.parts or last.calls):
        lost.append(
            f"messages[{len(items) - 1}]: a final assistant message (a prefill) is continued by Claude, "
            "where a Chat Completions model answers it anew"
        )
    out = _emit(turns)
    if not out and not lost:  # (with something lost, the request is valid, only not for a chat model)
        refuse("messages", "there is nothing to answer: no message holds anything but thinking or an empty prefill")
    return out


def _blocks(content: Any, where: str) -> list[tuple[Mapping[str, Any], str]]:
    """(block, its path) for a message's content; a string is one text block."""
    if isinstance(content, str):
        return [({"type": "text", "text": content}, where)] if content else []
    return [(obj(block, f"{where}[{n}]"), f"{where}[{n}]") for n, block in enumerate(seq(content, where))]


def text_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A text block as a text part (``cache_control`` and ``citations`` of an earlier
    answer's text are dropped: the words are what the model reads)."""
    value = text(block.get("text"), f"{where}.text")
    if not value:
        refuse(where, "text content blocks must be non-empty")
    if not value.strip():
        refuse(where, "text content blocks must contain non-whitespace text")
    return {"type": "text", "text": value}


def _block(block: Mapping[str, Any], where: str, turn: _Turn, reading: _Reading) -> None:
    kind = block.get("type")
    if not isinstance(kind, str):
        refuse(f"{where}.type", f"must be a string naming the block's type, got {shown(kind)}")
    if kind == "text":
        turn.parts.append(text_part(block, where))
    elif turn.role == "system":
        refuse(where, f"a system message holds only text blocks, not {kind!r}")
    elif kind in _THINKING:
        if turn.role != "assistant":
            refuse(where, f"{kind} blocks can only be in assistant messages")
        # an earlier answer's thinking, signed for Claude: the answer's words carry on without it
        for name in ("data",) if kind == "redacted_thinking" else ("thinking", "signature"):
            text(block.get(name), f"{where}.{name}")
    elif kind == "tool_use":
        if turn.role != "assistant":
            refuse(where, "tool_use blocks can only be in assistant messages")
        turn.calls.append(_tool_use(block, where, reading))
    elif kind == "tool_result":
        if turn.role != "user":
            refuse(where, "tool_result blocks can only be in user messages")
        _tool_result(block, where, turn, reading)
    elif kind in ("image", "document"):
        if turn.role != "user":
            reading.lost.append(f"{where}: an {kind} in an assistant message; chat assistant messages hold only text")
        elif kind == "image":
            turn.parts.extend(_image(block, where, reading.lost))
        else:
            turn.parts.extend(_document(block, where, reading.lost))
    elif kind in _SERVER_BLOCKS:
        reading.lost.append(f"{where}: a {kind!r} block of an Anthropic server tool; {_NO_CHAT}")
    elif kind == "search_result":
        reading.lost.append(f"{where}: a search_result block, for Claude to cite; {_NO_CHAT}")
    else:
        reading.lost.append(f"{where}: a content block of type {shown(kind)}, unknown to sluice; {_NO_CHAT}")


def _use_id(value: Any, where: str) -> str:
    found = text(value, where, empty=False)
    if not _ID.fullmatch(found):
        refuse(where, f"must match ^[a-zA-Z0-9_-]+$, got {shown(found)}")
    return found


def _tool_use(block: Mapping[str, Any], where: str, reading: _Reading) -> dict[str, Any]:
    call_id = _use_id(block.get("id"), f"{where}.id")
    if call_id in reading.seen_ids:
        refuse(f"{where}.id", f"tool_use ids must be unique, {call_id!r} is used twice")
    reading.seen_ids.add(call_id)
    name = text(block.get("name"), f"{where}.name", empty=False)
    arguments = compact_json(obj(block.get("input"), f"{where}.input"), f"{where}.input")
    caller = block.get("caller")
    if isinstance(caller, Mapping) and caller.get("type") not in (None, "direct"):
        reading.lost.append(f"{where}.caller: a call made by Anthropic's code execution tool; {_NO_CHAT}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: Mapping[str, Any], where: str, turn: _Turn, reading: _Reading) -> None:
    call_id = _use_id(block.get("tool_use_id"), f"{where}.tool_use_id")
    turn.result_ids.append((call_id, where))
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        refuse(f"{where}.is_error", "must be a boolean")
    content = block.get("content")
    said: str | list[dict[str, Any]]
    attachments: list[dict[str, Any]] = []
    if content is None or isinstance(content, str):
        said = text(content or "", f"{where}.content")
    else:
        texts: list[dict[str, Any]] = []
        for n, item in enumerate(seq(content, f"{where}.content")):
            at = f"{where}.content[{n}]"
            part = obj(item, at)
            kind = part.get("type")
            if kind == "text":
                texts.append(text_part(part, at))
            elif kind == "image":
                attachments.extend(_image(part, at, reading.lost))
            elif kind == "document":
                for piece in _document(part, at, reading.lost):
                    (texts if piece["type"] == "text" else attachments).append(piece)
            else:
                reading.lost.append(f"{at}: a tool result holding a {shown(kind)} block; {_NO_CHAT}")
        said = texts or ""
    if is_error:
        said = _as_error(said)
    turn.results.append({"role": "tool", "tool_call_id": call_id, "content": said})
    if attachments:
        # chat tool messages hold only text: what else the result holds follows in the user turn
        lead = {"type": "text", "text": f"The result of tool call {call_id} also holds:"}
        turn.attachments.extend([lead, *attachments])


def _as_error(said: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """``is_error`` in words, the only way a chat tool message can carry it."""
    first = said if isinstance(said, str) else said[0]["text"]
    if first.lstrip().lower().startswith("error"):
        return said
    if isinstance(said, str):
        return f"Error: {said}" if said else "Error"
    return [{"type": "text", "text": "Error:"}, *said]


def _image(block: Mapping[str, Any], where: str, lost: list[str]) -> list[dict[str, Any]]:
    source = obj(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = source.get("media_type")
        if media not in _IMAGE_TYPES:
            refuse(f"{where}.source.media_type", f"must be one of {', '.join(_IMAGE_TYPES)}, got {shown(media)}")
        data = text(source.get("data"), f"{where}.source.data", empty=False)
        return [{"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}]
    if kind == "url":
        url = text(source.get("url"), f"{where}.source.url", empty=False)
        return [{"type": "image_url", "image_url": {"url": url}}]
    if kind == "file":
        lost.append(f"{where}: an image by Anthropic file_id (the Files API); a chat deployment cannot read it")
        return []
    refuse(f"{where}.source.type", f"must be 'base64', 'url' or 'file', got {shown(kind)}")


def _document(block: Mapping[str, Any], where: str, lost: list[str]) -> list[dict[str, Any]]:
    """A PDF as a chat ``file`` part; plain text and content documents as text (and image) parts."""
    source = obj(block.get("source"), f"{where}.source")
    title = _optional_text(block.get("title"), f"{where}.title")
    context = _optional_text(block.get("context"), f"{where}.context")
    citations = block.get("citations")
    if citations is not None and obj(citations, f"{where}.citations").get("enabled") is True:
        lost.append(f"{where}.citations: Claude cites the document in its answer; a chat answer has no citations")
    kind = source.get("type")
    lead = [{"type": "text", "text": context}] if context else []
    if kind == "base64":
        if source.get("media_type") != "application/pdf":
            refuse(f"{where}.source.media_type", f"must be 'application/pdf', got {shown(source.get('media_type'))}")
        data = text(source.get("data"), f"{where}.source.data", empty=False)
        file = {"filename": title or "document.pdf", "file_data": f"data:application/pdf;base64,{data}"}
        return [*lead, {"type": "file", "file": file}]
    if kind == "text":
        if source.get("media_type") != "text/plain":
            refuse(f"{where}.source.media_type", f"must be 'text/plain', got {shown(source.get('media_type'))}")
        data = text(source.get("data"), f"{where}.source.data")
        words = "\n\n".join(piece for piece in (title, context, data) if piece)
        return [{"type": "text", "text": words}] if words.strip() else []
    if kind == "content":
        inner = source.get("content")
        if isinstance(inner, str):
            return [*lead, {"type": "text", "text": text(inner, f"{where}.source.content")}] if inner.strip() else lead
        parts = lead
        for n, item in enumerate(seq(inner, f"{where}.source.content")):
            at = f"{where}.source.content[{n}]"
            piece = obj(item, at)
            if piece.get("type") == "text":
                parts.append(text_part(piece, at))
            elif piece.get("type") == "image":
                parts.extend(_image(piece, at, lost))
            else:
                refuse(f"{at}.type", f"a content document holds text and image blocks, not {shown(piece.get('type'))}")
        return parts
    if kind in ("url", "file"):
        how = "by URL" if kind == "url" else "by Anthropic file_id (the Files API)"
        lost.append(f"{where}: a document {how}; a chat file part carries the file's bytes only")
        return []
    refuse(f"{where}.source.type", f"must be 'base64', 'text', 'content', 'url' or 'file', got {shown(kind)}")


def _optional_text(value: Any, where: str) -> str | None:
    return None if value is None else text(value, where)


def _check_pairs(turns: list[_Turn]) -> None:
    """Anthropic's (and Chat Completions') rule: each tool use is answered in the very next
    turn, and each result answers a use of the turn before."""
    for number, turn in enumerate(turns):
        before = turns[number - 1] if number else None
        asked = {call["id"] for call in before.calls} if before is not None else set()
        for call_id, where in turn.result_ids:
            if call_id not in asked:
                refuse(
                    where,
                    f"unexpected tool_use_id found in tool_result blocks: {call_id}. Each tool_result block "
                    "must have a corresponding tool_use block in the previous message.",
                )
        if turn.calls and number + 1 < len(turns):
            answered = {call_id for call_id, _ in turns[number + 1].result_ids}
            missing = [call["id"] for call in turn.calls if call["id"] not in answered]
            if missing:
                refuse(
                    f"messages[{turn.first}]",
                    f"tool_use ids were found without tool_result blocks immediately after: {', '.join(missing)}. "
                    "Each tool_use block must have a corresponding tool_result block in the next message.",
                )


def text_parts(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Content parts as chat content: one text part is a plain string (Anthropic's own
    equivalence of a string and one text block)."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def _emit(turns: list[_Turn]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in turns:
        if turn.role == "assistant":
            if not turn.parts and not turn.calls:
                continue  # only thinking, or an empty final message: nothing to say
            message: dict[str, Any] = {"role": "assistant", "content": text_parts(turn.parts) if turn.parts else None}
            if turn.calls:
                message["tool_calls"] = turn.calls
            out.append(message)
        elif turn.role == "system":
            out.append({"role": "system", "content": text_parts(turn.parts)})
        else:
            out.extend(turn.results)
            parts = [*turn.attachments, *turn.parts]
            if parts:
                out.append({"role": "user", "content": text_parts(parts)})
    return out
