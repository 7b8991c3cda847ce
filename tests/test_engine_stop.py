"""Issue 7's engine promises: a stop sends nothing new, map() never hangs, a hook or a
store that fails never loses a paid answer, and every attempt is noted before it is sent."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fake_provider import deployment_at
from polling import until

from sluice import (
    CallableProvider,
    CancelledError,
    Deployment,
    Engine,
    EngineClosedError,
    Price,
    Request,
    Result,
    RetryEvent,
    RetryPolicy,
    store_key,
)
from sluice.store import SqliteStore
from sluice.testing import FakeServer, run_in_virtual_time

MODEL = "openai/gpt-test"


def prompts(n: int) -> list[Request]:
    return [Request.from_prompt(MODEL, f"question {i}", max_tokens=20) for i in range(n)]


async def test_a_stop_sends_nothing_new_behind_a_long_429_pause(server: FakeServer) -> None:
    """Point 7: retries waiting for a paused deployment are not sent after stop()."""
    server.inject("429", times=5, retry_after=30)  # the deployment pauses 30 s (within the cap)
    policy = RetryPolicy(max_attempts=5, base_delay=0.01, attempt_timeout=5)
    got: list[Result] = []
    all_paused = asyncio.Event()

    def on_retry(event: RetryEvent) -> None:
        if engine.stats.rate_limited == 5:
            all_paused.set()

    async with Engine(deployment_at(server), retry=policy, concurrency=5, on_retry=on_retry) as engine:

        async def consume() -> None:
            async for result in engine.map(prompts(5)):
                got.append(result)

        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(all_paused.wait(), 10)  # every request had its 429 and waits out the pause
        received = server.stats.received
        engine.stop()
        await asyncio.wait_for(consumer, 5)  # at once, not after the 30 s pause
    assert server.stats.received == received  # nothing new was sent
    assert len(got) == 5
    assert all(isinstance(r.error, CancelledError) for r in got)
    assert all("stopped before retrying" in r.error.message for r in got if r.error is not None)


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


async def test_stop_with_grace_cuts_off_what_is_still_at_the_provider(server: FakeServer) -> None:
    """Point 21: a hang at the provider does not hold a stop for the attempt timeout."""
    server.inject("hang", times=3)
    policy = RetryPolicy(max_attempts=1, attempt_timeout=600)
    async with Engine(deployment_at(server), retry=policy) as engine:
        iterator = engine.map(prompts(3))
        consumer = asyncio.create_task(_collect(iterator))
        await server.until(lambda: server.in_flight >= 3)
        engine.stop(grace=0.2)
        results = await asyncio.wait_for(consumer, 5)
    assert len(results) == 3
    for result in results:
        assert isinstance(result.error, CancelledError)
        assert "may have been billed" in result.error.message


async def test_an_answer_cut_off_while_it_is_stored_is_reported_as_the_answer(
    server: FakeServer, tmp_path: Path
) -> None:
    """The grace runs out while the answer is being written: the caller is told what came
    back (it was paid for), not that it was never sent; the write still lands."""
    writing = asyncio.Event()
    path = tmp_path / "state.db"
    disk = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    class SlowDisk(SqliteStore):
        """The answer's write waits 1 s on a lock another process holds: a slow disk."""

        def _hold_the_disk(self) -> None:
            disk.execute("BEGIN IMMEDIATE")
            asyncio.get_running_loop().call_later(1.0, disk.execute, "ROLLBACK")
            writing.set()

        async def put_settled(self, *args: Any, **kwargs: Any) -> None:
            self._hold_the_disk()
            await super().put_settled(*args, **kwargs)

        async def put(self, key: str, result: Result) -> None:
            self._hold_the_disk()
            await super().put(key, result)

    store = SlowDisk(path)
    with contextlib.closing(disk), contextlib.closing(store):  # the caller's store: left open by the engine
        async with Engine(deployment_at(server), store=store) as engine:
            consumer = asyncio.create_task(_collect(engine.map(prompts(1))))
            await asyncio.wait_for(writing.wait(), 5)
            engine.stop(grace=0.1)  # the grace ends while the write waits
            (result,) = await asyncio.wait_for(consumer, 5)
        assert result.ok, result.error
        assert engine.stats.succeeded == 1
        assert engine.stats.cancelled == 0

        async def landed() -> bool:
            return store.get(store_key(result.request)) is not None

        await until(landed, timeout=5)  # the write lands once the other process lets go


