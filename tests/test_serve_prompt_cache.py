"""``sluice serve`` with ``[serve] prompt_cache``: clients' repeated prefixes marked for the
providers' prompt caches, over real loopback to the fake provider (which caches and bills
as the providers document), checked by the fake's own counts."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from cachejobs import text
from fake_provider import deployment_at
from servetools import ALICE_KEY, BOB_KEY, UPSTREAM_KEY, plain_server, sdk, serving
from test_serve_messages import Recorder

from sluice import ConfigError, Deployment
from sluice._models import Request
from sluice._pricing import Pricing
from sluice.caching._served import ServedCache
from sluice.serve.core._settings import ClientSpec, ServeSettings, serve_tables
from sluice.testing import FakeServer

CLAUDE = "anthropic/claude-sonnet-4-5"
CLIENTS = (ClientSpec(name="alice", key_env="ALICE_KEY"), ClientSpec(name="bob", key_env="BOB_KEY"))
#: One long system prompt (~3,000 tokens), as a client sends it with every request.
SYSTEM = "You answer questions about the handbook.\n\n" + text(3000, random.Random(3))
DOCUMENT = "The handbook:\n\n" + text(3000, random.Random(4))


def _upstream() -> FakeServer:
    return FakeServer(api_key=UPSTREAM_KEY, prices={"claude-sonnet-4-5": (3.0, 15.0), "*": (2.0, 8.0)})


def _claude(upstream: FakeServer) -> Deployment:
    return deployment_at(upstream, CLAUDE)


def _chat(question: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {question}: why?"}]


def _messages_sdk(url: str, key: str = ALICE_KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)


async def _metrics(url: str) -> dict[str, float]:
    """``/metrics``' prompt-cache series summed by kind (and the duplicates and savings)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        body = await response.text()
    found: dict[str, float] = {}
    for line in body.splitlines():
        match = re.match(r"sluice_serve_prompt_cache_(\w+?)(?:_total)?\{([^}]*)\} (\S+)", line)
        if match is None or "_created{" in line:
            continue
        kind = re.search(r'kind="(\w+)"', match.group(2))
        name = kind.group(1) if kind else match.group(1)
        found[name] = found.get(name, 0.0) + float(match.group(3))
    return found


async def _ask_chat(setting: str, tmp_path: Path, requests: int) -> tuple[FakeServer, dict[str, float]]:
    async with _upstream() as upstream:
        async with (
            serving([_claude(upstream)], tmp_path / setting, clients=CLIENTS, prompt_cache=setting) as url,
            sdk(url, ALICE_KEY) as client,
        ):
            for number in range(requests):
                await client.chat.completions.create(model=CLAUDE, messages=_chat(number), max_tokens=8)
            counted = await _metrics(url)
        return upstream, counted


async def test_a_repeated_system_prompt_is_billed_under_0_4x_of_off_and_metrics_match_the_fake(
    tmp_path: Path,
) -> None:
    off, _ = await _ask_chat("off", tmp_path, 10)
    on, counted = await _ask_chat("auto", tmp_path, 10)
    assert off.prompt_cache.stats.read_tokens == 0
    stats = on.prompt_cache.stats
    # the first request cannot know its prefix recurs (sent as it came), the second writes it
    assert stats.hits == 8
    assert on.total_billed_usd <= 0.4 * off.total_billed_usd, (on.total_billed_usd, off.total_billed_usd)
    assert counted["read"] == stats.read_tokens
    assert counted["written"] == stats.written_tokens
    prompt = sum(entry.input_tokens for entry in on.ledger)
    assert counted["read"] + counted["written"] + counted["uncached"] == prompt
    assert counted.get("duplicate_writes", 0) == stats.duplicate_writes == 0
    assert counted["saved_usd"] > 0


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[Recorder, Deployment]]:
    """An Anthropic upstream that keeps the bodies it is sent."""
    recorder = Recorder()
    app = aiohttp.web.Application()
    app.router.add_post("/v1/messages", recorder.handle)
    async with plain_server(app) as upstream_url:
        yield recorder, Deployment(CLAUDE, base_url=upstream_url, api_key=UPSTREAM_KEY)


