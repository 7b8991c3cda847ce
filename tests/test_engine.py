"""The engine end to end: real HTTP over loopback to the fake provider server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fake_provider import deployment_at

import sluice
from sluice import (
    AuthenticationError,
    BadRequestError,
    CallableProvider,
    CapacityError,
    Deployment,
    Engine,
    FatalProviderError,
    InvalidRequestError,
    LocalLimiter,
    NotFoundError,
    Price,
    Request,
    Result,
    RetryEvent,
    RetryPolicy,
    ServerError,
)
from sluice._errors import DeadlineExceededError
from sluice.store import SqliteStore
from sluice.testing import FakeServer, run_in_virtual_time

FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=2.0)


def prompts(n: int, model: str = "openai/gpt-test", **kwargs: Any) -> list[Request]:
    return [Request.from_prompt(model, f"question {i}", id=f"q{i}", **kwargs) for i in range(n)]


async def test_openai_round_trip(server: FakeServer) -> None:
    async with Engine(deployment_at(server)) as engine:
        result = await engine.complete("openai/gpt-test", "hello there", max_tokens=50)
    assert result.ok, result.error
    assert result.text == "echo: hello there"
    assert result.usage.input_tokens > 0
    assert result.usage.output_tokens == 16
    assert result.attempts == 1
    assert result.deployment == "openai/gpt-test"
    assert result.request_id is not None
    assert result.request_id.startswith("req_")
    assert result.raw is not None
    assert result.raw["object"] == "chat.completion"
    assert result.timings.total >= result.timings.latency > 0


async def test_a_deployments_own_headers_go_with_every_request_one_of_a_name(server: FakeServer) -> None:
    """``Deployment(headers=...)`` joins the provider's own: a name given again in another
    case replaces it (one Content-Type on the wire, the deployment's), and a new one is added."""
    seen: list[list[tuple[str, str]]] = []
    server.on_arrival = lambda headers: seen.append(list(headers.items()))
    own = {"Content-Type": "application/json; charset=utf-8", "X-Team": "search"}
    async with Engine(deployment_at(server, headers=own)) as engine:
        results = [await engine.complete("openai/gpt-test", f"hello {i}") for i in range(2)]
    assert all(result.ok for result in results), [result.error for result in results]
    assert len(seen) == 2
    for headers in seen:
        content_types = [value for name, value in headers if name.lower() == "content-type"]
        assert content_types == ["application/json; charset=utf-8"]
        assert [value for name, value in headers if name.lower() == "x-team"] == ["search"]
        assert [value for name, value in headers if name.lower() == "authorization"] == ["Bearer sk-test"]


async def test_anthropic_round_trip(server: FakeServer) -> None:
    deployment = Deployment("anthropic/claude-test", base_url=server.anthropic_url, api_key="sk-test")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi claude"}]
    async with Engine(deployment) as engine:
        result = await engine.complete("anthropic/claude-test", messages, max_tokens=100)
    assert result.ok, result.error
    assert result.text == "echo: hi claude"
    assert result.finish_reason == "stop"  # Anthropic's end_turn, in the common (OpenAI) shape
    assert result.usage.output_tokens == 16


async def test_wrong_key_fails_at_once_and_never_shows_the_key(server: FakeServer) -> None:
    deployment = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-wrong-secret")
    async with Engine(deployment, retry=FAST_RETRY) as engine:
        result = await engine.complete("openai/gpt-test", "hi")
    assert isinstance(result.error, AuthenticationError)
    assert result.attempts == 1
    assert server.stats.received == 1
    assert "sk-wrong-secret" not in str(result.error) + repr(result) + repr(engine)


@pytest.mark.parametrize(("fault", "error_cls"), [("400", BadRequestError), ("404", NotFoundError)])
async def test_client_errors_are_not_retried(server: FakeServer, fault: str, error_cls: type) -> None:
    server.inject(fault, times=5)
    async with Engine(deployment_at(server), retry=FAST_RETRY) as engine:
        result = await engine.complete("openai/gpt-test", "hi")
    assert isinstance(result.error, error_cls)
    assert result.attempts == 1
    assert server.stats.received == 1
    assert f"HTTP {fault}" in str(result.error)


@pytest.mark.parametrize("fault", ["500", "502", "503", "529", "reset", "malformed", "truncated", "empty_choices"])
async def test_transient_faults_are_retried_then_succeed(server: FakeServer, fault: str) -> None:
    server.inject(fault, times=2)
    retries: list[RetryEvent] = []
    async with Engine(deployment_at(server), retry=FAST_RETRY, on_retry=retries.append) as engine:
        result = await engine.complete("openai/gpt-test", "hi")
    assert result.ok, result.error
    assert result.attempts == 3
    assert [event.attempt for event in retries] == [1, 2]
    assert server.stats.accepted == 1


@pytest.mark.parametrize("fault", ["503", "reset", "malformed", "truncated"])
async def test_persistent_faults_are_reported_after_the_attempt_budget(server: FakeServer, fault: str) -> None:
    server.inject(fault, times=10)
    async with Engine(deployment_at(server), retry=FAST_RETRY) as engine:
        result = await engine.complete("openai/gpt-test", "hi")
    assert not result.ok
    assert isinstance(result.error, sluice.RetryableError)
    assert result.attempts == FAST_RETRY.max_attempts
    assert server.stats.received == FAST_RETRY.max_attempts


async def test_a_garbled_usage_object_is_a_malformed_response() -> None:
    from collections.abc import Mapping

    from sluice import MalformedResponseError
    from sluice.providers import HttpTransport, OpenAIProvider, Reply

    class Garbled(OpenAIProvider):
        def parse_reply(self, body: Mapping[str, Any]) -> Reply:
            return super().parse_reply({**body, "usage": {"prompt_tokens_details": 7}})

    async with FakeServer(api_key="sk-test") as server:
        transport = HttpTransport()
        deployment = deployment_at(server, provider=Garbled(transport))
        async with Engine(deployment, retry=RetryPolicy(max_attempts=2, base_delay=0.01)) as engine:
            result = await engine.complete("openai/gpt-test", "hi")
        await transport.aclose()
    assert isinstance(result.error, MalformedResponseError)
    assert "unexpected body (AttributeError" in str(result.error)
    assert result.attempts == 2


async def test_an_absurd_usage_count_is_a_malformed_answer_not_a_dead_store(tmp_path: Path) -> None:
    async def huge(request: web.Request) -> web.Response:
        await request.read()
        body = {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2**64 - 1, "completion_tokens": -100000},
        }
        return web.json_response(body)

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
    store = SqliteStore(tmp_path / "state.db")
    try:
        deployment = Deployment("openai/gpt-x", base_url=url, api_key="sk-x", price=sluice.Price(1.0, 1.0))
        policy = RetryPolicy(max_attempts=2, base_delay=0.01)
        async with Engine(deployment, store=store, retry=policy, budget_usd=1.0) as engine:
            result = await asyncio.wait_for(engine.complete("openai/gpt-x", "hi", max_tokens=10), 10)
            assert result.error is not None
            assert result.error.kind == "malformed_response"
            assert engine.spent() > 0  # charged its worst case, never a negative cost
            assert engine.store_error is None
    finally:
        store.close()
        await runner.cleanup()


