"""``sluice serve``: the official openai SDK against the proxy, the fake provider behind it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import io
import json
import logging
import os
import socket
import sys
import time
import zlib
from array import array
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servetools import ALICE_KEY, BOB_KEY, MESSAGES, UPSTREAM_KEY, ask, deployment, embedder, fake, sdk, serving

from sluice import Deployment, RetryPolicy
from sluice.serve.core._clients import SpendStore
from sluice.serve.core._settings import ClientSpec

# -- many clients, one set of limits -------------------------------------------------------------


async def test_concurrent_chats_through_the_proxy_meet_no_upstream_429(tmp_path: Path) -> None:
    async with (
        fake(rpm=10, window=0.5) as upstream,
        serving([deployment(upstream, rpm=10, window=0.5)], tmp_path) as url,
    ):
        client = sdk(url)
        replies = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=8
                )
                for i in range(25)
            )
        )
        assert [r.choices[0].message.content for r in replies] == [f"echo: question {i}" for i in range(25)]
        assert upstream.stats.accepted == 25
        async with aiohttp.ClientSession() as http, http.get(f"{upstream.url.removesuffix('/v1')}/_fake/stats") as got:
            stats = await got.json()
        assert stats["rate_limited"] == 0  # the same limit without sluice in front: see the next test
        await client.close()


async def test_the_same_burst_straight_at_the_fake_meets_429s() -> None:
    """The control for the test above: the fake's limit is strict enough to refuse this burst."""
    async with fake(rpm=10, window=0.5) as upstream:
        client = openai.AsyncOpenAI(base_url=upstream.url, api_key=UPSTREAM_KEY, max_retries=0)
        outcomes = await asyncio.gather(
            *(client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=8) for _ in range(25)),
            return_exceptions=True,
        )
        assert any(isinstance(o, openai.RateLimitError) for o in outcomes)
        await client.close()


async def test_past_the_queue_bound_requests_get_429_with_a_computed_retry_after(tmp_path: Path) -> None:
    async with (
        fake(rpm=2, window=1.0) as upstream,
        serving([deployment(upstream, rpm=2, window=1.0)], tmp_path, max_queue=1) as url,
    ):
        client = sdk(url)
        outcomes = await asyncio.gather(
            *(
                client.chat.completions.with_raw_response.create(model="gpt-test", messages=MESSAGES, max_tokens=8)
                for _ in range(6)
            ),
            return_exceptions=True,
        )
        refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
        answered = [o for o in outcomes if not isinstance(o, BaseException)]
        assert answered
        assert refused
        for error in refused:
            assert error.code == "rate_limit_exceeded"
            assert "queue is full" in error.message
            assert int(error.response.headers["retry-after"]) >= 1
            assert 0 < int(error.response.headers["retry-after-ms"]) <= 5000
        assert upstream.stats.rate_limited == 0
        await client.close()


async def test_a_wait_past_max_wait_is_a_429_saying_when_capacity_comes(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream, rpm=1, window=3.0)], tmp_path) as url:
        client = sdk(url)
        await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=8)
        began = time.monotonic()
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(
                model="gpt-test", messages=MESSAGES, max_tokens=8, extra_headers={"x-sluice-max-wait": "0.5"}
            )
        waited = time.monotonic() - began
        assert caught.value.code == "rate_limit_exceeded"
        # the limiter's schedule: the next slot is ~3 s after the first request, not a constant
        assert 1500 <= int(caught.value.response.headers["retry-after-ms"]) <= 3100
        assert waited < 2.5  # refused on the schedule's word, not after waiting for the slot
        assert upstream.stats.received == 1
        await client.close()


# -- chat, streaming, embeddings ----------------------------------------------------------------


