"""The fake provider's prompt caches, rule by documented rule, over real loopback HTTP.

OpenAI: automatic from 1,024 tokens, hits in 128-token steps, routing by the first 256
tokens and ``prompt_cache_key`` per organization, ~15 requests a minute per (prefix, key)
before the rest spill to cold machines, entries 5 minutes idle (a day with ``"24h"``
retention; GPT-5.6: writes billed and reported, 30 minutes). Anthropic: breakpoints (at
most 4, a 1-hour one never after a 5-minute one), the 20-block lookback, per-model
minimums, 5-minute and 1-hour entries, reads free of ITPM, an entry readable only once
the answer writing it has begun, Message Batches sharing the cache. Time is the fake's
clock: virtual where a test waits minutes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest

from sluice.testing import FakeServer, PromptCacheSettings, run_in_virtual_time
from sluice.testing.__main__ import build_parser, build_server
from sluice.testing._cache_blocks import anthropic_blocks, openai_pieces
from sluice.testing._tokenizer import REPLY_PRIMER, PromptCounter

VERSION = {"anthropic-version": "2023-06-01"}
Reply = tuple[int, Any]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def post(session: aiohttp.ClientSession, url: str, body: Any, headers: Mapping[str, str] | None = None) -> Reply:
    async with session.post(url, data=json.dumps(body).encode(), headers=headers) as response:
        return response.status, json.loads(await response.read())


def chat_body(text: str, *, key: str | None = "k", model: str = "gpt-4o-mini", **extra: Any) -> dict[str, Any]:
    """One user message of ``text``: with the chars tokenizer, ``7 + ceil(len / 4)`` tokens
    (3 framing and 1 for the role ahead of the text, 3 priming the reply after it)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
    if key is not None:
        body["prompt_cache_key"] = key
    return body


def sized(tokens: int, fill: str = "a") -> str:
    """A text that makes :func:`chat_body` exactly ``tokens`` tokens long."""
    return fill * (4 * (tokens - 7))


async def chat(session: aiohttp.ClientSession, server: FakeServer, body: Any, owner: str = "org-a") -> dict[str, Any]:
    status, answer = await post(session, f"{server.url}/chat/completions", body, {"Authorization": f"Bearer {owner}"})
    assert status == 200, answer
    usage: dict[str, Any] = answer["usage"]
    return usage


def cached(usage: Mapping[str, Any]) -> int:
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def claude_body(system: str, question: str = "q?", *, model: str = "claude-sonnet-4-5", **mark: Any) -> dict[str, Any]:
    """A system block of ``system`` marked with a breakpoint (ends at ``3 + ceil(len / 4)``)."""
    return {
        "model": model,
        "max_tokens": 8,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral", **mark}}],
        "messages": [{"role": "user", "content": question}],
    }


async def claude(session: aiohttp.ClientSession, server: FakeServer, body: Any, key: str = "org-a") -> Reply:
    return await post(session, f"{server.anthropic_url}/v1/messages", body, {**VERSION, "x-api-key": key})


async def claude_usage(session: aiohttp.ClientSession, server: FakeServer, body: Any) -> dict[str, Any]:
    status, answer = await claude(session, server, body)
    assert status == 200, answer
    usage: dict[str, Any] = answer["usage"]
    return usage


# -- OpenAI: minimums and 128-token steps --------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [(1023, 0), (1024, 1024), (1151, 1024), (1152, 1152), (2000, 1920), (5000, 4992)],
)
async def test_openai_caches_from_1024_tokens_in_128_token_steps(
    session: aiohttp.ClientSession, prompt: int, expected: int
) -> None:
    async with FakeServer() as server:
        first = await chat(session, server, chat_body(sized(prompt)))
        again = await chat(session, server, chat_body(sized(prompt)))
    assert first["prompt_tokens"] == prompt
    assert (cached(first), cached(again)) == (0, expected)


@pytest.mark.parametrize(("shared", "expected"), [(4 * (1152 - 4), 1152), (4 * (1152 - 4) - 1, 1024), (4000, 0)])
async def test_a_hit_is_the_whole_128_token_blocks_two_prompts_share(
    session: aiohttp.ClientSession, shared: int, expected: int
) -> None:
    """The blocks are of the prompt's tokens, so a text that differs part-way is read up to
    the last whole block before the difference (the message's 4 tokens of framing first)."""
    async with FakeServer() as server:
        await chat(session, server, chat_body("a" * shared + "b" * 2000))
        usage = await chat(session, server, chat_body("a" * shared + "c" * 2000))
    assert cached(usage) == expected


