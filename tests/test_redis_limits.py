"""Shared limits on a real redis-server: several OS processes, one limit, one fake provider
that enforces that limit with its own clock (see ``tests/redis_server.py``)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from fake_provider import deployment_at
from redis_server import RedisServer

from sluice import Deployment, Engine, RateLimitSnapshot, Request
from sluice.redis import RedisFailed, RedisLimits, deployment_fingerprint, redis_target
from sluice.testing import FakeServer

pytestmark = pytest.mark.timeout(60)

KEY = "sk-test-SECRET-do-not-store-4242"

#: One client process: runs ``n`` requests through an Engine whose limiter is shared in
#: Redis (and, with "budget", a shared budget); prints a JSON summary on its last line.
CLIENT = r"""
import asyncio, json, sys
from sluice import Deployment, Engine, Price, Request, RetryPolicy
from sluice.redis import RedisBudget, RedisLimits

cfg = json.loads(sys.argv[1])

async def main():
    limits = RedisLimits(cfg["redis"], lease_seconds=cfg.get("lease", 30.0), window_margin=cfg.get("margin", 0.05))
    budget = RedisBudget(cfg["redis"], cfg["budget_name"], cfg["budget"]) if "budget" in cfg else None
    price = Price(*cfg["price"]) if "price" in cfg else None
    deployment = Deployment("openai/gpt-test", base_url=cfg["url"], api_key=cfg["key"], rpm=cfg.get("rpm"),
                            tpm=cfg.get("tpm"), window=cfg.get("window", 60.0), max_in_flight=cfg.get("mif"), price=price)
    requests = [Request.from_prompt("openai/gpt-test", f"question {cfg['tag']} {i}", id=f"{cfg['tag']}-{i}",
                                    max_tokens=cfg.get("max_tokens", 16)) for i in range(cfg["n"])]
    engine = Engine(deployment, limiter_factory=limits.limiter_factory, shared_budget=budget,
                    retry=RetryPolicy(max_attempts=3, base_delay=0.05, max_delay=0.5))
    async with engine:
        results = await engine.run(requests)
    if budget is not None:
        await budget.flush()
        await budget.close()
    await limits.close()
    print(json.dumps({
        "ok": sum(r.ok for r in results),
        "n": len(results),
        "errors": sorted({type(r.error).__name__ for r in results if not r.ok}),
        "cost": sum(r.cost_usd or 0.0 for r in results),
        "rate_limited": engine.stats.rate_limited,
    }))

asyncio.run(main())
"""


async def run_clients(configs: list[dict[str, Any]], limit: float = 45.0) -> list[dict[str, Any]]:
    """Start one client process per config at once; their JSON summaries, in order."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CLIENT,
            json.dumps(cfg),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for cfg in configs
    ]
    summaries = []
    async with asyncio.timeout(limit):
        for proc in procs:
            out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()[-2000:]
            summaries.append(json.loads(out.decode().strip().splitlines()[-1]))
    return summaries


def max_in_any_window(times: list[float], window: float) -> int:
    """The most arrivals in any half-open window of ``window`` seconds (as the fake counts)."""
    times = sorted(times)
    best = start = 0
    for end, t in enumerate(times):
        while times[start] <= t - window:
            start += 1
        best = max(best, end - start + 1)
    return best


async def dump_redis(url: str) -> dict[str, Any]:
    """Every key with its value and its time to live (ms)."""
    client = aioredis.Redis.from_url(url)
    dump: dict[str, Any] = {}
    try:
        for key in await client.keys("*"):
            kind = (await client.type(key)).decode()
            if kind == "hash":
                value: Any = await client.hgetall(key)
            elif kind == "zset":
                value = await client.zrange(key, 0, -1, withscores=True)
            elif kind == "string":
                value = await client.get(key)
            else:
                value = kind
            dump[key.decode()] = (repr(value), await client.pttl(key))
    finally:
        await client.aclose()
    return dump


async def test_three_processes_share_one_strict_limit(redis_server: RedisServer) -> None:
    rpm, window, n = 40, 2.0, 15  # 20 requests/s for all three together: 45 requests, more than a window takes
    async with FakeServer(rpm=rpm, window=window, api_key=KEY) as server:
        # margin: a grant leaves the shared window 0.2 s late, room for the spread between a
        # grant at Redis and its arrival at the fake when five test runs share two cores
        base = {
            "redis": redis_server.url,
            "url": server.url,
            "key": KEY,
            "rpm": rpm,
            "window": window,
            "n": n,
            "margin": 0.2,
        }
        summaries = await run_clients([{**base, "tag": tag} for tag in "abc"])
        assert [s["ok"] for s in summaries] == [n, n, n], summaries
        assert server.stats.rate_limited == 0
        assert server.stats.accepted == 3 * n
        assert server.stats.duplicate_successes == 0
        times = [t for t, _ in server.stats.arrivals]
        assert max_in_any_window(times, window) <= rpm
        # Not absurdly slow (liveness, not speed): the ideal spaces 3n requests evenly at
        # rpm per window; allow three times that.
        ideal = (3 * n - 1) * window / rpm
        assert max(times) - min(times) < 3 * ideal


