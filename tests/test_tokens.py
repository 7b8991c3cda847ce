"""The budget's prompt bound: above what any byte-level tokenizer bills, images by formula."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice import Deployment, Request
from sluice._spending import worst_case_tokens
from sluice._tokens import (
    BOUND_PER_MESSAGE,
    BOUND_PER_PART,
    BOUND_REPLY_PRIMER,
    estimate_message_tokens,
    image_size,
    max_prompt_tokens,
)
from sluice.providers import max_output_tokens
from sluice.testing._tokenizer import PromptCounter

FRAME = BOUND_REPLY_PRIMER + BOUND_PER_MESSAGE + len("user")  # one user message around its content


def png(width: int, height: int) -> bytes:
    """A valid 1-bit grayscale PNG of any size (small: its rows are all zero)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\0" * (1 + (width + 7) // 8)) * height
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


# -- text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "text_bytes"),
    [
        ("", 0),
        ("abcd", 4),
        ("def f(x):\n    return x ** 2  # squares", 38),
        ("日本語のテキスト", 8 * 3),  # CJK: 3 bytes a character
        ("🙂🚀", 2 * 4),  # emoji: 4 bytes each
        ("héllo", 6),
    ],
)
def test_text_costs_at_most_its_utf8_bytes(content: str, text_bytes: int) -> None:
    assert max_prompt_tokens(user(content)) == FRAME + text_bytes
    parts = [{"type": "text", "text": content}, {"type": "text", "text": content}]
    assert max_prompt_tokens(user(parts)) == FRAME + 2 * (BOUND_PER_PART + text_bytes)


def test_names_tool_calls_system_and_tools_count() -> None:
    base = max_prompt_tokens(user("hi"))
    named = [{"role": "user", "content": "hi", "name": "ada"}]
    assert max_prompt_tokens(named) == base + 3 + 1
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    with_calls = [{"role": "assistant", "content": None, "tool_calls": calls}]
    assert max_prompt_tokens(with_calls) >= len(json.dumps(calls))
    assert max_prompt_tokens(user("hi"), {"system": "Be brief."}) == base + BOUND_PER_MESSAGE + 9
    tools = [{"type": "function", "function": {"name": "lookup", "description": "x" * 300, "parameters": {}}}]
    openai = max_prompt_tokens(user("hi"), {"tools": tools}, provider="openai", model="gpt-4o")
    anthropic = max_prompt_tokens(user("hi"), {"tools": tools}, provider="anthropic", model="claude-sonnet-4-5")
    assert openai - base >= len(json.dumps(tools))
    assert anthropic - base >= len(json.dumps(tools)) + 530  # Claude's tool-use system prompt, at most 530
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    assert max_prompt_tokens(user("hi"), {"response_format": schema}) > base + len(json.dumps(schema))
    assert max_prompt_tokens(user("hi"), {"temperature": 0.5, "max_tokens": 9}) == base  # not tokenized


def test_non_text_parts_count_their_decoded_bytes() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"\0" * 3000).decode(), "format": "wav"}}
    assert 3000 <= max_prompt_tokens(user([audio])) - FRAME < 3000 + 100
    unseen = {"type": "input_file", "file_id": "file-abc"}
    assert max_prompt_tokens(user([unseen])) >= 200_000  # a file we cannot see: a whole context window
    pdf = b"%PDF-1.4\n" + b"1 0 obj << /Type /Page >> endobj\n" * 3 + b"2 0 obj << /Type /Pages >> endobj\n"
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": ""}}
    document["source"]["data"] = base64.b64encode(pdf).decode()
    assert max_prompt_tokens(user([document]), provider="anthropic") >= len(pdf) + 3 * 4_600
    text_document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "ü" * 50}}
    assert max_prompt_tokens(user([text_document]), provider="anthropic") >= FRAME + 100


# -- the property: above the hostile tokenizer and above the TPM estimate --------------------

