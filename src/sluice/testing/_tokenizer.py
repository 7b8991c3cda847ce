"""The fake's own token counting: what it reports as usage and bills.

Written apart from sluice's estimates on purpose (nothing here imports from ``sluice``
outside ``sluice.testing``): if the fake counted with sluice's own estimator, a test of
sluice's budget would check sluice against itself and could never catch an estimate
that is too low.

``tokenizer`` is ``"chars"`` (the default: about four characters a token, so ordinary
tests see familiar numbers), ``"bytes"`` (one token per UTF-8 byte: the most any
byte-level BPE tokenizer can produce, the hostile case) or any ``str -> int`` callable.
It is applied to everything a provider tokenizes: message text, roles, names, tool
calls and results, and the request's ``tools``/``functions``/``response_format`` and
Anthropic ``system``. Images are charged by the providers' published pixel formulas,
from the real size of a base64 image (an image the fake cannot see counts as the
largest the formula allows).
"""

from __future__ import annotations

import binascii
import importlib
import io
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

__all__ = ["PromptCounter", "TokenizerSpec", "image_size", "unmarked"]

#: ``"chars"``, ``"bytes"``, or a callable counting the tokens of one string.
TokenizerSpec = Literal["chars", "bytes"] | Callable[[str], int]

# The fake's chat framing (OpenAI's published numbers for its chat format): each
# message costs 3 tokens plus its role, a name 1 more, and 3 prime the reply.
PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMER = 3
#: OpenAI wraps function definitions in a namespace; ~9 tokens on top of their text.
OPENAI_TOOLS = 9
#: Anthropic's tool-use system prompt: 346 tokens for Claude 4 models with
#: ``tool_choice`` auto (docs.anthropic.com/en/docs/tool-use-pricing-and-tokens).
ANTHROPIC_TOOLS = 346
#: What a document or file the fake cannot see (an id, a URL) is charged.
UNSEEN_DOCUMENT = 1_000

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _chars(text: str) -> int:
    return -(-len(text) // 4)


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class PromptCounter:
    """Prompt tokens of a request body, for one tokenizer."""

    __slots__ = ("_payload_divisor", "text")

    def __init__(self, tokenizer: TokenizerSpec = "chars") -> None:
        if tokenizer == "chars":
            self.text: Callable[[str], int] = _chars
            self._payload_divisor = 4
        elif tokenizer == "bytes":
            self.text = _bytes
            self._payload_divisor = 1
        elif callable(tokenizer):
            self.text = tokenizer
            self._payload_divisor = 1
        else:
            raise ValueError(f"tokenizer must be 'chars', 'bytes' or a callable, got {tokenizer!r}")

    def payload(self, size: int) -> int:
        """Tokens for ``size`` bytes of non-text media (audio, files): one per byte, or
        per four bytes for ``"chars"``."""
        return -(-size // self._payload_divisor)

    # -- whole requests ---------------------------------------------------------------------

    def openai(self, body: Mapping[str, Any]) -> int:
        """``POST /v1/chat/completions``."""
        total = REPLY_PRIMER + self._messages(body["messages"], _openai_image)
        for key in ("tools", "functions"):
            if body.get(key):
                total += self.text(_COMPACT(body[key])) + OPENAI_TOOLS
        for key in ("response_format", "tool_choice", "function_call"):
            if body.get(key):
                total += self.text(_COMPACT(body[key]))
        return total

    def anthropic(self, body: Mapping[str, Any]) -> int:
        """``POST /v1/messages``."""
        total = REPLY_PRIMER + self._messages(body["messages"], _anthropic_image)
        system = body.get("system")
        if system:
            total += PER_MESSAGE + self._content(system, _anthropic_image)
        if body.get("tools"):
            total += self.text(_COMPACT(unmarked(body["tools"]))) + ANTHROPIC_TOOLS
        if body.get("tool_choice"):
            total += self.text(_COMPACT(body["tool_choice"]))
        return total

    def responses(self, body: Mapping[str, Any]) -> int:
        """``POST /v1/responses``: counted as its Chat Completions translation would be
        (``instructions`` a system message, a string input one user message, a function
        call and its output one message each), plus the tools and the text format."""
        total = REPLY_PRIMER
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            total += PER_MESSAGE + self.text("system") + self.text(instructions)
        given = body["input"]
        for item in [{"role": "user", "content": given}] if isinstance(given, str) else given:
            total += self.responses_item(item)
        if body.get("tools"):
            total += self.text(_COMPACT(body["tools"])) + OPENAI_TOOLS
        spec = (body.get("text") or {}).get("format")
        if spec and spec.get("type") != "text":
            total += self.text(_COMPACT(spec))
        if body.get("tool_choice"):
            total += self.text(_COMPACT(body["tool_choice"]))
        return total

    def responses_item(self, item: Mapping[str, Any]) -> int:
        """One input item of a Responses request (a message, a function call or its output)."""
        kind, text = item.get("type", "message"), self.text
        if kind == "message":
            return PER_MESSAGE + text(str(item.get("role", ""))) + self._content(item.get("content"), _openai_image)
        if kind == "function_call":
            return PER_MESSAGE + sum(text(str(item.get(k, ""))) for k in ("call_id", "name", "arguments"))
        if kind == "function_call_output":
            return PER_MESSAGE + text(str(item.get("call_id", ""))) + self._content(item.get("output"), _openai_image)
        return self.text(_COMPACT(item))  # reasoning items, tool calls of other kinds: their JSON

    # -- pieces of a prompt, for the prompt cache (see ._cache_blocks) ---------------------

    def message(self, message: Mapping[str, Any], api: str) -> int:
        """One message as a whole request counts it (``api``: ``"anthropic"`` or another)."""
        return self._messages([message], _anthropic_image if api == "anthropic" else _openai_image)

    def part(self, part: Any, api: str) -> int:
        """One content part (or block) of a message."""
        return self._part(part, _anthropic_image if api == "anthropic" else _openai_image)

    def prefix_chars(self, text: str, tokens: int) -> int:
        """How many leading characters of ``text`` are whole tokens within its first
        ``tokens`` (where a prompt cache boundary falls inside a text)."""
        if tokens <= 0:
            return 0
        if self.text is _chars:
            return min(len(text), 4 * tokens)
        if self.text is _bytes:
            used = 0
            for index, char in enumerate(text):
                used += _bytes(char)
                if used > tokens:
                    return index
            return len(text)
        low, high = 0, len(text)  # the longest prefix the callable counts at most ``tokens``
        while low < high:
            middle = (low + high + 1) // 2
            if self.text(text[:middle]) <= tokens:
                low = middle
            else:
                high = middle - 1
        return low

    # -- parts ---------------------------------------------------------------------------

    def _messages(self, messages: list[Mapping[str, Any]], image: _ImageRule) -> int:
        total = 0
        for message in messages:
            total += PER_MESSAGE + self.text(str(message.get("role", "")))
            total += self._content(message.get("content"), image)
            name = message.get("name")
            if isinstance(name, str):
                total += self.text(name) + PER_NAME
            for key in ("tool_calls", "function_call"):
                if message.get(key):
                    total += self.text(_COMPACT(message[key]))
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str):
                total += self.text(call_id)
        return total

    def _content(self, content: Any, image: _ImageRule) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.text(content)
        if isinstance(content, list):
            return sum(self._part(part, image) for part in content)
        return self._part(content, image)

    def _part(self, part: Any, image: _ImageRule) -> int:
        if isinstance(part, str):
            return self.text(part)
        if not isinstance(part, dict):
            return self.text(str(part))
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            return self.text(part["text"])
        if kind in ("image_url", "input_image", "image"):
            return image(*_image_of(part))
        if kind == "tool_result":
            return self.text(str(part.get("tool_use_id", ""))) + self._content(part.get("content"), image)
        if kind == "thinking" and isinstance(part.get("thinking"), str):
            return self.text(part["thinking"])
        if kind in ("input_audio", "file", "input_file", "document"):
            return self._media(part)
        return self.text(_COMPACT(part))

    def _media(self, part: Mapping[str, Any]) -> int:
        """Audio, files and documents: their decoded bytes, or a fixed charge when unseen."""
        inner = part.get(str(part.get("type"))) or part.get("source") or part
        if not isinstance(inner, Mapping):
            return UNSEEN_DOCUMENT
        if inner.get("type") == "text" and isinstance(inner.get("data"), str):
            return self.text(inner["data"])
        if inner.get("type") == "content":
            return self._content(inner.get("content"), _anthropic_image)
        for key in ("data", "file_data"):
            data = inner.get(key)
            if isinstance(data, str):
                encoded = data.partition(",")[2] if data.startswith("data:") else data
                return self.payload(len(encoded) * 3 // 4)
        return UNSEEN_DOCUMENT


def unmarked(tools: Any) -> Any:
    """Anthropic tools without their ``cache_control`` markers, which cost no tokens."""
    if isinstance(tools, list) and any(isinstance(t, Mapping) and "cache_control" in t for t in tools):
        return [{k: v for k, v in t.items() if k != "cache_control"} if isinstance(t, Mapping) else t for t in tools]
    return tools


# -- images ---------------------------------------------------------------------------------

#: ``(size or None when unseen, low detail?) -> tokens``
_ImageRule = Callable[[tuple[int, int] | None, bool], int]


def _openai_image(size: tuple[int, int] | None, low: bool) -> int:
    """OpenAI's published high-detail formula (gpt-4o, gpt-4.1): fit in 2048x2048, then
    shortest side down to 768, then 170 tokens per 512-px tile plus 85; ``detail: low``
    is 85 (platform.openai.com/docs/guides/images-vision, "Calculating costs"). An
    unseen image counts as the worst size, 2048x768: 8 tiles."""
    if low:
        return 85
    if size is None:
        return 85 + 170 * 8
    fit = min(1.0, 2048 / max(size))
    width, height = size[0] * fit, size[1] * fit
    short = min(1.0, 768 / min(width, height))
    tiles = math.ceil(round(width * short, 6) / 512) * math.ceil(round(height * short, 6) / 512)
    return 85 + 170 * tiles


def _anthropic_image(size: tuple[int, int] | None, low: bool) -> int:
    """Anthropic's published formula: width * height / 750, after scaling so the long
    edge is at most 1568 px and the image at most ~1.15 megapixels
    (docs.anthropic.com/en/docs/build-with-claude/vision, "Evaluate image size")."""
    width, height = size if size is not None else (1568, 1568)
    scale = min(1.0, 1568 / max(width, height), math.sqrt(1_150_000 / (width * height)))
    return math.ceil(width * scale * height * scale / 750)


def _image_of(part: Mapping[str, Any]) -> tuple[tuple[int, int] | None, bool]:
    """(pixel size of a base64 image, or None; whether ``detail`` is ``low``)."""
    data: str | None = None
    detail = part.get("detail")
    kind = part.get("type")
    if kind == "image_url":
        inner = part.get("image_url")
        if isinstance(inner, Mapping):
            detail = inner.get("detail")
            inner = inner.get("url")
        if isinstance(inner, str) and inner.startswith("data:"):
            data = inner.partition(",")[2]
    elif kind == "input_image":
        url = part.get("image_url")
        if isinstance(url, str) and url.startswith("data:"):
            data = url.partition(",")[2]
    else:
        source = part.get("source")
        if isinstance(source, Mapping) and source.get("type") == "base64" and isinstance(source.get("data"), str):
            data = source["data"]
    return (image_size(data) if data else None), detail == "low"


def image_size(encoded: str) -> tuple[int, int] | None:
    """(width, height) of a base64-encoded PNG, JPEG, GIF or WebP, or None if unreadable.

    The header sniffing is the ``imagesize`` package's (pure Python, no dependencies);
    without it every image counts as unseen.
    """
    try:
        sniff = importlib.import_module("imagesize").get
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    for length in (4096, len(encoded)):  # the header first; a JPEG may need more
        try:
            raw = binascii.a2b_base64(encoded[: length - length % 4])
            width, height = sniff(io.BytesIO(raw))
        except Exception:  # any unreadable header: the image counts as unseen
            continue
        if width > 0 and height > 0:
            return int(width), int(height)
        if length >= len(encoded):
            break
    return None
