"""``sluice serve``'s response cache: off by default (a client that samples twice gets two
answers), ``"deterministic"`` for temperature-0 requests, ``true`` for all; a request
overrides it with ``x-sluice-cache``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from fake_provider import deployment_at
from prometheus_client.parser import text_string_to_metric_families
from servetools import ALICE_KEY, BOB_KEY, ENV, deployment, embedder, fake, sdk, serving

from sluice import ConfigError
from sluice.serve.core._settings import ClientSpec, ServeSettings, serve_tables

MESSAGES: list[Any] = [{"role": "user", "content": "Pick a number"}]


async def _twice(url: str, **options: Any) -> tuple[str, str]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    try:
        first = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4, **options)
        second = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4, **options)
    finally:
        await client.close()
    return first.id, second.id


async def test_by_default_two_identical_sampled_requests_get_two_answers(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment_at(upstream)], tmp_path) as url:
        ids = await _twice(url, temperature=1.0)
        assert upstream.stats.received == 2
        ids_at_zero = await _twice(url, temperature=0)
        assert upstream.stats.received == 4  # off means off, even at temperature 0
    assert ids[0] != ids[1]
    assert ids_at_zero[0] != ids_at_zero[1]


async def test_deterministic_caches_only_temperature_zero(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment_at(upstream)], tmp_path, cache="deterministic") as url:
        await _twice(url, temperature=0)
        assert upstream.stats.received == 1
        await _twice(url, temperature=0.7)
        assert upstream.stats.received == 3
        await _twice(url)  # no temperature: the provider's default samples
        assert upstream.stats.received == 5


async def test_a_request_overrides_the_setting_with_a_header(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment_at(upstream)], tmp_path, cache="deterministic") as url:
        await _twice(url, temperature=1.0, extra_headers={"x-sluice-cache": "on"})
        assert upstream.stats.received == 1
        async with aiohttp.ClientSession() as http:
            body = {"model": "gpt-test", "messages": MESSAGES}
            async with http.post(f"{url}/v1/chat/completions", json=body, headers={"x-sluice-cache": "maybe"}) as bad:
                assert bad.status == 400
                assert (await bad.json())["error"]["param"] == "x-sluice-cache"
    async with fake() as upstream, serving([deployment_at(upstream)], tmp_path / "on", cache=True) as url:
        await _twice(url, temperature=1.0)
        assert upstream.stats.received == 1
        await _twice(url, temperature=1.0, extra_headers={"x-sluice-cache": "off"})
        assert upstream.stats.received == 3


async def test_a_client_cannot_turn_on_what_the_operator_turned_off(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment_at(upstream)], tmp_path) as url:
        ids = await _twice(url, temperature=0, extra_headers={"x-sluice-cache": "on"})
        assert upstream.stats.received == 2  # cache = false: every request goes upstream
    assert ids[0] != ids[1]


def _tenants(**budgets: float) -> tuple[ClientSpec, ...]:
    return (
        ClientSpec("alice", "ALICE_KEY", budget_usd=budgets.get("alice")),
        ClientSpec("bob", "BOB_KEY", budget_usd=budgets.get("bob")),
        ClientSpec("carol", "CAROL_KEY", cache_group="team"),
        ClientSpec("dave", "DAVE_KEY", cache_group="team"),
    )


async def _spent(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as got:
        text = await got.text()
    return {
        s.labels["client"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sluice_client_spent_usd"
    }


async def test_one_tenant_is_never_answered_from_another_tenants_requests(tmp_path: Path) -> None:
    """B sending A's exact request gets an answer of its own, paid by B (and as slowly as a
    miss): only clients the operator put in one cache_group share answers."""
    environ = {**ENV, "CAROL_KEY": "sk-carol-0123456789abcdef", "DAVE_KEY": "sk-dave-0123456789abcdef0"}
    async with fake() as upstream:
        deployments = [deployment(upstream)]
        clients = _tenants(alice=1.0, bob=1.0)
        async with serving(deployments, tmp_path, clients=clients, environ=environ, cache=True) as url:
            got: dict[str, list[str]] = {}
            for name, key in (("alice", ALICE_KEY), ("bob", BOB_KEY), ("alice", ALICE_KEY), ("bob", BOB_KEY)):
                async with sdk(url, key=key) as client:
                    reply = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
                got.setdefault(name, []).append(reply.id)
            assert upstream.stats.received == 2  # one each: a client's own twin is its hit
            spent = await _spent(url)
            for name in ("carol", "dave"):
                async with sdk(url, key=environ[f"{name.upper()}_KEY"]) as client:
                    reply = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
                got[name] = [reply.id]
            assert upstream.stats.received == 3  # carol and dave share their group's answer
    assert got["alice"][0] == got["alice"][1]
    assert got["bob"][0] == got["bob"][1]
    assert got["alice"][0] != got["bob"][0]
    assert got["carol"] == got["dave"]
    assert got["carol"][0] not in (got["alice"][0], got["bob"][0])
    assert spent["alice"] > 0
    assert spent["bob"] == pytest.approx(spent["alice"])  # bob paid for his own answer


async def test_a_hit_is_free_but_refused_when_the_budget_cannot_cover_its_worst_case(tmp_path: Path) -> None:
    """alice's budget covers one request's worst case but not two: the first is answered
    and charged, the same again (a hit) is refused as a miss would be, plain or streamed."""
    async with fake(output_tokens=100) as upstream:
        deployments = [deployment(upstream)]
        clients = (ClientSpec("alice", "ALICE_KEY", budget_usd=0.001),)  # worst ~$0.0009, one costs ~$0.0008
        async with serving(deployments, tmp_path, clients=clients, cache=True) as url:
            async with sdk(url, key=ALICE_KEY) as client:
                await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=100)
                spent = await _spent(url)
                with pytest.raises(openai.RateLimitError) as plain:
                    await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=100)
                with pytest.raises(openai.RateLimitError) as streamed:  # refused before the stream begins
                    await client.chat.completions.create(
                        model="gpt-test", messages=MESSAGES, max_tokens=100, stream=True
                    )
                cheap = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=1)
            after = await _spent(url)
        assert after["alice"] == pytest.approx(spent["alice"] + cheap_cost(cheap))  # the refused hits cost nothing
        assert upstream.stats.received == 2  # the first, and the cheap one: never the refused hits
    for refused in (plain.value, streamed.value):
        assert refused.code == "insufficient_quota"
        assert "worst case" in refused.message


def cheap_cost(reply: Any) -> float:
    return float(reply.usage.prompt_tokens * 2e-6 + reply.usage.completion_tokens * 8e-6)


async def test_a_hit_within_the_budget_costs_nothing(tmp_path: Path) -> None:
    async with fake() as upstream:
        clients = (ClientSpec("alice", "ALICE_KEY", budget_usd=1.0),)
        async with serving([deployment(upstream)], tmp_path, clients=clients, cache=True) as url:
            async with sdk(url, key=ALICE_KEY) as client:
                first = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
                spent = await _spent(url)
                second = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
            assert await _spent(url) == spent
        assert upstream.stats.received == 1
    assert first.id == second.id
    assert spent["alice"] > 0


def test_the_cache_setting_is_validated() -> None:
    for good, kept in ((False, "off"), (True, "on"), ("deterministic", "deterministic")):
        settings, _ = serve_tables({"serve": {"cache": good}}, "sluice.toml")
        assert settings.cache == kept
    with pytest.raises(ConfigError, match='cache must be false, true or "deterministic"'):
        serve_tables({"serve": {"cache": "sometimes"}}, "sluice.toml")
    assert ServeSettings().cache == "off"
    _, (client,) = serve_tables({"client": [{"name": "a", "key_env": "A", "cache_group": "team"}]}, "sluice.toml")
    assert client.cache_group == "team"
    with pytest.raises(ConfigError, match="cache_group must be a non-empty string"):
        serve_tables({"client": [{"name": "a", "key_env": "A", "cache_group": ""}]}, "sluice.toml")


async def test_stored_embeddings_are_a_tenants_own(tmp_path: Path) -> None:
    """Vectors are kept in the state (a text embedded twice is sent once), per client: bob
    embedding alice's text is sent upstream and pays for it."""
    async with fake() as upstream:
        clients = (ClientSpec("alice", "ALICE_KEY", budget_usd=1.0), ClientSpec("bob", "BOB_KEY", budget_usd=1.0))
        async with serving([embedder(upstream)], tmp_path, clients=clients) as url:
            for key in (ALICE_KEY, ALICE_KEY, BOB_KEY):
                async with sdk(url, key=key) as client:
                    await client.embeddings.create(model="text-embedding-3-small", input="a private text")
            spent = await _spent(url)
        assert upstream.stats.received == 2  # alice once (her twin from the state), bob once
    assert spent["bob"] == pytest.approx(spent["alice"])
    assert spent["bob"] > 0
