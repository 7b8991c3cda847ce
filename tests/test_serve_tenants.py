"""``sluice serve`` between tenants: what the open endpoints tell a stranger, what a client
learns of the server's own upstream credentials, and the keys the operator chose."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis_server import RedisServer
from servetools import ALICE_KEY, ENV, MESSAGES, PRICE, deployment, fake, listening, sdk, serving

from sluice import ConfigError, Deployment, RetryPolicy
from sluice.cli._config import JobConfig
from sluice.serve._app import build_app
from sluice.serve.core._settings import ClientSpec, ServeSettings, serve_tables

METRICS_KEY = "mk-7f3a9c1e5b2d8046"
ALICE = ClientSpec("alice", "ALICE_KEY", budget_usd=1.0)


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}) as got:
        return got.status, await got.text()


# -- /health and /metrics -------------------------------------------------------------------------


async def test_health_says_nothing_of_any_client(tmp_path: Path, redis_server: RedisServer) -> None:
    """With --redis /health used to list every client's name, budget and spend, to anyone."""
    async with fake() as upstream:
        config = JobConfig((deployment(upstream),), retry=RetryPolicy(max_attempts=1))
        app = build_app(config, ServeSettings(), (ALICE,), tmp_path, environ=ENV, redis_url=redis_server.url)
        async with listening(app) as url:
            async with sdk(url, key=ALICE_KEY) as client:
                await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
            status, text = await _get(f"{url}/health")
    assert status == 200
    health = json.loads(text)
    assert health["status"] == "ok"
    assert health["redis"]["status"] == "ok"
    assert "alice" not in text
    assert "budget" not in text
    assert "spent" not in text


async def test_metrics_asks_for_its_key_when_one_is_set(tmp_path: Path) -> None:
    environ = {**ENV, "METRICS_KEY": METRICS_KEY}
    async with (
        fake() as upstream,
        serving(
            [deployment(upstream)], tmp_path, clients=(ALICE,), environ=environ, metrics_key_env="METRICS_KEY"
        ) as url,
    ):
        async with sdk(url, key=ALICE_KEY) as client:
            await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
        bare = await _get(f"{url}/metrics")
        wrong = await _get(f"{url}/metrics", {"authorization": "Bearer mk-not-the-metrics-key"})
        client_key = await _get(f"{url}/metrics", {"authorization": f"Bearer {ALICE_KEY}"})
        odd = await _get(f"{url}/metrics", {"authorization": "Bearer mk-\u00e9-0123456789abcd"})
        right = await _get(f"{url}/metrics", {"authorization": f"Bearer {METRICS_KEY}"})
        health = await _get(f"{url}/health")
    for status, text in (bare, wrong, client_key, odd):
        assert status == 401
        assert "alice" not in text
        assert json.loads(text)["error"]["code"] == "invalid_api_key"
    assert right[0] == 200
    spent = [
        s.value
        for family in text_string_to_metric_families(right[1])
        for s in family.samples
        if s.name == "sluice_client_spent_usd" and s.labels["client"] == "alice"
    ]
    assert len(spent) == 1
    assert spent[0] > 0
    assert health[0] == 200  # /health asks for no key


async def test_without_a_metrics_key_metrics_stays_open(tmp_path: Path) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, clients=(ALICE,)) as url:
        status, text = await _get(f"{url}/metrics")
    assert status == 200
    assert "sluice_serve_queue_depth" in text


def test_the_metrics_key_is_checked_at_start_up(tmp_path: Path) -> None:
    config = JobConfig((Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key="sk-x"),))
    settings = ServeSettings(metrics_key_env="METRICS_KEY")
    for env, said in (
        (ENV, r"metrics key variable \$METRICS_KEY is not set"),
        ({**ENV, "METRICS_KEY": "short"}, "shorter than 16"),
        ({**ENV, "METRICS_KEY": ALICE_KEY}, "is a client's key"),
    ):
        with pytest.raises(ConfigError, match=said):
            build_app(config, settings, (ALICE,), tmp_path / "s", environ=env)
    with pytest.raises(ConfigError, match="must name the environment variable"):
        serve_tables({"serve": {"metrics_key_env": METRICS_KEY}}, "sluice.toml")
    assert serve_tables({"serve": {"metrics_key_env": "M"}}, "sluice.toml")[0].metrics_key_env == "M"


# -- weak keys ---------------------------------------------------------------------------------------