async def test_streaming_assembles_the_same_answer_as_plain_with_a_final_usage_chunk(tmp_path: Path) -> None:
    async with fake(output_tokens=12) as upstream, serving([deployment(upstream)], tmp_path, cache=False) as url:
        client = sdk(url)
        question = [{"role": "user", "content": "Tell me about sluice gates and weirs"}]
        plain = await client.chat.completions.create(model="gpt-test", messages=question, max_tokens=12)  # type: ignore[arg-type]
        chunks = [
            chunk
            async for chunk in await client.chat.completions.create(
                model="gpt-test",
                messages=question,  # type: ignore[arg-type]
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == plain.choices[0].message.content
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
            plain.choices[0].finish_reason
        ]
        last = chunks[-1]
        assert last.choices == []
        assert last.usage is not None
        assert last.usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
        assert all(c.usage is None for c in chunks[:-1])
        await client.close()


async def test_a_stream_without_include_usage_has_no_usage_chunk(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path) as url, aiohttp.ClientSession() as http:
        body = {"model": "gpt-test", "messages": MESSAGES, "stream": True}
        async with http.post(f"{url}/v1/chat/completions", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = (await response.read()).decode()
        events = [e for e in raw.split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events)
        assert events[-1] == "data: [DONE]"
        assert '"usage"' not in raw


async def test_an_error_mid_stream_is_sent_as_openai_does(tmp_path: Path) -> None:
    async with fake(output_tokens=12) as upstream, serving([deployment(upstream)], tmp_path) as url:
        upstream.inject("stream_error", after=1)
        client = sdk(url)
        got: list[str] = []

        async def read() -> None:
            async for chunk in await client.chat.completions.create(
                model="gpt-test", messages=MESSAGES, max_tokens=12, stream=True
            ):
                got.append(chunk.choices[0].delta.content or "")

        with pytest.raises(openai.APIError) as caught:
            await read()
        assert "".join(got)  # the first piece came through before the error
        assert caught.value.message
        await client.close()


async def test_an_error_before_the_first_delta_is_an_ordinary_error_response(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, retry=RetryPolicy(max_attempts=1)) as url:
        upstream.inject("400")
        client = sdk(url)
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
        await client.close()


async def test_embeddings_as_floats_and_as_the_sdks_base64(tmp_path: Path) -> None:
    async with fake() as upstream, serving([embedder(upstream)], tmp_path) as url:
        direct = openai.AsyncOpenAI(base_url=upstream.url, api_key=UPSTREAM_KEY, max_retries=0)
        want = await direct.embeddings.create(
            model="text-embedding-3-small", input=["a sluice", "a weir"], encoding_format="float"
        )
        client = sdk(url)
        floats = await client.embeddings.create(
            model="text-embedding-3-small", input=["a sluice", "a weir"], encoding_format="float"
        )
        default = await client.embeddings.create(model="text-embedding-3-small", input=["a sluice", "a weir"])
        for got in (floats, default):
            assert [d.index for d in got.data] == [0, 1]
            for mine, theirs in zip(got.data, want.data, strict=True):
                assert mine.embedding == pytest.approx(theirs.embedding, rel=1e-6)
        assert floats.usage.prompt_tokens > 0
        async with aiohttp.ClientSession() as http:
            body = {"model": "text-embedding-3-small", "input": "a sluice", "encoding_format": "base64"}
            async with http.post(f"{url}/v1/embeddings", json=body) as response:
                encoded = (await response.json())["data"][0]["embedding"]
        vector = array("f")
        vector.frombytes(base64.b64decode(encoded))
        assert vector.tolist() == pytest.approx(want.data[0].embedding, rel=1e-6)
        await direct.close()
        await client.close()


# -- clients: keys, budgets, limits, models -----------------------------------------------------


ALICE = ClientSpec("alice", "ALICE_KEY")
BOB = ClientSpec("bob", "BOB_KEY", models=("gpt-test",))


async def test_a_wrong_or_missing_key_is_a_401(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, clients=(ALICE,)) as url:
        wrong = sdk(url, key="sk-wrong-key-0123456789abcdef")
        with pytest.raises(openai.AuthenticationError) as caught:
            await wrong.chat.completions.create(model="gpt-test", messages=MESSAGES)
        assert caught.value.code == "invalid_api_key"
        assert "sk-wrong-key" not in caught.value.response.text
        async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/models") as response:
            assert response.status == 401
        right = sdk(url, key=ALICE_KEY)
        reply = await right.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
        assert reply.choices[0].message.content
        assert upstream.stats.received == 1
        await wrong.close()
        await right.close()
    for secret in ("sk-wrong-key", ALICE_KEY, UPSTREAM_KEY):
        assert secret not in caplog.text


async def test_a_client_sees_and_uses_only_its_models(tmp_path: Path) -> None:
    async with (
        fake() as upstream,
        serving([deployment(upstream), embedder(upstream)], tmp_path, clients=(ALICE, BOB)) as url,
    ):
        bob, alice = sdk(url, key=BOB_KEY), sdk(url, key=ALICE_KEY)
        assert {m.id async for m in alice.models.list()} == {
            "openai/gpt-test",
            "gpt-test",
            "openai/text-embedding-3-small",
            "text-embedding-3-small",
        }
        assert {m.id async for m in bob.models.list()} == {"openai/gpt-test", "gpt-test"}
        with pytest.raises(openai.NotFoundError) as caught:
            await bob.embeddings.create(model="text-embedding-3-small", input="x")
        assert caught.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            await alice.chat.completions.create(model="openai/gpt-unknown", messages=MESSAGES)
        assert (await alice.embeddings.create(model="text-embedding-3-small", input="x")).data
        await bob.close()
        await alice.close()


async def test_a_client_over_budget_gets_insufficient_quota_and_a_restart_keeps_its_spend(tmp_path: Path) -> None:
    tight = ClientSpec("alice", "ALICE_KEY", budget_usd=0.002)
    async with fake() as upstream:
        async with serving([deployment(upstream)], tmp_path, clients=(tight,), cache=False) as url:
            client = sdk(url, key=ALICE_KEY)
            answered = 0

            async def until_refused() -> None:
                nonlocal answered
                for _ in range(50):
                    await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=100)
                    answered += 1

            with pytest.raises(openai.RateLimitError) as caught:
                await until_refused()
            assert caught.value.code == "insufficient_quota"
            assert caught.value.type == "insufficient_quota"
            assert 1 <= answered < 50
            await client.close()
        received = upstream.stats.received
        async with serving([deployment(upstream)], tmp_path, clients=(tight,), cache=False) as url:
            client = sdk(url, key=ALICE_KEY)
            with pytest.raises(openai.RateLimitError) as again:
                await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=100)
            assert again.value.code == "insufficient_quota"
            assert upstream.stats.received == received  # nothing sent: the spend came back from the state
            await client.close()
        async with serving([deployment(upstream)], tmp_path / "fresh", clients=(tight,), cache=False) as url:
            client = sdk(url, key=ALICE_KEY)  # the control: a fresh state lets the same request through
            assert (await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=100)).choices
            await client.close()


