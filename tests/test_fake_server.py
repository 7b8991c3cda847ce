"""Tests for sluice.testing.FakeServer: wire formats, limits, faults, counters, runners."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sluice.testing import FakeServer, Fault, openai_duration
from sluice.testing.__main__ import build_parser, build_server

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hello world"},
]
OPENAI = {"model": "gpt-test", "messages": MESSAGES}
ANTHROPIC: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 64,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
}
VERSION = {"anthropic-version": "2023-06-01"}
SRC = str(Path(__file__).resolve().parents[1] / "src")
Reply = tuple[int, Mapping[str, str], Any]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: Any,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """POST JSON (or raw bytes) and return status, headers and the decoded body."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers=headers) as response:
        raw = await response.read()
        return response.status, response.headers, json.loads(raw)


async def chat(session: aiohttp.ClientSession, server: FakeServer, **body: Any) -> Reply:
    return await post(session, f"{server.url}/chat/completions", {**OPENAI, **body})


async def messages(session: aiohttp.ClientSession, server: FakeServer, headers: Mapping[str, str] = VERSION) -> Reply:
    return await post(session, f"{server.anthropic_url}/v1/messages", ANTHROPIC, headers)


# -- wire formats ---------------------------------------------------------------------


async def test_openai_success_body(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        assert server.url == f"http://127.0.0.1:{server.port}/v1"
        status, headers, body = await chat(session, server)
    assert status == 200
    assert headers["x-request-id"] == "req_1"
    # the fake's own count ("chars": ceil(len / 4) a string): 3 per message + its role,
    # 3 to prime the reply. system: 3 + 2 ("system") + 3 ("Be brief."); user: 3 + 1 + 3
    prompt = 3 + (3 + 2 + 3) + (3 + 1 + 3)
    assert body["id"] == "chatcmpl-1"
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int)
    assert body["model"] == "gpt-test"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "echo: hello world"},
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 16,
        "total_tokens": prompt + 16,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


async def test_openai_max_tokens_cuts_the_reply(session: aiohttp.ClientSession) -> None:
    async with FakeServer(output_tokens=20) as server:
        _, _, cut = await chat(session, server, max_tokens=5)
        _, _, newer = await chat(session, server, max_tokens=50, max_completion_tokens=7)
        _, _, exact = await chat(session, server, max_tokens=20)
    assert (cut["usage"]["completion_tokens"], cut["choices"][0]["finish_reason"]) == (5, "length")
    assert (newer["usage"]["completion_tokens"], newer["choices"][0]["finish_reason"]) == (
        7,
        "length",
    )
    assert (exact["usage"]["completion_tokens"], exact["choices"][0]["finish_reason"]) == (
        20,
        "stop",
    )


async def test_anthropic_success_body(session: aiohttp.ClientSession) -> None:
    async with FakeServer(output_tokens=100) as server:
        assert server.anthropic_url == f"http://127.0.0.1:{server.port}"
        status, headers, body = await messages(session, server)
    assert status == 200
    assert headers["request-id"] == "req_1"
    prompt = 3 + (3 + 3) + (3 + 1 + 2)  # primer; system "Be brief."; user "hi there"
    assert body == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": "echo: hi there"}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt,
            "output_tokens": 64,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
    }


