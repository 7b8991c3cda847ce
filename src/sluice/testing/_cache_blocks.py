"""A prompt as the prompt caches see it: OpenAI's 128-token blocks, Anthropic's content blocks.

Both caches match exact prefixes. OpenAI hashes the prompt in blocks of 128 tokens (a hit
is a whole number of blocks, from 1,024 tokens) and routes a request by its first ~256
tokens; Anthropic caches the prefix that ends at a block marked with ``cache_control``
(tools, then system, then messages). Here a request body becomes the cumulative hashes
those rules need: the hash at each 128-token boundary (:func:`token_blocks`), or the hash
and token count at the end of each content block, with its breakpoint if it has one
(:func:`anthropic_blocks`; the reply primer after the last block is never cached). Tokens
are the fake's own (:class:`PromptCounter`), so a prefix's length here is the length the
fake bills.

Markers (``cache_control``) are not part of a hash: a prefix written with its breakpoint
on block 10 is found by a later request whose breakpoint moved to block 15, as Anthropic's
lookback example has it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from ._tokenizer import ANTHROPIC_TOOLS, OPENAI_TOOLS, PER_MESSAGE, PromptCounter, unmarked

__all__ = [
    "AnthropicBlocks",
    "Block",
    "Piece",
    "Refused",
    "anthropic_blocks",
    "marked",
    "openai_pieces",
    "token_blocks",
]

#: As the fake counts JSON: in the order written (a cache is byte-exact: keys reordered miss).
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _compact(value: Any) -> bytes:
    return _JSON(value).encode("utf-8", "surrogatepass")


#: Blocks that cannot carry a breakpoint, nor be the target of automatic caching.
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})
TTLS = ("5m", "1h")


class Piece(NamedTuple):
    """A run of a prompt's tokens: a text a cache boundary may fall inside, or a whole
    (framing, an image, a tool list) known by ``ident``."""

    tokens: int
    text: str | None
    ident: bytes


def _text(counter: PromptCounter, text: str) -> Piece:
    return Piece(counter.text(text), text, b"t")


def _atomic(tokens: int, ident: bytes) -> Piece:
    return Piece(tokens, None, ident)


# -- OpenAI -----------------------------------------------------------------------------------


def openai_pieces(counter: PromptCounter, api: str, body: Mapping[str, Any], total: int) -> list[Piece]:
    """The pieces of a Chat Completions (``api="chat"``) or Responses body, in the order the
    prompt is laid out: tools and output schema first, then the conversation; the rest of
    ``total`` (the reply primer) last."""
    pieces: list[Piece] = []
    for key in ("tools", "functions"):
        if body.get(key):
            pieces.append(_atomic(OPENAI_TOOLS, b"tools"))
            pieces.append(_text(counter, _JSON(body[key])))
    spec = body.get("response_format") if api == "chat" else (body.get("text") or {}).get("format")
    if spec and not (api == "responses" and spec.get("type") == "text"):
        pieces.append(_text(counter, _JSON(spec)))
    for key in ("tool_choice", "function_call"):
        if body.get(key):
            pieces.append(_text(counter, _JSON(body[key])))
    if api == "chat":
        for message in body["messages"]:
            pieces.extend(_message_pieces(counter, message, counter.message(message, api), "content"))
    else:
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            system = {"role": "system", "content": instructions}
            pieces.extend(_message_pieces(counter, system, counter.responses_item(system), "content"))
        given = body["input"]
        for item in [{"role": "user", "content": given}] if isinstance(given, str) else given:
            where = "output" if item.get("type") == "function_call_output" else "content"
            pieces.extend(_message_pieces(counter, item, counter.responses_item(item), where))
    rest = total - sum(piece.tokens for piece in pieces)
    if rest > 0:
        pieces.append(_atomic(rest, b"end"))
    return pieces


def _message_pieces(counter: PromptCounter, message: Mapping[str, Any], tokens: int, where: str) -> Iterator[Piece]:
    """A message: its framing (role, name, tool calls) as one whole, then its text parts
    as texts and its other parts (images, files) as wholes."""
    content = message.get(where)
    parts: list[Piece] = []
    if isinstance(content, str):
        parts.append(_text(counter, content))
    elif isinstance(content, list):
        for part in content:
            text = part.get("text") if isinstance(part, Mapping) else part
            if isinstance(text, str) and (not isinstance(part, Mapping) or len(part) <= 2):
                parts.append(_text(counter, text))
            else:
                parts.append(_atomic(counter.part(part, "chat"), _compact(part)))
    head = {k: v for k, v in message.items() if k != where}
    yield _atomic(tokens - sum(p.tokens for p in parts), _compact(head))
    yield from parts


def token_blocks(counter: PromptCounter, pieces: list[Piece], size: int, most: int) -> list[bytes]:
    """The cumulative hash at each ``size``-token boundary of ``pieces`` (at most ``most``
    of them): entry ``i`` names the prompt's first ``(i + 1) * size`` tokens."""
    hashes: list[bytes] = []
    state = hashlib.sha256()
    done = 0  # tokens hashed so far
    boundary = size
    for piece in pieces:
        state.update(b"\x1f" + piece.ident + b"\x1e")
        end = done + piece.tokens
        text, taken = piece.text, 0
        while boundary <= end and len(hashes) < most:
            if text is None:
                marked = state.copy()
                marked.update(b"@%d" % (boundary - done))
                hashes.append(marked.digest())
            else:
                cut = counter.prefix_chars(text, boundary - done)
                state.update(text[taken:cut].encode("utf-8", "surrogatepass"))
                taken = cut
                hashes.append(state.digest())
            boundary += size
        if len(hashes) >= most:
            break
        if text is not None:
            state.update(text[taken:].encode("utf-8", "surrogatepass"))
        done = end
    return hashes