async def test_a_clients_own_rpm_is_enforced_in_front_of_the_engine(tmp_path: Path) -> None:
    limited = ClientSpec("alice", "ALICE_KEY", rpm=2)
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, clients=(limited, BOB)) as url:
        alice, bob = sdk(url, key=ALICE_KEY), sdk(url, key=BOB_KEY)
        for i in range(2):
            await alice.chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=4)
        with pytest.raises(openai.RateLimitError) as caught:
            await alice.chat.completions.create(model="gpt-test", messages=ask(2), max_tokens=4)
        assert caught.value.code == "rate_limit_exceeded"
        assert "alice" in caught.value.message
        assert 50 <= int(caught.value.response.headers["retry-after"]) <= 61  # the minute's window, from the limiter
        assert (await bob.chat.completions.create(model="gpt-test", messages=ask(3), max_tokens=4)).choices
        assert upstream.stats.received == 3
        await alice.close()
        await bob.close()


async def test_a_request_refused_before_it_was_sent_does_not_count_against_the_clients_rpm(tmp_path: Path) -> None:
    limited = ClientSpec("alice", "ALICE_KEY", rpm=2)
    async with (
        fake() as upstream,
        serving([deployment(upstream, tpm=10_000)], tmp_path, clients=(limited,)) as url,
    ):
        alice = sdk(url, key=ALICE_KEY)
        for i in range(2):  # more tokens than the deployment can ever take: refused by the engine, nothing sent
            with pytest.raises(openai.BadRequestError):
                await alice.chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=10**9)
        for i in range(2):
            assert (await alice.chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=4)).choices
        assert upstream.stats.received == 2
        await alice.close()