async def test_a_killed_holder_s_in_flight_slots_come_back(redis_server: RedisServer) -> None:
    # A second process takes both in-flight slots and is SIGKILLed while holding them.
    holder = r"""
import asyncio, sys
from sluice import Deployment
from sluice.redis import RedisLimits
async def main():
    limits = RedisLimits(sys.argv[1], lease_seconds=0.6)
    lim = limits.limiter_factory(Deployment("openai/gpt-test", base_url=sys.argv[2], api_key=sys.argv[3], max_in_flight=2))
    held = [await lim.acquire(1), await lim.acquire(1)]
    print("held", flush=True)
    await asyncio.Event().wait()  # holds them until killed
asyncio.run(main())
"""
    base_url = "http://127.0.0.1:9/v1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", holder, redis_server.url, base_url, KEY, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            assert (await proc.stdout.readline()).strip() == b"held"
        limits = RedisLimits(redis_server.url, lease_seconds=0.6)
        limiter = limits.limiter_factory(Deployment("openai/gpt-test", base_url=base_url, api_key=KEY, max_in_flight=2))
        waiting = asyncio.ensure_future(limiter.acquire(1))
        # While the holder lives it refreshes its leases (every 0.2 s): nothing for us,
        # though the lease (0.6 s) has passed more than twice.
        await asyncio.sleep(1.5)
        assert not waiting.done()
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await proc.wait()
        async with asyncio.timeout(5):
            first = await waiting
            second = await limiter.acquire(1)
        assert time.monotonic() - killed_at < 0.6 + 1.0  # its leases expired; ours go
        first.done()
        second.done()
        await limits.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_redis_stopped_mid_run_sends_nothing_until_it_is_back(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    n = 60
    async with FakeServer(rpm=40, window=1.0, api_key=KEY) as server:
        limits = RedisLimits(redis_server.url)
        engine = Engine(deployment_at(server, rpm=40, window=1.0), limiter_factory=limits.limiter_factory)
        async with engine:
            requests = [Request.from_prompt("openai/gpt-test", f"q{i}", id=f"q{i}") for i in range(n)]
            run = asyncio.ensure_future(engine.run(requests))
            await server.until(lambda: server.stats.received >= 15)
            with caplog.at_level(logging.WARNING, logger="sluice.redis"):
                await asyncio.to_thread(redis_server.stop)
                await asyncio.sleep(0.3)  # what was granted before the stop lands
                before = server.stats.received
                await asyncio.sleep(0.5)  # at 40 a second, 20 would go were Redis's limit not held
                assert server.stats.received == before  # nothing sent while Redis is down
                assert not limits.healthy
                assert limits.problem is not None
                assert redis_target(redis_server.url) in limits.problem
                await asyncio.to_thread(redis_server.start)
                async with asyncio.timeout(30):
                    results = await run
        await limits.close()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert len(results) == n
    assert server.stats.accepted == n
    assert server.stats.duplicate_successes == 0
    assert server.stats.rate_limited == 0
    assert limits.healthy
    warnings = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(warnings) == 1  # said once, not once per retry


async def test_scripts_flushed_from_redis_are_loaded_again(redis_server: RedisServer) -> None:
    limits = RedisLimits(redis_server.url)
    limiter = limits.limiter_factory(Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", rpm=600))
    (await limiter.acquire(1)).done()
    client = aioredis.Redis.from_url(redis_server.url)
    await client.script_flush()  # what a restart does to the script cache
    assert (await client.script_exists(*[s.sha for s in limits.connection._scripts.values()])) == [False]
    grant = await asyncio.wait_for(limiter.acquire(1), 5)  # NOSCRIPT -> load, run again
    grant.done()
    await client.aclose()
    await limits.close()


async def test_the_api_key_is_never_written_to_redis_and_keys_expire(redis_server: RedisServer) -> None:
    async with FakeServer(rpm=600, tpm=100_000, window=1.0, api_key=KEY) as server:
        limits = RedisLimits(redis_server.url)
        engine = Engine(
            deployment_at(server, rpm=600, tpm=100_000, window=1.0, max_in_flight=4),
            limiter_factory=limits.limiter_factory,
        )
        async with engine:
            results = await engine.run([Request.from_prompt("openai/gpt-test", f"q{i}", id=f"q{i}") for i in range(10)])
            engine.limiter("openai/gpt-test").penalize(0.01)
        await limits.connection.flush()
        await limits.close()
    assert all(r.ok for r in results)
    dump = await dump_redis(redis_server.url)
    assert dump, "nothing was written to Redis"
    fingerprint = deployment_fingerprint(deployment_at(server))
    assert all(fingerprint in key for key in dump)
    text = json.dumps(dump)
    for secret in (KEY, KEY[3:], KEY[-8:]):
        assert secret not in text
    # -1: no expiry (-2: it expired while we looked, fine)
    assert all(ttl != -1 for _, ttl in dump.values()), {k: ttl for k, (_, ttl) in dump.items()}


def test_deployments_that_differ_in_key_or_endpoint_do_not_share() -> None:
    a = Deployment("openai/gpt-test", base_url="http://a/v1", api_key="k1", rpm=10)
    assert deployment_fingerprint(a) == deployment_fingerprint(
        Deployment("openai/gpt-test", base_url="http://a/v1/", api_key="k1")
    )
    assert deployment_fingerprint(a) != deployment_fingerprint(
        Deployment("openai/gpt-test", base_url="http://a/v1", api_key="k2")
    )
    assert deployment_fingerprint(a) != deployment_fingerprint(
        Deployment("openai/gpt-test", base_url="http://b/v1", api_key="k1")
    )
    assert deployment_fingerprint(a) != deployment_fingerprint(
        Deployment("openai/gpt-other", base_url="http://a/v1", api_key="k1")
    )
    assert redis_target("redis://user:hunter2@db.example:6380/2") == "db.example:6380/2"


def test_a_deployment_naming_the_default_endpoint_shares_with_one_that_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both send to api.openai.com with the same key: one limit, not one each (which
    would let the two together send twice the provider's limit)."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    implicit = Deployment("openai/gpt-x", api_key=KEY, rpm=60)
    explicit = Deployment("openai/gpt-x", base_url="https://api.openai.com/v1/", api_key=KEY, rpm=60)
    assert deployment_fingerprint(implicit) == deployment_fingerprint(explicit)
    claude = Deployment("anthropic/claude-x", api_key=KEY)
    named = Deployment("anthropic/claude-x", base_url="https://api.anthropic.com", api_key=KEY)
    assert deployment_fingerprint(claude) == deployment_fingerprint(named)
    # a different endpoint set by the environment is a different deployment
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.example/anthropic")
    assert deployment_fingerprint(claude) != deployment_fingerprint(named)


async def test_down_redis_grants_nothing_unless_fail_open(caplog: pytest.LogCaptureFixture) -> None:
    from redis_server import _free_port

    dead = f"redis://:hunter2@127.0.0.1:{_free_port()}/0"  # nothing listens there
    closed = RedisLimits(dead)
    limiter = closed.limiter_factory(Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", rpm=600))
    with caplog.at_level(logging.WARNING, logger="sluice.redis"), pytest.raises(TimeoutError):
        await asyncio.wait_for(limiter.acquire(1), 0.5)
    assert closed.problem is not None
    assert "admission paused" in closed.problem
    assert "hunter2" not in caplog.text
    assert "hunter2" not in closed.problem
    await closed.close()

    async with FakeServer(rpm=600, window=1.0, api_key=KEY) as server:
        opened = RedisLimits(dead, fail_open=True)
        engine = Engine(deployment_at(server, rpm=600, window=1.0), limiter_factory=opened.limiter_factory)
        async with engine:
            results = await engine.run([Request.from_prompt("openai/gpt-test", f"q{i}", id=f"q{i}") for i in range(20)])
        assert all(r.ok for r in results)
        assert server.stats.rate_limited == 0
        assert not opened.healthy
        await opened.close()
    assert "local limits grant meanwhile (fail_open)" in caplog.text


async def test_reconcile_returns_unused_tokens_to_every_process(redis_server: RedisServer) -> None:
    # 1000 tokens per 10 s: a 600-token estimate leaves no room for another until it is
    # reconciled to 100; then a second process's 600 fits at once.
    d = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY, tpm=1000, window=10.0)
    one, two = RedisLimits(redis_server.url), RedisLimits(redis_server.url)
    first = await one.limiter_factory(d).acquire(600)
    other = two.limiter_factory(d)
    waiting = asyncio.ensure_future(other.acquire(600))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    first.reconcile(100)
    first.done()
    await one.connection.flush()
    # the pacer still spaces tokens evenly (100 tokens = 1 s at 1000 per 10 s)
    async with asyncio.timeout(3):
        (await waiting).done()
    await one.close()
    await two.close()


async def test_penalize_pauses_the_deployment_for_every_process(redis_server: RedisServer) -> None:
    d = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY, rpm=6000, window=60.0)
    one, two = RedisLimits(redis_server.url), RedisLimits(redis_server.url)
    one.limiter_factory(d).penalize(0.8)
    await one.connection.flush()
    started = time.monotonic()
    (await two.limiter_factory(d).acquire(1)).done()
    assert time.monotonic() - started >= 0.6
    await one.close()
    await two.close()


async def test_a_freed_slot_wakes_a_waiter_in_another_process_at_once(redis_server: RedisServer) -> None:
    d = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY, max_in_flight=1)
    one, two = RedisLimits(redis_server.url), RedisLimits(redis_server.url)  # leases of 30 s
    held = await one.limiter_factory(d).acquire(1)
    waiting = asyncio.ensure_future(two.limiter_factory(d).acquire(1))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    held.done()
    started = time.monotonic()
    async with asyncio.timeout(3):  # not the lease's 30 s: the release's message wakes it
        (await waiting).done()
    assert time.monotonic() - started < 1.0
    await one.close()
    await two.close()


async def test_a_lower_limit_from_headers_binds_every_process(redis_server: RedisServer) -> None:
    d = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY, rpm=6000, window=60.0)
    one, two = RedisLimits(redis_server.url), RedisLimits(redis_server.url)
    one.limiter_factory(d).observe(RateLimitSnapshot(limit_requests=60, requests_window=60.0))  # 1 a second
    await one.connection.flush()
    limiter = two.limiter_factory(d)
    (await limiter.acquire(1)).done()
    started = time.monotonic()
    (await limiter.acquire(1)).done()
    assert time.monotonic() - started >= 0.8  # paced at the learnt 1/s, not the configured 100/s
    await one.close()
    await two.close()


