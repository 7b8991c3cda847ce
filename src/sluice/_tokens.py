"""Token estimates made before sending, the way providers count against a TPM limit.

Providers reserve ``prompt tokens + max_tokens`` when a request arrives and settle
with the real usage afterwards; sluice does the same. Exact tokenizers (tiktoken)
download their vocabularies at run time and differ per model, so this is a fast,
offline, deliberately slightly generous estimate; reconciliation with the reported
usage corrects it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["estimate_message_tokens", "estimate_text_tokens"]

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
        total += PER_MESSAGE + _content_tokens(message.get("content"))
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