def test_a_key_that_looks_guessable_is_named_weak() -> None:
    from sluice.serve.core._key_rules import weakness

    for weak in ("aaaaaaaaaaaaaaaa", "abcabcabcabcabcabcabc", "0123456789abcdefghij", "sk-1111111111111111"):
        assert weakness(weak) is not None, weak
    for strong in ("mk-7f3a9c1e5b2d8046", "3f9a1c7e0b5d2f8a4c6e9b1d", "Tq8-ZpLw2rVx_Kc5Hn0y"):
        assert weakness(strong) is None, strong


async def test_weak_keys_are_warned_about_at_start_up_and_never_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weak_admin, weak_client = "adminadminadminadmin", "1234567890123456"
    environ = {"ALICE_KEY": weak_client, "BOB_KEY": "3f9a1c7e0b5d2f8a4c6e9b1d", "ADMIN_KEY": weak_admin}
    clients = (ALICE, ClientSpec("bob", "BOB_KEY"))
    caplog.set_level(logging.WARNING, logger="sluice.serve")
    async with (
        fake() as upstream,
        serving([deployment(upstream)], tmp_path, clients=clients, environ=environ, admin_key_env="ADMIN_KEY") as url,
        sdk(url, key=weak_client) as client,  # warned about, not refused
    ):
        await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)
    said = [r.getMessage() for r in caplog.records if "looks weak" in r.getMessage()]
    assert len(said) == 2, said
    assert any("client 'alice'" in m and "$ALICE_KEY" in m for m in said)
    assert any("admin_key_env" in m and "$ADMIN_KEY" in m for m in said)
    everything = caplog.text
    for key in (weak_admin, weak_client, environ["BOB_KEY"]):
        assert key not in everything


# -- the provider refusing the server's own key --------------------------------------------------------


async def test_a_provider_refusing_the_servers_key_is_a_generic_502_and_its_words_go_to_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The provider's 401 text (which may quote part of the server's upstream key) reaches
    no client: not a chat answer, not a stream, not a batch's error line, not the
    dashboard's error list; the operator's log has it."""
    caplog.set_level(logging.WARNING, logger="sluice.serve")
    environ = {**ENV, "ADMIN_KEY": "3f9a1c7e0b5d2f8a4c6e9b1d"}
    async with fake(echo_key_in_errors=True) as upstream:
        wrong = Deployment("openai/gpt-test", base_url=upstream.url, api_key="sk-upstream-wrong-4242", price=PRICE)
        async with (
            serving(
                [wrong], tmp_path, clients=(ALICE,), environ=environ, admin_key_env="ADMIN_KEY",
                retry=RetryPolicy(max_attempts=1),
            ) as url,
            sdk(url, key=ALICE_KEY) as client,
        ):  # fmt: skip
            answers = []
            for stream in (False, True):
                async with aiohttp.ClientSession() as http:
                    body = {"model": "gpt-test", "messages": MESSAGES, "max_tokens": 4, "stream": stream}
                    headers = {"authorization": f"Bearer {ALICE_KEY}"}
                    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as got:
                        answers.append((got.status, await got.text()))
            line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body | {"stream": False}}
            upload = await client.files.create(file=("in.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
            batch = await client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            deadline = asyncio.get_running_loop().time() + 60
            while batch.status not in ("completed", "failed") and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                batch = await client.batches.retrieve(batch.id)
            assert batch.error_file_id is not None
            error_line = (await client.files.content(batch.error_file_id)).text
            status, dashboard = await _get(f"{url}/dashboard/data", {"authorization": f"Bearer {environ['ADMIN_KEY']}"})
    assert status == 200
    for status, text in answers:
        assert status == 502
        assert "upstream_auth_failed" in text
    errors = [e for e in json.loads(dashboard)["errors"] if e["source"] == "client"]
    assert len(errors) == 2
    assert {e["kind"] for e in errors} == {"upstream_auth_failed"}
    for text in (*(t for _, t in answers), json.dumps(errors), error_line):
        assert "Incorrect API key" not in text  # the provider's own words
        assert "****" not in text
        assert "4242" not in text
        assert "operator must fix the deployment's key" in text
    (written,) = [json.loads(x) for x in error_line.splitlines()]
    assert written["error"]["code"] == "upstream_auth_failed"
    assert written["response"]["status_code"] == 502
    logged = [r.getMessage() for r in caplog.records if "refused the server's own key" in r.getMessage()]
    assert len(logged) == 2  # the chat and the stream (a batch line's words stay in the state)
    assert all("Incorrect API key provided" in m for m in logged)
    assert "sk-upstream-wrong-4242" not in caplog.text