async def test_reply_text_escapes_any_prompt(session: aiohttp.ClientSession) -> None:
    prompt = 'héllo "quoted" \\ ünïcode ✓ ' + "x" * 300
    user = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    async with FakeServer() as server:
        _, _, body = await chat(session, server, model='m"odel', messages=user)
        system = [{"type": "text", "text": "sys"}]
        anthropic_body = {**ANTHROPIC, "system": system, "messages": user}
        status, _, anthropic = await post(session, f"{server.anthropic_url}/v1/messages", anthropic_body, VERSION)
    assert body["model"] == 'm"odel'
    assert body["choices"][0]["message"]["content"] == "echo: " + prompt[:200]
    assert status == 200
    assert anthropic["content"][0]["text"] == "echo: " + prompt[:200]
    assert anthropic["usage"]["input_tokens"] == 3 + (3 + 1) + (3 + 1 + -(-len(prompt) // 4))


async def test_reply_text_skips_non_text_parts(session: aiohttp.ClientSession) -> None:
    parts = [{"type": "image_url", "image_url": {"url": "x"}}, "plain", 7]
    async with FakeServer() as server:
        status, _, body = await chat(session, server, messages=[{"role": "user", "content": parts}])
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "echo: plain"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MESSAGES}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"content": "no role"}]}, "messages[0]"),
        ({**OPENAI, "max_tokens": 0}, "max_tokens"),
        ({**OPENAI, "stream": "yes"}, "stream"),
        (b"{not json", None),
    ],
)
async def test_openai_rejects_invalid_requests(session: aiohttp.ClientSession, body: Any, param: str | None) -> None:
    async with FakeServer() as server:
        status, headers, reply = await post(session, f"{server.url}/chat/completions", body)
        assert server.stats.accepted == 0
    assert status == 400
    assert "x-request-id" in headers
    assert reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["param"] == param
    assert set(reply["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (ANTHROPIC, {}),
        ({k: v for k, v in ANTHROPIC.items() if k != "max_tokens"}, VERSION),
        ({**ANTHROPIC, "system": 5}, VERSION),
        ({**ANTHROPIC, "messages": "hi"}, VERSION),
    ],
)
async def test_anthropic_rejects_invalid_requests(
    session: aiohttp.ClientSession, body: Any, headers: Mapping[str, str]
) -> None:
    async with FakeServer() as server:
        status, _, reply = await post(session, f"{server.anthropic_url}/v1/messages", body, headers)
    assert status == 400
    assert reply["type"] == "error"
    assert reply["error"]["type"] == "invalid_request_error"


async def test_api_key_is_required_when_configured(session: aiohttp.ClientSession) -> None:
    async with FakeServer(api_key="sk-test") as server:
        url = f"{server.url}/chat/completions"
        status, _, reply = await post(session, url, OPENAI, {"Authorization": "Bearer nope"})
        assert (status, reply["error"]["code"]) == (401, "invalid_api_key")
        assert reply["error"]["type"] == "invalid_request_error"
        ok, _, _ = await post(session, url, OPENAI, {"Authorization": "Bearer sk-test"})
        assert ok == 200
        status, _, reply = await messages(session, server)
        assert (status, reply["error"]["type"]) == (401, "authentication_error")
        ok, _, _ = await messages(session, server, {**VERSION, "x-api-key": "sk-test"})
        assert ok == 200


async def test_unknown_route_is_404(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server, session.get(f"{server.url}/models") as response:
        assert response.status == 404
        await response.read()


# -- rate limits ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.02, "20ms"),
        (0.0005, "0.5ms"),
        (1, "1s"),
        (360, "6m0s"),
        (90.5, "1m30.5s"),
        (3723, "1h2m3s"),
    ],
)
def test_openai_duration_format(seconds: float, text: str) -> None:
    assert openai_duration(seconds) == text


async def test_request_limit_429_and_sliding_window(session: aiohttp.ClientSession) -> None:
    async with FakeServer(rpm=3, window=0.5, slice=None) as server:
        remaining = []
        for i in range(3):
            if i == 1:
                await asyncio.sleep(0.2)  # so only the first has left when a 4th fits
            status, headers, _ = await chat(session, server)
            assert status == 200
            assert headers["x-ratelimit-limit-requests"] == "360"  # per minute, as OpenAI's: 3 per 0.5 s
            assert headers["x-ratelimit-reset-requests"].endswith("ms")
            remaining.append(headers["x-ratelimit-remaining-requests"])
        assert remaining == ["240", "120", "0"]
        assert "x-ratelimit-limit-tokens" not in headers
        status, headers, body = await chat(session, server)
        assert status == 429
        assert body["error"]["type"] == "requests"
        assert body["error"]["code"] == "rate_limit_exceeded"
        assert body["error"]["message"].startswith("Rate limit reached for requests")
        assert headers["retry-after"] == "1"
        wait_ms = int(headers["retry-after-ms"])
        assert 100 < wait_ms <= 300
        assert server.stats.rate_limited == 1
        assert len(server.stats.arrivals) == 3  # the 429 was not counted
        await asyncio.sleep(wait_ms / 1000 + 0.01)
        status, headers, _ = await chat(session, server)
        assert status == 200
        assert headers["x-ratelimit-remaining-requests"] == "0"


