"""Prompt tokens before sending: an estimate for rate limits, a true bound for budgets.

Two different questions, two functions:

- :func:`estimate_message_tokens` is what a provider counts against a TPM limit when a
  request arrives (providers estimate from characters, then settle with the real
  usage; sluice does the same). Fast, offline, roughly 4 characters a token.
- :func:`max_prompt_tokens` is the most the provider can *bill* for the prompt, for a
  budget's worst case. Exact tokenizers (tiktoken) download their vocabularies at run
  time and differ per model, so it bounds instead of counting: every token of a
  byte-level BPE tokenizer covers at least one byte of the text, so a text costs at
  most its UTF-8 length in tokens, whatever the model. Images cost what the
  provider's published pixel formula says, other media their byte size.
"""

from __future__ import annotations

import binascii
import functools
import importlib
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["estimate_message_tokens", "estimate_text_tokens", "max_prompt_tokens"]

#: OpenAI's documented chat overheads: ~4 tokens per message, 3 to prime the reply.
PER_MESSAGE = 4
REPLY_PRIMER = 3
#: What one image part costs at the most common (one-tile, high-detail) size.
IMAGE_PART = 765


def estimate_text_tokens(text: str) -> int:
    """~4 characters per token for ASCII text, one token per other character."""
    if not text:
        return 0
    ascii_chars = len(text.encode("ascii", "ignore"))
    other = len(text) - ascii_chars
    return -(-ascii_chars // 4) + other


def _part_tokens(part: Any) -> int:
    if isinstance(part, str):
        return estimate_text_tokens(part)
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind in ("text", "input_text"):
            return estimate_text_tokens(str(part.get("text", "")))
        if kind in ("image_url", "image", "input_image"):
            return IMAGE_PART
        return estimate_text_tokens(json.dumps(part, default=str))
    return estimate_text_tokens(str(part))


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return estimate_text_tokens(content)
    if isinstance(content, Iterable):
        return sum(_part_tokens(p) for p in content)
    return estimate_text_tokens(str(content))


def estimate_message_tokens(messages: Sequence[Mapping[str, Any]], extra: Mapping[str, Any] | None = None) -> int:
    """Prompt tokens for chat ``messages`` (plus tools or a system prompt in ``extra``)."""
    total = REPLY_PRIMER
    for message in messages:
        content = message.get("content")
        total += PER_MESSAGE + (estimate_text_tokens(content) if type(content) is str else _content_tokens(content))
        name = message.get("name")
        if isinstance(name, str):
            total += estimate_text_tokens(name)
        calls = message.get("tool_calls")
        if calls:
            total += estimate_text_tokens(json.dumps(calls, default=str))
    if extra:
        for key in ("tools", "functions", "system", "response_format"):
            value = extra.get(key)
            if value:
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                total += estimate_text_tokens(text)
    return total


# -- the most the provider can bill, for budgets ---------------------------------------------
#
# Every token of a byte-level BPE tokenizer (tiktoken's, Claude's, Llama 3's, ...)
# covers at least one byte of its input, so text costs at most its UTF-8 length. The
# constants below bound what a provider adds around the text; each says where it comes
# from. A bound must never be below what is billed; it may be above (the reservation's
# unused part returns when the answer lands).

#: Chat framing: OpenAI documents 3 tokens per message plus the role, 1 more for a name
#: and 3 to prime the reply; Anthropic publishes no figure. Bound: 8 + the role's bytes
#: per message, 8 for the reply.
BOUND_PER_MESSAGE = 8
BOUND_REPLY_PRIMER = 8
BOUND_PER_NAME = 1
#: Between the parts of a message's content (a separator at most).
BOUND_PER_PART = 2
#: Tool definitions become text the provider writes: OpenAI renders their JSON schemas
#: as a TypeScript namespace (shorter than the JSON) plus ~9 tokens; Anthropic adds a
#: tool-use system prompt, 530 tokens at most in its docs (Claude 3 Opus, tool_choice
#: auto; docs.anthropic.com/en/docs/tool-use-pricing-and-tokens). Bound: the definitions'
#: compact JSON, every UTF-8 byte a token, plus these and ``BOUND_PER_TOOL`` each.
BOUND_TOOLS = {"openai": 64, "azure": 64, "anthropic": 600}
BOUND_TOOLS_OTHER = 600
BOUND_PER_TOOL = 16
#: A structured-output schema is rendered into the prompt like a tool.
BOUND_RESPONSE_FORMAT = 64
#: A file, document or clip we cannot see (a file id, a URL): no prompt can pass the
#: model's context window, and 200K is that of most current models. A model with a
#: larger window could bill more for such a part: this one figure is not a proof.
UNSEEN_PART = 200_000
#: A PDF page is billed as its text (1,500-3,000 tokens) plus an image of it (~1,600)
#: (Anthropic, docs.anthropic.com/en/docs/build-with-claude/pdf-support): 4,600 a page
#: on top of one token per byte. Pages are counted from the PDF's page objects; when
#: they are hidden in object streams, a page per KiB, at most the 600 a request allows.
PDF_PAGE = 4_600
PDF_MAX_PAGES = 600

_ASCII_JSON = json.JSONEncoder(default=str).encode  # ensure_ascii: its length is its bytes


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _json_len(value: Any) -> int:
    """UTF-8 bytes of ``value`` as compact JSON: every string in it, quoted and escaped,
    plus its punctuation (orjson: ~10x the standard library's speed here)."""
    try:
        return len(orjson.dumps(value, default=str))
    except TypeError:  # lone surrogates, integers past 64 bits: ASCII JSON, no shorter
        return len(_ASCII_JSON(value))


def _cover(length: float, unit: int) -> int:
    """Units of ``unit`` pixels covering ``length`` (float noise rounded away)."""
    return max(1, math.ceil(round(length, 6) / unit))


ImageSize = tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class _Tiles:
    """OpenAI's tile formula: fit in 2048x2048, shortest side down to 768, then ``tile``
    tokens per 512-px tile plus ``base``; ``detail: low`` costs ``base``. gpt-4o and
    gpt-4.1: 85 + 170; o1/o3: 75 + 150; gpt-4o-mini: 2833 + 5667, ~33x gpt-4o
    (platform.openai.com/docs/guides/images-vision, "Calculating costs")."""

    base: int
    tile: int

    def tokens(self, size: ImageSize, low: bool) -> int:
        if low:
            return self.base
        if size is None:  # 2048x768 has the most tiles the formula allows: 4 x 2
            return self.base + 8 * self.tile
        fit = min(1.0, 2048 / max(size))
        width, height = size[0] * fit, size[1] * fit
        short = min(1.0, 768 / min(width, height))
        return self.base + self.tile * _cover(width * short, 512) * _cover(height * short, 512)


@dataclass(frozen=True, slots=True)
class _Patches:
    """OpenAI's patch formula: 32-px patches, at most 1536 (larger images are scaled
    down), times the model's multiplier: gpt-4.1-mini 1.62, gpt-4.1-nano 2.46, o4-mini
    1.72 (same page). ``detail`` does not lower it."""

    multiplier: float

    def tokens(self, size: ImageSize, low: bool) -> int:
        patches = 1536 if size is None else min(1536, _cover(size[0], 32) * _cover(size[1], 32))
        return math.ceil(patches * self.multiplier)


@dataclass(frozen=True, slots=True)
class _Area:
    """Anthropic's formula: about width * height / 750 tokens, after scaling the long
    edge down to ``edge`` and padding to 28-px cells (one token each), at most ``cap``:
    1568 px and ~1,600 tokens up to Claude 4.6, 2576 px and ~5,000 (3.75 MP) from Opus
    4.7 (docs.anthropic.com/en/docs/build-with-claude/vision)."""

    edge: int
    cap: int

    def tokens(self, size: ImageSize, low: bool) -> int:
        if size is None:
            return self.cap
        scale = min(1.0, self.edge / max(size))
        width, height = size[0] * scale, size[1] * scale
        return min(self.cap, max(math.ceil(width * height / 750), _cover(width, 28) * _cover(height, 28)))


@dataclass(frozen=True, slots=True)
class _Largest:
    """A model whose formula is not known for sure: the largest of several."""

    rules: tuple[_Tiles | _Patches | _Area, ...]

    def tokens(self, size: ImageSize, low: bool) -> int:
        return max(rule.tokens(size, low) for rule in self.rules)


_Rule = _Tiles | _Patches | _Area | _Largest

#: OpenAI models by name prefix, the most specific first.
_OPENAI_IMAGES: tuple[tuple[str, _Rule], ...] = (
    ("gpt-4o-mini", _Tiles(2833, 5667)),
    ("gpt-4.1-mini", _Patches(1.62)),
    ("gpt-4.1-nano", _Patches(2.46)),
    ("o4-mini", _Patches(1.72)),
    ("gpt-4.1", _Largest((_Tiles(85, 170), _Patches(1.0)))),  # sources differ: both
    ("gpt-4o", _Tiles(85, 170)),
    ("chatgpt-4o", _Tiles(85, 170)),
    ("gpt-4.5", _Tiles(85, 170)),
    ("gpt-4-turbo", _Tiles(85, 170)),
    ("o1", _Tiles(75, 150)),
    ("o3", _Tiles(75, 150)),
    ("computer-use-preview", _Tiles(65, 129)),
)
_OPENAI_ANY = _Largest((_Tiles(2833, 5667), _Patches(2.46)))  # dominates every rule above
_CLAUDE_UP_TO_4_6 = _Area(1568, 1600)
_CLAUDE_ANY = _Area(2576, 5000)
_ANY = _Largest((_Tiles(2833, 5667), _Patches(2.46), _CLAUDE_ANY))
_CLAUDE_VERSION = re.compile(r"claude-(?:(\d+)(?:-(\d))?-[a-z]+|[a-z]+-(\d+)(?:[-.](\d)(?!\d))?)")


@functools.lru_cache(maxsize=256)
def _image_rule(provider: str, model: str) -> _Rule:
    """The image formula for a model; an unknown model or provider gets the largest."""
    if provider in ("openai", "azure"):
        for prefix, rule in _OPENAI_IMAGES:
            if model.startswith(prefix):
                return rule
        return _OPENAI_ANY
    if provider == "anthropic":
        match = _CLAUDE_VERSION.match(model)
        if match is None:
            return _CLAUDE_ANY
        major, minor = match.group(1) or match.group(3), match.group(2) or match.group(4) or "0"
        return _CLAUDE_UP_TO_4_6 if (int(major), int(minor)) <= (4, 6) else _CLAUDE_ANY
    return _ANY


def max_prompt_tokens(
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any] | None = None,
    *,
    provider: str = "",
    model: str = "",
) -> int:
    """The most prompt tokens ``provider`` can bill for ``messages`` and ``params``.

    Text counts its UTF-8 bytes (contents, roles, names, tool calls and results, and
    ``system``/``tools``/``functions``/``response_format``/``tool_choice`` in
    ``params``) plus the framing bounds above; images count by the provider's formula
    for ``model`` (``provider`` as in ``Deployment.provider_name``; an unknown one gets
    the largest formula); audio, files and documents their decoded bytes (PDFs also
    per page). On ordinary English text it is about 4x the real count: a reservation,
    returned when the answer lands, never a charge.
    """
    images = _image_rule(provider, model)
    total = BOUND_REPLY_PRIMER
    for message in messages:
        role = message.get("role")
        total += BOUND_PER_MESSAGE + (_utf8(role) if isinstance(role, str) else 0)
        total += _content_bound(message.get("content"), images)
        if len(message) > 2:  # rare: name, tool_calls, tool_call_id, ...
            total += _message_extras(message)
    if params:
        total += _params_bound(params, provider, images)
    return total