async def test_auto_caches_only_what_asks_on_caches_every_openai_prompt_off_nothing(
    session: aiohttp.ClientSession,
) -> None:
    text = sized(3000)
    for mode, key, expected in (("auto", None, 0), ("auto", "k", 2944), ("on", None, 2944), ("off", "k", 0)):
        async with FakeServer(prompt_cache=mode, prices={"*": (1.0, 2.0)}) as server:  # type: ignore[arg-type]
            await chat(session, server, chat_body(text, key=key))
            usage = await chat(session, server, chat_body(text, key=key))
            assert cached(usage) == expected, (mode, key)
            assert server.ledger[-1].cost_usd == pytest.approx((3000 - expected * 0.5 + 16 * 2) / 1e6)
            if mode == "auto" and key is None:  # untouched: the usage a test always saw
                assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
                assert server.prompt_cache.stats.requests == 0


async def test_caches_are_per_organization_model_and_key(session: aiohttp.ClientSession) -> None:
    text = sized(2000)
    async with FakeServer() as server:
        await chat(session, server, chat_body(text, key="a"))
        assert cached(await chat(session, server, chat_body(text, key="b"))) == 0  # another machine
        assert cached(await chat(session, server, chat_body(text, key="a"), owner="org-b")) == 0
        assert cached(await chat(session, server, chat_body(text, key="a", model="gpt-4o"))) == 0
        assert cached(await chat(session, server, chat_body(text, key="a"))) == 1920


async def test_the_responses_api_reports_cached_tokens_in_its_input_details(session: aiohttp.ClientSession) -> None:
    body = {"model": "gpt-4.1", "instructions": "x" * 8000, "input": "what?", "prompt_cache_key": "k"}
    async with FakeServer(prices={"gpt-4.1": (2.0, 8.0)}) as server:
        for _ in range(2):
            status, answer = await post(session, f"{server.url}/responses", body)
            assert status == 200
        usage = answer["usage"]
        assert usage["input_tokens"] == 2014  # instructions 2,000 + 5 framing, "what?" 6, primer 3
        assert usage["input_tokens_details"] == {"cached_tokens": 1920, "cache_write_tokens": 0}
        read = 1920
        assert server.ledger[-1].cost_usd == pytest.approx(
            ((usage["input_tokens"] - read) * 2 + read * 0.5 + 16 * 8) / 1e6
        )