async def test_a_hang_times_out_and_is_retried(server: FakeServer) -> None:
    server.inject("hang", times=1)
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, attempt_timeout=0.3)
    async with Engine(deployment_at(server), retry=policy) as engine:
        result = await engine.complete("openai/gpt-test", "hi")
    assert result.ok, result.error
    assert result.attempts == 2


async def test_x_should_retry_false_is_obeyed(server: FakeServer) -> None:
    server.inject("x_should_retry_false", times=3)
    async with Engine(deployment_at(server), retry=FAST_RETRY) as engine:
        result = await engine.complete("openai/gpt-test", "hi")
    assert isinstance(result.error, ServerError)
    assert result.attempts == 1


async def test_deadline_stops_retries_that_could_not_finish_in_time(server: FakeServer) -> None:
    server.inject("503", times=5, retry_after=5.0)
    policy = RetryPolicy(max_attempts=5, deadline=1.0)
    async with Engine(deployment_at(server), retry=policy) as engine:
        result = await engine.complete("openai/gpt-test", "hi")
    assert isinstance(result.error, ServerError)
    assert result.attempts == 1  # waiting 5 s would pass the 1 s deadline: give up now


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


def test_a_burst_allowance_sends_that_many_at_once_then_paces() -> None:
    """``burst_requests=5`` at 60 a minute: six calls leave at once, the seventh a second later."""
    sent: list[float] = []

    async def answer(request: Request) -> str:
        sent.append(asyncio.get_running_loop().time())
        return "ok"

    async def scenario() -> None:
        deployment = Deployment("mine/x", provider=CallableProvider(answer), rpm=60, burst_requests=5)
        async with Engine(deployment) as engine:
            results = await asyncio.gather(*(engine.complete("mine/x", f"q{i}") for i in range(8)))
        assert all(result.ok for result in results)

    run_in_virtual_time(scenario())
    start = sent[0]
    assert [t - start for t in sent] == pytest.approx([0.0] * 6 + [1.0, 2.0], abs=0.02)  # (the pace margin)