async def _collect(iterator: AsyncIterator[Result]) -> list[Result]:
    return [r async for r in iterator]


async def test_close_without_draining_while_map_is_iterated_never_hangs(server: FakeServer) -> None:
    """Point 8: every taken item yields a Result, or the iteration ends with a clear error."""
    server.inject("hang", times=100)  # answered only when the server stops (at most 64 are in flight)
    engine = Engine(deployment_at(server, max_in_flight=64), retry=RetryPolicy(max_attempts=1))
    await engine.start()

    def endless() -> Any:
        i = 0
        while True:
            yield Request.from_prompt(MODEL, f"q{i}", max_tokens=5)
            i += 1

    got: list[Result] = []

    async def consume() -> None:
        async for result in engine.map(endless()):
            got.append(result)

    consumer = asyncio.create_task(consume())
    await server.until(lambda: server.in_flight >= 10)
    await engine.close(drain=False)
    with pytest.raises(EngineClosedError):
        await asyncio.wait_for(consumer, 5)
    assert got, "the taken items came back"
    assert all(isinstance(r.error, CancelledError) for r in got)


async def test_close_without_draining_gives_every_taken_item_a_result(server: FakeServer) -> None:
    server.inject("hang", times=20)  # answered only when the server stops
    engine = Engine(deployment_at(server, max_in_flight=64), retry=RetryPolicy(max_attempts=1))
    await engine.start()
    consumer = asyncio.create_task(_collect(engine.map(prompts(20))))
    await server.until(lambda: server.in_flight >= 20)
    await engine.close(drain=False)
    results = await asyncio.wait_for(consumer, 5)
    assert len(results) == 20
    assert all(isinstance(r.error, CancelledError) for r in results)


async def test_a_close_without_draining_as_an_answer_is_handed_out_sends_nothing_more(server: FakeServer) -> None:
    """One request at a time: a close without draining as the first answer is handed out
    sends nothing more (the reader may have taken further items; none of them has begun),
    and every other item taken gets its cancelled, never-sent result."""
    engine = Engine(deployment_at(server), concurrency=1, retry=RetryPolicy(max_attempts=1))
    await engine.start()
    results: list[Result] = []

    async def consume() -> None:
        async for result in engine.map(prompts(3)):
            results.append(result)
            if len(results) == 1:
                await engine.close(drain=False)

    with pytest.raises(EngineClosedError):
        await consume()
    assert server.stats.received == 1
    assert results[0].ok
    assert len(results) >= 2  # every item taken from the source has its result
    assert all(isinstance(r.error, CancelledError) for r in results[1:])
    assert all(not r.attempts for r in results[1:])


async def test_two_closes_at_once_both_return() -> None:
    started = asyncio.Event()

    async def slow(request: Request) -> str:
        started.set()
        await asyncio.sleep(0.1)
        return "ok"

    engine = Engine(Deployment("mine/x", provider=CallableProvider(slow)))
    task = asyncio.create_task(engine.complete("mine/x", "hi"))
    await started.wait()
    await asyncio.wait_for(asyncio.gather(engine.close(), engine.close()), timeout=5)
    assert task.result().ok