# -- Anthropic --------------------------------------------------------------------------------


class Block(NamedTuple):
    """One content block: where it is, the prompt's tokens up to its end, the hash of the
    prefix that ends with it, and its breakpoint's TTL (None: not marked)."""

    path: str
    end: int
    hash: bytes
    ttl: str | None
    markable: bool


class AnthropicBlocks(NamedTuple):
    """A Messages request's blocks in cache order, and the breakpoints (indexes into
    ``blocks``, automatic caching's included) in order."""

    blocks: list[Block]
    breakpoints: list[int]


class Refused(ValueError):
    """A breakpoint the Messages API refuses (a 400 ``invalid_request_error`` saying this)."""


def _refuse(message: str) -> Refused:
    return Refused(message)


def marked(body: Mapping[str, Any]) -> bool:
    """Whether a Messages body has a ``cache_control`` anywhere one may be (cheap: no counting)."""
    if body.get("cache_control") is not None:
        return True
    system = body.get("system")
    groups = [body.get("tools") or [], system if isinstance(system, list) else []]
    groups += [m.get("content") for m in body["messages"] if isinstance(m.get("content"), list)]
    return any(isinstance(block, Mapping) and "cache_control" in block for group in groups for block in group)


def _mark(path: str, block: Any) -> str | None:
    """The TTL of a block's ``cache_control`` (None: none), checked as the API checks it."""
    if not isinstance(block, Mapping) or block.get("cache_control") is None:
        return None
    control = block["cache_control"]
    if block.get("type") in _UNMARKABLE:
        raise _refuse(f"{path}.cache_control: Extra inputs are not permitted")
    return _ttl(path, control)


def _ttl(path: str, control: Any) -> str:
    where = f"{path}.cache_control" if path else "cache_control"
    if not isinstance(control, Mapping) or control.get("type") != "ephemeral":
        raise _refuse(f"{where}.type: Input should be 'ephemeral'")
    ttl = control.get("ttl", "5m")
    if ttl not in TTLS:
        raise _refuse(f"{where}.ttl: Input should be '5m' or '1h'")
    return str(ttl)


