"""Input and output token limits apart (Anthropic's ITPM and OTPM, issue 21): deployments
and config files that take them, the limiter reserving and settling each in virtual time,
the headers it learns them from, the fake enforcing them, Redis sharing them, and a
``sluice run`` job against a fake that enforces the limits it was given."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from clitools import env_for, read_output, run_cli, write_jsonl
from fake_provider import deployment_at
from redis_server import RedisServer

from sluice import CapacityError, ConfigError, Deployment, Engine, LocalLimiter, RateLimitSnapshot, Request, Usage
from sluice._limits import usage_counts
from sluice._meter import INPUT, OUTPUT, WINDOW_MARGIN, pace_factor
from sluice.cli._config import JobConfig, config_from_bytes, describe, with_overrides
from sluice.providers import AnthropicProvider, CallableProvider, Reply
from sluice.providers._http import HttpTransport
from sluice.providers._translate import anthropic_reply
from sluice.redis import RedisLimits
from sluice.testing import FakeServer, run_in_virtual_time
from sluice.testing.__main__ import build_parser, build_server

VERSION = {"anthropic-version": "2023-06-01", "x-api-key": "sk-test"}

# -- deployments and config files --------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"itpm": 0}, "itpm must be a positive number, got 0"),
        ({"otpm": -5}, "otpm must be a positive number, got -5"),
        ({"itpm": "fast"}, "itpm must be a positive number, got 'fast'"),
        ({"otpm": float("nan")}, "otpm must be a positive number"),
        ({"otpm": 0.5, "window": 1.0}, "otpm must be at least 1 per window; for fewer, lengthen window= (now 1 s)"),
    ],
)
def test_a_deployment_refuses_impossible_input_and_output_limits(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="deployment 'anthropic/claude-x': ") as caught:
        Deployment("anthropic/claude-x", **settings)
    assert message in str(caught.value)


def test_a_deployment_shows_its_input_and_output_limits() -> None:
    d = Deployment("anthropic/claude-x", rpm=50, itpm=30_000, otpm=8_000)
    assert repr(d) == "Deployment('anthropic/claude-x', rpm=50, itpm=30000, otpm=8000)"
    limiter = LocalLimiter.for_deployment(d)
    assert (limiter.requests_limit, limiter.tokens_limit, limiter.input_limit, limiter.output_limit) == (
        50,
        None,
        30_000,
        8_000,
    )
    assert "input_tokens=0/30000 output_tokens=0/8000" in repr(limiter)


def test_a_config_file_takes_itpm_and_otpm_and_says_where_one_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    good = b'[[deployment]]\nmodel = "anthropic/claude-x"\nitpm = 40000\notpm = 8000\nwindow = 30\n'
    (d,) = config_from_bytes(good, path).deployments
    assert (d.itpm, d.otpm, d.window) == (40_000, 8_000, 30)
    (row,) = describe(config_from_bytes(good, path))
    assert (row["itpm"], row["otpm"], row["tpm"]) == ("40000", "8000", "-")
    bad = b'[[deployment]]\nmodel = "anthropic/claude-x"\notpm = "lots"\n'
    with pytest.raises(ConfigError) as caught:
        config_from_bytes(bad, path)
    assert str(caught.value).endswith(
        "sluice.toml: [[deployment]] #1: deployment 'anthropic/claude-x': otpm must be a positive number, got 'lots'"
    )
    typo = b'[[deployment]]\nmodel = "anthropic/claude-x"\notmp = 8000\n'
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['otmp'\]"):
        config_from_bytes(typo, path)


def test_itpm_and_otpm_flags_go_to_the_models_deployment() -> None:
    config = with_overrides(JobConfig(), model="anthropic/claude-x", itpm=30_000, otpm=8_000)
    (d,) = config.deployments
    assert (d.model, d.itpm, d.otpm, d.tpm) == ("anthropic/claude-x", 30_000, 8_000, None)
    with pytest.raises(ConfigError, match="otpm must be a positive number"):
        with_overrides(JobConfig(), otpm=-1)  # for every model without a deployment: checked at once


# -- the limiter, in virtual time ---------------------------------------------------------

Sent = tuple[float, int, int, int]  # (when it left, tokens, input, output)


async def _send_all(
    limiter: LocalLimiter, asks: list[tuple[int, int]], settle: list[tuple[int, int]] | None = None
) -> list[Sent]:
    """Acquire every (tokens, output) at once and send each as the engine does; settle each
    to ``settle[i]`` (input, output) the moment it is sent (an answer at once), or not at all."""
    loop = asyncio.get_running_loop()
    sent: list[Sent] = []

    async def one(i: int, tokens: int, output: int) -> None:
        grant = await limiter.acquire(tokens, output=output)
        await asyncio.sleep(grant.send_delay(loop.time()))
        grant.sent(loop.time())
        given, wrote = (tokens - output, output) if settle is None else settle[i]
        if settle is not None:
            grant.reconcile(given + wrote, input_tokens=given, output_tokens=wrote)
        sent.append((loop.time(), given + wrote, given, wrote))
        grant.done()

    await asyncio.gather(*(one(i, tokens, output) for i, (tokens, output) in enumerate(asks)))
    return sorted(sent)


def _most_in_a_window(sent: list[Sent], window: float, field: int) -> int:
    """The most of ``field`` (1 tokens, 2 input, 3 output) sent in any window [s, s + window)."""
    best = 0
    for i, first in enumerate(sent):
        best = max(best, sum(s[field] for s in sent[i:] if s[0] < first[0] + window))
    return best


def test_output_is_reserved_against_otpm_at_max_tokens_and_paced() -> None:
    # 100 output tokens per 10 s; each request may write 50: two a window, one every 5 s
    limiter = LocalLimiter(input_tokens=100_000, output_tokens=100, window=10.0)
    sent = run_in_virtual_time(_send_all(limiter, [(60, 50)] * 6))
    gaps = {round(b[0] - a[0], 6) for a, b in itertools.pairwise(sent)}
    assert gaps == {round(5.0 * pace_factor(10.0), 6)}
    assert _most_in_a_window(sent, 10.0, 3) <= 100


def test_input_is_reserved_against_itpm_without_the_output() -> None:
    # 1000 input tokens per 10 s; 600 tokens each, of which 100 output: 500 input, 5 s apart
    limiter = LocalLimiter(input_tokens=1000, output_tokens=100_000, window=10.0)
    sent = run_in_virtual_time(_send_all(limiter, [(600, 100)] * 5))
    gaps = {round(b[0] - a[0], 6) for a, b in itertools.pairwise(sent)}
    assert gaps == {round(5.0 * pace_factor(10.0), 6)}
    assert _most_in_a_window(sent, 10.0, 2) <= 1000
    assert limiter.used[INPUT] == 1000  # the last two, still in the window


def test_settling_gives_back_the_output_not_written_and_the_next_goes_sooner() -> None:
    async def scenario() -> tuple[float, tuple[int, int, int, int]]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(output_tokens=100, window=10.0)
        first = await limiter.acquire(60, output=50)  # 10 input, up to 50 output
        first.sent(loop.time())
        first.reconcile(30, input_tokens=10, output_tokens=20)  # it wrote 20
        first.done()
        used = limiter.used
        (await limiter.acquire(60, output=50)).done()
        return loop.time(), used

    at, used = run_in_virtual_time(scenario())
    assert used == (1, 30, 10, 20)
    assert at == pytest.approx(2.0 * pace_factor(10.0))  # 20 written: 2 s of the pace, not 5


@pytest.mark.parametrize("limits", [(12_000, 8_000, 1_500), (6_000, 4_000, 1_500)], ids=["otpm-binds", "all-near"])
def test_tpm_itpm_and_otpm_are_each_honoured_at_once(limits: tuple[int, int, int]) -> None:
    """Random prompts and outputs, settled lower than reserved: no window ever holds more
    than any of the three limits. When one binds, its pace is the documented bound: a full
    window keeps room for one whole reservation (max_tokens), so at least (limit -
    max_tokens) a window. (When all three are close the pace is slower: each limit's pacer
    restarts when another held a request back, saving nothing up for a burst.)"""
    rng = random.Random(21)
    asks = [(rng.randint(10, 300) + 100, 100) for _ in range(300)]  # prompt + max_tokens 100
    settle = [(tokens - 100 - rng.randint(0, 5), rng.randint(20, 100)) for tokens, _ in asks]
    tpm, itpm, otpm = limits
    limiter = LocalLimiter(tokens=tpm, input_tokens=itpm, output_tokens=otpm, window=10.0)
    sent = run_in_virtual_time(_send_all(limiter, asks, settle))
    assert _most_in_a_window(sent, 10.0, 1) <= tpm
    assert _most_in_a_window(sent, 10.0, 2) <= itpm
    assert _most_in_a_window(sent, 10.0, 3) <= otpm
    if limits[0] == 12_000:
        span = sent[-1][0] - sent[0][0]
        ideal = sum(s[3] for s in sent[:-1]) / otpm * 10.0
        assert ideal <= span <= ideal * pace_factor(10.0) / (1 - 100 / otpm)


def test_a_request_that_can_never_fit_its_input_or_output_limit_says_which() -> None:
    limiter = LocalLimiter(input_tokens=100, output_tokens=50, window=60.0, name="claude")
    with pytest.raises(CapacityError, match=r"~190 input tokens .* claude allows 100 input tokens per 60 s \(itpm\)"):
        limiter.check(200, output=10)
    with pytest.raises(CapacityError, match=r"may write 60 output tokens .* 50 output tokens per 60 s .*max_tokens"):
        limiter.check(80, output=60)
    limiter.check(150, output=50)  # 100 in, 50 out: fits, alone in its window


def test_the_engine_refuses_a_max_tokens_above_otpm_before_sending(server: FakeServer) -> None:
    async def main() -> str:
        async with Engine(deployment_at(server, "anthropic/claude-x", otpm=100)) as engine:
            result = (await engine.run([Request.from_prompt("anthropic/claude-x", "hi", max_tokens=500)]))[0]
        assert isinstance(result.error, CapacityError)
        return str(result.error)

    message = asyncio.run(main())
    assert "may write 500 output tokens (max_tokens)" in message
    assert server.stats.received == 0


def test_a_lower_output_limit_from_the_headers_is_adopted_in_our_window() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(output_tokens=10_000, window=6.0)
        limiter.observe(RateLimitSnapshot(limit_output_tokens=600, tokens_window=60.0))  # 60 per 6 s
        assert limiter.output_limit == 60
        with pytest.raises(CapacityError, match="allows 600 output tokens per 60 s"):
            await limiter.acquire(700, output=650)
        times = []
        for _ in range(3):
            (await limiter.acquire(40, output=30)).done()
            times.append(loop.time())
        return times

    step = 3.0 * pace_factor(6.0)  # 30 tokens at 10 a second
    assert run_in_virtual_time(scenario()) == pytest.approx([0.0, step, 2 * step])


def test_a_limit_learnt_where_none_was_configured_counts_what_was_already_sent() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(window=10.0)
        for _ in range(3):
            (await limiter.acquire(50, output=40)).done()  # unlimited: all at once
        # the server says 100 output tokens per 10 s; we have 120 in the window already
        limiter.observe(RateLimitSnapshot(limit_output_tokens=100, tokens_window=10.0))
        assert limiter.used[OUTPUT] == 120
        (await limiter.acquire(50, output=40)).done()
        return loop.time()

    assert run_in_virtual_time(scenario()) == pytest.approx(10.0 + WINDOW_MARGIN)  # once they left


def test_remaining_input_below_our_count_is_outside_traffic_until_the_reset() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(input_tokens=1000, window=60.0)
        (await limiter.acquire(110, output=10)).done()  # 100 input
        # another process used the rest: nothing left until the bucket refills, in 30 s
        limiter.observe(RateLimitSnapshot(limit_input_tokens=1000, remaining_input_tokens=0, reset_input_tokens=30.0))
        (await limiter.acquire(110, output=10)).done()
        return loop.time()

    assert run_in_virtual_time(scenario()) == pytest.approx(30.0)


def test_cache_reads_do_not_count_against_itpm_but_cache_writes_do() -> None:
    usage = Usage(input_tokens=1000, output_tokens=50, cached_input_tokens=600, cache_write_tokens=100)
    assert usage_counts(usage) == (1050, 400, 50)
    # the Anthropic reply parser folds cached tokens into input_tokens; the count takes them out again
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 300,
            "output_tokens": 20,
            "cache_read_input_tokens": 600,
            "cache_creation_input_tokens": 100,
        },
    }
    assert usage_counts(anthropic_reply(body, created=0).usage) == (1020, 400, 20)


def test_an_answer_settles_input_as_anthropic_counts_it() -> None:
    async def answer(request: Request) -> Reply:
        usage = Usage(input_tokens=1000, output_tokens=10, cached_input_tokens=900, cache_write_tokens=50)
        return Reply(text="ok", usage=usage)

    async def main() -> tuple[int, int, int, int]:
        d = Deployment("mine/x", provider=CallableProvider(answer), itpm=10_000, otpm=1_000)
        async with Engine(d) as engine:
            result = await engine.complete("mine/x", "hello", max_tokens=200)
            assert result.ok
            limiter = engine.limiter("mine/x")
            assert isinstance(limiter, LocalLimiter)
            return limiter.used

    assert run_in_virtual_time(main()) == (1, 1010, 100, 10)  # 1000 in, 900 of them cache reads


# -- headers ------------------------------------------------------------------------------


def test_anthropic_input_and_output_headers_are_read_and_tokens_is_not_a_limit_of_its_own() -> None:
    provider = AnthropicProvider(HttpTransport())
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2999-01-01T00:00:00Z",
        "anthropic-ratelimit-input-tokens-limit": "30000",
        "anthropic-ratelimit-input-tokens-remaining": "29000",
        "anthropic-ratelimit-input-tokens-reset": "2999-01-01T00:00:00Z",
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "7000",
        "anthropic-ratelimit-output-tokens-reset": "2999-01-01T00:00:00Z",
        "anthropic-ratelimit-tokens-limit": "8000",  # the more restrictive of the two
        "anthropic-ratelimit-tokens-remaining": "7000",
    }
    snapshot = provider.parse_ratelimit(headers)
    assert snapshot is not None
    assert (snapshot.limit_input_tokens, snapshot.remaining_input_tokens) == (30_000, 29_000)
    assert (snapshot.limit_output_tokens, snapshot.remaining_output_tokens) == (8_000, 7_000)
    assert snapshot.reset_input_tokens is not None
    assert snapshot.reset_output_tokens is not None
    assert (snapshot.limit_tokens, snapshot.remaining_tokens) == (None, None)  # not 8000 for input + output
    older = provider.parse_ratelimit({k: v for k, v in headers.items() if "put-tokens" not in k})
    assert older is not None
    assert (older.limit_tokens, older.limit_input_tokens) == (8_000, None)  # a server without the split


async def test_the_engine_learns_itpm_and_otpm_from_the_fakes_headers() -> None:
    async with FakeServer(api_key="sk-test", itpm=20_000, otpm=4_000, window=60.0) as server:
        d = deployment_at(server, "anthropic/claude-x")  # nothing configured
        async with Engine(d) as engine:
            assert (await engine.complete("anthropic/claude-x", "hello", max_tokens=50)).ok
            limiter = engine.limiter("anthropic/claude-x")
            assert isinstance(limiter, LocalLimiter)
            assert (limiter.input_limit, limiter.output_limit) == (20_000, 4_000)
            assert limiter.tokens_limit is None  # tokens-* is the more restrictive of the two, not a third


async def test_429s_for_output_teach_the_limit_and_every_request_gets_through() -> None:
    async with FakeServer(api_key="sk-test", otpm=100, window=1.0) as server:
        d = deployment_at(server, "anthropic/claude-x", window=1.0)  # otpm unknown to sluice
        async with Engine(d) as engine:
            asks = [Request.from_prompt("anthropic/claude-x", f"q{i}", max_tokens=80) for i in range(5)]
            results = await engine.run(asks)
            limiter = engine.limiter("anthropic/claude-x")
        assert all(r.ok for r in results), [r.error for r in results]
        assert server.stats.rate_limited_by["output_tokens"] >= 1  # at first: nothing paced them
        assert server.stats.rate_limited == server.stats.rate_limited_by["output_tokens"]
        assert isinstance(limiter, LocalLimiter)
        assert limiter.output_limit == 100  # learnt from the 429s' headers and the answers'


# -- the fake enforces them -----------------------------------------------------------------


async def _messages(
    session: aiohttp.ClientSession, server: FakeServer, **body: Any
) -> tuple[int, Mapping[str, str], Any]:
    payload = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi there"}], **body}
    async with session.post(f"{server.anthropic_url}/v1/messages", json=payload, headers=VERSION) as response:
        return response.status, response.headers, json.loads(await response.read())


async def test_the_fake_takes_max_tokens_from_otpm_and_gives_back_what_was_not_written() -> None:
    async with (
        FakeServer(api_key="sk-test", itpm=1_000, otpm=100, window=10.0) as server,
        aiohttp.ClientSession() as session,
    ):
        status, headers, body = await _messages(session, server)
        assert status == 200
        assert body["usage"]["output_tokens"] == 16
        prompt = body["usage"]["input_tokens"]
        assert headers["anthropic-ratelimit-input-tokens-limit"] == "6000"  # per minute: 6 windows of 10 s
        assert headers["anthropic-ratelimit-output-tokens-limit"] == "600"
        # 64 taken at the start, 48 given back at the end: 84 left (and a little refill), per minute
        assert 84 * 6 <= int(headers["anthropic-ratelimit-output-tokens-remaining"]) <= 86 * 6
        assert (1000 - prompt) * 6 <= int(headers["anthropic-ratelimit-input-tokens-remaining"]) <= 6000
        assert headers["anthropic-ratelimit-tokens-limit"] == "600"  # the more restrictive: output
        status, headers, body = await _messages(session, server, max_tokens=90)  # more than is left
        assert (status, body["type"], body["error"]["type"]) == (429, "error", "rate_limit_error")
        assert "output tokens per 10s (OTPM)" in body["error"]["message"]
        assert headers["retry-after"] == "1"
        assert "anthropic-ratelimit-output-tokens-reset" in headers
        status, headers, body = await _messages(session, server, max_tokens=101)  # more than the bucket holds
        assert status == 429
        assert "retry-after" not in headers
        assert server.stats.rate_limited_by == {"output_tokens": 2}
        assert server.stats.rate_limited == 2
        assert server.stats.summary()["rate_limited_by"] == {"output_tokens": 2}
        assert server.stats.accepted == 1


async def test_the_fake_counts_input_on_chat_too_and_a_stream_settles_its_output() -> None:
    async with (
        FakeServer(api_key="sk-test", itpm=60, otpm=100, window=10.0) as server,
        aiohttp.ClientSession() as session,
    ):
        chat = {"model": "gpt-x", "max_tokens": 20, "messages": [{"role": "user", "content": "x" * 400}]}
        headers = {"Authorization": "Bearer sk-test"}
        async with session.post(f"{server.url}/chat/completions", json=chat, headers=headers) as response:
            assert response.status == 429  # ~100 prompt tokens: more than 60 input tokens a window
            assert (await response.json())["error"]["type"] == "tokens"
        assert server.stats.rate_limited_by == {"input_tokens": 1}
        streamed = {
            "model": "claude-x",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        async with session.post(f"{server.anthropic_url}/v1/messages", json=streamed, headers=VERSION) as response:
            assert response.status == 200
            assert "anthropic-ratelimit-output-tokens-remaining" in response.headers
            await response.read()
        status, headers, _ = await _messages(session, server, max_tokens=80)  # 100 - 50 + 34 given back
        assert status == 200, headers


async def test_the_fakes_command_line_takes_itpm_and_otpm() -> None:
    args = build_parser().parse_args(["--port", "0", "--itpm", "1000", "--otpm", "100", "--window", "10"])
    assert (args.itpm, args.otpm) == (1000.0, 100.0)
    async with build_server(args) as server, aiohttp.ClientSession() as session:
        status, headers, _ = await _messages(session, server, max_tokens=64)
        assert status == 200
        assert headers["anthropic-ratelimit-output-tokens-limit"] == "600"


# -- several machines, one limit ------------------------------------------------------------


async def test_output_reserved_in_redis_is_shared_and_settling_frees_it_for_another_process(
    redis_server: RedisServer,
) -> None:
    d = Deployment("anthropic/claude-x", base_url="http://127.0.0.1:9", api_key="sk", otpm=100, window=10.0)
    one, two = RedisLimits(redis_server.url), RedisLimits(redis_server.url)
    try:
        first = await one.limiter_factory(d).acquire(70, output=60)
        waiting = asyncio.ensure_future(two.limiter_factory(d).acquire(70, output=60))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # 60 + 60 > 100 output tokens in the window
        first.reconcile(30, input_tokens=10, output_tokens=20)  # it wrote 20: 40 back
        first.done()
        await one.connection.flush()
        async with asyncio.timeout(4):  # paced: 20 tokens written are 2 s of 100 per 10 s
            (await waiting).done()
        with pytest.raises(CapacityError, match="output tokens per 10 s"):
            await two.limiter_factory(d).acquire(200, output=150)
    finally:
        await one.close()
        await two.close()


async def test_an_output_limit_learnt_by_one_process_binds_the_others(redis_server: RedisServer) -> None:
    d = Deployment("anthropic/claude-x", base_url="http://127.0.0.1:9", api_key="sk", window=10.0)
    one, two = RedisLimits(redis_server.url), RedisLimits(redis_server.url)
    try:
        one.limiter_factory(d).observe(RateLimitSnapshot(limit_output_tokens=600, tokens_window=60.0))  # 100 / 10 s
        await one.connection.flush()
        other = two.limiter_factory(d)
        (await other.acquire(70, output=60)).done()
        waiting = asyncio.ensure_future(other.acquire(70, output=60))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    finally:
        await one.close()
        await two.close()


#: How much slower than the limit's pace a run on the wall clock may be. Never faster (that
#: is a 429, or the 0.97 bound); slower, by the loop's own lag on a loaded machine (1.25x
#: seen for two engines on Redis beside two busy processes on 2 cores). The exact pace,
#: settling included, is checked in virtual time (test_settling_gives_back_..., and
#: test_tpm_itpm_and_otpm_are_each_honoured_at_once); here only a gross loss shows.
LOADED = 1.5


async def test_two_machines_sharing_itpm_and_otpm_in_redis_meet_no_429(redis_server: RedisServer) -> None:
    """Two engines, each with its own connection to Redis (two machines), one Anthropic
    limit: the fake's buckets never refuse, and the pair goes no faster than the limit's
    pace (nor much slower: ``LOADED``)."""
    async with FakeServer(api_key="sk-test", itpm=50_000, otpm=1_500, window=5.0, output_tokens=30) as server:
        d = deployment_at(server, "anthropic/claude-x", itpm=50_000, otpm=1_500, window=5.0)
        limits = [RedisLimits(redis_server.url), RedisLimits(redis_server.url)]
        try:
            engines = [Engine(d, limiter_factory=lim.limiter_factory) for lim in limits]

            async def run(engine: Engine, tag: str) -> list[Any]:
                asks = [Request.from_prompt(d.model, f"{tag} {i}", max_tokens=40) for i in range(40)]
                async with engine:
                    return await engine.run(asks)

            done = await asyncio.gather(*(run(engine, tag) for engine, tag in zip(engines, "ab", strict=True)))
        finally:
            for lim in limits:
                await lim.close()
    assert all(r.ok for results in done for r in results)
    assert server.stats.rate_limited == 0
    times = [t for t, _ in server.stats.arrivals]
    written = sum(entry.output_tokens for entry in server.ledger)
    ideal = (written - 30) / (1_500 / 5.0)  # first to last arrival at 300 output tokens a second
    assert ideal * 0.97 <= times[-1] - times[0] <= ideal * LOADED


# -- the headline: a sluice run job at the pace of the limit that binds ----------------------


def _job(server: FakeServer, tmp_path: Path, limits: dict[str, float], records: list[dict[str, Any]]) -> float:
    """Run ``records`` with ``sluice run`` on an Anthropic deployment with ``limits`` (from a
    config file) against ``server``; the time from its first request's arrival to its last,
    on the fake's own clock."""
    config = tmp_path / "sluice.toml"
    lines = [f"{key} = {value!r}" for key, value in limits.items()]
    config.write_text(
        'model = "anthropic/claude-x"\n[[deployment]]\nmodel = "anthropic/claude-x"\n'
        f'base_url = "{server.anthropic_url}"\n' + "\n".join(lines) + "\n"
    )
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    env = env_for(server, ANTHROPIC_API_KEY="sk-test")
    done = run_cli(server, "run", source, "-o", out, "--config", config, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert all(r["ok"] for r in read_output(out))
    assert server.stats.accepted == len(records)
    assert server.stats.rate_limited == 0, dict(server.stats.rate_limited_by)
    times = [t for t, _ in server.stats.arrivals]
    return times[-1] - times[0]


def test_a_run_bound_by_otpm_meets_no_429_and_keeps_the_limits_pace(tmp_path: Path) -> None:
    """160 answers of 60 output tokens (max_tokens 80: reserved at 80, settled to 60) under
    6,000 output tokens per 10 s: the fake's first to last arrival no shorter than 97 % of
    159 x 60 / 600 per second (nor much longer: ``LOADED``), and never a 429."""
    limits = {"itpm": 400_000, "otpm": 6_000, "window": 10.0}
    with FakeServer(api_key="sk-test", output_tokens=60, **limits).running_in_thread() as server:
        records = [
            {"messages": [{"role": "user", "content": f"question {i:03d}"}], "max_tokens": 80} for i in range(160)
        ]
        span = _job(server, tmp_path, limits, records)
        written = [entry.output_tokens for entry in server.ledger]
    assert set(written) == {60}
    ideal = (sum(written) - 60) / (6_000 / 10.0)
    assert 0.97 <= span / ideal <= LOADED, (span, ideal)


def test_a_run_bound_by_itpm_meets_no_429_and_keeps_the_limits_pace(tmp_path: Path) -> None:
    """80 prompts of ~250 tokens under 15,000 input tokens per 10 s (sluice's estimate of
    each is not the fake's count: the settle corrects it): no faster than the ideal, and
    never a 429."""
    limits = {"itpm": 15_000, "otpm": 200_000, "window": 10.0}
    with FakeServer(api_key="sk-test", **limits).running_in_thread() as server:
        text = "lorem ipsum dolor sit amet " * 36
        records = [
            {"messages": [{"role": "user", "content": f"question {i:03d} {text}"}], "max_tokens": 16} for i in range(80)
        ]
        span = _job(server, tmp_path, limits, records)
        prompts = [entry.input_tokens for entry in server.ledger]
    assert len(set(prompts)) == 1  # the same size each
    ideal = (sum(prompts) - prompts[0]) / (15_000 / 10.0)
    assert 0.97 <= span / ideal <= LOADED, (span, ideal)


def test_the_estimate_bounds_the_time_by_itpm_and_otpm(server: FakeServer, tmp_path: Path) -> None:
    records = [{"messages": [{"role": "user", "content": "q"}], "max_tokens": 100} for _ in range(100)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    done = run_cli(server, "estimate", source, "--model", "openai/gpt-test", "--otpm", "1000")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "shortest time" in line]
    assert "10:00 under its limits" in line  # 10,000 output tokens at 1,000 a minute, reserved
    assert server.stats.received == 0
