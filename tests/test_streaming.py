"""Streaming through the engine: real SSE over loopback to the fake provider server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fake_provider import deployment_at

from sluice import (
    AttemptTimeoutError,
    BudgetExhaustedError,
    CallableProvider,
    CancelledError,
    ConnectError,
    Deployment,
    Engine,
    OverloadedError,
    Price,
    Request,
    Result,
    RetryEvent,
    RetryPolicy,
    ServerError,
    Usage,
    store_key,
)
from sluice.providers import StreamEvent, ToolCallDelta, UsageUpdate
from sluice.providers._sse import SseDecoder, SseEvent
from sluice.store import SqliteStore
from sluice.testing import FakeServer

PRICE = Price(input_per_mtok=2.0, output_per_mtok=8.0)
FAST = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=10.0)
PROMPT = "tell me about sluices and weirs today"


def openai(server: FakeServer, **kwargs: Any) -> Deployment:
    return deployment_at(server, price=PRICE, **kwargs)


def anthropic(server: FakeServer, **kwargs: Any) -> Deployment:
    return deployment_at(server, "anthropic/claude-test", price=PRICE, **kwargs)


APIS: dict[str, tuple[str, Callable[..., Deployment]]] = {
    "openai": ("openai/gpt-test", openai),
    "anthropic": ("anthropic/claude-test", anthropic),
}


def fake(**kwargs: Any) -> FakeServer:
    kwargs.setdefault("latency", 0.2)
    return FakeServer(api_key="sk-test", prices={"*": (2.0, 8.0)}, **kwargs)


async def read(engine: Engine, *args: Any, **fields: Any) -> tuple[list[str], Result]:
    async with engine.stream(*args, **fields) as stream:
        deltas = [delta async for delta in stream]
    return deltas, stream.result


def worst_case(engine: Engine, result: Result) -> float:
    assert result.request is not None
    return engine.spending.worst_cost(result.request, engine.deployments[0])


@pytest.mark.parametrize("api", APIS)
async def test_deltas_arrive_as_written_and_join_to_the_result(api: str) -> None:
    model, make = APIS[api]
    async with fake() as server, Engine(make(server)) as engine:
        deltas: list[str] = []
        billed_at_first_delta = None
        async with engine.stream(model, PROMPT, max_tokens=50) as stream:
            async for delta in stream:
                if not deltas:
                    billed_at_first_delta = len(server.ledger)
                deltas.append(delta)
        result = stream.result
    assert result.ok, result.error
    assert len(deltas) == server.stream_pieces  # several pieces, in order, each handed on as it came
    assert "".join(deltas) == result.text == stream.text == "echo: " + PROMPT
    assert billed_at_first_delta == 0  # the first piece arrived before the answer was finished
    assert result.usage.output_tokens == 16
    assert result.usage.input_tokens == server.ledger[0].input_tokens  # the provider's usage, not an estimate
    assert result.cost_usd == pytest.approx(server.total_billed_usd)
    assert engine.stats.cost_usd == pytest.approx(server.total_billed_usd)
    assert result.timings.first_token is not None
    assert 0 < result.timings.first_token < result.timings.total
    assert result.finish_reason == "stop"
    assert result.request_id == "req_1"
    assert result.attempts == 1
    assert result.raw is not None
    assert result.raw["object"] == "chat.completion"
    assert result.raw["choices"][0]["message"]["content"] == result.text
    assert [e.kind for e in server.ledger] == ["delivered"]


@pytest.mark.parametrize("fault", ["stream_cut", "stream_error"])
@pytest.mark.parametrize("api", APIS)
async def test_an_error_after_the_first_delta_ends_the_stream_and_is_not_retried(api: str, fault: str) -> None:
    model, make = APIS[api]
    async with fake() as server, Engine(make(server), retry=FAST, budget_usd=1.0) as engine:
        server.inject(fault, after=2)
        deltas, result = await read(engine, model, PROMPT, max_tokens=50)
        budget = engine.spending.budget
        assert budget is not None
        await server.until(lambda: server.in_flight == 0)
        expected = ConnectError if fault == "stream_cut" else OverloadedError if api == "anthropic" else ServerError
        assert isinstance(result.error, expected), result.error
        assert result.text is None
        assert len(deltas) == 2  # what came before the break came, and nothing after it
        assert server.stats.received == 1  # no second answer spliced onto the first
        assert result.attempts == 1
        worst = worst_case(engine, result)
        assert result.cost_usd == pytest.approx(worst)  # possibly billed: counted at its worst case
        assert engine.stats.maybe_billed_usd == pytest.approx(worst)
        assert engine.spent() == pytest.approx(worst)
        assert budget.reserved() == 0
        assert engine.limiter(model).in_flight == 0
        assert [e.kind for e in server.ledger] == ["truncated"]  # the provider billed it
        assert worst >= server.total_billed_usd
        assert engine.router.routes[0].failed == 1  # the deployment's health heard of it


@pytest.mark.parametrize(("fault", "after"), [("503", 1), ("429", 1), ("reset", 1), ("stream_cut", 0)])
async def test_a_failure_before_the_first_delta_is_retried(fault: str, after: int) -> None:
    retries: list[RetryEvent] = []
    async with fake() as server, Engine(openai(server), retry=FAST, on_retry=retries.append) as engine:
        server.inject(fault, after=after, retry_after=0.01 if fault == "429" else None)
        deltas, result = await read(engine, "openai/gpt-test", PROMPT, max_tokens=50)
    assert result.ok, result.error
    assert result.attempts == 2
    assert [event.attempt for event in retries] == [1]
    assert "".join(deltas) == result.text == "echo: " + PROMPT  # one whole answer, nothing repeated
    assert server.stats.received == 2


@pytest.mark.parametrize("how", ["break", "raise", "cancel"])
async def test_leaving_early_closes_the_connection_and_settles_everything(how: str) -> None:
    async with fake(latency=1.0) as server, Engine(openai(server), budget_usd=1.0) as engine:
        streams = []
        first = asyncio.Event()

        async def consume() -> None:
            async with engine.stream("openai/gpt-test", PROMPT, max_tokens=50) as stream:
                streams.append(stream)
                async for _ in stream:
                    first.set()
                    if how == "break":
                        break
                    if how == "raise":
                        raise KeyError("the consumer's own error")

        if how == "cancel":
            task = asyncio.create_task(consume())
            await first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "raise":
            with pytest.raises(KeyError):
                await consume()
        else:
            await consume()
        result = streams[0].result
        assert isinstance(result.error, CancelledError)
        assert "may have been billed" in str(result.error)
        # the server sees the client go before its answer is finished, and bills it as abandoned
        await server.until(lambda: server.in_flight == 0)
        assert [e.kind for e in server.ledger] == ["abandoned"]
        budget = engine.spending.budget
        assert budget is not None
        assert budget.reserved() == 0
        assert engine.limiter("openai/gpt-test").in_flight == 0
        assert engine.spent() == pytest.approx(worst_case(engine, result))
        assert engine.stats.cancelled == 1
        assert engine.runtime.gate.held == 0
        # and the engine carries on
        server.latency = 0.05
        _, again = await read(engine, "openai/gpt-test", "again", max_tokens=50)
        assert again.ok, again.error


async def test_a_stream_left_before_it_is_read_sends_nothing() -> None:
    async with fake() as server, Engine(openai(server), budget_usd=1.0) as engine:
        async with engine.stream("openai/gpt-test", PROMPT) as stream:
            pass
        assert isinstance(stream.result.error, CancelledError)
        assert "never sent" in str(stream.result.error)
        assert server.stats.received == 0
        assert engine.spent() == 0
        assert engine.runtime.gate.held == 0


@pytest.mark.parametrize("api", APIS)
async def test_tool_call_deltas_are_carried_and_assembled(api: str) -> None:
    model, make = APIS[api]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up.",
                "parameters": {"type": "object", "properties": {"echo": {"type": "string"}}},
            },
        }
    ]
    async with fake() as server, Engine(make(server)) as engine:
        params = {"tools": tools, "tool_choice": "required"}
        async with engine.stream(model, "find the weir", max_tokens=50, params=params) as stream:
            events = [event async for event in stream.events()]
        result = stream.result
    calls = [event for event in events if isinstance(event, ToolCallDelta)]
    arguments = json.dumps({"echo": "echo: find the weir"})
    assert len(calls) > 2  # the call's id and name, then its arguments in pieces
    assert calls[0].name == "lookup"
    assert calls[0].id
    assert {call.index for call in calls} == {0}
    assert "".join(call.arguments for call in calls) == arguments
    assert stream.tool_calls == [
        {"id": calls[0].id, "type": "function", "function": {"name": "lookup", "arguments": arguments}}
    ]
    assert result.ok, result.error
    assert result.finish_reason == "tool_calls"
    assert result.text is None
    assert result.raw is not None
    assert result.raw["choices"][0]["message"]["tool_calls"] == stream.tool_calls


async def test_anthropic_json_mode_streams_as_text() -> None:
    schema = {"type": "object", "properties": {"echo": {"type": "string"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    async with fake() as server, Engine(anthropic(server)) as engine:
        params = {"response_format": response_format}
        deltas, result = await read(engine, "anthropic/claude-test", "hi", max_tokens=50, params=params)
    assert result.ok, result.error
    assert len(deltas) > 1
    assert json.loads("".join(deltas)) == {"echo": "echo: hi"}  # the forced tool's input is the answer's text
    assert result.finish_reason == "stop"
    assert result.raw is not None
    assert "tool_calls" not in result.raw["choices"][0]["message"]


async def test_a_server_that_ignores_stream_answers_in_one_delta() -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }

    async def handle(request: web.BaseRequest) -> web.Response:
        assert (await request.json())["stream"] is True
        return web.json_response(body)

    runner = web.ServerRunner(web.Server(handle))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        deployment = Deployment("openai/m", base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
        async with Engine(deployment) as engine:
            deltas, result = await read(engine, "openai/m", "hi")
    finally:
        await runner.cleanup()
    assert deltas == ["whole"]
    assert result.usage.input_tokens == 7
    assert result.finish_reason == "stop"


async def test_concurrent_streams_never_overshoot_the_budget() -> None:
    max_tokens = 200
    async with FakeServer(
        api_key="sk-test", output_tokens=max_tokens, prices={"gpt-test": (2.0, 8.0)}, latency=0.05, tokenizer="bytes"
    ) as server:
        probe = Engine(openai(server), budget_usd=100.0)
        request = Request.from_prompt("openai/gpt-test", PROMPT, max_tokens=max_tokens)
        _, worst = probe.spending.prepare(request, probe.deployments[0], probe.spending.budget)
        limit = 3.5 * worst
        violations: list[float] = []

        def check(result: Result) -> None:
            budget = engine.spending.budget
            assert budget is not None
            if budget.spent() + budget.reserved() > limit + 1e-12:
                violations.append(budget.spent() + budget.reserved())

        engine = Engine(openai(server), budget_usd=limit, concurrency=20, on_result=check)

        async def one(i: int) -> Result:
            _, result = await read(
                engine, Request.from_prompt("openai/gpt-test", f"{PROMPT} {i}", max_tokens=max_tokens)
            )
            return result

        async with engine:
            results = await asyncio.gather(*(one(i) for i in range(12)))
    assert not violations
    ok = [r for r in results if r.ok]
    refused = [r for r in results if isinstance(r.error, BudgetExhaustedError)]
    assert ok
    assert refused  # the cap was what stopped them
    assert len(ok) + len(refused) == 12
    assert engine.spent() <= limit
    assert server.total_billed_usd <= limit  # what the provider billed, too
    assert sum(r.cost_usd or 0 for r in ok) == pytest.approx(server.total_billed_usd)


async def test_a_streamed_result_is_stored_and_a_stored_answer_is_replayed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    request = Request.from_prompt("openai/gpt-test", PROMPT, max_tokens=50)
    try:
        async with fake() as server, Engine(openai(server), store=store) as engine:
            deltas, result = await read(engine, request)
            stored = store.get(store_key(request))
            assert stored is not None
            assert stored.ok
            assert stored.record["text"] == "".join(deltas) == result.text
            spend = store.spend()
            assert spend.in_flight == 0  # the intent was settled
            assert spend.answered == pytest.approx(server.total_billed_usd)

            again, replayed = await read(engine, request)
            assert again == [result.text]  # the stored answer, as one delta
            assert replayed.cached
            assert server.stats.received == 1  # never paid for twice
    finally:
        store.close()


async def test_the_attempt_timeout_after_the_first_delta_ends_the_stream() -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, attempt_timeout=0.6)
    async with fake(latency=2.0) as server, Engine(openai(server), retry=policy) as engine:
        server.stream_pieces = 8  # a piece every 0.25 s: the first in time, the end not
        deltas, result = await read(engine, "openai/gpt-test", PROMPT, max_tokens=50)
        await server.until(lambda: server.in_flight == 0)
    assert isinstance(result.error, AttemptTimeoutError)
    assert deltas
    assert result.attempts == 1
    assert server.stats.received == 1


async def test_a_callable_async_generator_streams_and_is_not_retried_after_its_first_piece() -> None:
    calls = 0

    async def model(request: Request) -> AsyncIterator[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("not yet")  # before any piece: retried
        yield "one "
        yield "two "
        if calls == 2:
            raise ConnectionError("gone")  # after a piece: the end
        yield "three"

    deployment = Deployment("mine/gen", provider=CallableProvider(model, name="mine"))
    async with Engine(deployment, retry=FAST) as engine:
        deltas, result = await read(engine, "mine/gen", "hi")
        assert deltas == ["one ", "two "]
        assert isinstance(result.error, ConnectError)
        assert result.attempts == 2
        async with engine.stream("mine/gen", "hi") as stream:
            result = await stream.collect()
        assert result.text == stream.text == "one two three"
        assert result.usage.output_tokens > 0  # estimated: the function reported none
        assert (await engine.complete("mine/gen", "hi")).text == "one two three"  # send() joins the pieces


async def test_a_provider_that_cannot_stream_answers_in_one_delta() -> None:
    async def model(request: Request) -> str:
        return "all at once"

    deployment = Deployment("mine/plain", provider=CallableProvider(model))
    async with Engine(deployment) as engine:
        deltas, result = await read(engine, "mine/plain", "hi")
    assert deltas == ["all at once"]
    assert result.text == "all at once"


async def test_the_simulated_provider_streams_in_pieces() -> None:
    deployment = Deployment("simulate/demo", options={"latency": 0.05})
    async with Engine(deployment) as engine:
        deltas, result = await read(engine, "simulate/demo", "how do sluice gates hold back water")
    assert len(deltas) > 1
    assert "".join(deltas) == result.text
    assert result.text is not None
    assert result.text.startswith("[simulated reply")


async def test_usage_events_from_a_callable_are_used_for_the_cost() -> None:
    async def model(request: Request) -> AsyncIterator[str | StreamEvent]:
        yield "hi"
        yield UsageUpdate(Usage(input_tokens=1000, output_tokens=100))

    deployment = Deployment("mine/gen", provider=CallableProvider(model), price=PRICE)
    async with Engine(deployment) as engine:
        _, result = await read(engine, "mine/gen", "hi")
    assert result.usage.input_tokens == 1000
    assert result.cost_usd == pytest.approx((1000 * 2.0 + 100 * 8.0) / 1e6)


STREAM = (
    b"\xef\xbb\xbf: a comment\r\n"
    b'event: message_start\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
    b"data: caf\xc3\xa9\n\n"
    b"id: 7\rdata: [DONE]\r\r"
    b"data: never dispatched"
)
EVENTS = [
    SseEvent("message_start", '{"a":\n1}'),
    SseEvent("message", "café"),
    SseEvent("message", "[DONE]", "7"),
]


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(STREAM)])
def test_sse_decoding_does_not_depend_on_how_the_bytes_are_split(size: int) -> None:
    decoder = SseDecoder()
    events: list[SseEvent] = []
    for start in range(0, len(STREAM), size):
        events.extend(decoder.feed(STREAM[start : start + size]))
    events.extend(decoder.close())
    assert events == EVENTS