def _message_extras(message: Mapping[str, Any]) -> int:
    total = 0
    for key, value in message.items():
        if key in ("role", "content") or value is None:
            continue
        if key == "name" and isinstance(value, str):
            total += _utf8(value) + BOUND_PER_NAME
        else:  # tool_calls, function_call, tool_call_id, anything else: as JSON
            total += _json_len(value)
    return total


def _params_bound(params: Mapping[str, Any], provider: str, images: _Rule) -> int:
    total = 0
    system = params.get("system")
    if system:
        total += BOUND_PER_MESSAGE + _content_bound(system, images)
    for key in ("tools", "functions"):
        tools = params.get(key)
        if tools:
            count = len(tools) if isinstance(tools, Sequence) else 1
            total += _json_len(tools) + BOUND_TOOLS.get(provider, BOUND_TOOLS_OTHER) + BOUND_PER_TOOL * count
    schema = params.get("response_format")
    if schema:
        total += _json_len(schema) + BOUND_RESPONSE_FORMAT
    for key in ("tool_choice", "function_call"):
        if params.get(key):
            total += _json_len(params[key])
    return total


def _content_bound(content: Any, images: _Rule) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _utf8(content)
    if isinstance(content, Mapping):
        return _part_bound(content, images)
    if isinstance(content, Iterable) and not isinstance(content, bytes | bytearray):
        total = 0
        for part in content:
            total += BOUND_PER_PART + _part_bound(part, images)
        return total
    return _utf8(str(content))