async def test_a_limit_learnt_from_headers_binds_every_process_when_none_is_configured(
    redis_server: RedisServer,
) -> None:
    """The usual worker has no rpm of its own (``Deployment(model)``) and learns the limit
    from the provider's headers: that limit must reach Redis and bind every process."""
    d = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    one, two = RedisLimits(redis_server.url), RedisLimits(redis_server.url)
    try:
        one.limiter_factory(d).observe(RateLimitSnapshot(limit_requests=6, requests_window=60.0))  # 1 in 10 s
        await one.connection.flush()
        limiter = two.limiter_factory(d)
        (await limiter.acquire(1)).done()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(limiter.acquire(1), 1.0)  # the next slot is 10 s away
    finally:
        await one.close()
        await two.close()


async def test_two_engines_share_a_token_limit(redis_server: RedisServer) -> None:
    # Tokens bind here (reserved at prompt + max_tokens, reconciled to the usage reported).
    tpm, window = 3_000, 1.0
    async with FakeServer(tpm=tpm, window=window, api_key=KEY, output_tokens=60) as server:
        limits = [RedisLimits(redis_server.url), RedisLimits(redis_server.url)]  # two connections, as two processes
        engines = [
            Engine(deployment_at(server, tpm=tpm, window=window), limiter_factory=x.limiter_factory) for x in limits
        ]
        async with engines[0], engines[1]:
            runs = [
                engine.run(
                    [
                        Request.from_prompt("openai/gpt-test", f"{tag} {i}", id=f"{tag}{i}", max_tokens=60)
                        for i in range(25)
                    ]
                )
                for tag, engine in zip("ab", engines, strict=True)
            ]
            results = [r for batch in await asyncio.gather(*runs) for r in batch]
        for x in limits:
            await x.close()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert server.stats.rate_limited == 0
    # the fake settles each request to its usage as we reconcile ours: more than one window's worth went
    assert sum(cost for _, cost in server.stats.arrivals) > tpm


async def test_an_error_from_redis_reaches_the_request_instead_of_hanging(redis_server: RedisServer) -> None:
    d = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY, rpm=600)
    client = aioredis.Redis.from_url(redis_server.url)
    await client.set(f"sluice:lim:{{{deployment_fingerprint(d)}}}:state", "not a hash")  # WRONGTYPE for the script
    limits = RedisLimits(redis_server.url)
    with pytest.raises(RedisFailed, match="WRONGTYPE"):
        await asyncio.wait_for(limits.limiter_factory(d).acquire(1), 5)
    assert limits.healthy  # an answer with an error is not an outage
    await client.aclose()
    await limits.close()
