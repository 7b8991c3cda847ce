"""Regressions from the code review: each test once failed (hung, leaked or paid twice)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sluice import (
    CallableProvider,
    CancelledError,
    Deployment,
    Engine,
    FatalProviderError,
    LocalLimiter,
    Price,
    RateLimitSnapshot,
    Request,
    Result,
    RetryPolicy,
)
from sluice._errors import ConfigError, DeadlineExceededError
from sluice.store import SqliteStore
from sluice.testing import FakeServer
from sluice.testing._virtual_time import run_in_virtual_time


def _deployment(server: FakeServer, **kwargs: Any) -> Deployment:
    return Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test", **kwargs)


async def test_an_odd_item_is_an_error_result_not_a_hang() -> None:
    async with FakeServer(api_key="sk-test") as server, Engine(_deployment(server)) as engine:
        results = await asyncio.wait_for(
            engine.run(
                [
                    {"messages": [{"role": "user", "content": "fine"}]},
                    {"messages": [{"role": "user", "content": "fine"}], "temperature": 10**400},
                    {"messages": [{"role": "user", "content": "lone \ud800 surrogate"}]},
                ],
                model="openai/gpt-test",
            ),
            timeout=20,
        )
    assert results[0].ok
    assert "temperature must be a number" in str(results[1].error)
    assert "not valid Unicode" in str(results[2].error)


async def test_a_provider_bug_fails_its_request_and_frees_its_slot() -> None:
    async def broken(request: Request) -> str:
        raise RuntimeError("oops")

    class Buggy(CallableProvider):
        async def send(self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None) -> Any:
            raise AttributeError("'int' object has no attribute 'get'")

    deployment = Deployment("mine/x", provider=Buggy(broken, name="buggy"), max_in_flight=1, price=Price(1, 1))
    async with Engine(deployment, budget_usd=1.0) as engine:
        results = await asyncio.wait_for(engine.run([f"q{i}" for i in range(3)], model="mine/x"), timeout=20)
        limiter = engine.limiter("mine/x")
        assert isinstance(limiter, LocalLimiter)
        assert limiter.in_flight == 0
        budget = engine.spending.budget
        assert budget is not None
        assert budget.reserved() == 0.0
    assert all(isinstance(r.error, FatalProviderError) for r in results)
    assert "AttributeError" in str(results[0].error)


async def test_a_garbled_usage_object_is_a_malformed_response() -> None:
    from collections.abc import Mapping

    from sluice import MalformedResponseError
    from sluice.providers import HttpTransport, OpenAIProvider, Reply

    class Garbled(OpenAIProvider):
        def parse_reply(self, body: Mapping[str, Any]) -> Reply:
            return super().parse_reply({**body, "usage": {"prompt_tokens_details": 7}})

    async with FakeServer(api_key="sk-test") as server:
        transport = HttpTransport()
        deployment = _deployment(server, provider=Garbled(transport))
        async with Engine(deployment, retry=RetryPolicy(max_attempts=2, base_delay=0.01)) as engine:
            result = await engine.complete("openai/gpt-test", "hi")
        await transport.aclose()
    assert isinstance(result.error, MalformedResponseError)
    assert "unexpected body (AttributeError" in str(result.error)
    assert result.attempts == 2


async def test_timed_out_attempts_are_charged_to_the_budget() -> None:
    async with FakeServer(api_key="sk-test", latency=1.0, prices={"gpt-test": (2.0, 8.0)}) as server:
        policy = RetryPolicy(max_attempts=2, base_delay=0.01, attempt_timeout=0.2)
        async with Engine(_deployment(server, price=Price(2.0, 8.0)), budget_usd=1.0, retry=policy) as engine:
            result = await engine.complete("openai/gpt-test", "slow", max_tokens=100)
            spent = engine.spent()
        await asyncio.sleep(1.0)  # the server finishes (and bills) what we gave up on
        assert not result.ok
        assert result.cost_usd is not None
        assert result.cost_usd > 0
        assert spent >= server.total_billed_usd  # never less than what was billed


async def test_identical_requests_waiting_at_the_gate_are_not_sent_twice(tmp_path: Path) -> None:
    async with FakeServer(api_key="sk-test") as server:
        store = SqliteStore(tmp_path / "s.db")
        async with Engine(_deployment(server), store=store, concurrency=1) as engine:
            results = await engine.run(["same"] * 3, model="openai/gpt-test")
        store.close()
    assert all(r.ok for r in results)
    assert server.stats.received == 1


async def test_a_cancelled_leader_does_not_make_every_follower_send(tmp_path: Path) -> None:
    async with FakeServer(api_key="sk-test", latency=0.3) as server:
        store = SqliteStore(tmp_path / "s.db")
        async with Engine(_deployment(server), store=store) as engine:
            leader = asyncio.create_task(engine.complete("openai/gpt-test", "same"))
            await asyncio.sleep(0.05)
            followers = [asyncio.create_task(engine.complete("openai/gpt-test", "same")) for _ in range(5)]
            await asyncio.sleep(0.05)
            leader.cancel()
            results = await asyncio.gather(*followers)
        store.close()
    assert all(r.ok for r in results)
    assert server.stats.received == 2  # the cancelled leader's, and one follower's


def test_stop_does_not_send_what_is_still_queued() -> None:
    sent: list[float] = []

    async def answer(request: Request) -> str:
        sent.append(asyncio.get_running_loop().time())
        return "ok"

    async def scenario() -> list[Result]:
        deployment = Deployment("mine/x", provider=CallableProvider(answer), rpm=60)
        async with Engine(deployment) as engine:
            results: list[Result] = []

            async def consume() -> None:
                async for result in engine.map([f"q{i}" for i in range(100)], model="mine/x"):
                    results.append(result)

            consumer = asyncio.create_task(consume())
            await asyncio.sleep(2.5)
            engine.stop()
            await consumer
            return results

    results = run_in_virtual_time(scenario())
    assert len(sent) == 3  # at 0, 1 and 2 s; nothing after the stop
    assert sum(r.ok for r in results) == 3
    assert all(isinstance(r.error, CancelledError) for r in results if not r.ok)


def test_the_deadline_bounds_the_wait_for_capacity() -> None:
    calls = 0

    async def answer(request: Request) -> str:
        nonlocal calls
        calls += 1
        return "ok"

    async def scenario() -> Result:
        deployment = Deployment("mine/x", provider=CallableProvider(answer))
        async with Engine(deployment, retry=RetryPolicy(deadline=900)) as engine:
            engine.limiter("mine/x").penalize(3600)  # a 429 said: come back in an hour
            return await engine.complete("mine/x", "hi")

    result = run_in_virtual_time(scenario())
    assert isinstance(result.error, DeadlineExceededError)
    assert calls == 0


async def test_a_bare_model_name_uses_the_configured_deployment() -> None:
    async with FakeServer(api_key="sk-test") as server:
        deployment = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test", rpm=600)
        async with Engine(deployment) as engine:
            result = await engine.complete("gpt-test", "hi")
            assert result.deployment == "openai/gpt-test"
            assert len(engine.deployments) == 1


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf"])
def test_nonsense_limit_headers_are_ignored(bad: str) -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=100, window=60.0, burst_requests=10)
        limiter.observe(RateLimitSnapshot(limit_requests=float(bad)))
        if bad != "0":  # remaining 0 is a real answer: wait for the reset
            limiter.observe(RateLimitSnapshot(remaining_requests=float(bad), reset_requests=1.0))
        (await limiter.acquire(1)).done()
        return loop.time()

    assert run_in_virtual_time(scenario()) == 0.0


def test_two_engines_sharing_a_limiter_do_not_break_its_queue() -> None:
    async def scenario() -> int:
        shared = LocalLimiter(requests=10, window=1.0)
        granted = 0

        async def take(seq: int) -> None:
            nonlocal granted
            (await shared.acquire(1, priority=0, seq=seq)).done()
            granted += 1

        await asyncio.gather(*(take(i % 3) for i in range(30)))  # equal (priority, seq) pairs
        return granted

    assert run_in_virtual_time(scenario()) == 30


def test_less_than_one_request_per_window_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 1 per window"):
        Deployment("openai/x", rpm=0.5)


async def test_two_closes_at_once_both_return() -> None:
    async def slow(request: Request) -> str:
        await asyncio.sleep(0.1)
        return "ok"

    engine = Engine(Deployment("mine/x", provider=CallableProvider(slow)))
    task = asyncio.create_task(engine.complete("mine/x", "hi"))
    await asyncio.sleep(0.01)
    await asyncio.wait_for(asyncio.gather(engine.close(), engine.close()), timeout=5)
    assert task.result().ok


async def test_n_choices_are_counted_in_tokens_and_worst_case() -> None:
    from sluice.providers import max_output_tokens

    request = Request("openai/x", [{"role": "user", "content": "hi"}], max_tokens=100, params={"n": 8})
    assert max_output_tokens(request, Deployment("openai/x")) == 800


def test_a_second_run_on_the_same_output_is_refused(tmp_path: Path) -> None:
    from sluice.batch._runner import _exclusive

    state = tmp_path / "out.sluice.db"
    with _exclusive(state), pytest.raises(ConfigError, match="in use by a running sluice job"), _exclusive(state):
        pass


def test_record_counts_handle_blank_lines_crlf_and_quoted_newlines(tmp_path: Path) -> None:
    from sluice.batch._inputs import InputOptions, Template, count_records

    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes(b'{"messages": []}\r\n\r\n  \n{"messages": []}\n\n\n')
    assert count_records(jsonl, InputOptions()) == 2
    table = tmp_path / "a.csv"
    table.write_text('name,notes\nx,"two\nlines"\ny,plain\n\n')
    assert count_records(table, InputOptions(template=Template("{name}"))) == 2