def _document_body(question: int, *, marks: int = 1) -> dict[str, Any]:
    """A Messages body: a short system prompt the client marks itself, then one long
    document every request shares and a question of its own (``marks``: the client's own
    breakpoints, 1 to 4)."""
    ephemeral = {"type": "ephemeral"}
    tools = [{"name": f"tool{i}", "description": "d", "input_schema": {"type": "object"}} for i in range(2)]
    body: dict[str, Any] = {
        "model": CLAUDE,
        "max_tokens": 8,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": ephemeral}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": DOCUMENT},
                    {"type": "text", "text": f"Question {question}: what does it say?"},
                ],
            }
        ],
    }
    if marks >= 2:
        body["tools"] = [tools[0], {**tools[1], "cache_control": ephemeral}]
    for extra in range(marks - 2):
        body["messages"].insert(
            0, {"role": "user", "content": [{"type": "text", "text": f"t{extra}", "cache_control": ephemeral}]}
        )
        body["messages"].insert(1, {"role": "assistant", "content": "ok"})
    return body


def _as_sent(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as an Anthropic deployment is sent it unmarked (its model's own name put in)."""
    return {**body, "model": CLAUDE.split("/")[1]}


def _breakpoints(body: Any) -> int:
    if isinstance(body, dict):
        return ("cache_control" in body) + sum(_breakpoints(v) for k, v in body.items() if k != "cache_control")
    if isinstance(body, list):
        return sum(_breakpoints(v) for v in body)
    return 0


async def test_messages_keep_the_clients_marks_and_gain_one_at_the_shared_document(
    tmp_path: Path, recorded: tuple[Recorder, Deployment]
) -> None:
    recorder, claude = recorded
    async with serving([claude], tmp_path, clients=CLIENTS) as url, _messages_sdk(url) as client:
        for number in range(3):
            await client.messages.create(**_document_body(number))
        for number in range(3):
            await client.messages.create(**_document_body(number, marks=4))
    first, second, third = recorder.bodies[:3]
    assert first == _as_sent(_document_body(0))  # the first of a prefix goes as it came
    for sent, number in ((second, 1), (third, 2)):
        assert sent["system"] == _document_body(number)["system"]  # the client's own mark kept
        document, question = sent["messages"][0]["content"]
        assert document == {"type": "text", "text": DOCUMENT, "cache_control": {"type": "ephemeral"}}
        assert "cache_control" not in question
        assert _breakpoints(sent) == 2
    for sent, number in zip(recorder.bodies[3:], range(3), strict=True):
        assert sent == _as_sent(_document_body(number, marks=4))  # four of its own: no room for more
        assert _breakpoints(sent) == 4


async def test_off_sends_every_request_as_its_client_wrote_it(
    tmp_path: Path, recorded: tuple[Recorder, Deployment]
) -> None:
    recorder, claude = recorded
    async with serving([claude], tmp_path, clients=CLIENTS, prompt_cache="off") as url, _messages_sdk(url) as client:
        for number in range(4):
            await client.messages.create(**_document_body(number))
    assert recorder.bodies == [_as_sent(_document_body(number)) for number in range(4)]


async def test_a_streamed_request_is_marked_and_reads_the_cache(tmp_path: Path) -> None:
    async with (
        _upstream() as upstream,
        serving([_claude(upstream)], tmp_path, clients=CLIENTS) as url,
        _messages_sdk(url) as client,
    ):
        await client.messages.create(**_document_body(0))
        assert upstream.prompt_cache.stats.written_tokens == 0
        usages = []
        for number in (1, 2):
            async with client.messages.stream(**_document_body(number)) as stream:
                usages.append((await stream.get_final_message()).usage)
        stats = upstream.prompt_cache.stats
    assert usages[0].cache_creation_input_tokens
    assert stats.written_tokens == usages[0].cache_creation_input_tokens
    assert usages[1].cache_read_input_tokens
    assert stats.read_tokens == usages[1].cache_read_input_tokens


async def test_openai_keys_are_per_client_and_sharded_under_15_rpm(tmp_path: Path) -> None:
    async with (
        _upstream() as upstream,
        serving([deployment_at(upstream)], tmp_path, clients=CLIENTS) as url,
        sdk(url, ALICE_KEY) as alice,
        sdk(url, BOB_KEY) as bob,
    ):
        for number in range(3):
            for client in (alice, bob):
                await client.chat.completions.create(model="openai/gpt-test", messages=_chat(number))
        keys = {label.split("|")[0] for label in upstream.prompt_cache.stats.by_prefix}
        assert len({key for key in keys if key.startswith("sluice-")}) == 2  # one per client
        for number in range(40):  # alice alone, 40 requests inside a minute
            await alice.chat.completions.create(model="openai/gpt-test", messages=_chat(100 + number))
        await alice.chat.completions.create(
            model="openai/gpt-test", messages=_chat(0), extra_body={"prompt_cache_key": "alice-own"}
        )
        stats = upstream.prompt_cache.stats
    shards = {label.split("|")[0] for label in stats.by_prefix} - keys
    assert len(shards - {"alice-own"}) >= 2  # alice's key spread over more shards
    assert "alice-own" in shards  # a client's own key is kept
    assert stats.spills == 0  # no (prefix, key) went past ~15 a minute
    assert stats.read_tokens > 0


def test_a_bad_prompt_cache_value_is_an_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"\[serve\] prompt_cache must be \"auto\" or \"off\", got 'yes'"):
        serve_tables({"serve": {"prompt_cache": "yes"}}, "sluice.toml")
    with pytest.raises(ConfigError, match="prompt_cache"):
        ServeSettings(prompt_cache=True)  # type: ignore[arg-type]
    assert serve_tables({"serve": {"prompt_cache": "off"}}, "sluice.toml")[0].prompt_cache == "off"
    assert ServeSettings().prompt_cache == "auto"


def test_the_servers_index_and_groups_stay_bounded() -> None:
    """A server runs for weeks: distinct prefixes without end keep its memory flat, and
    groups unused for twice an entry's lifetime are forgotten."""
    plan = ServedCache(Pricing(), most_prefixes=2_000, most_groups=50)
    claude = Deployment(CLAUDE, api_key="sk-test")
    rng = random.Random(5)
    marked = 0
    for number in range(300):
        system = text(1500, rng)
        for question in range(2):
            request = Request(
                CLAUDE, [{"role": "system", "content": system}, {"role": "user", "content": f"q{question}"}]
            )
            sent, ticket = plan.mark(request, [claude], "alice", float(number))
            if ticket is not None:
                assert question == 1  # marked from its second request, never its first
                assert sent is not request
                marked += 1
                plan.done(ticket, None, None, float(number))
        assert len(plan.index) <= 2_000
        assert len(plan.groups) <= 50
    assert marked >= 250  # a prefix forgotten between its two requests (the index full) is the exception
    plan.groups.expire(300.0 + 601.0, 600.0)
    assert len(plan.groups) == 0


@pytest.mark.parametrize("model", [CLAUDE, "openai/gpt-4o-mini"])
async def test_marks_do_not_change_what_the_answer_cache_keys_a_request_by(tmp_path: Path, model: str) -> None:
    """``[serve] cache`` answers a repeated request from the store; the prompt-cache marks a
    request gets (none the first time, breakpoints or a key shard later) are how it is
    sent, not what was asked: the same request asked again is a hit, not sent again."""
    async with _upstream() as upstream:
        deployment = deployment_at(upstream, model)
        async with (
            serving([deployment], tmp_path, clients=CLIENTS, cache=True, prompt_cache="auto") as url,
            sdk(url, ALICE_KEY) as client,
        ):
            for _ in range(3):
                await client.chat.completions.create(model=model, messages=_chat(1), temperature=0, max_tokens=8)
            await client.chat.completions.create(model=model, messages=_chat(2), temperature=0, max_tokens=8)
        assert upstream.stats.accepted == 2  # each question once


async def _chat_batch(setting: str, tmp_path: Path) -> FakeServer:
    """Eight chat lines sharing the long system prompt, as one Batch API job (OpenAI's
    Files and Batches) through the server, to the Anthropic model."""
    lines = [
        {
            "custom_id": f"q-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": CLAUDE, "max_tokens": 8, "messages": _chat(n)},
        }
        for n in range(8)
    ]
    raw = "".join(json.dumps(line) + "\n" for line in lines).encode()
    async with _upstream() as upstream:
        async with (
            serving([_claude(upstream)], tmp_path / setting, clients=CLIENTS, prompt_cache=setting) as url,
            sdk(url, ALICE_KEY) as client,
        ):
            upload = await client.files.create(file=("in.jsonl", raw), purpose="batch")
            batch = await client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            for _ in range(300):
                batch = await client.batches.retrieve(batch.id)
                if batch.status in ("completed", "failed", "expired", "cancelled"):
                    break
                await asyncio.sleep(0.1)
            assert batch.status == "completed"
            assert batch.request_counts is not None
            assert batch.request_counts.completed == 8
        return upstream


