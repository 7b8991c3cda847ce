"""Fairness between deployments and honest waits (issue 34, points 16 and 17): requests
waiting on one deployment's limiter lend their slots of the engine's gate, so a burst on
one deployment cannot starve another that has room (the gate still caps the requests at
work); and ``sluice serve`` predicts a wait from the deployment's own queue and schedule
(its window, pacer and burst), so it refuses only what its limits would not send in time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from fake_provider import deployment_at
from servetools import ENV, PRICE, UPSTREAM_KEY, listening

from sluice import Deployment, Engine, Price, Result, RetryPolicy
from sluice._gate import PriorityGate
from sluice._limits import pace_factor
from sluice.cli._config import JobConfig
from sluice.serve._app import build_app
from sluice.serve.core._queue import ServeLimiter
from sluice.serve.core._settings import ServeSettings
from sluice.store import SqliteStore
from sluice.testing import FakeServer, run_in_virtual_time

# -- the gate ------------------------------------------------------------------------------------


def test_an_idle_slot_goes_to_a_waiter_and_its_lender_comes_back_first() -> None:
    async def main() -> list[str]:
        gate = PriorityGate(1)
        order: list[str] = []
        assert gate.try_acquire()
        lease = gate.idle()  # the holder waits outside the gate

        async def newcomer(name: str, seq: int) -> None:
            await gate.acquire(0, seq)
            order.append(name)
            await asyncio.sleep(1)
            gate.release()

        first = asyncio.ensure_future(newcomer("first", 1))
        await asyncio.sleep(0.1)
        assert order == ["first"]  # lent the idle slot
        assert lease.lent
        second = asyncio.ensure_future(newcomer("second", 2))
        await asyncio.sleep(0.1)
        back = asyncio.ensure_future(gate.back(lease, 5, 0))  # a lower priority, and later: first all the same
        await asyncio.gather(first, back)
        order.append("lender")
        assert gate.held == 1
        gate.release()
        await second
        assert gate.held == 0
        return order

    assert run_in_virtual_time(main()) == ["first", "lender", "second"]


def test_a_wait_that_does_not_wait_keeps_its_slot() -> None:
    async def main() -> None:
        gate = PriorityGate(1)
        assert gate.try_acquire()
        waiter = asyncio.ensure_future(gate.acquire(0, 1))
        await asyncio.sleep(0)
        lease = gate.idle()
        await gate.back(lease, 0, 0)  # over before the loop ran again: nothing was lent
        assert not waiter.done()
        assert gate.held == 1
        gate.release()
        await waiter
        gate.release()
        assert gate.held == 0

    run_in_virtual_time(main())


def test_a_lender_cancelled_on_its_way_back_leaves_the_count_whole() -> None:
    async def main() -> None:
        gate = PriorityGate(1)
        assert gate.try_acquire()
        lease = gate.idle()
        taker = asyncio.ensure_future(gate.acquire(0, 1))
        await asyncio.sleep(0)
        await taker
        back = asyncio.ensure_future(gate.back(lease, 0, 0))
        await asyncio.sleep(0)
        back.cancel()
        await asyncio.gather(back, return_exceptions=True)
        gate.busy(lease)  # settled already: nothing more
        gate.release()  # the lender's (taken over the cap)
        gate.release()  # the taker's
        assert gate.held == 0
        assert gate.try_acquire()

    run_in_virtual_time(main())


# -- the engine ---------------------------------------------------------------------------------


def test_a_burst_on_one_deployment_leaves_another_its_own_window() -> None:
    """60 requests for model a, then 60 for b, each deployment 30 per 6 s, the gate 20 wide.
    Before: a's 20 waiters held the whole gate, and b sent nothing in the first window."""

    async def scenario() -> tuple[dict[str, list[float]], list[Result]]:
        arrivals: dict[str, list[float]] = {"a": [], "b": []}
        async with FakeServer(rpm=30, window=6.0) as a, FakeServer(rpm=30, window=6.0) as b:
            loop = asyncio.get_running_loop()
            a.on_arrival = lambda _: arrivals["a"].append(loop.time())
            b.on_arrival = lambda _: arrivals["b"].append(loop.time())
            deployments = [
                deployment_at(a, "openai/model-a", rpm=30, window=6.0),
                deployment_at(b, "openai/model-b", rpm=30, window=6.0),
            ]
            async with Engine(deployments, concurrency=20) as engine:
                start = loop.time()
                calls = [engine.complete("openai/model-a", f"a{i}", max_tokens=4) for i in range(60)]
                calls += [engine.complete("openai/model-b", f"b{i}", max_tokens=4) for i in range(60)]
                results = await asyncio.gather(*calls)
            assert a.stats.rate_limited == b.stats.rate_limited == 0
        return {m: [t - start for t in ts] for m, ts in arrivals.items()}, results

    arrivals, results = run_in_virtual_time(scenario())
    assert all(r.ok for r in results)
    for times in arrivals.values():
        assert len(times) == 60
        assert sum(t <= 6.0 for t in times) >= 29  # side by side: each its own window's worth
        assert max(times) < 13.0  # two windows each, not one deployment after the other


