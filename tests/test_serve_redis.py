"""``sluice serve --redis``: replicas in front of one fake provider share its limits, the
clients' budgets and rpm through a real redis-server (see ``redis_server.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from redis_server import RedisServer
from servetools import ALICE_KEY, ENV, MESSAGES, ask, deployment, fake, listening, sdk

from sluice import BudgetExhaustedError, Deployment, Engine, RetryPolicy
from sluice.cli._config import JobConfig
from sluice.redis import RedisBudget
from sluice.serve._app import build_app
from sluice.serve.core._settings import ClientSpec, ServeSettings


@contextlib.asynccontextmanager
async def replica(
    deployments: list[Deployment],
    state: Path,
    redis_url: str | None,
    *,
    clients: tuple[ClientSpec, ...] = (),
    fail_open: bool = False,
    **settings: Any,
) -> AsyncIterator[str]:
    """One ``sluice serve`` replica on a loopback port (its own state dir); yields its URL."""
    config = JobConfig(tuple(deployments), retry=RetryPolicy(max_attempts=1, base_delay=0.01))
    app = build_app(
        config, ServeSettings(**settings), clients, state, environ=ENV, redis_url=redis_url, redis_fail_open=fail_open
    )
    async with listening(app) as url:
        yield url


@contextlib.asynccontextmanager
async def replicas(
    n: int, deployments: list[Deployment], tmp: Path, redis_url: str | None, **kwargs: Any
) -> AsyncIterator[list[str]]:
    async with contextlib.AsyncExitStack() as stack:
        urls = [
            await stack.enter_async_context(replica(deployments, tmp / f"r{i}", redis_url, **kwargs)) for i in range(n)
        ]
        yield urls


async def fake_stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{url.removesuffix('/v1')}/_fake/stats") as got:
        stats: dict[str, Any] = await got.json()
        return stats


async def burst(urls: list[str], count: int, key: str = "anything") -> list[Any]:
    """``count`` concurrent chats spread round-robin over the replicas."""
    clients = [sdk(url, key=key) for url in urls]
    try:
        return await asyncio.gather(
            *(
                clients[i % len(clients)].chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=8)
                for i in range(count)
            ),
            return_exceptions=True,
        )
    finally:
        for client in clients:
            await client.close()


# -- the deployments' limits -------------------------------------------------------------------


async def test_replicas_on_one_redis_share_the_deployments_limit(tmp_path: Path, redis_server: RedisServer) -> None:
    async with fake(rpm=10, window=0.5) as upstream:
        dep = deployment(upstream, rpm=10, window=0.5)
        async with replicas(3, [dep], tmp_path, redis_server.url) as urls:
            outcomes = await burst(urls, 30)
        answered = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        for error in refused:  # only sluice's own refusals, each saying when to come back
            assert isinstance(error, openai.RateLimitError), error
            assert int(error.response.headers["retry-after"]) >= 1
        stats = await fake_stats(upstream.url)
        said = [f"{e.response.status_code} {e.response.headers.get('retry-after')}: {e.message}" for e in refused]
        assert len(answered) == 30, (said, stats)  # 1.5 s of the limit's pace: well within the 30 s max wait
        assert stats["rate_limited"] == 0


async def test_without_redis_the_same_replicas_meet_upstream_429s(tmp_path: Path) -> None:
    """The control: each replica keeps the whole limit for itself, so together they exceed it."""
    async with fake(rpm=10, window=0.5) as upstream:
        dep = deployment(upstream, rpm=10, window=0.5)
        async with replicas(3, [dep], tmp_path, None) as urls:
            await burst(urls, 30)
        assert (await fake_stats(upstream.url))["rate_limited"] > 0


# -- client budgets and rpm ---------------------------------------------------------------------


async def _spend_until_refused(url: str, rounds: int) -> tuple[int, list[openai.RateLimitError]]:
    client = sdk(url, key=ALICE_KEY)
    answered = 0
    refused: list[openai.RateLimitError] = []
    try:
        for i in range(rounds):
            try:
                await client.chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=100)
                answered += 1
            except openai.RateLimitError as exc:
                refused.append(exc)
    finally:
        await client.close()
    return answered, refused


async def test_a_clients_budget_holds_across_replicas_and_restarts(tmp_path: Path, redis_server: RedisServer) -> None:
    limit = 0.004
    alice = ClientSpec("alice", "ALICE_KEY", budget_usd=limit)
    async with fake() as upstream:
        dep = deployment(upstream)
        async with replicas(2, [dep], tmp_path, redis_server.url, clients=(alice,), cache=False) as urls:
            results = await asyncio.gather(*(_spend_until_refused(url, 30) for url in urls))
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{urls[1]}/health") as got:
                    health = await got.json()
                async with http.get(f"{urls[1]}/metrics") as got:
                    metrics = await got.text()
        answered = sum(a for a, _ in results)
        assert answered >= 2
        for _, refused in results:  # each replica ends up refusing: the budget is one
            assert refused
            assert all(r.code == "insufficient_quota" for r in refused)
        billed = upstream.total_billed_usd
        assert 0 < billed <= limit  # what the provider bills, over both replicas
        assert health["status"] == "ok"
        assert "clients" not in health  # /health asks for no key: it says nothing of any client
        assert "alice" not in json.dumps(health)
        gauges = {
            s.name: s.value
            for family in text_string_to_metric_families(metrics)
            for s in family.samples
            if s.labels.get("client") == "alice"
        }
        assert gauges["sluice_client_spent_usd"] == pytest.approx(billed, abs=1e-6)  # every replica's spend
        assert gauges["sluice_client_budget_usd"] == pytest.approx(limit)
        received = upstream.stats.received
        # a replica started afresh (a new state dir) on the same Redis: the spend is still there
        async with replica([dep], tmp_path / "fresh", redis_server.url, clients=(alice,), cache=False) as url:
            again, refused = await _spend_until_refused(url, 1)
        assert again == 0
        assert refused[0].code == "insufficient_quota"
        assert upstream.stats.received == received


async def test_a_clients_rpm_holds_across_replicas(tmp_path: Path, redis_server: RedisServer) -> None:
    limited = ClientSpec("alice", "ALICE_KEY", rpm=3)
    async with fake() as upstream:
        async with replicas(2, [deployment(upstream)], tmp_path, redis_server.url, clients=(limited,)) as urls:
            clients = [sdk(url, key=ALICE_KEY) for url in urls]
            outcomes: list[Any] = []
            for i in range(8):  # one by one, alternating replicas
                try:
                    outcomes.append(
                        await clients[i % 2].chat.completions.create(
                            model="gpt-test",
                            messages=ask(i),
                            max_tokens=4,
                            # the client's window is a minute, so its refusals come at once at
                            # any wait under that; 0.5 s was missed by the Redis round trips of
                            # a loaded machine (a 429 for the deployment, not the client)
                            extra_headers={"x-sluice-max-wait": "5"},
                        )
                    )
                except openai.RateLimitError as exc:
                    outcomes.append(exc)
            for client in clients:
                await client.close()
        refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
        assert len(outcomes) - len(refused) == 3  # the client's rpm, not 3 per replica
        assert upstream.stats.received == 3
        for error in refused:
            assert "alice" in error.message
            assert int(error.response.headers["retry-after"]) >= 50  # the minute's window, as Redis said


# -- Redis trouble -------------------------------------------------------------------------------


async def test_redis_down_is_a_clear_503_within_max_wait_and_recovers(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    async with (
        fake() as upstream,
        replica([deployment(upstream, rpm=600)], tmp_path, redis_server.url, max_wait_s=1.0) as url,
    ):
        client = sdk(url)
        assert (await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)).choices
        received = upstream.stats.received
        redis_server.stop()
        async with asyncio.timeout(20):  # a generous guard against a hang, not a speed check
            with pytest.raises(openai.InternalServerError) as caught:
                await client.chat.completions.create(model="gpt-test", messages=ask(1), max_tokens=4)
        assert caught.value.status_code == 503
        assert caught.value.code == "shared_state_unavailable"
        assert "Redis" in caught.value.message
        assert "cannot be reached" in caught.value.message
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as got:
            assert got.status == 503
            assert (await got.json())["redis"]["status"] == "down"
        assert upstream.stats.received == received  # nothing reached the provider meanwhile
        redis_server.start()
        reply = None
        async with asyncio.timeout(20):
            while reply is None:  # the reconnect backoff may outlast one max wait: retry as a client would
                with contextlib.suppress(openai.InternalServerError):
                    reply = await client.chat.completions.create(model="gpt-test", messages=ask(2), max_tokens=4)
        assert reply.choices
        assert upstream.stats.received == received + 1
        await client.close()


async def test_with_fail_open_a_replica_answers_on_its_own_limits_while_redis_is_down(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    async with fake() as upstream:
        dep = deployment(upstream, rpm=600)
        async with replica([dep], tmp_path, redis_server.url, fail_open=True, max_wait_s=5.0) as url:
            client = sdk(url)
            assert (await client.chat.completions.create(model="gpt-test", messages=MESSAGES, max_tokens=4)).choices
            redis_server.stop()
            async with asyncio.timeout(20):
                reply = await client.chat.completions.create(model="gpt-test", messages=ask(1), max_tokens=4)
            assert reply.choices  # the opt-in: local limits grant meanwhile
            assert upstream.stats.received == 2
            await client.close()


# -- the library: a session's own shared budget --------------------------------------------------


async def test_a_session_holds_in_every_shared_budget_of_its_chain_all_or_none(redis_server: RedisServer) -> None:
    async with fake() as upstream:
        dep = deployment(upstream)
        team = RedisBudget(redis_server.url, "team", 0.0005)  # the engine's: too small for one request
        task = RedisBudget(redis_server.url, "task", 1.0)  # the session's: roomy
        async with Engine(dep, budget_usd=1.0, shared_budget=team) as engine:
            session = engine.session(1.0, shared=task)
            result = await session.complete("openai/gpt-test", MESSAGES, max_tokens=100)
        await task.flush()
        totals = await task.totals()
        assert isinstance(result.error, BudgetExhaustedError)  # refused by the engine's shared budget
        assert upstream.stats.received == 0
        assert totals.reserved == 0  # the session's shared hold, taken first, was given back
        assert totals.spent == 0
        roomy = RedisBudget(redis_server.url, "team-roomy", 1.0)
        async with Engine(dep, budget_usd=1.0, shared_budget=roomy) as engine:
            result = await engine.session(1.0, shared=task).complete("openai/gpt-test", MESSAGES, max_tokens=100)
        await task.flush()
        await roomy.flush()
        assert result.error is None
        billed = upstream.total_billed_usd
        assert (await task.totals()).spent == pytest.approx(billed, abs=1e-6)  # both count the request
        assert (await roomy.totals()).spent == pytest.approx(billed, abs=1e-6)
        for budget in (team, task, roomy):
            await budget.close()


def test_serve_help_names_redis_and_says_batches_stay_per_replica() -> None:
    from sluice.cli import main

    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--redis URL" in result.output
    assert "--redis-fail-open" in result.output
    assert "any replica answers for it" in " ".join(result.output.split())