async def test_a_raising_hook_neither_aborts_map_nor_loses_an_answer(server: FakeServer, tmp_path: Path) -> None:
    """Point 2: on_result raising is logged and counted; every answer is delivered and stored."""
    calls = 0

    def hook(result: Result) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("a bug in the user's hook")

    store = SqliteStore(tmp_path / "state.db")
    async with Engine(deployment_at(server), on_result=hook, store=store) as engine:
        results = await engine.run(prompts(10))
    assert calls == 10
    assert engine.stats.hook_errors == 10
    assert all(r.ok for r in results)
    assert store.summary()["succeeded"] == 10
    store.close()


async def test_every_attempt_is_noted_before_it_is_sent(server: FakeServer, tmp_path: Path) -> None:
    """Point 4: when a request reaches the provider, its intent is already in the state
    file (committed: another connection sees it), with its worst case."""
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    other = sqlite3.connect(path)  # what a rerun would find if we died at that instant
    missing: list[str] = []
    checked = 0

    def on_arrival(headers: Any) -> None:
        nonlocal checked
        checked += 1
        rows = other.execute("SELECT key, worst_usd FROM intents").fetchall()
        noted = {"sluice-" + hashlib.sha256(key.encode()).hexdigest()[:32]: worst for key, worst in rows}
        if not noted.get(headers["Idempotency-Key"], 0) > 0:
            missing.append(headers["Idempotency-Key"])

    server.on_arrival = on_arrival
    blocker = sqlite3.connect(path)
    blocker.execute("BEGIN IMMEDIATE")  # the disk is slow for a moment: intents wait, so must sends
    asyncio.get_running_loop().call_later(0.3, blocker.rollback)
    async with Engine(deployment_at(server, price=Price(1.0, 2.0)), store=store) as engine:
        results = await engine.run(prompts(20))
    blocker.close()
    other.close()
    assert all(r.ok for r in results)
    assert checked == 20
    assert missing == []
    assert store.spend().in_flight == 0  # settled
    store.close()


async def test_a_store_that_fails_stops_admission_and_keeps_the_answers(server: FakeServer, tmp_path: Path) -> None:
    """Points 2 and 18: a locked state file stops the engine; answers still come out."""
    server.latency = 0.05
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    blocker = sqlite3.connect(path, timeout=0.1)
    got: list[Result] = []
    async with Engine(deployment_at(server), store=store, concurrency=4) as engine:
        async for result in engine.map(prompts(200)):
            got.append(result)
            if len(got) == 20:
                blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    blocker.rollback()
    blocker.close()
    assert engine.store_error is not None
    assert str(path) in engine.store_error.message
    assert "locked" in engine.store_error.message
    answered = [r for r in got if r.ok]
    assert 20 <= len(answered) < 200  # it stopped admitting
    assert all(isinstance(r.error, CancelledError) for r in got if not r.ok)
    assert server.stats.accepted == len(answered)  # nothing answered was dropped
    store.close()


async def test_a_failing_store_stops_with_the_grace_not_after_hung_requests(tmp_path: Path) -> None:
    async with FakeServer(api_key="sk-test") as server:
        server.inject("hang", times=4)
        path = tmp_path / "state.db"
        store = SqliteStore(path)
        deployment = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test", max_in_flight=16)
        blocker = sqlite3.connect(path, timeout=0.1)
        engine = Engine(deployment, store=store, grace=0.5, retry=RetryPolicy(max_attempts=1))
        got = []
        async with engine:
            iterator = engine.map([Request.from_prompt("openai/gpt-test", f"q{i}") for i in range(40)])
            async for result in iterator:
                got.append(result)
                if len(got) == 1:
                    blocker.execute("BEGIN IMMEDIATE")  # the state file is locked by someone else
        blocker.rollback()
        blocker.close()
        store.close()
    assert engine.store_error is not None
    hung = [r for r in got if r.error is not None and "grace" in r.error.message]
    assert len(hung) == 4  # cut off after the grace, not after the 600 s attempt timeout