async def test_requests_are_also_enforced_per_slice(session: aiohttp.ClientSession) -> None:
    # 240 per 60 s is 4 per second; sliced by 1.25 s a burst of 5 passes, the 6th waits.
    async with FakeServer(rpm=240, window=60.0, slice=1.25) as server:
        statuses = [(await chat(session, server))[0] for _ in range(5)]
        assert statuses == [200] * 5
        status, headers, body = await chat(session, server)
        assert (status, body["error"]["type"]) == (429, "requests")
        assert headers["x-ratelimit-remaining-requests"] == "235"
        wait = int(headers["retry-after-ms"]) / 1000
        assert 0 < wait <= (1 - 0.02 * 4) / 4 + 0.001  # (1 - jitter * rate) / rate
        await asyncio.sleep(wait + 0.01)
        assert (await chat(session, server))[0] == 200


async def test_token_limit_reserves_max_tokens_then_settles(
    session: aiohttp.ClientSession,
) -> None:
    prompt = 18  # as in test_openai_success_body
    tpm = (prompt + 100) + (prompt + 16)  # the 2nd fits only once the 1st is settled
    async with FakeServer(tpm=tpm, window=5.0, output_tokens=16) as server:
        status, headers, _ = await chat(session, server, max_tokens=100)
        assert status == 200
        assert headers["x-ratelimit-limit-tokens"] == str(tpm * 12)  # per minute: 12 windows of 5 s
        assert headers["x-ratelimit-remaining-tokens"] == str((tpm - prompt - 16) * 12)
        status, headers, _ = await chat(session, server, max_tokens=100)
        assert status == 200
        assert headers["x-ratelimit-remaining-tokens"] == str((tpm - 2 * (prompt + 16)) * 12)
        status, headers, body = await chat(session, server, max_tokens=100)
        assert (status, body["error"]["type"]) == (429, "tokens")
        assert 0 < int(headers["retry-after-ms"]) <= 5000
        status, headers, body = await chat(session, server, max_tokens=tpm)
        assert status == 429
        assert body["error"]["message"].startswith("Request too large")
        assert "retry-after" not in headers
        assert server.stats.arrivals[0][1] == prompt + 100
        assert len(server.stats.arrivals) == 2


async def test_anthropic_rate_limit_headers(session: aiohttp.ClientSession) -> None:
    async with FakeServer(rpm=1, tpm=10_000, window=0.5, slice=None) as server:
        before = time.time()
        status, headers, _ = await messages(session, server)
        assert status == 200
        assert headers["anthropic-ratelimit-requests-limit"] == "120"  # per minute: 1 per 0.5 s
        assert headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert headers["anthropic-ratelimit-tokens-limit"] == "1200000"
        reset = datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"])
        assert before < reset.timestamp() <= time.time() + 0.5
        status, headers, body = await messages(session, server)
        assert (status, body["error"]["type"]) == (429, "rate_limit_error")
        assert headers["retry-after"] == "1"


async def test_retry_after_can_be_turned_off(session: aiohttp.ClientSession) -> None:
    async with FakeServer(rpm=1, window=5.0, send_retry_after=False) as server:
        await chat(session, server)
        status, headers, _ = await chat(session, server)
        server.inject("429")
        injected, injected_headers, _ = await chat(session, server)
    assert (status, injected) == (429, 429)
    assert "retry-after" not in headers
    assert "retry-after-ms" not in injected_headers