async def test_streams_end_with_the_usage_the_cache_served(session: aiohttp.ClientSession) -> None:
    text = sized(2000)
    async with FakeServer() as server:
        await chat(session, server, chat_body(text))
        stream = chat_body(text, stream=True, stream_options={"include_usage": True})
        mine = {"Authorization": "Bearer org-a"}
        async with session.post(f"{server.url}/chat/completions", json=stream, headers=mine) as response:
            events = [json.loads(line[6:]) for line in (await response.text()).splitlines() if line[6:7] == "{"]
        assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 1920}
        body = {"model": "gpt-4o", "input": text, "prompt_cache_key": "k", "stream": True}
        for _ in range(2):
            async with session.post(f"{server.url}/responses", json=body) as response:
                raw = await response.text()
        done = [json.loads(line[6:]) for line in raw.splitlines() if '"response.completed"' in line]
        assert done[0]["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 1920
        claude_stream = {**claude_body("s" * 8000), "stream": True}
        for _ in range(2):
            async with session.post(
                f"{server.anthropic_url}/v1/messages", json=claude_stream, headers={**VERSION, "x-api-key": "k"}
            ) as response:
                raw = await response.text()
        start = next(json.loads(line[6:]) for line in raw.splitlines() if '"message_start"' in line)
        assert start["message"]["usage"]["cache_read_input_tokens"] == 2003
        assert start["message"]["usage"]["input_tokens"] == 3 + 1 + 1 + 3  # the question and the primer


async def test_cache_fields_are_refused_as_openai_refuses_them(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        status, answer = await post(session, f"{server.url}/chat/completions", chat_body("hi", key=7))  # type: ignore[arg-type]
        assert (status, answer["error"]["code"]) == (400, "invalid_type")
        assert (
            answer["error"]["message"]
            == "Invalid type for 'prompt_cache_key': expected a string, but got an integer instead."
        )
        body = {"model": "gpt-5", "input": "hi", "prompt_cache_retention": "forever"}
        status, answer = await post(session, f"{server.url}/responses", body)
        assert (status, answer["error"]["param"]) == (400, "prompt_cache_retention")
        assert "Supported values are: 'in_memory' and '24h'" in answer["error"]["message"]


# -- OpenAI: routing, overflow, lifetimes (virtual time) -----------------------------------


def _paced(settings: PromptCacheSettings, keys: list[str], every: float, seed: int = 1) -> tuple[list[int], Any]:
    """Requests of one 3,000-token prompt, one each ``every`` seconds of the fake's clock."""

    async def scenario() -> tuple[list[int], Any]:
        got = []
        async with FakeServer(prompt_cache=settings, seed=seed) as server, aiohttp.ClientSession() as session:
            for key in keys:
                got.append(cached(await chat(session, server, chat_body(sized(3000), key=key))))
                await asyncio.sleep(every)
            return got, server.prompt_cache.stats

    return run_in_virtual_time(scenario())


def test_more_than_15_a_minute_for_one_prefix_and_key_spill_to_cold_machines() -> None:
    got, stats = _paced(PromptCacheSettings(spill_machines=10_000), ["k"] * 30 + ["other"] * 2, every=1.0)
    assert got[:15] == [0] + [2944] * 14  # the home machine, warm after the first
    assert got[15:30] == [0] * 15  # the 16th and later in that minute: cold machines
    assert stats.spills == 15
    assert got[30:] == [0, 2944]  # another key is another (prefix, key): its own machine


def test_once_the_minute_has_passed_requests_go_home_again() -> None:
    got, stats = _paced(PromptCacheSettings(spill_machines=10_000), ["k"] * 20, every=4.0)
    assert got == [0] + [2944] * 19  # 15 a minute: never more than that in any 60 s
    assert stats.spills == 0


def test_a_machine_a_request_spilled_to_is_warm_for_the_next_that_lands_there() -> None:
    got, stats = _paced(PromptCacheSettings(spill_machines=1), ["k"] * 18, every=0.5)
    assert got == [0] + [2944] * 14 + [0, 2944, 2944]
    assert stats.spills == 3


@pytest.mark.parametrize(
    ("model", "retention", "idle", "expected"),
    [
        ("gpt-4o-mini", None, 299.0, 2944),
        ("gpt-4o-mini", None, 301.0, 0),  # 5 minutes unused, and it is gone
        ("gpt-4o-mini", "24h", 301.0, 0),  # a model without extended retention: in memory
        ("gpt-5", "24h", 23 * 3600.0, 2944),
        ("gpt-5", "24h", 24 * 3600.0 + 1, 0),
        ("gpt-5.6-sol", None, 1799.0, 2944),  # GPT-5.6: at least 30 minutes
        ("gpt-5.6-sol", None, 1801.0, 0),
    ],
)
def test_an_openai_entry_lives_its_lifetime_unused(
    model: str, retention: str | None, idle: float, expected: int
) -> None:
    extra = {} if retention is None else {"prompt_cache_retention": retention}

    async def scenario() -> int:
        async with FakeServer() as server, aiohttp.ClientSession() as session:
            await chat(session, server, chat_body(sized(3000), model=model, **extra))
            await asyncio.sleep(idle)
            return cached(await chat(session, server, chat_body(sized(3000), model=model, **extra)))

    assert run_in_virtual_time(scenario()) == expected


def test_each_use_refreshes_an_entrys_lifetime() -> None:
    async def scenario() -> list[int]:
        async with FakeServer() as server, aiohttp.ClientSession() as session:
            got = []
            for _ in range(4):
                got.append(cached(await chat(session, server, chat_body(sized(3000)))))
                await asyncio.sleep(250.0)
            return got

    assert run_in_virtual_time(scenario()) == [0, 2944, 2944, 2944]  # 750 s, never 300 s idle


async def test_gpt_5_6_reports_and_bills_its_cache_writes(session: aiohttp.ClientSession) -> None:
    prices = {"gpt-5.6-sol": (4.0, 20.0)}  # genai-prices: cache reads 0.4, writes 5.0
    async with FakeServer(prices=prices, output_tokens=10) as server:
        first = await chat(session, server, chat_body(sized(3000), model="gpt-5.6-sol"))
        again = await chat(session, server, chat_body(sized(3000), model="gpt-5.6-sol"))
        assert first["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 2944}
        assert again["prompt_tokens_details"] == {"cached_tokens": 2944, "cache_write_tokens": 0}
        costs = [entry.cost_usd for entry in server.ledger]
        assert costs[0] == pytest.approx((56 * 4.0 + 2944 * 5.0 + 10 * 20) / 1e6)
        assert costs[1] == pytest.approx((56 * 4.0 + 2944 * 0.4 + 10 * 20) / 1e6)
        body = {"model": "gpt-5.6-sol", "input": sized(3000), "prompt_cache_key": "r"}
        _status, answer = await post(session, f"{server.url}/responses", body)
        assert answer["usage"]["input_tokens_details"]["cache_write_tokens"] == 2944


# -- both: an entry is readable only once its answer has begun ------------------------------


async def test_parallel_first_requests_all_write(session: aiohttp.ClientSession) -> None:
    async with FakeServer(latency=0.5, prices={"*": (3.0, 15.0)}) as server:
        bodies = [claude_body("s" * 8000, f"question {i}?") for i in range(3)]
        usages = await asyncio.gather(*(claude_usage(session, server, body) for body in bodies))
        assert [u["cache_creation_input_tokens"] for u in usages] == [2003] * 3  # each paid the write
        assert [u["cache_read_input_tokens"] for u in usages] == [0] * 3
        after = await claude_usage(session, server, claude_body("s" * 8000, "later?"))
        assert after["cache_read_input_tokens"] == 2003
        openai = await asyncio.gather(*(chat(session, server, chat_body(sized(3000))) for _ in range(3)))
        assert [cached(u) for u in openai] == [0, 0, 0]
        assert cached(await chat(session, server, chat_body(sized(3000)))) == 2944
        assert server.prompt_cache.stats.duplicate_writes == 2 + 2


def test_a_streamed_answer_makes_its_entry_readable_at_its_first_piece() -> None:
    async def scenario() -> list[int]:
        async with FakeServer(latency=2.0) as server, aiohttp.ClientSession() as session:
            server.stream_pieces = 4  # the first piece 0.5 s after the request
            body = {**claude_body("s" * 8000), "stream": True}

            async def send(wait: float) -> int:
                await asyncio.sleep(wait)
                headers = {**VERSION, "x-api-key": "k"}
                async with session.post(f"{server.anthropic_url}/v1/messages", json=body, headers=headers) as response:
                    raw = await response.text()
                start = next(json.loads(line[6:]) for line in raw.splitlines() if '"message_start"' in line)
                return int(start["message"]["usage"]["cache_read_input_tokens"])

            return list(await asyncio.gather(send(0.0), send(0.25), send(0.75)))

    assert run_in_virtual_time(scenario()) == [0, 0, 2003]


# -- Anthropic: minimums, breakpoints, lookback, lifetimes ---------------------------------


@pytest.mark.parametrize(
    ("model", "minimum"),
    [
        ("claude-sonnet-4-5-20250929", 1024),
        ("claude-opus-4-1", 1024),
        ("claude-sonnet-4-6", 2048),
        ("claude-haiku-4-5", 4096),
        ("claude-opus-4-6", 4096),
        ("claude-3-5-haiku-20241022", 2048),
        ("claude-test", 1024),
    ],
)
async def test_a_prefix_below_the_models_minimum_is_not_cached(
    session: aiohttp.ClientSession, model: str, minimum: int
) -> None:
    async with FakeServer() as server:
        short = await claude_usage(session, server, claude_body("s" * (4 * (minimum - 4)), model=model))
        enough = await claude_usage(session, server, claude_body("t" * (4 * (minimum - 3)), model=model))
    assert (short["cache_creation_input_tokens"], short["input_tokens"]) == (0, minimum - 1 + 8)
    assert (enough["cache_creation_input_tokens"], enough["input_tokens"]) == (minimum, 8)


async def test_minimums_may_be_set_by_model(session: aiohttp.ClientSession) -> None:
    settings = PromptCacheSettings(minimums={"claude-sonnet": 100, "*": 50})
    async with FakeServer(prompt_cache=settings) as server:
        assert (await claude_usage(session, server, claude_body("s" * 400)))["cache_creation_input_tokens"] == 103
        haiku = claude_body("s" * 200, model="claude-haiku-4-5")  # 53 tokens: over "*", under the documented 4,096
        assert (await claude_usage(session, server, haiku))["cache_creation_input_tokens"] == 53


def _blocks(count: int, marks: Mapping[int, dict[str, Any]], *, fill: str = "b") -> dict[str, Any]:
    """A user message of ``count`` text blocks of 200 tokens (1-based ``marks``: breakpoints)."""
    content = []
    for number in range(1, count + 1):
        block: dict[str, Any] = {"type": "text", "text": f"{number:04d}" + fill * 796}
        if number in marks:
            block["cache_control"] = {"type": "ephemeral", **marks[number]}
        content.append(block)
    return {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}


@pytest.mark.parametrize(
    ("written", "later", "extra", "read"),
    [
        (10, 15, (), 10),  # the docs' turn 2: walks back from 15 and finds 10
        (15, 35, (), None),  # turn 3: 35 looks at 35..16, one short of 15
        (15, 34, (), 15),  # 34 looks at 34..15: found
        (15, 35, (15,), 15),  # a second breakpoint starts a second window there
    ],
)
async def test_a_read_looks_back_20_blocks_from_each_breakpoint(
    session: aiohttp.ClientSession, written: int, later: int, extra: tuple[int, ...], read: int | None
) -> None:
    async with FakeServer() as server:
        await claude_usage(session, server, _blocks(written, {written: {}}))
        usage = await claude_usage(session, server, _blocks(later, {later: {}, **{n: {} for n in extra}}))
    expected = 0 if read is None else 4 + 200 * read  # the message's framing, then 200 a block
    assert usage["cache_read_input_tokens"] == expected
    assert usage["cache_creation_input_tokens"] == 4 + 200 * later - expected


async def test_a_write_is_only_at_a_breakpoint_not_at_the_stable_blocks_before_it(
    session: aiohttp.ClientSession,
) -> None:
    """The docs' common mistake: the breakpoint on the block that changes every request."""
    async with FakeServer() as server:
        for question in ("one", "two"):
            body = _blocks(6, {})
            body["messages"][0]["content"].append(
                {"type": "text", "text": question, "cache_control": {"type": "ephemeral"}}
            )
            usage = await claude_usage(session, server, body)
            assert usage["cache_read_input_tokens"] == 0  # nothing was written at block 6


@pytest.mark.parametrize(
    ("marks", "message"),
    [
        ({n: {} for n in range(1, 6)}, "A maximum of 4 blocks with cache_control may be provided. Found 5."),
        (
            {1: {"ttl": "5m"}, 2: {"ttl": "1h"}},
            "messages.0.content.1.cache_control.ttl: a ttl='1h' cache_control block must not come after a "
            "ttl='5m' cache_control block. Note that blocks are processed in the following order: `tools`, "
            "`system`, `messages`.",
        ),
        ({1: {"ttl": "2h"}}, "messages.0.content.0.cache_control.ttl: Input should be '5m' or '1h'"),
    ],
)
async def test_breakpoints_are_refused_as_anthropic_refuses_them(
    session: aiohttp.ClientSession, marks: dict[int, dict[str, Any]], message: str
) -> None:
    async with FakeServer(prompt_cache="off") as server:  # checked even with the cache off
        status, answer = await claude(session, server, _blocks(6, marks))
    assert (status, answer["error"]["type"], answer["error"]["message"]) == (400, "invalid_request_error", message)


async def test_four_breakpoints_and_1h_before_5m_are_taken(session: aiohttp.ClientSession) -> None:
    async with FakeServer(prompt_cache=PromptCacheSettings(minimums={"*": 1})) as server:
        marks = {1: {"ttl": "1h"}, 2: {"ttl": "1h"}, 3: {}, 4: {"ttl": "5m"}}
        usage = await claude_usage(session, server, _blocks(6, marks))
        assert usage["cache_creation"] == {"ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 404}
        assert usage["input_tokens"] == 400 + REPLY_PRIMER  # blocks 5 and 6, and the primer


async def test_top_level_cache_control_marks_the_last_block_and_takes_a_slot(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        body = {**_blocks(6, {}), "cache_control": {"type": "ephemeral"}}
        assert (await claude_usage(session, server, body))["cache_creation_input_tokens"] == 1204
        grown = _blocks(8, {})
        usage = await claude_usage(session, server, {**grown, "cache_control": {"type": "ephemeral"}})
        assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (1204, 400)
        status, answer = await claude(
            session, server, {**_blocks(6, {n: {} for n in range(1, 5)}), "cache_control": {"type": "ephemeral"}}
        )
        assert (status, answer["error"]["message"]) == (
            400,
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        )


@pytest.mark.parametrize(
    ("ttl", "idle", "read"),
    [({}, 299.0, 2003), ({}, 301.0, 0), ({"ttl": "1h"}, 3599.0, 2003), ({"ttl": "1h"}, 3601.0, 0)],
)
def test_an_anthropic_entry_lives_5_minutes_or_an_hour(ttl: dict[str, str], idle: float, read: int) -> None:
    async def scenario() -> int:
        async with FakeServer() as server, aiohttp.ClientSession() as session:
            await claude_usage(session, server, claude_body("s" * 8000, **ttl))
            await asyncio.sleep(idle)
            return int((await claude_usage(session, server, claude_body("s" * 8000, **ttl)))["cache_read_input_tokens"])

    assert run_in_virtual_time(scenario()) == read


# -- Anthropic: ITPM counts uncached input and writes, not reads ----------------------------


@pytest.mark.parametrize(("model", "refused"), [("claude-sonnet-4-5", 0), ("claude-3-5-haiku-20241022", 5)])
async def test_cache_reads_do_not_count_against_itpm_on_current_models(
    session: aiohttp.ClientSession, model: str, refused: int
) -> None:
    async with FakeServer(itpm=5_000, window=60.0, send_retry_after=False) as server:
        statuses = []
        for number in range(6):
            status, _answer = await claude(session, server, claude_body("s" * 12_000, f"q{number}?", model=model))
            statuses.append(status)
        assert statuses.count(429) == refused  # 3,003 written, then 3,003 read each time: 9 tokens counted
        assert server.stats.rate_limited_by["input_tokens"] == refused
        if not refused:
            assert server.prompt_cache.stats.read_tokens == 5 * 3003


async def test_itpm_headers_count_what_the_limit_counts(session: aiohttp.ClientSession) -> None:
    async with FakeServer(itpm=60_000, window=60.0) as server:
        headers = {**VERSION, "x-api-key": "org-a"}
        remaining = []
        for _ in range(3):
            body = claude_body("s" * 12_000)
            async with session.post(f"{server.anthropic_url}/v1/messages", json=body, headers=headers) as response:
                remaining.append(int(response.headers["anthropic-ratelimit-input-tokens-remaining"]))
        taken = [60_000 - remaining[0], remaining[0] - remaining[1], remaining[1] - remaining[2]]
        assert taken[0] >= 3011 - 30  # all 3,011 counted (less a refill of a few ms)
        assert all(t <= 9 for t in taken[1:])


# -- prices ---------------------------------------------------------------------------------

CLAUDE = {"claude-sonnet-4-5": (3.0, 15.0)}  # the docs' table: writes 3.75 (5m) and 6 (1h), reads 0.30


@pytest.mark.parametrize(
    ("prices", "mark", "first", "then"),
    [
        (CLAUDE, {}, 3003 * 3.75 + 8 * 3 + 8 * 15, 3003 * 0.30 + 8 * 3 + 8 * 15),
        (CLAUDE, {"ttl": "1h"}, 3003 * 6.0 + 8 * 3 + 8 * 15, 3003 * 0.30 + 8 * 3 + 8 * 15),
        ({"*": (3.0, 15.0, 0.5, 4.0)}, {}, 3003 * 4.0 + 8 * 3 + 8 * 15, 3003 * 0.5 + 8 * 3 + 8 * 15),
    ],
)
async def test_the_bill_prices_cache_reads_and_writes(
    session: aiohttp.ClientSession,
    prices: dict[str, tuple[float, ...]],
    mark: dict[str, str],
    first: float,
    then: float,
) -> None:
    async with FakeServer(prices=prices, output_tokens=8) as server:
        for _ in range(2):
            await claude_usage(session, server, claude_body("s" * 12_000, **mark))
        assert [e.cost_usd for e in server.ledger] == pytest.approx([first / 1e6, then / 1e6])
        assert [(e.cache_read_tokens, e.cache_write_tokens) for e in server.ledger] == [(0, 3003), (3003, 0)]
        assert server.total_billed_usd == pytest.approx((first + then) / 1e6)


@pytest.mark.parametrize(
    ("model", "rate"), [("gpt-4o-mini", 0.5), ("gpt-4.1", 0.25), ("o3", 0.25), ("gpt-5-mini", 0.1)]
)
async def test_openai_reads_cost_the_models_documented_share_and_writes_nothing_extra(
    session: aiohttp.ClientSession, model: str, rate: float
) -> None:
    async with FakeServer(prices={model: (1.0, 2.0)}, output_tokens=10) as server:
        for _ in range(2):
            await chat(session, server, chat_body(sized(3000), model=model))
        assert [e.cost_usd for e in server.ledger] == pytest.approx([(3000 + 20) / 1e6, (56 + 2944 * rate + 20) / 1e6])


# -- batches share the cache ------------------------------------------------------------------


async def _anthropic_batch(session: aiohttp.ClientSession, server: FakeServer, bodies: list[Any]) -> list[Any]:
    requests = [{"custom_id": f"line-{n}", "params": body} for n, body in enumerate(bodies)]
    headers = {**VERSION, "x-api-key": "org-a"}
    status, batch = await post(session, f"{server.anthropic_url}/v1/messages/batches", {"requests": requests}, headers)
    assert status == 200
    await server.until(lambda: server.batches.status_of(batch["id"]) == "ended")
    async with session.get(f"{server.anthropic_url}/v1/messages/batches/{batch['id']}/results", headers=headers) as r:
        return [json.loads(line)["result"]["message"]["usage"] for line in (await r.text()).splitlines()]


async def test_message_batches_share_the_cache_and_read_what_earlier_lines_wrote(
    session: aiohttp.ClientSession,
) -> None:
    async with FakeServer(prices=CLAUDE, output_tokens=8) as server:
        usages = await _anthropic_batch(session, server, [claude_body("s" * 12_000, f"q{n}?") for n in range(3)])
        assert [(u["cache_creation_input_tokens"], u["cache_read_input_tokens"]) for u in usages] == [
            (3003, 0),
            (0, 3003),
            (0, 3003),
        ]
        assert server.ledger[1].cost_usd == pytest.approx(0.5 * (3003 * 0.30 + 8 * 3 + 8 * 15) / 1e6)  # batch: half
        sync = await claude_usage(session, server, claude_body("s" * 12_000, "sync?"))
        assert sync["cache_read_input_tokens"] == 3003  # the batch's entry, read by a request


async def test_openai_batch_lines_report_cached_tokens(session: aiohttp.ClientSession) -> None:
    lines = [
        {"custom_id": f"c{n}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(sized(3000) + str(n))}
        for n in range(3)
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    async with FakeServer() as server:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename="in.jsonl")
        async with session.post(f"{server.url}/files", data=form) as response:
            file = await response.json()
        create = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        _status, batch = await post(session, f"{server.url}/batches", create)
        await server.until(lambda: server.batches.status_of(batch["id"]) == "completed")
        output = server.batches.batches[batch["id"]].output_file_id
        async with session.get(f"{server.url}/files/{output}/content") as response:
            answers = [json.loads(line) for line in (await response.text()).splitlines()]
    assert [cached(a["response"]["body"]["usage"]) for a in answers] == [0, 2944, 2944]


# -- the CLI, the stats endpoint, and the fake's own counting ----------------------------------


def test_cli_flags_set_the_prompt_cache() -> None:
    flags = "--port 0 --prompt-cache on --cache-ttl 120 --cache-ttl-5m 30 --cache-overflow-rpm 4"
    flags += " --cache-spill-machines 2 --cache-min-tokens 512 --cache-min-tokens claude-haiku=64"
    flags += " --price claude-x=3,15,0.3,3.75"
    server = build_server(build_parser().parse_args(flags.split()))
    settings = server.prompt_cache.settings
    assert (settings.mode, settings.ttl, settings.ttl_5m, settings.overflow_rpm, settings.spill_machines) == (
        "on",
        120.0,
        30.0,
        4.0,
        2,
    )
    assert settings.minimums == {"*": 512, "claude-haiku": 64}
    assert server.prices == {"claude-x": (3.0, 15.0, 0.3, 3.75)}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--price", "m=1,2,3"])


async def test_the_stats_endpoint_shows_the_caches_counters(session: aiohttp.ClientSession) -> None:
    async with FakeServer() as server:
        for _ in range(2):
            await chat(session, server, chat_body(sized(3000), key="job-1"))
        async with session.get(f"{server.anthropic_url}/_fake/stats") as response:
            summary = (await response.json())["prompt_cache"]
        assert (summary["requests"], summary["hits"], summary["read_tokens"], summary["spills"]) == (2, 1, 2944, 0)
        [(label, prefix)] = summary["by_prefix"].items()
        assert label.startswith("job-1|")
        assert prefix["hits"] == 1
        server.reset_stats()
        assert server.prompt_cache.stats.requests == 0


IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
CHAT_BODIES = [
    chat_body("hello"),
    {
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": "be brief", "name": "boss"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
    },
]
CLAUDE_BODIES = [
    claude_body("sys"),
    {
        "model": "claude-x",
        "max_tokens": 5,
        "tools": [
            {"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
            {"name": "g", "input_schema": {"type": "object"}},
        ],
        "tool_choice": {"type": "auto"},
        "system": "plain system",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}},
                ],
            },
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ],
    },
]


@pytest.mark.parametrize("tokenizer", ["chars", "bytes", len])
def test_the_caches_split_a_prompt_into_exactly_the_tokens_the_fake_bills(tokenizer: Any) -> None:
    counter = PromptCounter(tokenizer)
    for body in CHAT_BODIES:
        total = counter.openai(body)
        assert sum(piece.tokens for piece in openai_pieces(counter, "chat", body, total)) == total
    responses = {
        "model": "m",
        "instructions": "sys",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ],
    }
    total = counter.responses(responses)
    assert sum(piece.tokens for piece in openai_pieces(counter, "responses", responses, total)) == total
    for body in CLAUDE_BODIES:
        blocks = anthropic_blocks(counter, body).blocks
        assert blocks[-1].end + REPLY_PRIMER == counter.anthropic(body)
        assert [b.end for b in blocks] == sorted(b.end for b in blocks)


async def test_anthropic_input_reads_and_writes_add_up_to_the_counted_prompt(session: aiohttp.ClientSession) -> None:
    body = CLAUDE_BODIES[1]
    async with FakeServer(prompt_cache=PromptCacheSettings(minimums={"*": 1})) as server:
        _status, counted = await post(
            session,
            f"{server.anthropic_url}/v1/messages/count_tokens",
            {k: v for k, v in body.items() if k != "max_tokens"},
            VERSION,
        )
        for _ in range(2):
            usage = await claude_usage(session, server, body)
    parts = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    assert parts == counted["input_tokens"]
    assert usage["cache_read_input_tokens"] > 0  # the first tool, marked, read


async def test_embeddings_are_not_prompt_cached(session: aiohttp.ClientSession) -> None:
    async with FakeServer(prompt_cache="on") as server:
        for _ in range(2):
            status, answer = await post(session, f"{server.url}/embeddings", {"model": "e", "input": "x" * 9000})
            assert status == 200, answer
        assert server.prompt_cache.stats.requests == 0


def test_an_anthropic_read_refreshes_the_entry_it_read() -> None:
    async def scenario() -> list[int]:
        async with FakeServer() as server, aiohttp.ClientSession() as session:
            got = []
            for wait in (0.0, 250.0, 250.0, 301.0):
                await asyncio.sleep(wait)
                usage = await claude_usage(session, server, claude_body("s" * 8000))
                got.append(int(usage["cache_read_input_tokens"]))
            return got

    assert run_in_virtual_time(scenario()) == [0, 2003, 2003, 0]  # 500 s of reads; then 301 s unused


# -- sluice against the fake: the cost it records is what the fake billed ---------------------


@pytest.mark.parametrize("model", ["anthropic/claude-sonnet-4-5", "openai/gpt-4o-mini", "openai/gpt-5.6-sol"])
async def test_sluice_records_what_the_fake_bills_for_cache_reads_and_writes(model: str) -> None:
    """genai-prices' rates for these models are the ones the fake's multipliers give; a
    GPT-5.6 chat answer reports its writes in ``prompt_tokens_details.cache_write_tokens``."""
    import sluice

    prices = {"claude-sonnet-4-5": (3.0, 15.0), "gpt-4o-mini": (0.15, 0.6), "gpt-5.6-sol": (4.0, 20.0)}
    system: Any = [{"type": "text", "text": "s" * 12_000, "cache_control": {"type": "ephemeral"}}]
    async with FakeServer(api_key="sk-x", prices=prices, prompt_cache="on") as server:
        base = server.anthropic_url if model.startswith("anthropic") else server.url
        async with sluice.Engine(sluice.Deployment(model, base_url=base, api_key="sk-x")) as engine:
            for question in ("one?", "two?"):
                messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
                result = await engine.complete(model, messages, max_tokens=20)
                assert result.ok, result.error
                assert result.cost_usd == pytest.approx(server.ledger[-1].cost_usd)
        assert [(e.cache_read_tokens > 0, e.cache_write_tokens > 0) for e in server.ledger][1] == (True, False)