class _HeldBack:
    """A LocalLimiter's reservation whose send pacer holds it back ``hold`` seconds (as
    when the requests before it left late): the engine must wait before it sends."""

    def __init__(self, inner: Any, hold: float) -> None:
        self._inner, self._hold = inner, hold

    def send_delay(self, now: float) -> float:
        self._inner.send_delay(now)
        return self._hold

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _PacedLimiter(LocalLimiter):
    """Grants at once (no limit), each reservation held back 5 s by the pacer."""

    def try_acquire(self, tokens: int, *, output: int = 0) -> Any:
        granted = super().try_acquire(tokens, output=output)
        return None if granted is None else _HeldBack(granted, 5.0)


def test_a_request_the_send_pacer_holds_back_leaves_when_it_says() -> None:
    sent: list[float] = []

    async def answer(request: Request) -> str:
        sent.append(asyncio.get_running_loop().time())
        return "ok"

    async def scenario() -> tuple[float, list[Result]]:
        deployment = Deployment("mine/x", provider=CallableProvider(answer))
        async with Engine(deployment, limiter_factory=lambda d: _PacedLimiter(name=d.label)) as engine:
            start = asyncio.get_running_loop().time()
            return start, await asyncio.gather(*(engine.complete("mine/x", f"q{i}") for i in range(3)))

    start, results = run_in_virtual_time(scenario())
    assert all(result.ok for result in results)
    assert [t - start for t in sent] == pytest.approx([5.0] * 3, abs=0.01)


def test_a_stop_while_the_send_pacer_holds_a_map_request_back_sends_nothing() -> None:
    sent: list[str] = []

    async def answer(request: Request) -> str:
        sent.append(str(request.messages[0]["content"]))
        return "ok"

    async def scenario() -> list[Result]:
        deployment = Deployment("mine/x", provider=CallableProvider(answer))
        async with Engine(deployment, limiter_factory=lambda d: _PacedLimiter(name=d.label)) as engine:
            loop = asyncio.get_running_loop()
            loop.call_later(1.0, engine.stop)  # before the pacer's 5 s are up
            return [result async for result in engine.map([f"q{i}" for i in range(3)], model="mine/x")]

    results = run_in_virtual_time(scenario())
    assert sent == []
    assert len(results) == 3
    assert all(not result.ok and result.error is not None and result.error.kind == "cancelled" for result in results)


async def test_a_429_pauses_the_whole_deployment_for_retry_after(server: FakeServer) -> None:
    loop = asyncio.get_running_loop()
    server.inject("429", times=1, retry_after=0.4)
    paused = asyncio.Event()  # the engine heard the 429 (on_retry is told after the pause is set)
    async with Engine(deployment_at(server), retry=FAST_RETRY, on_retry=lambda _: paused.set()) as engine:
        first = asyncio.create_task(engine.complete("openai/gpt-test", "first"))
        await paused.wait()
        paused_at = loop.time()
        others = await asyncio.gather(*(engine.complete("openai/gpt-test", f"q{i}") for i in range(5)))
        await first
    assert all(r.ok for r in [first.result(), *others])
    # nobody was sent before the pause ended, not only the request that drew the 429
    accepted_times = [t for t, _ in server.stats.arrivals]
    assert len(accepted_times) == 6
    assert min(accepted_times) >= paused_at + 0.3
    assert engine.stats.rate_limited == 1