# -- faults ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "anthropic_type"),
    [
        ("500", 500, "api_error"),
        ("502", 502, "api_error"),
        ("503", 503, "api_error"),
        ("529", 529, "overloaded_error"),
        ("429", 429, "rate_limit_error"),
        ("400", 400, "invalid_request_error"),
        ("401", 401, "authentication_error"),
        ("404", 404, "not_found_error"),
        (Fault.NO_RETRY, 500, "api_error"),
    ],
)
async def test_status_faults(session: aiohttp.ClientSession, kind: str, status: int, anthropic_type: str) -> None:
    async with FakeServer() as server:
        server.inject(kind, times=2, headers={"x-extra": "yes"})
        openai_status, headers, body = await chat(session, server)
        anthropic_status, _, anthropic = await messages(session, server)
        after, _, _ = await chat(session, server)
        assert server.stats.accepted == 1
    assert (openai_status, anthropic_status, after) == (status, status, 200)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert anthropic["type"] == "error"
    assert anthropic["error"]["type"] == anthropic_type
    assert headers["x-extra"] == "yes"
    assert headers.get("x-should-retry") == ("false" if kind == Fault.NO_RETRY else None)
    assert ("retry-after" in headers) == (status == 429)


async def test_injected_faults_apply_in_arrival_order(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        server.inject("503")
        server.inject(Fault.RATE_LIMIT, retry_after=2.5)
        assert server.pending_faults == 2
        first, _, _ = await chat(session, server)
        second, headers, _ = await chat(session, server)
        third, _, _ = await chat(session, server)
    assert (first, second, third) == (503, 429, 200)
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("3", "2500")


async def test_fault_delay(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        server.inject("502", delay=0.1)
        started = time.monotonic()
        status, _, _ = await chat(session, server)
    assert status == 502
    assert time.monotonic() - started >= 0.1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="rpm"):
        FakeServer(rpm=0)
    with pytest.raises(ValueError, match="add up"):
        FakeServer(fault_rates={"500": 0.7, "reset": 0.4})
    with pytest.raises(ValueError, match="fire"):
        FakeServer().inject("fire")
    with pytest.raises(ValueError, match="times"):
        FakeServer().inject("500", times=0)


async def test_reset_fault_closes_the_connection(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        server.inject("reset")
        with pytest.raises(aiohttp.ClientConnectionError):
            await chat(session, server)
        assert (await chat(session, server))[0] == 200
        assert server.stats.by_status == {0: 1, 200: 1}


async def test_hang_fault_until_client_gives_up(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        server.inject("hang")
        with pytest.raises(asyncio.TimeoutError):
            async with session.post(
                f"{server.url}/chat/completions",
                json=OPENAI,
                timeout=aiohttp.ClientTimeout(total=0.2),
            ):
                pass
        assert (await chat(session, server))[0] == 200


async def test_hang_does_not_block_shutdown(session: aiohttp.ClientSession) -> None:
    server = await FakeServer().start()
    server.inject("hang")
    pending = asyncio.ensure_future(chat(session, server))
    await server.until(lambda: server.in_flight == 1)
    assert server.in_flight == 1
    started = time.monotonic()
    await server.stop()
    assert time.monotonic() - started < 0.5
    with pytest.raises(aiohttp.ClientConnectionError):
        await pending


async def test_malformed_and_empty_faults(session: aiohttp.ClientSession) -> None:
    async with FakeServer(prices={"*": (1.0, 2.0)}) as server:
        server.inject("malformed")
        server.inject("empty_choices", times=2)
        async with session.post(f"{server.url}/chat/completions", json=OPENAI) as response:
            assert response.status == 200
            with pytest.raises(json.JSONDecodeError):
                json.loads(await response.read())
        _, _, empty = await chat(session, server)
        _, _, anthropic_empty = await messages(session, server)
        assert server.stats.accepted == 0
        assert server.stats.by_status[200] == 3
        # the garbled answer was generated: billed (prompt + a normal completion), not delivered
        (garbled,) = server.ledger
        assert (garbled.kind, garbled.delivered, garbled.input_tokens, garbled.output_tokens) == (
            "malformed",
            False,
            18,
            16,
        )
        assert server.total_billed_usd == pytest.approx((18 * 1.0 + 16 * 2.0) / 1e6)
        assert (server.stats.undelivered, server.stats.duplicate_successes) == (1, 0)
    assert empty["choices"] == []
    assert anthropic_empty["content"] == []


async def test_truncated_fault(session: aiohttp.ClientSession) -> None:
    async with FakeServer(prices={"*": (1.0, 2.0)}) as server:
        server.inject("truncated")
        with pytest.raises(aiohttp.ClientPayloadError):
            await chat(session, server, max_tokens=5)
        assert (await chat(session, server, max_tokens=5))[0] == 200
        assert server.stats.by_status[0] == 1
        cut, answered = server.ledger
        assert (cut.kind, cut.output_tokens) == ("truncated", 5)  # capped by max_tokens, as answers are
        assert answered.kind == "delivered"
        assert cut.cost_usd == answered.cost_usd > 0
        assert server.stats.accepted == 1  # retrying a cut answer is right, not a duplicate
        assert server.stats.duplicate_successes == 0


async def test_faulted_invalid_requests_are_not_billed(session: aiohttp.ClientSession) -> None:
    async with FakeServer(api_key="sk-test", prices={"*": (1.0, 2.0)}) as server:
        server.inject("malformed")
        server.inject("truncated")
        async with session.post(f"{server.url}/chat/completions", json=OPENAI) as response:  # no key: a 401's work
            await response.read()
        with pytest.raises(aiohttp.ClientPayloadError):
            await chat(session, server)
        assert server.ledger == []


async def test_an_answer_the_client_stopped_waiting_for_is_still_billed(session: aiohttp.ClientSession) -> None:
    async with FakeServer(latency=0.3, prices={"*": (1.0, 2.0)}) as server:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(f"{server.url}/chat/completions", json=OPENAI, timeout=aiohttp.ClientTimeout(total=0.05))
        assert server.ledger == []  # still generating
        await server.until(lambda: server.in_flight == 0)
        (abandoned,) = server.ledger
        assert (abandoned.kind, abandoned.delivered, abandoned.output_tokens) == ("abandoned", False, 16)
        assert abandoned.cost_usd > 0
        # generated, so it counts as a success: the client's retry is a (billed) duplicate
        assert (server.stats.accepted, server.stats.undelivered) == (1, 1)
        assert (await chat(session, server))[0] == 200
        assert server.ledger[-1].kind == "delivered"
        assert server.stats.duplicate_successes == 1


async def test_an_answer_cut_short_by_shutdown_is_billed(session: aiohttp.ClientSession) -> None:
    server = await FakeServer(latency=5.0, prices={"*": (1.0, 2.0)}).start()
    pending = asyncio.ensure_future(chat(session, server))
    await server.until(lambda: server.in_flight == 1)
    await server.stop()  # aiohttp cancels the handler still generating
    with pytest.raises(aiohttp.ClientConnectionError):
        await pending
    assert [entry.kind for entry in server.ledger] == ["abandoned"]


async def test_random_faults_follow_the_seed(session: aiohttp.ClientSession) -> None:
    outcomes = []
    for _ in range(2):
        async with FakeServer(fault_rates={"500": 0.5}, seed=7) as server:
            outcomes.append([(await chat(session, server))[0] for _ in range(30)])
    assert outcomes[0] == outcomes[1]
    assert 5 < outcomes[0].count(500) < 25
    assert set(outcomes[0]) == {200, 500}


# -- the fake's own tokenizer ---------------------------------------------------------

DENSE = "def 日本(x): return '🙂' * x"  # code, CJK and emoji: 25 characters, 32 UTF-8 bytes


async def test_tokenizers_count_the_same_prompt_differently(session: aiohttp.ClientSession) -> None:
    prompt = [{"role": "user", "content": DENSE}]
    usage = {}
    for tokenizer in ("chars", "bytes", len):
        async with FakeServer(tokenizer=tokenizer) as server:
            _, _, body = await chat(session, server, messages=prompt)
            usage[tokenizer] = body["usage"]["prompt_tokens"]
    assert len(DENSE) == 25
    assert len(DENSE.encode()) == 32
    assert usage == {"chars": 3 + (3 + 1 + 7), "bytes": 3 + (3 + 4 + 32), len: 3 + (3 + 4 + 25)}
    with pytest.raises(ValueError, match="tokenizer"):
        FakeServer(tokenizer="words")  # type: ignore[arg-type]


async def test_the_fake_counts_tools_names_and_tool_calls(session: aiohttp.ClientSession) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    chat_with_tools = [
        {"role": "user", "content": "hi", "name": "ada"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    async with FakeServer(tokenizer="bytes") as server:
        _, _, plain = await chat(session, server, messages=chat_with_tools)
        _, _, with_tools = await chat(session, server, messages=chat_with_tools, tools=tools)
    compact = json.dumps(calls, separators=(",", ":"))
    expected = 3 + (3 + 4 + 2 + 3 + 1) + (3 + 9 + len(compact)) + (3 + 4 + 2 + 2)
    assert plain["usage"]["prompt_tokens"] == expected
    assert with_tools["usage"]["prompt_tokens"] == expected + len(json.dumps(tools, separators=(",", ":"))) + 9


def _png(width: int, height: int) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\0" * (1 + (width + 7) // 8)) * height
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("image", "tokens"),
    [
        ({"url": "data:image/png;base64," + _png(1024, 1024)}, 85 + 4 * 170),  # 768x768: 4 tiles
        ({"url": "data:image/png;base64," + _png(1024, 1024), "detail": "low"}, 85),
        ({"url": "data:image/png;base64," + _png(4000, 1500)}, 85 + 8 * 170),  # 2048x768: 8 tiles
        ({"url": "data:image/png;base64," + _png(100, 100)}, 85 + 170),
        ({"url": "https://example.com/unseen.png"}, 85 + 8 * 170),  # the largest
    ],
)
async def test_openai_images_are_charged_by_their_pixels(
    session: aiohttp.ClientSession, image: dict[str, str], tokens: int
) -> None:
    content = [{"type": "image_url", "image_url": image}]
    async with FakeServer() as server:
        _, _, body = await chat(session, server, messages=[{"role": "user", "content": content}])
    assert body["usage"]["prompt_tokens"] == 3 + (3 + 1) + tokens


@pytest.mark.parametrize(
    ("source", "tokens"),
    [
        ({"type": "base64", "media_type": "image/png", "data": _png(1024, 1024)}, 1399),  # 1024 * 1024 / 750
        ({"type": "base64", "media_type": "image/png", "data": _png(3000, 3000)}, 1534),  # ~1.15 MP at most
        ({"type": "url", "url": "https://example.com/unseen.png"}, 1534),
    ],
)
async def test_anthropic_images_are_charged_by_their_pixels(
    session: aiohttp.ClientSession, source: dict[str, str], tokens: int
) -> None:
    body = {**ANTHROPIC, "system": "", "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}]}
    async with FakeServer() as server:
        _, _, reply = await post(session, f"{server.anthropic_url}/v1/messages", body, VERSION)
    assert reply["usage"]["input_tokens"] == 3 + (3 + 1) + tokens


# -- counters and billing -------------------------------------------------------------


async def test_counters_and_duplicate_successes(session: aiohttp.ClientSession) -> None:
    async with FakeServer(latency=0.1) as server:
        await asyncio.gather(*(chat(session, server, user=str(i)) for i in range(4)))
        stats = server.stats
        assert (stats.received, stats.accepted, stats.max_in_flight) == (4, 4, 4)
        server.latency = 0.0
        server.inject("500")
        await chat(session, server, user="4")
        assert stats.by_status == {200: 4, 500: 1}
        assert stats.duplicate_successes == 0
        # The failed one is retried: still no duplicate. Re-sending a finished one is.
        for i in range(5):
            await chat(session, server, user=str(i))
        assert stats.duplicate_successes == 4
        assert len(stats.by_key) == 5
        assert sorted(stats.succeeded_keys.values()) == [1, 2, 2, 2, 2]
        key = {"Idempotency-Key": "job-1"}
        url = f"{server.url}/chat/completions"
        await post(session, url, {**OPENAI, "n": 1}, key)
        await post(session, url, {**OPENAI, "n": 2}, key)
        assert stats.by_key["job-1"] == 2
        assert stats.duplicate_successes == 5
        assert stats.prompt_tokens > 0
        assert stats.completion_tokens == 16 * stats.accepted
        server.reset_stats()
        assert server.stats.received == 0
        assert server.ledger == []


async def test_ledger_prices_each_success(session: aiohttp.ClientSession) -> None:
    prices = {"gpt-test": (1.0, 2.0), "*": (10.0, 10.0)}
    async with FakeServer(prices=prices) as server:
        _, _, body = await chat(session, server)
        await chat(session, server, model="other")
        server.inject("500")
        await chat(session, server)
    prompt = body["usage"]["prompt_tokens"]
    first, second = server.ledger
    assert (first.model, first.input_tokens, first.output_tokens) == ("gpt-test", prompt, 16)
    assert first.cost_usd == pytest.approx((prompt * 1.0 + 16 * 2.0) / 1e6)
    assert second.cost_usd == pytest.approx((prompt + 16) * 10.0 / 1e6)
    assert server.total_billed_usd == pytest.approx(first.cost_usd + second.cost_usd)


async def test_latency_delays_answers(session: aiohttp.ClientSession) -> None:
    async with FakeServer(latency=0.1) as server:
        started = time.monotonic()
        await chat(session, server)
    assert time.monotonic() - started >= 0.1


async def test_stats_endpoint(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        await chat(session, server)
        async with session.get(f"{server.anthropic_url}/_fake/stats") as response:
            summary = await response.json()
    assert summary["received"] == 1
    assert summary["by_status"] == {"200": 1}
    assert summary["duplicate_successes"] == 0


# -- ways to run it -------------------------------------------------------------------


def _sync_post(url: str, body: Mapping[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, json.loads(response.read())


def test_running_in_thread() -> None:
    with FakeServer(rpm=100).running_in_thread() as server:
        status, body = _sync_post(f"{server.url}/chat/completions", OPENAI)
        assert status == 200
        assert body["choices"][0]["message"]["content"] == "echo: hello world"
        assert server.stats.accepted == 1
    with pytest.raises(urllib.error.URLError):
        _sync_post(f"{server.url}/chat/completions", OPENAI)


def test_running_in_thread_reports_a_busy_port() -> None:
    with FakeServer().running_in_thread() as first:
        taken = FakeServer(port=first.port)
        with pytest.raises(OSError, match=r"(?i)in use"), taken.running_in_thread():
            pass


def test_cli_options_build_the_server() -> None:
    options = "--port 0 --tpm 5000 --slice none --fault-rate 529=0.25 --price gpt-x=0.5,1.5"
    args = build_parser().parse_args([*options.split(), "--no-retry-after", "--latency", "0.01"])
    server = build_server(args)
    assert server.fault_rates == {Fault.OVERLOADED: 0.25}
    assert server.prices == {"gpt-x": (0.5, 1.5)}
    assert (server.send_retry_after, server.latency) == (False, 0.01)


async def test_cli_serves_in_another_process(session: aiohttp.ClientSession) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "sluice.testing", "--port", "0", "--rpm", "100"]
    process = await asyncio.create_subprocess_exec(*command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 10)).decode().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        base = line.removeprefix("listening on ")
        assert not base.endswith(":0")
        status, headers, _ = await post(session, f"{base}/v1/chat/completions", OPENAI)
        assert (status, headers["x-ratelimit-remaining-requests"]) == (200, "99")
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0, stderr.decode()