# -- errors and hostile clients --------------------------------------------------------------------


async def test_malformed_json_and_wrong_types_are_400s_naming_the_field(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path) as url, aiohttp.ClientSession() as http:
        cases: list[tuple[bytes, str | None]] = [
            (b'{"model": "gpt-test", "messages": [', None),
            (b'{"model": "gpt-test", "messages": "hi"}', "messages"),
            (b'{"model": "gpt-test", "messages": [{"content": "hi"}]}', "messages"),
            (b'{"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
            (b'{"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens"),
            (b'{"model": 7, "messages": []}', "model"),
            (b"[1, 2]", None),
        ]
        for raw, param in cases:
            async with http.post(
                f"{url}/v1/chat/completions", data=raw, headers={"content-type": "application/json"}
            ) as response:
                assert response.status == 400, raw
                error = (await response.json())["error"]
                assert error["type"] == "invalid_request_error"
                assert error["param"] == param, raw
                assert error["message"]
        assert upstream.stats.received == 0


async def test_a_request_the_engine_can_never_run_is_refused_by_its_own_checks(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream, tpm=10_000)], tmp_path) as url:
        client = sdk(url)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=10**9)
        assert "10000" in caught.value.message or "tpm" in caught.value.message.lower()
        assert upstream.stats.received == 0
        await client.close()


async def test_an_oversized_body_is_a_413(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, max_body_mb=0.01) as url:
        client = sdk(url)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "x" * 20_000}])
        assert caught.value.status_code == 413
        assert (await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)).choices
        assert upstream.stats.received == 1
        await client.close()


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before closing the connection (raises TimeoutError if it did not).
    A reset is a close too: bytes still trickling in when the server hangs up make the
    kernel answer them with a RST rather than a clean end."""
    async with asyncio.timeout(seconds):
        try:
            return await reader.read()
        except ConnectionResetError:
            return b""


async def test_headers_sent_byte_by_byte_are_cut_off_without_disturbing_others(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, header_timeout_s=0.5) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)

        sender = asyncio.create_task(trickle())
        client = sdk(url)
        try:
            reply = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
            assert reply.choices[0].message.content  # others are served meanwhile
            assert await _closed_within(reader, 5.0) == b""  # cut off, not answered
            assert not sender.done() or sender.exception() is None
        finally:
            sender.cancel()
            writer.close()
            await client.close()


async def test_a_body_sent_byte_by_byte_is_cut_off_with_a_408(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, body_timeout_s=0.5) as url:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 500\r\n\r\n"
        )
        answer = await _answer_to_trickle(url, head, b"{")
        assert answer.startswith(b"HTTP/1.1 408")
        assert b"did not arrive" in answer
        assert upstream.stats.received == 0


_BOUNDARY = "sluiceboundary"


async def _answer_to_trickle(url: str, head: bytes, first: bytes) -> bytes:
    """Send ``head`` and ``first``, then one byte every 50 ms (a slowloris body) until the
    server's answer begins; what the server sent (TimeoutError if nothing came within 5 s).

    The trickle stops once the answer's head is in, as a real client's would: a client
    that kept sending past the server's lingering close (2 s) would be reset, and a reset
    loses what the client had not yet read (seen on a loaded machine, where this test's
    loop fell that far behind)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + first)
    await writer.drain()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(600):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)

    sender = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(5.0):
            answer = await reader.readuntil(b"\r\n\r\n")
        sender.cancel()
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(10.0):
                answer += await reader.read()
        return answer
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.parametrize(
    ("path", "content_type", "first"),
    [
        ("/v1/batches", "application/json", b"{"),
        ("/v1/files", f"multipart/form-data; boundary={_BOUNDARY}", f"--{_BOUNDARY}\r\n".encode()),
    ],
)
async def test_a_batch_or_file_body_sent_byte_by_byte_is_cut_off_with_a_408(
    tmp_path: Path, path: str, content_type: str, first: bytes
) -> None:
    """The Batch API's bodies were read without the body timeout: a trickling client held
    its connection and handler for as long as it liked."""
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, body_timeout_s=0.5) as url:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: 100000\r\n\r\n"
        ).encode()
        answer = await _answer_to_trickle(url, head, first)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive" in answer