roles = st.sampled_from(["system", "user", "assistant", "tool", "developer"])
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": roles,
            "content": st.one_of(st.text(), st.lists(st.text().map(lambda t: {"type": "text", "text": t}))),
        },
        optional={"name": st.text(min_size=1, max_size=20)},
    ),
    min_size=1,
    max_size=6,
)
tools = st.lists(
    st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.text(), "description": st.text()})}
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(chat=messages, system=st.text(), defined=tools)
def test_the_bound_is_above_a_byte_level_tokenizer_and_the_estimate(
    chat: list[dict[str, Any]], system: str, defined: list[dict[str, Any]]
) -> None:
    hostile = PromptCounter("bytes")
    params: dict[str, Any] = {"tools": defined} if defined else {}
    openai = max_prompt_tokens(chat, params, provider="openai", model="gpt-4o")
    assert openai >= hostile.openai({"messages": chat, **params})
    assert openai >= estimate_message_tokens(chat, params)
    anthropic_params = {**params, "system": system}
    anthropic = max_prompt_tokens(chat, anthropic_params, provider="anthropic", model="claude-sonnet-4-5")
    assert anthropic >= hostile.anthropic({"messages": chat, **anthropic_params})
    assert anthropic >= estimate_message_tokens(chat, anthropic_params)
    unknown = max_prompt_tokens(chat, anthropic_params)  # no provider known: no smaller
    assert unknown >= max(openai, anthropic)


@settings(max_examples=100, deadline=None)
@given(text=st.text(min_size=1))
def test_the_bound_holds_for_one_long_dense_prompt(text: str) -> None:
    prompt = text * 50  # code, CJK, emoji: whatever hypothesis draws, at length
    chat = user(prompt)
    assert max_prompt_tokens(chat) >= PromptCounter("bytes").openai({"messages": chat})
    assert max_prompt_tokens(chat) >= len(prompt.encode("utf-8", "surrogatepass"))


# -- images -------------------------------------------------------------------------------

SQUARE = data_url(png(1024, 1024))
WIDE = data_url(png(2048, 768))
HUGE = data_url(png(4096, 4096))


def image_tokens(part: dict[str, Any], provider: str, model: str) -> int:
    return max_prompt_tokens(user([part]), provider=provider, model=model) - FRAME - BOUND_PER_PART


def openai_image(url: str, detail: str | None = None) -> dict[str, Any]:
    inner = {"url": url} if detail is None else {"url": url, "detail": detail}
    return {"type": "image_url", "image_url": inner}


