"""A budget shared in Redis: never exceeded as the provider bills it, across processes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time

import pytest
import redis
from polling import until
from redis_server import RedisServer
from test_redis_limits import KEY, run_clients

from sluice import BudgetExhaustedError, Deployment, Engine, Price, Request
from sluice.redis import RedisBudget
from sluice.testing import FakeServer

pytestmark = pytest.mark.timeout(60)

PRICE = 1000.0  # USD per million tokens, in and out: a cent a request, so a dollar runs out fast


async def _expired_is(budget: RedisBudget, usd: float) -> bool:
    return (await budget.totals()).expired == pytest.approx(usd)


async def _reserved_is(budget: RedisBudget, usd: float) -> bool:
    return (await budget.totals()).reserved == pytest.approx(usd)


async def test_three_processes_never_overspend_a_shared_budget(redis_server: RedisServer) -> None:
    budget, n = 1.00, 30
    async with FakeServer(api_key=KEY, prices={"*": (PRICE, PRICE)}, latency=0.02) as server:
        base = {
            "redis": redis_server.url,
            "url": server.url,
            "key": KEY,
            "n": n,
            "budget": budget,
            "budget_name": "job-1",
            "price": [PRICE, PRICE],
        }
        summaries = await run_clients([{**base, "tag": tag} for tag in "abc"])
        billed = server.total_billed_usd
        assert billed <= budget + 1e-9  # as the provider bills it
        answered = sum(s["ok"] for s in summaries)
        assert 0 < answered < 3 * n  # some ran, the rest were refused
        assert all(s["errors"] in ([], ["BudgetExhaustedError"]) for s in summaries), summaries
        assert sum(s["errors"] == ["BudgetExhaustedError"] for s in summaries) >= 1
        assert answered == server.stats.accepted
        # what the clients counted is what the provider billed, and Redis has it all
        assert sum(s["cost"] for s in summaries) == pytest.approx(billed, abs=1e-6 * answered)
        async with RedisBudget(redis_server.url, "job-1", budget) as shared:
            totals = await shared.totals()
        assert totals.reserved == 0
        assert totals.spent == pytest.approx(billed, abs=1e-6 * (answered + 1))
        # it stopped because the next worst case did not fit, not long before
        assert totals.remaining < 0.1


async def test_holds_are_atomic_and_a_spent_budget_refuses(redis_server: RedisServer) -> None:
    one, two = RedisBudget(redis_server.url, "b", 1.0), RedisBudget(redis_server.url, "b", 1.0)
    tasks = [asyncio.ensure_future((one if i % 2 else two).reserve(0.1)) for i in range(20)]
    await asyncio.sleep(0.5)
    granted = [t.result() for t in tasks if t.done()]
    assert len(granted) == 10  # exactly what fits; the others wait for the holds
    totals = await one.totals()
    assert totals.reserved == pytest.approx(1.0)
    for hold in granted:
        hold.commit(0.1)  # every cent of it spent
    await one.flush()
    await two.flush()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    refused = [r for r in results if isinstance(r, BudgetExhaustedError)]
    assert len(refused) == 10
    assert "shared budget 'b'" in str(refused[0])
    totals = await two.totals()
    assert (totals.spent, totals.reserved) == (pytest.approx(1.0), 0)
    await one.close()
    await two.close()


async def test_a_waiter_is_woken_by_a_settle_not_by_polling(redis_server: RedisServer) -> None:
    one, two = RedisBudget(redis_server.url, "w", 1.0), RedisBudget(redis_server.url, "w", 1.0)
    hold = await one.reserve(0.8)
    waiting = asyncio.ensure_future(two.reserve(0.5))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    started = time.monotonic()
    hold.commit(0.2)  # 0.6 returns
    async with asyncio.timeout(2):  # the hold's lease is 30 s: only the settle's message wakes it
        (await waiting).commit(0.0)
    assert time.monotonic() - started < 1.0
    await one.close()
    await two.close()


async def test_a_dead_holder_s_hold_counts_as_spent_at_its_worst_case(redis_server: RedisServer) -> None:
    holder = r"""
import asyncio, sys
from sluice.redis import RedisBudget
async def main():
    budget = RedisBudget(sys.argv[1], "d", 1.0, lease_seconds=0.5)
    await budget.reserve(0.6)
    print("held", flush=True)
    await asyncio.Event().wait()  # holds it until killed