async def test_a_429_storm_loses_nothing() -> None:
    # The client is told nothing about the limit; the server allows 20 per 0.5 s
    # (the deployment's window says what unit the provider's limits are counted in).
    async with FakeServer(rpm=20, window=0.5, api_key="sk-test") as server:
        policy = RetryPolicy(max_attempts=30, base_delay=0.02, max_delay=0.2)
        # max_in_flight says "send this many at once" (no adaptive slow start): a storm follows
        async with Engine(deployment_at(server, window=0.5, max_in_flight=200), retry=policy) as engine:
            results = await engine.run(prompts(120))
        assert len(results) == 120
        assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
        assert [r.id for r in results] == [f"q{i}" for i in range(120)]
        assert server.stats.accepted == 120
        assert server.stats.duplicate_successes == 0
        assert engine.stats.rate_limited == server.stats.rate_limited > 0
        # it learnt the limit from the x-ratelimit headers
        assert engine.limiter("openai/gpt-test").requests_limit == 20  # type: ignore[attr-defined]


async def test_within_configured_limits_the_server_never_says_429() -> None:
    async with FakeServer(rpm=40, tpm=4_000, window=0.5, api_key="sk-test") as server:
        deployment = deployment_at(server, rpm=40, tpm=4_000, window=0.5)
        async with Engine(deployment, retry=FAST_RETRY) as engine:
            results = await engine.run(prompts(100, max_tokens=30))
        assert all(r.ok for r in results)
        assert server.stats.rate_limited == 0
        assert engine.stats.retries == 0


async def test_priority_request_overtakes_a_queued_batch(server: FakeServer) -> None:
    order: list[str] = []
    five_done = asyncio.Event()

    def note(result: Result) -> None:
        order.append(result.id)
        if len(order) == 5:
            five_done.set()

    deployment = deployment_at(server, rpm=100, window=1.0)  # one request every 10 ms
    async with Engine(deployment, on_result=note) as engine:
        batch = asyncio.create_task(engine.run(prompts(60)))
        await five_done.wait()
        urgent = await engine.complete("openai/gpt-test", "urgent!", id="urgent")
        batch_results = await batch
    assert urgent.ok
    assert all(r.ok for r in batch_results)
    # ~55 batch items were queued when it arrived; it went next, or nearly (one may be
    # granted in the same tick)
    assert order.index("urgent") <= 7


async def test_cancellation_leaves_no_stray_tasks_and_reports_in_flight(server: FakeServer) -> None:
    server.latency = 0.2
    seen: list[Result] = []
    async with Engine(deployment_at(server), concurrency=8, on_result=seen.append) as engine:

        async def consume() -> None:
            async for _ in engine.map(prompts(100)):
                pass

        consumer = asyncio.create_task(consume())
        await server.until(lambda: server.in_flight >= 8)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert not engine_tasks()
    cancelled = [r for r in seen if r.error is not None and r.error.kind == "cancelled"]
    sent = [r for r in cancelled if "was sent" in str(r.error)]
    assert len(sent) == 8  # each in-flight request is accounted for, none silently dropped
    # and the one item taken from the source while it waited for a slot, never sent
    assert [str(r.error) for r in cancelled if r not in sent] in ([], ["not started: the engine was stopping"])


async def test_a_call_waiting_beside_a_map_is_served_by_priority() -> None:
    """One slot, a map's items and a call waiting for it: the slot each item frees goes by
    priority, so a lower-priority call waits behind the map's remaining items and a
    higher-priority one goes next (a hand-off that kept the slot for the map's next item,
    or gave it to whoever waited, fails one of the two)."""
    order: list[str] = []
    calls: list[asyncio.Task[Result]] = []
    setup: dict[str, Any] = {}

    async def answer(request: Request) -> str:
        if not calls:  # the first item holds the one slot: the call queues for it meanwhile
            call = setup["engine"].complete("local/echo", "call", id="call", priority=setup["call_priority"])
            calls.append(asyncio.create_task(call))
            for _ in range(3):
                await asyncio.sleep(0)
        return "ok"

    deployment = Deployment("local/echo", provider=CallableProvider(answer, name="local"))
    for map_priority, call_priority, call_at in ((0, 100, 5), (100, 0, 1)):
        order.clear()
        calls.clear()
        async with Engine([deployment], concurrency=1, on_result=lambda r: order.append(r.request.id)) as engine:
            setup.update(engine=engine, call_priority=call_priority)
            items = [Request.from_prompt("local/echo", f"item {i}", id=f"m{i}") for i in range(5)]
            assert all([r.ok async for r in engine.map(items, priority=map_priority)])
            assert (await calls[0]).ok
        assert order.index("call") == call_at, (map_priority, order)