async def test_a_day_long_retry_after_is_not_obeyed(server: FakeServer) -> None:
    """Point 6: a hint beyond RetryPolicy.max_retry_after is treated as no hint."""
    server.inject("429", times=1, retry_after=86_400)
    policy = RetryPolicy(deadline=30, base_delay=0.05, max_delay=0.2)
    async with Engine(deployment_at(server), retry=policy) as engine:
        first = await asyncio.wait_for(engine.complete(MODEL, "one"), 10)
        second = await asyncio.wait_for(engine.complete(MODEL, "two"), 10)
    assert first.ok, first.error
    assert second.ok, second.error
    assert first.attempts == 2
    assert engine.stats.rate_limited == 1


async def test_a_silent_connection_is_a_timeout_long_before_the_attempt_timeout(server: FakeServer) -> None:
    """Point 21: nothing received for idle_timeout seconds ends the attempt."""
    server.inject("hang", times=1)
    policy = RetryPolicy(max_attempts=1, attempt_timeout=600, idle_timeout=0.3)
    async with Engine(deployment_at(server), retry=policy) as engine:
        result = await asyncio.wait_for(engine.complete(MODEL, "hello"), 10)
    assert result.error is not None
    assert result.error.kind == "timeout"
    assert "idle timeout" in result.error.message


async def test_a_slow_body_that_keeps_arriving_is_not_an_idle_timeout(server: FakeServer) -> None:
    """A gateway's keep-alive whitespace: bytes every 0.1 s for 1.2 s, three times the
    idle timeout in all, and never silent for it."""
    server.inject("trickle", times=1, after=12, every=0.1)
    policy = RetryPolicy(max_attempts=1, attempt_timeout=600, idle_timeout=0.4)
    async with Engine(deployment_at(server), retry=policy) as engine:
        result = await asyncio.wait_for(engine.complete(MODEL, "hello"), 10)
    assert result.ok, result.error
    assert result.attempts == 1
    assert [entry.kind for entry in server.ledger] == ["delivered"]


async def test_a_body_that_stops_arriving_is_an_idle_timeout(server: FakeServer) -> None:
    """The headers and one byte, then silence: cut off idle_timeout after the last byte."""
    server.inject("trickle", times=1, after=2, every=3.0)
    policy = RetryPolicy(max_attempts=1, attempt_timeout=600, idle_timeout=0.3)
    async with Engine(deployment_at(server), retry=policy) as engine:
        result = await asyncio.wait_for(engine.complete(MODEL, "hello"), 10)
    assert result.error is not None
    assert result.error.kind == "timeout"
    assert "sent nothing for 0.3 s (idle timeout)" in result.error.message


async def test_a_body_arriving_for_longer_than_the_attempt_timeout_is_cut_off_at_it(server: FakeServer) -> None:
    """Bytes every 0.1 s for 3 s: never silent for the idle timeout (six gaps of it: a
    loaded CI run once stalled a 0.1 s gap past a 0.3 s one), cut off at the attempt's."""
    server.inject("trickle", times=1, after=30, every=0.1)
    policy = RetryPolicy(max_attempts=1, attempt_timeout=1.2, idle_timeout=0.6)
    async with Engine(deployment_at(server), retry=policy) as engine:
        result = await asyncio.wait_for(engine.complete(MODEL, "hello"), 10)
    assert result.error is not None
    assert result.error.kind == "timeout"
    assert "within 1.2 s" in result.error.message


async def test_models_without_a_deployment_get_the_defaults_and_their_price_before_sending() -> None:
    """Points 15 and 19: --rpm without --model applies to each model met; its price is
    looked up when the model is first met, not between an answer and its commit."""
    async with Engine(defaults={"rpm": 7, "tpm": 7000}) as engine:
        for model in ("openai/gpt-4o-mini", "anthropic/claude-3-5-haiku-latest"):
            limiter = engine.limiter(model)
            assert limiter.requests_limit == 7  # type: ignore[attr-defined]
            assert limiter.tokens_limit == 7000  # type: ignore[attr-defined]
            (deployment_of_model,) = [d for d in engine.deployments if d.model == model]
            assert id(deployment_of_model) in engine.spending.pricing._cache