async def test_a_json_nesting_bomb_for_a_batch_is_a_400_not_a_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        fake() as upstream,
        serving([deployment(upstream)], tmp_path) as url,
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/batches", data=b"[" * 100_000 + b"]" * 100_000) as got,
    ):
        assert got.status == 400
        assert "could not parse the JSON body" in (await got.json())["error"]["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_client_that_hangs_up_mid_body_is_not_logged_as_an_internal_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path) as url:
        host, port = url.removeprefix("http://").split(":")
        for path in ("/v1/batches", "/v1/files", "/v1/chat/completions"):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={_BOUNDARY}\r\n"
                f"Content-Length: 100000\r\n\r\n--{_BOUNDARY}\r\n".encode()
            )
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            assert reader is not None
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as got:
            assert got.status == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


async def test_a_compressed_body_is_refused_not_inflated(tmp_path: Path) -> None:
    """aiohttp inflated a gzip body as it arrived: a 2 MB bomb cost ~200 MB of memory
    before the 413. No OpenAI SDK compresses its requests: a 415, the body never read."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(packer.compress(b"\0" * (1 << 20)) for _ in range(64)) + packer.flush()
    small = gzip.compress(json.dumps({"model": "gpt-test", "messages": ask(0), "max_tokens": 4}).encode())
    async with fake() as upstream, serving([deployment(upstream)], tmp_path) as url, aiohttp.ClientSession() as http:
        for body in (bomb, small):
            headers = {"content-encoding": "gzip", "content-type": "application/json"}
            async with http.post(f"{url}/v1/chat/completions", data=body, headers=headers) as got:
                assert got.status == 415
                assert "uncompressed" in (await got.json())["error"]["message"]
        client = sdk(url)
        reply = await client.chat.completions.create(model="gpt-test", messages=ask(1), max_tokens=4)
        assert reply.choices[0].message.content == "echo: question 1"
        await client.close()
        assert upstream.stats.received == 1


async def test_upstream_errors_are_passed_on_without_keys_or_urls(tmp_path: Path) -> None:
    async with fake(echo_key_in_errors=True) as upstream:
        wrong_key = Deployment("openai/gpt-test", base_url=upstream.url, api_key="sk-not-the-upstream-key-42")
        async with serving([wrong_key], tmp_path, retry=RetryPolicy(max_attempts=1)) as url:
            client = sdk(url)
            with pytest.raises(openai.APIStatusError) as caught:  # the server's key, not the client's: a 502
                await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
            assert caught.value.status_code == 502
            text = caught.value.response.text
            assert "upstream" in caught.value.message
            assert "sk-not-the-upstream-key-42" not in text
            assert upstream.url not in text
            await client.close()
    # a deployment nobody answers at: the connection error names no host or port
    async with fake() as gone:
        dead_url = gone.url
    dead = Deployment("openai/gpt-test", base_url=dead_url, api_key=UPSTREAM_KEY)
    async with serving([dead], tmp_path / "dead", retry=RetryPolicy(max_attempts=1)) as url:
        client = sdk(url)
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        assert failed.value.status_code == 502
        text = failed.value.response.text
        authority = dead_url.removeprefix("http://").split("/")[0]
        assert authority not in text
        assert "<upstream>" in text or "connect" in text
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as response:
            health = await response.text()
        assert authority not in health
        await client.close()


# -- metrics and health -------------------------------------------------------------------------------


async def test_metrics_parse_and_count_requests_tokens_cost_and_refusals(tmp_path: Path) -> None:
    limited = ClientSpec("alice", "ALICE_KEY", rpm=2)
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, clients=(limited,)) as url:
        client = sdk(url, key=ALICE_KEY)
        for i in range(2):
            await client.chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=4)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="gpt-test", messages=ask(2), max_tokens=4)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
            text = await response.text()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

        def value(name: str, **labels: str) -> float:
            return samples[(name, tuple(sorted(labels.items())))]

        endpoint = "/v1/chat/completions"
        assert value("sluice_serve_requests_total", endpoint=endpoint, client="alice", status="200") == 2
        assert value("sluice_serve_requests_total", endpoint=endpoint, client="alice", status="429") == 1
        assert value("sluice_serve_refused_total", client="alice", reason="client_rate_limit") == 1
        assert value("sluice_serve_tokens_total", client="alice", deployment="openai/gpt-test", kind="output") == 8
        assert value("sluice_serve_cost_usd_total", client="alice", deployment="openai/gpt-test") > 0
        assert value("sluice_serve_upstream_latency_seconds_count", deployment="openai/gpt-test") == 2
        assert value("sluice_serve_queue_depth") == 0
        assert value("sluice_upstream_rate_limited_total", deployment="openai/gpt-test") == 0
        assert ALICE_KEY not in text
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as response:
            health = await response.json()
        assert health["status"] == "ok"
        assert health["deployments"][0]["deployment"] == "openai/gpt-test"
        assert upstream.url not in str(health)
        await client.close()


# -- the real command --------------------------------------------------------------------------------


def _cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(extra)
    return env


async def test_sluice_serve_runs_as_a_command(tmp_path: Path) -> None:
    async with fake() as upstream:
        config = tmp_path / "sluice.toml"
        config.write_text(
            f"""