_TEXT_PARTS = frozenset(("text", "input_text", "output_text"))
_IMAGE_PARTS = frozenset(("image_url", "input_image", "image"))
_MEDIA_PARTS = frozenset(("input_audio", "file", "input_file", "document"))


def _part_bound(part: Any, images: _Rule) -> int:
    if isinstance(part, str):
        return _utf8(part)
    if not isinstance(part, Mapping):
        return _utf8(str(part))
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        text = part.get("text")
        if isinstance(text, str) and len(part) == 2:  # else cache_control, citations...: all of it
            return _utf8(text)
    elif kind in _IMAGE_PARTS:
        size, low = _image_of(part)
        return images.tokens(size, low)
    elif kind in _MEDIA_PARTS:
        return _media_bound(part)
    elif kind == "tool_result":
        inner = part.get("content")
        return _json_len({k: v for k, v in part.items() if k != "content"}) + _content_bound(inner, images)
    return _json_len(part)  # tool_use, thinking, anything else: all of it, as JSON


def _image_of(part: Mapping[str, Any]) -> tuple[ImageSize, bool]:
    """(pixel size of a base64 image, None for one we cannot see; ``detail: low``?)."""
    kind = part.get("type")
    detail = part.get("detail")
    encoded: str | None = None
    if kind == "image":  # Anthropic: {"source": {"type": "base64", "data": ...}}
        source = part.get("source")
        if isinstance(source, Mapping) and source.get("type") == "base64" and isinstance(source.get("data"), str):
            encoded = source["data"]
    else:  # OpenAI: "image_url": "..." or {"url": "...", "detail": ...}; "input_image"
        url = part.get("image_url")
        if isinstance(url, Mapping):
            detail = url.get("detail", detail)
            url = url.get("url")
        if isinstance(url, str) and url.startswith("data:"):
            encoded = url.partition(",")[2]
    return (image_size(encoded) if encoded else None), detail == "low"