def engine_tasks() -> list[asyncio.Task[Any]]:
    """Tasks running the engine's code (the fake server's handler tasks are not counted)."""
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "").startswith(("Engine.", "aiterate", "fan_out"))
    ]


async def test_breaking_out_of_map_cancels_the_rest(server: FakeServer) -> None:
    async with Engine(deployment_at(server), concurrency=4) as engine:
        async with contextlib.aclosing(engine.map(prompts(50))) as results:
            async for result in results:
                assert result.ok
                if result.index == 2:
                    break
        assert not engine_tasks()  # closed at once
        async for _ in engine.map(prompts(50)):
            break
        # a plain break leaves closing to the loop's async-generator finalizer: soon, not never
        for _ in range(100):
            if not engine_tasks():
                break
            await asyncio.sleep(0)
        assert not engine_tasks()
    assert server.stats.received < 30


async def test_leaving_map_early_never_leaks_a_concurrency_slot() -> None:
    async def answer(request: Request) -> str:
        await asyncio.sleep(0)
        return "ok"

    deployment = Deployment("local/echo", provider=CallableProvider(answer, name="local"))
    async with Engine([deployment], concurrency=8, buffer=2) as engine:
        for round_ in range(60):
            prompts = [f"r{round_} q{i}" for i in range(40)]
            async with contextlib.aclosing(engine.map(prompts, model="local/echo")) as results:
                taken = 0
                async for _ in results:
                    taken += 1
                    if taken == 1 + round_ % 4:
                        break
        assert engine.runtime.gate.held == 0
        assert (await asyncio.wait_for(engine.complete("local/echo", "still here?"), 5)).ok


async def test_map_back_pressures_a_huge_generator(server: FakeServer) -> None:
    pulled = 0

    def source() -> Iterator[Request]:
        nonlocal pulled
        for i in range(10_000_000):
            pulled += 1
            yield Request.from_prompt("openai/gpt-test", f"q{i}")

    async with Engine(deployment_at(server), concurrency=4, buffer=16) as engine:
        consumed = 0
        async for _ in engine.map(source()):
            consumed += 1
            assert pulled - consumed <= 16 + 1
            if consumed == 200:
                break
    assert pulled < 300


async def test_ordered_map_and_bad_items_become_results(server: FakeServer) -> None:
    items: list[Any] = [
        "plain prompt",
        {"messages": [{"role": "user", "content": "dict item"}], "max_tokens": 5},
        {"messages": []},
        {"prompt": "wrong field"},
        42,
        Request.from_prompt("nobody/model", "unknown provider"),
    ]
    async with Engine(deployment_at(server)) as engine:
        results = [r async for r in engine.map(items, model="openai/gpt-test", ordered=True)]
    assert [r.index for r in results] == list(range(6))
    assert [r.ok for r in results] == [True, True, False, False, False, False]
    assert "messages is empty" in str(results[2].error)
    assert "unknown field(s) ['prompt']" in str(results[3].error)
    assert "cannot make a request from a int" in str(results[4].error)
    assert "unknown provider 'nobody'" in str(results[5].error)
    assert engine.stats.submitted == 6


async def test_an_odd_item_is_an_error_result_not_a_hang() -> None:
    async with FakeServer(api_key="sk-test") as server, Engine(deployment_at(server)) as engine:
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


async def test_impossible_requests_are_refused_before_sending(server: FakeServer) -> None:
    async with Engine(deployment_at(server, tpm=1_000)) as engine:
        with pytest.raises(CapacityError, match="lower max_tokens"):
            await engine.complete("openai/gpt-test", "hi", max_tokens=5_000)
        with pytest.raises(InvalidRequestError, match="messages is empty"):
            await engine.complete("openai/gpt-test", [])
        results = await engine.run([Request.from_prompt("openai/gpt-test", "hi", max_tokens=5_000)])
    assert isinstance(results[0].error, CapacityError)
    assert server.stats.received == 0