[serve]
max_queue = 16

[[deployment]]
model = "openai/gpt-test"
base_url = "{upstream.url}"
api_key_env = "UPSTREAM_KEY"
rpm = 600

[[client]]
name = "alice"
key_env = "ALICE_KEY"
"""
        )
        env = _cli_env(UPSTREAM_KEY=UPSTREAM_KEY, ALICE_KEY=ALICE_KEY)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sluice", "serve", "--config", str(config), "--port", "0",
            "--state", str(tmp_path / "state"),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            async with asyncio.timeout(30):
                line = (await process.stdout.readline()).decode()
            assert "listening on http://127.0.0.1:" in line, line
            url = line.split("listening on ")[1].split()[0]
            client = sdk(url, key=ALICE_KEY)
            reply = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
            assert reply.choices[0].message.content == "echo: Say hello to the proxy"
            await client.close()
        finally:
            process.terminate()
            async with asyncio.timeout(30):
                _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
        for secret in (UPSTREAM_KEY, ALICE_KEY):
            assert secret not in stderr.decode()
        assert (tmp_path / "state" / "clients.db").exists()


async def test_sluice_serve_refuses_a_public_address_without_client_keys(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text('[[deployment]]\nmodel = "simulate/demo"\n')
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sluice", "serve", "--config", str(config), "--host", "0.0.0.0", "--port", "0",
        "--state", str(tmp_path / "state"),
        env=_cli_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(30):
        _, stderr = await process.communicate()
    assert process.returncode == 2
    assert "without client keys" in stderr.decode()


async def _run_cli(*args: str, env: dict[str, str]) -> tuple[int | None, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sluice", "serve", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(30):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, stderr.decode()


async def test_a_port_in_use_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text('[[deployment]]\nmodel = "simulate/demo"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = await _run_cli(
            "--config", str(config), "--port", str(port), "--state", str(tmp_path / "state"), env=_cli_env()
        )
    assert code == 2, stderr
    assert f"cannot listen on 127.0.0.1:{port}" in stderr
    assert "Traceback" not in stderr


async def test_a_config_without_deployments_is_refused_at_startup(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text("[serve]\nmax_queue = 4\n")
    code, stderr = await _run_cli(
        "--config", str(config), "--port", "0", "--state", str(tmp_path / "s"), env=_cli_env()
    )
    assert code == 2, stderr
    assert "no [[deployment]]" in stderr


async def test_kill_9_mid_request_keeps_at_least_what_the_provider_bills_in_the_clients_spend(
    tmp_path: Path,
) -> None:
    """Client spend was written only when a request settled (or every 2 s): a kill -9 with
    requests in flight lost their cost, and the restarted server let the client spend it again."""
    async with fake(latency=1.0) as upstream:
        config = tmp_path / "sluice.toml"
        config.write_text(
            f"""