async def test_a_clients_chat_batch_is_planned_and_off_turns_that_off_too(tmp_path: Path) -> None:
    """A client's Batch API job runs through the ``sluice run`` path (``Engine.map``), whose
    planner marks the shared system prompt: a line writes it, the rest read it.
    ``prompt_cache = "off"`` sends the lines as written: nothing asked of the fake's cache."""
    planned = await _chat_batch("auto", tmp_path)
    assert planned.prompt_cache.stats.hits >= 5
    plain = await _chat_batch("off", tmp_path)
    assert plain.prompt_cache.stats.requests == 0
    assert sum(e.cost_usd for e in planned.ledger) < 0.5 * sum(e.cost_usd for e in plain.ledger)


def test_a_model_whose_deployments_cache_by_different_rules_is_not_marked() -> None:
    """A model served by an Anthropic deployment and an OpenAI one (or falling back from one
    to the other): a breakpoint one would refuse, a key the other ignores; nothing is marked."""
    plan = ServedCache(Pricing())
    both = [Deployment(CLAUDE, api_key="sk-a"), Deployment("openai/gpt-4o-mini", api_key="sk-o")]
    request = Request(messages=_chat(1), model=CLAUDE, max_tokens=8)
    for now in (1.0, 2.0, 3.0):
        sent, ticket = plan.mark(request, both, "alice", now)
        assert sent is request
        assert ticket is None
    alone = [Deployment(CLAUDE, api_key="sk-a")]
    plan.mark(request, alone, "alice", 4.0)  # counted now (a prefix's first request goes as it came)
    assert plan.mark(request, alone, "alice", 5.0)[0] is not request  # the same request, one kind: marked


async def test_a_clients_message_batch_is_planned_in_the_bodies_as_written(tmp_path: Path) -> None:
    """An Anthropic Message Batch's requests are sent as their clients wrote them (bodies
    as written): the planner reads the body's system and messages and marks them there, so
    one request writes the shared system prompt and the rest read it."""
    requests = [
        {
            "custom_id": f"q-{n}",
            "params": {
                "model": CLAUDE,
                "max_tokens": 8,
                "system": SYSTEM,
                "messages": [{"role": "user", "content": f"Question {n}: why?"}],
            },
        }
        for n in range(8)
    ]
    async with _upstream() as upstream, serving([_claude(upstream)], tmp_path, clients=CLIENTS) as url:
        client = _messages_sdk(url)
        try:
            batch = await client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
            for _ in range(300):
                batch = await client.messages.batches.retrieve(batch.id)
                if batch.processing_status == "ended":
                    break
                await asyncio.sleep(0.1)
            assert batch.request_counts.succeeded == 8
        finally:
            await client.close()
    stats = upstream.prompt_cache.stats
    assert stats.hits >= 6
    assert stats.duplicate_writes == 0