asyncio.run(main())
"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", holder, redis_server.url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            assert (await proc.stdout.readline()).strip() == b"held"
        budget = RedisBudget(redis_server.url, "d", 1.0)
        await asyncio.sleep(1.0)  # alive: it refreshes its hold past its lease
        assert (await budget.totals()).reserved == pytest.approx(0.6)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await until(lambda: _expired_is(budget, 0.6))  # its lease runs out
        totals = await budget.totals()
        # it may have been billed before it died: counted as spent, never handed back
        assert (totals.spent, totals.reserved, totals.expired) == (pytest.approx(0.6), 0, pytest.approx(0.6))
        with pytest.raises(BudgetExhaustedError):
            await budget.reserve(0.5)
        (await budget.reserve(0.4)).commit(0.0)
        await budget.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_one_limit_per_name_and_earlier_spending_counted_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    first = RedisBudget(redis_server.url, "job-2", 1.0)
    (await first.reserve(0.1)).commit(0.1)
    other = RedisBudget(redis_server.url, "job-2", 2.0)
    with caplog.at_level(logging.WARNING, logger="sluice.redis"):
        (await other.reserve(0.1)).commit(0.0)
        (await other.reserve(0.1)).commit(0.0)
    assert other.limit == 1.0  # the first process set it; a second one asking more uses it
    assert caplog.text.count("has a limit of $1.00") == 1
    with pytest.raises(BudgetExhaustedError):
        await other.reserve(1.5)
    await other.set_limit(2.0)  # a coordinator raises it, on purpose, for everyone
    (await other.reserve(1.5)).commit(0.0)
    assert (await first.totals()).limit == 2.0
    (await first.reserve(0.1)).commit(0.0)
    assert first.limit == 2.0
    # what an earlier run spent, from the coordinator's own records: a maximum, not a sum
    await other.flush()
    await other.count_spent_before(0.5)
    await other.count_spent_before(0.5)
    assert (await other.totals()).spent == pytest.approx(0.5)
    await first.flush()
    await first.close()
    await other.close()


async def test_asking_a_new_budget_its_totals_does_not_set_its_limit_to_zero(redis_server: RedisServer) -> None:
    """``totals()`` or ``count_spent_before()`` before the first reserve (a dashboard, a
    rerun counting earlier spending) must not make the budget $0 for everyone."""
    async with RedisBudget(redis_server.url, "fresh", 1.0) as budget:
        before = await budget.count_spent_before(0.2)
        assert before.limit == 1.0
        hold = await budget.reserve(0.5)
        hold.commit(0.5)
        await budget.flush()
        totals = await budget.totals()
    assert (totals.limit, totals.spent) == (1.0, pytest.approx(0.7))


async def test_a_limit_between_two_micro_dollars_is_never_exceeded(redis_server: RedisServer) -> None:
    """Redis counts integer micro-dollars; costs round up, so the limit must round down."""
    async with RedisBudget(redis_server.url, "tiny", 0.0000015) as budget:
        with pytest.raises(BudgetExhaustedError):
            await budget.reserve(0.000002)  # 2 micro-dollars do not fit in 1.5
        hold = await budget.reserve(0.000001)
        hold.commit(0.000001)


async def test_redis_down_holds_nothing_and_resumes(redis_server: RedisServer) -> None:
    budget = RedisBudget(redis_server.url, "r", 1.0)
    (await budget.reserve(0.1)).commit(0.1)
    await budget.flush()
    await asyncio.to_thread(redis_server.stop)
    waiting = asyncio.ensure_future(budget.reserve(0.1))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    assert budget.problem is not None
    await asyncio.to_thread(redis_server.start)  # AOF: what was spent survives the restart
    async with asyncio.timeout(10):
        (await waiting).commit(0.0)
    await budget.flush()
    assert (await budget.totals()).spent == pytest.approx(0.1)
    await budget.close()


async def test_a_hold_redis_lost_still_counts_what_it_cost(redis_server: RedisServer) -> None:
    """Redis restarted without its data while a request was in flight: its settle finds
    no hold, and must count the money all the same (the provider billed it)."""
    async with RedisBudget(redis_server.url, "lost", 1.0) as budget:
        hold = await budget.reserve(0.5)
        redis.Redis.from_url(redis_server.url).flushall()
        hold.commit(0.3)
        await budget.flush()
        totals = await budget.totals()
        assert totals.spent == pytest.approx(0.3)
        # the owner re-counting what its records say adds to it, not a maximum that hides it
        totals = await budget.count_spent_before(0.6)
        assert totals.spent == pytest.approx(0.9)
        totals = await budget.count_spent_before(0.6)  # still idempotent
        assert totals.spent == pytest.approx(0.9)


async def test_a_joining_process_never_recreates_a_budget_redis_lost(redis_server: RedisServer) -> None:
    """A job's workers join its budget: after Redis lost it they wait for the coordinator
    to count again what was spent, instead of starting a fresh budget at $0 spent."""
    async with RedisBudget(redis_server.url, "job:x", 1.0) as owner:
        await owner.set_limit(1.0)
        hold = await owner.reserve(0.6)
        hold.commit(0.6)
        await owner.flush()
        redis.Redis.from_url(redis_server.url).flushall()
        async with RedisBudget(redis_server.url, "job:x", 1.0, create=False) as worker:
            waiting = asyncio.ensure_future(worker.reserve(0.6))
            await asyncio.sleep(0.5)
            assert not waiting.done()  # nothing granted against a budget Redis forgot
            await owner.set_limit(1.0, spent_at_least=0.6)  # the coordinator's records, at once
            with pytest.raises(BudgetExhaustedError):
                await asyncio.wait_for(waiting, 5)
            totals = await owner.totals()
            assert totals.spent == pytest.approx(0.6)