[[deployment]]
model = "openai/gpt-test"
base_url = "{upstream.url}"
api_key_env = "UPSTREAM_KEY"
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0 }}

[[client]]
name = "alice"
key_env = "ALICE_KEY"
budget_usd = 1.0
"""
        )
        state = tmp_path / "state"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sluice", "serve", "--config", str(config), "--port", "0", "--state", str(state),
            env=_cli_env(UPSTREAM_KEY=UPSTREAM_KEY, ALICE_KEY=ALICE_KEY),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            async with asyncio.timeout(30):
                line = (await process.stdout.readline()).decode()
            url = line.split("listening on ")[1].split()[0]
            async with aiohttp.ClientSession(headers={"authorization": f"Bearer {ALICE_KEY}"}) as http:
                sent = [
                    asyncio.create_task(
                        http.post(
                            f"{url}/v1/chat/completions",
                            json={"model": "gpt-test", "messages": ask(i), "max_tokens": 16},
                        )
                    )
                    for i in range(3)
                ]
                await upstream.until(lambda: upstream.in_flight == 3, timeout=10)
                process.kill()
                await process.wait()
                await asyncio.gather(*sent, return_exceptions=True)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.communicate()
        await upstream.until(lambda: upstream.in_flight == 0, timeout=10)
    billed = upstream.total_billed_usd
    assert billed > 0
    spend = SpendStore(state / "clients.db")
    try:
        assert spend.load("alice") >= billed  # the worst case of those in flight, at least what was billed
    finally:
        spend.close()


# -- the Batch API, mounted on the same app ------------------------------------------------------


def _batch_file(n: int) -> bytes:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-test", "messages": ask(i), "max_tokens": 8},
        }
        for i in range(n)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def _run_batch(client: openai.AsyncOpenAI, payload: bytes) -> Any:
    """Upload, create, and poll until the batch has ended; the batch."""
    uploaded = await client.files.create(file=("in.jsonl", payload), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    async with asyncio.timeout(60):
        while batch.status not in ("completed", "failed", "expired"):
            await asyncio.sleep(0.05)
            batch = await client.batches.retrieve(batch.id)
    return batch


async def test_the_batch_api_runs_behind_the_same_keys_and_client_budget(tmp_path: Path) -> None:
    import json

    payload = _batch_file(5)
    budgeted = ClientSpec("alice", "ALICE_KEY", budget_usd=1.0)
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, clients=(budgeted, BOB)) as url:
        anonymous = sdk(url, key="sk-not-a-client-key-0123456789")
        with pytest.raises(openai.AuthenticationError):
            await anonymous.files.create(file=("in.jsonl", payload), purpose="batch")
        alice, bob = sdk(url, key=ALICE_KEY), sdk(url, key=BOB_KEY)
        batch = await _run_batch(alice, payload)
        assert batch.status == "completed"
        assert batch.output_file_id is not None
        output = (await alice.files.content(batch.output_file_id)).text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in output) == [f"req-{i}" for i in range(5)]
        assert [b.id async for b in bob.batches.list()] == []  # another client's batches are not his
        await anonymous.close()
        await alice.close()
        await bob.close()
        billed = upstream.total_billed_usd
    # what the batch spent is alice's, after a restart too (its lines' charges are in the state)
    async with (
        serving([deployment(upstream)], tmp_path, clients=(budgeted, BOB)) as url,
        aiohttp.ClientSession() as http,
        http.get(f"{url}/metrics") as got,
    ):
        text = await got.text()
    spent = {
        s.labels["client"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sluice_client_spent_usd"
    }
    assert billed > 0
    assert spent["alice"] == pytest.approx(billed)


async def test_a_clients_models_hold_for_its_batch_lines_too(tmp_path: Path) -> None:
    """The Batch API was mounted without the model check: a client limited to one model ran
    any other through a batch."""
    only_embeddings = ClientSpec("alice", "ALICE_KEY", models=("openai/text-embedding-3-small",))
    async with (
        fake() as upstream,
        serving([deployment(upstream), embedder(upstream)], tmp_path, clients=(only_embeddings,)) as url,
    ):
        client = sdk(url, ALICE_KEY)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="gpt-test", messages=ask(0), max_tokens=4)
        lines = _chat_lines(["gpt-test", "openai/gpt-test"])
        upload = await client.files.create(file=("in.jsonl", io.BytesIO(lines)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        async with asyncio.timeout(10):
            while batch.status not in ("completed", "failed", "cancelled"):
                await asyncio.sleep(0.05)
                batch = await client.batches.retrieve(batch.id)
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (0, 2)
        assert batch.error_file_id is not None
        errors = [json.loads(line) for line in (await client.files.content(batch.error_file_id)).text.splitlines()]
        assert {e["error"]["code"] for e in errors} == {"model_not_found"}
        assert upstream.stats.received == 0
        await client.close()


def _chat_lines(models: list[str]) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": ask(i), "max_tokens": 4},
            }
        )
        + "\n"
        for i, model in enumerate(models)
    ).encode()


async def test_a_clients_rpm_holds_for_its_batch_lines_too(tmp_path: Path) -> None:
    """A batch ran its lines past its client's rpm: the Batch API was a way around it."""
    limited = ClientSpec("alice", "ALICE_KEY", rpm=3)
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, clients=(limited,)) as url:
        client = sdk(url, ALICE_KEY)
        upload = await client.files.create(
            file=("in.jsonl", io.BytesIO(_chat_lines(["gpt-test"] * 6))), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await upstream.until(lambda: upstream.stats.accepted >= 3, timeout=10)
        await asyncio.sleep(0.5)  # room for more to go, were the rpm not held
        assert upstream.stats.received == 3
        batch = await client.batches.retrieve(batch.id)
        assert batch.status == "in_progress"
        assert batch.request_counts is not None
        assert batch.request_counts.completed == 3
        with pytest.raises(openai.RateLimitError):  # its interactive quota is spent as well
            await client.chat.completions.create(
                model="gpt-test", messages=ask(99), max_tokens=4, extra_headers={"x-sluice-max-wait": "0"}
            )
        await client.batches.cancel(batch.id)  # a line waiting for the quota stops waiting
        async with asyncio.timeout(5):
            while batch.status != "cancelled":
                await asyncio.sleep(0.05)
                batch = await client.batches.retrieve(batch.id)
        assert batch.request_counts is not None
        assert batch.request_counts.completed == 3
        assert batch.error_file_id is not None
        errors = [json.loads(line) for line in (await client.files.content(batch.error_file_id)).text.splitlines()]
        assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 3
        assert upstream.stats.received == 3
        await client.close()


async def test_batch_tier_batch_runs_a_clients_batch_through_the_providers_batch_api(tmp_path: Path) -> None:
    """``[serve] batch_tier = "batch"``: the client's chat batch goes to the upstream's
    Batch API (half price, no synchronous request), spending from the client's budget."""
    import json

    payload = _batch_file(6)
    budgeted = ClientSpec("alice", "ALICE_KEY", budget_usd=1.0)
    async with (
        fake() as upstream,
        serving([deployment(upstream)], tmp_path, clients=(budgeted,), batch_tier="batch", batch_poll_every=0.2) as url,
    ):
        alice = sdk(url, key=ALICE_KEY)
        batch = await _run_batch(alice, payload)
        assert batch.status == "completed"
        assert batch.output_file_id is not None
        output = (await alice.files.content(batch.output_file_id)).text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in output) == [f"req-{i}" for i in range(6)]
        assert upstream.stats.received == 0  # no synchronous request upstream
        assert upstream.stats.accepted == 6
        assert {e.tier for e in upstream.ledger} == {"batch"}
        assert batch.usage is not None
        await alice.close()


def test_a_batch_tier_other_than_sync_or_batch_is_refused() -> None:
    from sluice._errors import ConfigError
    from sluice.serve.core._settings import serve_tables

    with pytest.raises(ConfigError, match="batch_tier must be 'sync' or 'batch'"):
        serve_tables({"serve": {"batch_tier": "flex"}}, "sluice.toml")