def image_size(encoded: str) -> tuple[int, int] | None:
    """(width, height) of a base64 PNG, JPEG, GIF or WebP, or None when unreadable.

    Headers are read by the ``imagesize`` package (pure Python, no dependencies),
    imported only when an image is met; without it every image counts as unseen, the
    largest its formula allows.
    """
    try:
        sniff: Callable[[io.BytesIO], tuple[int, int]] = importlib.import_module("imagesize").get
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    for length in (4096, len(encoded)):  # the header is at the start; a JPEG's may be later
        try:
            width, height = sniff(io.BytesIO(binascii.a2b_base64(encoded[: length - length % 4])))
        except Exception:  # an unreadable header: the image counts as unseen
            width = height = -1
        if width > 0 and height > 0:
            return int(width), int(height)
        if length >= len(encoded):
            break
    return None


def _media_bound(part: Mapping[str, Any]) -> int:
    """Audio, files, documents: the JSON around the payload plus the payload's bound."""
    kind = str(part.get("type"))
    slot = next((k for k in (kind, "source") if isinstance(part.get(k), Mapping)), None)
    inner: Mapping[str, Any] = part[slot] if slot is not None else part
    for key in ("data", "file_data"):
        payload = inner.get(key)
        if isinstance(payload, str):
            shell = {**inner, key: ""}
            around = _json_len({**part, slot: shell} if slot is not None else shell)
            if inner.get("type") == "text":  # an Anthropic plain-text document
                return around + _utf8(payload)
            return around + _payload_bound(payload)
    if slot is not None and inner.get("type") == "content":
        return _json_len({**part, slot: {**inner, "content": None}}) + _content_bound(inner.get("content"), _ANY)
    return _json_len(part) + UNSEEN_PART


def _payload_bound(payload: str) -> int:
    """One token per decoded byte (base64, or a base64 data URL); PDFs also per page."""
    encoded = payload.partition(",")[2] if payload.startswith("data:") else payload
    size = -(-len(encoded) // 4) * 3
    if not encoded.startswith("JVBER"):  # base64 of "%PDF"
        return size
    try:
        document = binascii.a2b_base64(encoded)
    except binascii.Error:
        document = b""
    pages = len(_PDF_PAGE_OBJECT.findall(document))
    if not pages or b"/ObjStm" in document:  # page objects hidden in compressed streams
        pages = 1 + size // 1024
    return size + PDF_PAGE * min(pages, PDF_MAX_PAGES)


_PDF_PAGE_OBJECT = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