def anthropic_blocks(counter: PromptCounter | None, body: Mapping[str, Any]) -> AnthropicBlocks:
    """The blocks of a Messages body (tools, system, messages), checked as the API checks
    breakpoints: at most four (automatic caching takes one), a 1-hour one never after a
    5-minute one; raises :class:`Refused` otherwise. Without a ``counter`` only the check
    is made (no tokens, no hashes)."""
    blocks: list[Block] = []
    state = hashlib.sha256()
    done = 0

    def add(path: str, block: Any, tokens: int, markable: bool = True) -> None:
        nonlocal done
        digest = b""
        if counter is not None:
            done += tokens
            clean = {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, Mapping) else block
            state.update(b"\x1f" + _compact(clean))
            digest = state.digest()
        blocks.append(Block(path, done, digest, _mark(path, block), markable))

    def count(what: Any, api: str = "anthropic") -> int:
        return 0 if counter is None else counter.part(what, api)

    tools = body.get("tools") or []
    if tools:
        state.update(b"\x1ftools")
        shares = [0 if counter is None else counter.text(_JSON(unmarked([tool]))) for tool in tools]
        whole = 0 if counter is None else counter.text(_JSON(unmarked(tools))) + ANTHROPIC_TOOLS
        for index, tool in enumerate(tools):
            add(f"tools.{index}", tool, shares[index] + (whole - sum(shares) if index == 0 else 0))
    system = body.get("system")
    if system:
        state.update(b"\x1fsystem")
        system_blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system
        for index, block in enumerate(system_blocks):
            add(f"system.{index}", block, count(block) + (PER_MESSAGE if index == 0 else 0))
    state.update(b"\x1fmessages" + _compact([body.get("tool_choice"), body.get("thinking")]))
    lead = counter.text(_JSON(body["tool_choice"])) if counter is not None and body.get("tool_choice") else 0
    for number, message in enumerate(body["messages"]):
        content = message.get("content")
        listed = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        state.update(b"\x1frole:" + str(message.get("role")).encode())
        parts = [count(block) for block in listed]
        head = (0 if counter is None else counter.message(message, "anthropic")) - sum(parts) + lead
        lead = 0
        for index, block in enumerate(listed):
            kind = block.get("type") if isinstance(block, Mapping) else None
            markable = kind not in _UNMARKABLE and not (kind == "text" and not block.get("text"))
            add(f"messages.{number}.content.{index}", block, parts[index] + (head if index == 0 else 0), markable)
    breakpoints = [index for index, block in enumerate(blocks) if block.ttl is not None]
    automatic = body.get("cache_control")
    if automatic is not None:
        _automatic(blocks, breakpoints, _ttl("", automatic))
    if len(breakpoints) > 4:
        raise _refuse(f"A maximum of 4 blocks with cache_control may be provided. Found {len(breakpoints)}.")
    _check_order(blocks, breakpoints)
    return AnthropicBlocks(blocks, breakpoints)


def _automatic(blocks: list[Block], breakpoints: list[int], ttl: str) -> None:
    """Top-level ``cache_control``: a breakpoint on the last block that can take one."""
    target = next((i for i in range(len(blocks) - 1, -1, -1) if blocks[i].markable), None)
    if target is None:
        return  # nothing eligible: caching is skipped
    if blocks[target].ttl is not None:
        if blocks[target].ttl != ttl:
            raise _refuse(
                f"{blocks[target].path}.cache_control.ttl: the automatic cache_control ttl='{ttl}' differs from "
                f"this block's ttl='{blocks[target].ttl}'"
            )
        return  # already marked the same: a no-op
    if len(breakpoints) >= 4:
        raise _refuse(f"A maximum of 4 blocks with cache_control may be provided. Found {len(breakpoints) + 1}.")
    blocks[target] = blocks[target]._replace(ttl=ttl)
    breakpoints.append(target)
    breakpoints.sort()


def _check_order(blocks: list[Block], breakpoints: list[int]) -> None:
    short = False
    for index in breakpoints:
        block = blocks[index]
        if block.ttl == "5m":
            short = True
        elif short:
            raise _refuse(
                f"{block.path}.cache_control.ttl: a ttl='1h' cache_control block must not come after a ttl='5m' "
                "cache_control block. Note that blocks are processed in the following order: `tools`, `system`, "
                "`messages`."
            )