async def test_waiting_for_money_or_a_twin_lends_the_slot_too(tmp_path: Path) -> None:
    """Two slots; money for about two requests at once; a rate limit; copies of the same
    requests: requests holding money and a grant come back to the gate while its slots are
    held by requests waiting for that money, or for their twin in flight. Had either wait
    kept its slot, this would never end."""
    async with FakeServer(rpm=100, window=2.0, prices={"*": (1.0, 1.0)}) as server:
        deployment = deployment_at(server, rpm=100, window=2.0, price=Price(1.0, 1.0))
        store = SqliteStore(tmp_path / "state.db")
        async with Engine(deployment, concurrency=2, budget_usd=0.0025, store=store) as engine:
            prompts = [f"q{i % 7}" for i in range(60)]

            async def run() -> list[Result]:
                return [r async for r in engine.map(prompts, model="openai/gpt-test")]

            results = await asyncio.wait_for(run(), 120)
        store.close()
    assert len(results) == 60
    assert all(r.ok for r in results), {str(r.error) for r in results if not r.ok}
    assert server.stats.received == 7  # each once: the copies shared its answer


def test_the_gate_still_caps_the_requests_at_work() -> None:
    """Lent slots do not widen the cap: a limiter that grants a burst at once still sends
    no more at a time than ``concurrency``."""

    async def scenario() -> int:
        async with FakeServer(latency=2.0) as server:
            deployment = deployment_at(server, rpm=100, window=10.0, burst_requests=100)
            async with Engine(deployment, concurrency=4) as engine:
                results = [r async for r in engine.map([f"q{i}" for i in range(40)], model="openai/gpt-test")]
            assert all(r.ok for r in results)
            return server.stats.max_in_flight

    assert run_in_virtual_time(scenario()) == 4


# -- through sluice serve, with the official SDKs -----------------------------------------------