async def test_a_paused_holder_s_late_settle_corrects_the_count(redis_server: RedisServer) -> None:
    # A holder that could not refresh (stopped, partitioned) is counted at its worst case;
    # when it comes back and settles, the count becomes what the request cost.
    holder = r"""
import asyncio, sys
from sluice.redis import RedisBudget
async def main():
    budget = RedisBudget(sys.argv[1], "p", 1.0, lease_seconds=0.3)
    hold = await budget.reserve(0.6)
    print("held", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    hold.commit(0.1)
    await budget.flush()
    print("settled", flush=True)
    await budget.close()
asyncio.run(main())
"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", holder, redis_server.url, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(20):
            assert (await proc.stdout.readline()).strip() == b"held"
        budget = RedisBudget(redis_server.url, "p", 1.0)
        proc.send_signal(signal.SIGSTOP)
        await until(lambda: _expired_is(budget, 0.6))  # its lease runs out
        totals = await budget.totals()
        assert (totals.spent, totals.expired) == (pytest.approx(0.6), pytest.approx(0.6))
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        async with asyncio.timeout(20):
            assert (await proc.stdout.readline()).strip() == b"settled"
        totals = await budget.totals()
        assert (totals.spent, totals.reserved, totals.expired) == (pytest.approx(0.1), 0, 0)
        await budget.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_an_engine_s_own_budget_counts_against_the_shared_one(redis_server: RedisServer) -> None:
    async with FakeServer(api_key=KEY, prices={"*": (PRICE, PRICE)}) as server:
        deployment = Deployment("openai/gpt-test", base_url=server.url, api_key=KEY, price=Price(PRICE, PRICE))
        shared = RedisBudget(redis_server.url, "team", 1.0)
        requests = [Request.from_prompt("openai/gpt-test", f"q{i}", id=f"q{i}", max_tokens=16) for i in range(30)]
        async with Engine(deployment, budget_usd=0.2, shared_budget=shared) as engine:
            results = await engine.run(requests)
        await shared.flush()
        totals = await shared.totals()
        await shared.close()
    billed = server.total_billed_usd
    assert 0 < billed <= 0.2  # the engine's own cap binds first
    assert any(isinstance(r.error, BudgetExhaustedError) for r in results)
    assert totals.spent == pytest.approx(billed, abs=1e-5)  # and every cent is in the shared one
    assert totals.reserved == 0


async def _slow_replies(port: int, delay: float, handlers: list[asyncio.Task[None]]) -> asyncio.Server:
    """A loopback TCP proxy to Redis that holds every reply back ``delay`` seconds (each
    connection's handler task goes into ``handlers``, to be awaited before the loop ends:
    a socket left to the garbage collector warns in whichever test runs then)."""

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, wait: float) -> None:
            while data := await src.read(65536):
                if wait:
                    await asyncio.sleep(wait)
                dst.write(data)
                await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pipe(client_r, redis_w, 0), pipe(redis_r, client_w, delay), return_exceptions=True)
        finally:
            for writer in (client_w, redis_w):
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_a_reserve_cancelled_while_redis_replies_leaves_no_hold_behind(redis_server: RedisServer) -> None:
    """Cancelled after Redis granted the hold but before the reply came back: the hold is
    given back when the reply lands, not left to expire into money spent."""
    handlers: list[asyncio.Task[None]] = []
    proxy = await _slow_replies(redis_server.port, 0.3, handlers)
    port = proxy.sockets[0].getsockname()[1]
    slow = RedisBudget(f"redis://127.0.0.1:{port}/0", "cancelled", 10.0, lease_seconds=1.0)
    direct = RedisBudget(redis_server.url, "cancelled", 10.0)
    try:
        (await slow.reserve(0.5)).release()  # scripts loaded, budget made
        await slow.flush()
        task = asyncio.get_running_loop().create_task(slow.reserve(1.0))
        await until(lambda: _reserved_is(direct, 1.0))  # the script has run in Redis; its reply is still on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the reply lands and the hold is given back (an orphaned one would leave only when
        # its lease ran out, counted as spent: the totals expire holds before they count)
        await until(lambda: _reserved_is(direct, 0.0))
        await slow.flush()
        totals = await direct.totals()
        assert totals.reserved == pytest.approx(0.0)
        assert totals.spent == pytest.approx(0.0)
    finally:
        await slow.close()
        await direct.close()
        proxy.close()
        await asyncio.wait_for(asyncio.gather(*handlers, return_exceptions=True), 10)
