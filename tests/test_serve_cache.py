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
from servetools import fake, serving

from sluice import ConfigError
from sluice.serve._settings import ServeSettings, serve_tables

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
    async with fake() as upstream, serving([deployment_at(upstream)], tmp_path) as url:
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


def test_the_cache_setting_is_validated() -> None:
    for good, kept in ((False, "off"), (True, "on"), ("deterministic", "deterministic")):
        settings, _ = serve_tables({"serve": {"cache": good}}, "sluice.toml")
        assert settings.cache == kept
    with pytest.raises(ConfigError, match='cache must be false, true or "deterministic"'):
        serve_tables({"serve": {"cache": "sometimes"}}, "sluice.toml")
    assert ServeSettings().cache == "off"