async def test_a_messages_burst_and_a_responses_burst_through_serve_go_side_by_side(tmp_path: Path) -> None:
    """The issue's run, smaller: Anthropic-SDK Messages calls to one deployment and
    openai-SDK Responses calls to another, each with its own upstream key and limit (20
    per 2 s), all at once through a server whose gate is 10 wide. Counted, not timed:
    of the first 40 requests the upstreams saw, each deployment had its share (before:
    35 and 5), and nothing was refused."""
    n, rpm, window = 40, 20, 2.0
    seen: list[str] = []
    async with (
        FakeServer(rpm=rpm, window=window, api_key=UPSTREAM_KEY) as claude_up,
        FakeServer(rpm=rpm, window=window, api_key=UPSTREAM_KEY) as gpt_up,
    ):
        claude_up.on_arrival = lambda _: seen.append("claude")
        gpt_up.on_arrival = lambda _: seen.append("gpt")
        limits: dict[str, Any] = {"rpm": rpm, "window": window, "price": PRICE, "api_key": UPSTREAM_KEY}
        deployments = (
            Deployment("anthropic/claude-test", base_url=claude_up.anthropic_url, **limits),
            Deployment("openai/gpt-test", base_url=gpt_up.url, **limits),
        )
        config = JobConfig(deployments, retry=RetryPolicy(max_attempts=3, base_delay=0.01), concurrency=10)
        app = build_app(config, ServeSettings(max_queue=4 * n, max_wait_s=60), (), tmp_path, environ=ENV)
        async with listening(app) as url:
            messages = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
            responses = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
            try:
                calls: list[Any] = [
                    messages.messages.create(
                        model="claude-test", max_tokens=8, messages=[{"role": "user", "content": f"m{i}"}]
                    )
                    for i in range(n)
                ]
                calls += [responses.responses.create(model="gpt-test", input=f"r{i}") for i in range(n)]
                outcomes = await asyncio.gather(*calls, return_exceptions=True)
            finally:
                await messages.close()
                await responses.close()
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
        assert claude_up.stats.rate_limited == gpt_up.stats.rate_limited == 0
    first = seen[: 2 * rpm]
    assert first.count("claude") >= rpm * 3 // 4, first
    assert first.count("gpt") >= rpm * 3 // 4, first


# -- wait predictions ---------------------------------------------------------------------------


def test_a_plain_windows_wait_is_predicted_as_the_window_admits_it() -> None:
    """300 per 60 s as a plain window (a burst of the whole limit): the 600th request waits
    one window, not the two minutes an even pace would take; an even pace is predicted as
    one. Before: 599 x 0.2 s = 120 s for both."""

    async def scenario() -> tuple[float, float]:
        window = ServeLimiter(requests=300, window=60.0, burst_requests=300)
        paced = ServeLimiter(requests=300, window=60.0)
        return window.eta(12, 599, None), paced.eta(12, 599, None)

    window, paced = run_in_virtual_time(scenario())
    assert window == pytest.approx(60.0, abs=0.1)
    assert paced == pytest.approx(599 * 60.0 / 300 * pace_factor(60.0))


async def test_serve_admits_what_the_deployments_windows_send_within_max_wait(tmp_path: Path) -> None:
    """Two deployments, each upstream a plain window of 20 per 4 s and each deployment
    told so (``burst_requests`` = its rpm). A first 20 for each fill their windows; then 20
    more for each at once, with a max wait of 6 s: each deployment sends them when its
    window turns, within 4 s, so none is refused. Before: every request the server held
    counted as queued ahead of each, at an even pace (up to 40 x 0.2 s), and most of the
    second wave was refused at once."""
    rpm, window = 20, 4.0
    async with (
        FakeServer(rpm=rpm, window=window, slice=None, api_key=UPSTREAM_KEY) as one,
        FakeServer(rpm=rpm, window=window, slice=None, api_key=UPSTREAM_KEY) as other,
    ):
        limits: dict[str, Any] = {"rpm": rpm, "window": window, "burst_requests": rpm, "price": PRICE}
        deployments = (
            deployment_at(one, "openai/gpt-one", api_key=UPSTREAM_KEY, **limits),
            deployment_at(other, "openai/gpt-other", api_key=UPSTREAM_KEY, **limits),
        )
        config = JobConfig(deployments, retry=RetryPolicy(max_attempts=1))
        app = build_app(config, ServeSettings(max_queue=200, max_wait_s=6), (), tmp_path, environ=ENV)
        async with listening(app) as url:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

            async def wave(name: str) -> list[Any]:
                calls = [
                    client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": f"{name} {model} {i}"}], max_tokens=8
                    )
                    for i in range(rpm)
                    for model in ("gpt-one", "gpt-other")
                ]
                return await asyncio.gather(*calls, return_exceptions=True)

            try:
                outcomes = await wave("first")
                outcomes += await wave("second")
            finally:
                await client.close()
        refused = [str(o)[:200] for o in outcomes if isinstance(o, BaseException)]
        assert refused == []
        assert one.stats.accepted == other.stats.accepted == 2 * rpm
        assert one.stats.rate_limited == other.stats.rate_limited == 0
