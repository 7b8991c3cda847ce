"""A request's prefix fingerprint: where its prompt may be cut, and the hash of what comes before.

The prompt is walked in the order the caches read it (tools, then the system prompt, then
the messages; Anthropic lifts every system message to the system prompt, and so does this
walk) and at every block's end, and at candidate points inside a long text (after a run of
newlines, else after a sentence, past the fewest tokens any provider caches), the walk
notes a :class:`Boundary`: a 64-bit hash of everything before it, the tokens it holds
(sluice's estimate, not a tokenizer's) and the :class:`Cut` that marks it. Two requests
whose prompts begin alike share the boundaries up to where they part; so a document
followed by different questions in one user message shares the boundary at the end of
the document, and a split there is what a breakpoint needs.

The hash runs on without a marker between a text's pieces, so a text cut at a point and a
text that ends there have the same hash: once split, their blocks are the same.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from .._models import BATCH_SUFFIX, Request
from .._tokens import IMAGE_PART, PER_MESSAGE, estimate_text_tokens
from ._rules import LOWEST_MINIMUM

__all__ = ["Boundary", "Cut", "fingerprint", "marked_positions", "prompt_estimate"]

#: Parameters that do not change what a cache holds (sampling, limits, routing hints).
_NOT_IN_PREFIX = frozenset(
    {
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stop_sequences",
        "seed",
        "n",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "cache_control",
        "service_tier",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "store",
        "tools",
        "system",
    }
)
_SYSTEM_ROLES = ("system", "developer")
#: Inside a text: at most this many candidate cuts, at least this many tokens apart.
_MOST_CUTS = 48
_CUT_SPACING = 32
_NEWLINES = re.compile(r"\n+")
_SENTENCES = re.compile(r"[.!?][\"')\]]*\s+")


class Cut(NamedTuple):
    """Where a boundary is in a request: ``message`` -2 is the tools, -1 the ``system``
    parameter, else an index into ``messages``; ``part`` -1 is a string content (else the
    index of its part); ``offset`` -1 is the block's end (else a character offset in it)."""

    message: int
    part: int = -1
    offset: int = -1


class Boundary(NamedTuple):
    """A point a prompt may be cut at: the hash of what comes before, its tokens, its place."""

    digest: int
    tokens: int
    cut: Cut
    #: Its place in the walk (tools, system, messages): breakpoints are ordered by it.
    order: int