async def test_sync_facade_works_inside_a_running_loop() -> None:
    with FakeServer(api_key="sk-test").running_in_thread() as server:
        deployment = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test")
        results = sluice.run(["a", "b", "c"], model="openai/gpt-test", deployments=[deployment])
        one = sluice.complete("openai/gpt-test", "d", deployments=[deployment])
    assert [r.text for r in results] == ["echo: a", "echo: b", "echo: c"]
    assert one.text == "echo: d"


def test_sync_facade_without_a_loop() -> None:
    results = sluice.run(
        ["x", "y"],
        deployments=[Deployment("simulate/demo", options={"latency": 0.01})],
        model="simulate/demo",
    )
    assert [r.ok for r in results] == [True, True]
    assert results[0].text is not None
    assert "[simulated reply" in results[0].text


async def test_close_drains_in_flight_work(server: FakeServer) -> None:
    server.latency = 0.1
    engine = Engine(deployment_at(server))
    tasks = [asyncio.create_task(engine.complete("openai/gpt-test", f"q{i}")) for i in range(5)]
    await server.until(lambda: server.in_flight > 0)
    await engine.close()
    assert all(t.done() and t.result().ok for t in tasks)
    with pytest.raises(sluice.EngineClosedError):
        await engine.complete("openai/gpt-test", "late")


async def test_stats_count_everything(server: FakeServer) -> None:
    server.inject("500", times=1)
    server.inject("400", times=1)
    async with Engine(deployment_at(server), retry=FAST_RETRY) as engine:
        results = await engine.run(prompts(10))
    stats = engine.stats.snapshot()
    assert stats["submitted"] == 10
    assert stats["succeeded"] + stats["failed"] == 10
    assert stats["failed"] == 1
    assert stats["errors"] == {"bad_request": 1}
    assert stats["retries"] == 1
    assert stats["attempts"] == 11
    assert stats["output_tokens"] == 16 * 9
    assert stats["latency_p50"] is not None
    assert sum(r.ok for r in results) == 9


async def test_callable_provider_wraps_any_async_function() -> None:
    calls = 0

    async def model(request: Request) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise sluice.RateLimitError("busy", retry_after=0.01)
        return f"you said {request.messages[-1]['content']}"

    deployment = Deployment("mine/echo", provider=sluice.CallableProvider(model, name="mine"))
    async with Engine(deployment, retry=FAST_RETRY) as engine:
        result = await engine.complete("mine/echo", "ping")
    assert result.text == "you said ping"
    assert result.attempts == 2


def test_an_engine_runs_on_one_loop_after_another_whatever_it_is_asked_first() -> None:
    """The attempt core reads the running loop as the job's making left it (no property
    call a request): every way a job is made must ask for it, embeddings as well as chat,
    or an attempt would time itself on no loop, or on the last run's closed one."""
    engine = Engine(Deployment("simulate/demo", options={"latency": 0.001}), concurrency=4)

    async def embeddings_first(tag: str) -> tuple[int, bool, int]:
        vectors = await engine.embed([f"a {tag}", f"b {tag}"], model="simulate/demo")
        answer = await engine.complete("simulate/demo", f"one {tag}")
        mapped = [r async for r in engine.map([f"q{i} {tag}" for i in range(6)], model="simulate/demo")]
        return len(vectors), answer.ok, sum(r.ok for r in mapped)

    assert asyncio.run(embeddings_first("first")) == (2, True, 6)
    assert asyncio.run(embeddings_first("second")) == (2, True, 6)

    async def chat_then_close() -> bool:
        answer = await engine.complete("simulate/demo", "third")
        await engine.close()
        return answer.ok

    assert asyncio.run(chat_then_close())


async def test_a_request_over_a_mebibyte_is_sent_without_a_warning(server: FakeServer) -> None:
    """A long document (or a base64 image) makes a body past aiohttp's 1 MiB mark for raw
    bytes, where it warns that the body may block the loop; the suite's warnings are
    errors, so before the body went as a BytesIO this request failed before it was sent."""
    document = "word " * 300_000  # 1.5 MB
    async with Engine(deployment_at(server), retry=FAST_RETRY) as engine:
        result = await engine.complete("openai/gpt-test", document, max_tokens=10)
    assert result.ok, result.error
    assert server.stats.received == 1
    assert result.usage.input_tokens > 100_000