def claude_image(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": url.partition(",")[2]}}
    return {"type": "image", "source": {"type": "url", "url": url}}


@pytest.mark.parametrize(
    ("part", "provider", "model", "tokens"),
    [
        # OpenAI's tiles: 1024x1024 -> 768x768 -> 4 tiles
        (openai_image(SQUARE), "openai", "gpt-4o", 85 + 4 * 170),
        (openai_image(SQUARE, "high"), "openai", "gpt-4o-2024-08-06", 85 + 4 * 170),
        (openai_image(SQUARE, "low"), "openai", "gpt-4o", 85),
        (openai_image(WIDE), "openai", "gpt-4o", 85 + 8 * 170),
        (openai_image(HUGE), "openai", "gpt-4o", 85 + 4 * 170),  # fit in 2048, then 768 a side
        (openai_image("https://example.com/cat.png"), "openai", "gpt-4o", 85 + 8 * 170),  # unseen: the most
        (openai_image("https://example.com/cat.png", "low"), "openai", "gpt-4o", 85),
        (openai_image(SQUARE), "openai", "o1", 75 + 4 * 150),
        # gpt-4o-mini: ~33x gpt-4o
        (openai_image(SQUARE), "openai", "gpt-4o-mini", 2833 + 4 * 5667),
        (openai_image(SQUARE, "low"), "openai", "gpt-4o-mini-2024-07-18", 2833),
        # 32-px patches times the model's multiplier; detail does not lower it
        (openai_image(SQUARE), "openai", "gpt-4.1-mini", 1659),  # ceil(1024 * 1.62)
        (openai_image(SQUARE, "low"), "openai", "gpt-4.1-nano", 2520),  # ceil(1024 * 2.46)
        (openai_image(SQUARE), "openai", "o4-mini", 1762),  # ceil(1024 * 1.72)
        (openai_image(HUGE), "openai", "o4-mini", 2642),  # capped at 1536 patches
        ({"type": "input_image", "image_url": SQUARE, "detail": "low"}, "openai", "gpt-4o", 85),
        # a model nobody knows: the largest formula
        (openai_image(SQUARE), "openai", "my-finetune", 2833 + 4 * 5667),
        (openai_image(SQUARE, "low"), "azure", "my-deployment", 2833),
        # Anthropic: width * height / 750 (or 28-px cells), long edge and total capped per model
        (claude_image(SQUARE), "anthropic", "claude-sonnet-4-5-20250929", 1399),  # ceil(1024 * 1024 / 750)
        (claude_image(HUGE), "anthropic", "claude-3-5-sonnet-20241022", 1600),
        (claude_image("https://example.com/cat.png"), "anthropic", "claude-sonnet-4-20250514", 1600),
        (claude_image("https://example.com/cat.png"), "anthropic", "claude-opus-4-7", 5000),
        (claude_image(HUGE), "anthropic", "claude-opus-4-7", 5000),
        (claude_image(data_url(png(10, 10))), "anthropic", "claude-haiku-4-5", 1),
    ],
)
def test_image_formula_table(part: dict[str, Any], provider: str, model: str, tokens: int) -> None:
    assert image_tokens(part, provider, model) == tokens


def test_an_unknown_provider_takes_the_largest_of_every_formula() -> None:
    for url in (SQUARE, WIDE, "https://example.com/cat.png"):
        unknown = image_tokens(openai_image(url), "", "")
        known = [image_tokens(openai_image(url), "openai", m) for m in ("gpt-4o", "gpt-4o-mini", "gpt-4.1-nano")]
        claude = image_tokens(claude_image(url), "anthropic", "claude-opus-4-7")
        assert unknown >= max(*known, claude)


def test_image_headers_are_read_for_every_common_format() -> None:
    gif = b"GIF89a" + struct.pack("<HH", 640, 480) + b"\x00\x00\x00;"
    frame = struct.pack(">HBHHB", 17, 8, 300, 400, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    exif = b"\xff\xe1" + struct.pack(">H", 20_000) + b"\0" * 19_998  # the size comes after a long header
    jpeg = b"\xff\xd8" + exif + b"\xff\xc0" + frame + b"\xff\xd9"
    webp = b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8X" + struct.pack("<I", 10) + b"\0" * 4
    webp += (799).to_bytes(3, "little") + (599).to_bytes(3, "little")
    sizes = [image_size(base64.b64encode(data).decode()) for data in (png(33, 7), gif, jpeg, webp)]
    assert sizes == [(33, 7), (640, 480), (400, 300), (800, 600)]
    assert image_size("bm90IGFuIGltYWdl") is None  # "not an image": counts as unseen


# -- output caps --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_tokens", "params", "expected"),
    [
        (None, {}, 1024),  # the deployment's default
        (100, {}, 100),
        (None, {"max_tokens": 300}, 300),
        (None, {"max_completion_tokens": 400}, 400),
        (None, {"max_output_tokens": 500}, 500),
        (100, {"max_tokens": 5000}, 5000),  # params are merged over the request's cap: the larger counts
        (100, {"max_completion_tokens": 50, "max_tokens": 70}, 100),
        (None, {"max_completion_tokens": 40, "max_tokens": 900}, 900),
        (100, {"n": 8}, 800),
        (None, {"max_tokens": 30, "n": 3}, 90),
        (100, {"n": 0}, 100),
        (100, {"max_tokens": True, "n": True}, 100),  # booleans are not counts
        (None, {"max_tokens": "many"}, 1024),
    ],
)
def test_max_output_tokens_takes_the_largest_cap(max_tokens: int | None, params: dict[str, Any], expected: int) -> None:
    request = Request("openai/x", user("hi"), max_tokens=max_tokens, params=params)
    assert max_output_tokens(request, Deployment("openai/x", default_max_tokens=1024)) == expected


async def test_n_choices_are_counted_in_tokens_and_worst_case() -> None:
    from sluice.providers import max_output_tokens

    request = Request("openai/x", [{"role": "user", "content": "hi"}], max_tokens=100, params={"n": 8})
    assert max_output_tokens(request, Deployment("openai/x")) == 800


def test_worst_case_tokens_pairs_the_bound_with_the_output_cap() -> None:
    request = Request("anthropic/claude-sonnet-4-5", user("日本語"), max_tokens=50, params={"max_tokens": 70})
    deployment = Deployment("anthropic/claude-sonnet-4-5")
    assert worst_case_tokens(request, deployment) == (FRAME + 9, 70)