class _Walk:
    """The hash and token count as the walk goes (see :func:`fingerprint`)."""

    __slots__ = ("found", "order", "state", "tokens")

    def __init__(self, seed: bytes) -> None:
        self.state = hashlib.blake2b(seed, digest_size=8)
        self.tokens = 0
        self.order = 0
        self.found: list[Boundary] = []

    def note(self, cut: Cut, tokens: int) -> None:
        self.found.append(Boundary(int.from_bytes(self.state.copy().digest(), "little"), tokens, cut, self.order))

    def whole(self, cut: Cut, tag: bytes, value: Any, tokens: int) -> None:
        """A block known as a whole (tools, an image, a tool call)."""
        self.state.update(b"\x1e" + tag + _canonical(value))
        self.tokens += tokens
        self.order += 1
        self.note(cut, self.tokens)

    def text(self, cut: Cut, text: str) -> None:
        """A text block, with candidate cuts inside it once past the fewest tokens cached."""
        self.state.update(b"\x1et")
        start, length = self.tokens, estimate_text_tokens(text)
        self.tokens += length
        self.order += 1
        if self.tokens >= LOWEST_MINIMUM and len(text) > 1:
            taken = 0
            for offset in _candidates(text, start, length):
                self.state.update(_utf8(text[taken:offset]))
                taken = offset
                self.note(cut._replace(offset=offset), start + length * offset // len(text))
            self.state.update(_utf8(text[taken:]))
        else:
            self.state.update(_utf8(text))
        self.note(cut, self.tokens)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _canonical(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    except TypeError:  # integers past 64 bits, lone surrogates: any stable form will do
        return repr(value).encode("utf-8", "surrogatepass")


def _candidates(text: str, start: int, length: int) -> list[int]:
    """Character offsets inside ``text`` worth cutting at: after newlines (else sentences),
    past the fewest tokens cached, thinned from the end so that the last ones (where texts
    that share a beginning part) are kept."""
    size = len(text)
    least = max(0, (LOWEST_MINIMUM - start) * size // max(1, length))
    offsets = [m.end() for m in _NEWLINES.finditer(text, least) if m.end() < size]
    if not offsets:
        offsets = [m.end() for m in _SENTENCES.finditer(text, least) if m.end() < size]
    kept: list[int] = []
    spacing = _CUT_SPACING * size // max(1, length)  # in characters
    for offset in reversed(offsets):
        if not kept or kept[-1] - offset >= spacing:
            kept.append(offset)
            if len(kept) >= _MOST_CUTS:
                break
    kept.reverse()
    return kept


def _seed(request: Request) -> bytes:
    """What every boundary of a request depends on: its model (a model's batch tier,
    ``model@batch``, is the model: its lines share the model's cache) and the parameters
    that go in the prompt (a response format, a tool choice, its schema)."""
    params = request.params
    shaping = {k: v for k, v in params.items() if k not in _NOT_IN_PREFIX} if params else {}
    if request.schema is not None:
        shaping["\x00schema"] = request.schema.digest
    return request.model.removesuffix(BATCH_SUFFIX).encode() + b"\x1f" + _canonical(shaping)


def _part_tokens(part: Any) -> int:
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind in ("image_url", "image", "input_image"):
            return IMAGE_PART
    return estimate_text_tokens(_canonical(part).decode("utf-8", "replace"))


def _text_of(part: Any) -> str | None:
    """The text of a plain text part (one a cut may go inside), else None."""
    if isinstance(part, str):
        return part
    plain = isinstance(part, Mapping) and part.get("type") in ("text", "input_text")
    if plain and isinstance(part.get("text"), str) and all(k in ("type", "text", "cache_control") for k in part):
        return str(part["text"])
    return None


def _content(walk: _Walk, index: int, content: Any) -> None:
    if isinstance(content, str):
        walk.text(Cut(index), content)
        return
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        walk.whole(Cut(index), b"c", content, estimate_text_tokens(str(content)))
        return
    for number, part in enumerate(content):
        text = _text_of(part)
        if text is not None:
            walk.text(Cut(index, number), text)
        else:
            clean = {k: v for k, v in part.items() if k != "cache_control"} if isinstance(part, Mapping) else part
            walk.whole(Cut(index, number), b"p", clean, _part_tokens(clean))


def _ordered(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The messages as the caches read them: system ones first (Anthropic lifts them to its
    system prompt; OpenAI's prompts open with them anyway), then the rest."""
    rest = []
    for index, message in enumerate(messages):
        if message.get("role") in _SYSTEM_ROLES:
            yield index, message
        else:
            rest.append((index, message))
    yield from rest


def fingerprint(request: Request) -> list[Boundary]:
    """The boundaries of ``request``'s prompt, in order (see the module docstring)."""
    walk = _Walk(_seed(request))
    params = request.params
    tools = params.get("tools") if params else None
    if tools:
        walk.whole(Cut(-2), b"tools", tools, estimate_text_tokens(_canonical(tools).decode("utf-8", "replace")))
    system = params.get("system") if params else None
    if system:
        walk.tokens += PER_MESSAGE
        _content(walk, -1, system)
    for index, message in _ordered(request.messages):
        head = {k: v for k, v in message.items() if k != "content"}
        walk.state.update(b"\x1d" + _canonical(head))
        walk.tokens += PER_MESSAGE
        content = message.get("content")
        if content is not None:
            _content(walk, index, content)
    return walk.found


def prompt_estimate(boundaries: Sequence[Boundary]) -> int:
    """The prompt's tokens up to its last boundary."""
    return boundaries[-1].tokens if boundaries else 0


def marked_positions(request: Request) -> list[tuple[int, str]]:
    """The breakpoints ``request`` carries already (its own ``cache_control``), as (place in
    the walk, TTL), in order; a top-level ``cache_control`` (Anthropic's automatic caching)
    takes one at the end."""
    found: list[tuple[int, str]] = []
    order = 0

    def seen(block: Any) -> None:
        nonlocal order
        order += 1
        control = block.get("cache_control") if isinstance(block, Mapping) else None
        if isinstance(control, Mapping):
            found.append((order, "1h" if control.get("ttl") == "1h" else "5m"))

    params = request.params
    tools = params.get("tools") if params else None
    if tools:
        order += 1
        for tool in tools if isinstance(tools, Sequence) else ():
            control = tool.get("cache_control") if isinstance(tool, Mapping) else None
            if isinstance(control, Mapping):
                found.append((order, "1h" if control.get("ttl") == "1h" else "5m"))
    system = params.get("system") if params else None
    for content in [system] + [m.get("content") for _, m in _ordered(request.messages)]:
        if isinstance(content, str) or content is None:
            order += content is not None
        elif isinstance(content, Sequence):
            for part in content:
                seen(part)
    automatic = params.get("cache_control") if params else None
    if isinstance(automatic, Mapping):
        found.append((order + 1, "1h" if automatic.get("ttl") == "1h" else "5m"))
    return found
