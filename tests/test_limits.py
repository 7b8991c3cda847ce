"""The in-process limiter, in virtual time: a minute of limits runs in milliseconds."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice._errors import CapacityError
from sluice._limits import WINDOW_MARGIN, LocalLimiter, RateLimitSnapshot
from sluice.testing._virtual_time import run_in_virtual_time

Grant = tuple[float, int]  # (time granted, tokens)


def max_in_any_window(grants: list[Grant], window: float, *, tokens: bool) -> float:
    """The most requests (or tokens) granted inside any half-open window [s, s + window)."""
    times = sorted(grants)
    best = 0.0
    for i, (start, _) in enumerate(times):
        total = 0.0
        for t, cost in times[i:]:
            if t >= start + window:
                break
            total += cost if tokens else 1
        best = max(best, total)
    return best


async def _take_all(
    limiter: LocalLimiter, costs: list[int], on_grant: Callable[[int, object], Awaitable[None]] | None = None
) -> list[Grant]:
    loop = asyncio.get_running_loop()
    grants: list[Grant] = []

    async def one(i: int, cost: int) -> None:
        reservation = await limiter.acquire(cost)
        grants.append((loop.time(), cost))
        if on_grant is not None:
            await on_grant(i, reservation)
        reservation.done()

    await asyncio.gather(*(one(i, c) for i, c in enumerate(costs)))
    return grants


def test_requests_never_exceed_the_limit_in_any_window_and_are_paced_evenly() -> None:
    limiter = LocalLimiter(requests=10, window=60.0)
    grants = run_in_virtual_time(_take_all(limiter, [1] * 35))
    assert max_in_any_window(grants, 60.0, tokens=False) <= 10
    times = sorted(t for t, _ in grants)
    gaps = {round(b - a, 6) for a, b in itertools.pairwise(times)}
    assert gaps == {6.0, 6.0 + WINDOW_MARGIN}  # 60 s / 10, never a burst; a margin at each window
    assert times[0] == 0.0  # starts at once, not empty


def test_tokens_never_exceed_the_limit_in_any_window() -> None:
    rng = random.Random(7)
    costs = [rng.randint(1, 100) for _ in range(1000)]
    limiter = LocalLimiter(tokens=10_000, window=10.0)
    grants = run_in_virtual_time(_take_all(limiter, costs))
    assert max_in_any_window(grants, 10.0, tokens=True) <= 10_000
    # and it does not dawdle: within 2 % of sending at exactly the limit's rate
    finish = max(t for t, _ in grants)
    assert finish <= 1.02 * sum(costs) / 1000.0


def test_burst_allowance_lets_that_many_go_at_once_but_never_more_than_the_window() -> None:
    limiter = LocalLimiter(requests=10, window=60.0, burst_requests=4)
    grants = run_in_virtual_time(_take_all(limiter, [1] * 30))
    at_zero = sum(1 for t, _ in grants if t == 0.0)
    assert at_zero == 5
    assert max_in_any_window(grants, 60.0, tokens=False) <= 10


def test_fifo_a_large_request_is_not_starved_by_small_ones() -> None:
    async def scenario() -> list[str]:
        limiter = LocalLimiter(tokens=1000, window=10.0)
        order: list[str] = []

        async def take(name: str, cost: int) -> None:
            r = await limiter.acquire(cost)
            order.append(name)
            r.done()

        first = asyncio.create_task(take("first", 600))
        await asyncio.sleep(0)
        big = asyncio.create_task(take("big", 900))
        await asyncio.sleep(0)
        small = [asyncio.create_task(take(f"small{i}", 10)) for i in range(5)]
        await asyncio.gather(first, big, *small)
        return order

    order = run_in_virtual_time(scenario())
    assert order[:2] == ["first", "big"]


def test_priority_lane_overtakes_waiting_batch() -> None:
    async def scenario() -> list[str]:
        limiter = LocalLimiter(requests=60, window=60.0)
        order: list[str] = []

        async def take(name: str, priority: int) -> None:
            r = await limiter.acquire(1, priority=priority)
            order.append(name)
            r.done()

        batch = [asyncio.create_task(take(f"batch{i}", 100)) for i in range(10)]
        await asyncio.sleep(2.5)  # three batch items are through
        urgent = asyncio.create_task(take("urgent", 0))
        await asyncio.gather(urgent, *batch)
        return order

    order = run_in_virtual_time(scenario())
    assert order.index("urgent") == 3


def test_reconciliation_frees_capacity() -> None:
    async def scenario(actual: int) -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(tokens=1000, window=60.0)
        first = await limiter.acquire(1000)
        first.reconcile(actual)
        first.done()
        await limiter.acquire(500)
        return loop.time()

    without = run_in_virtual_time(scenario(1000))
    with_reconcile = run_in_virtual_time(scenario(100))
    assert without == pytest.approx(60.0 + WINDOW_MARGIN)  # full until the first entry ages out
    assert with_reconcile == pytest.approx(6.0)  # only the pacer's share of 100 tokens


def test_reconciling_upward_delays_the_next_request() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(tokens=1000, window=60.0)
        r = await limiter.acquire(100)
        r.reconcile(900)
        r.done()
        await limiter.acquire(200)
        return loop.time()

    assert run_in_virtual_time(scenario()) == pytest.approx(60.0 + WINDOW_MARGIN)  # 900 used until it ages out


def test_impossible_amounts_are_refused_at_once() -> None:
    async def scenario() -> None:
        limiter = LocalLimiter(tokens=1000, window=60.0, name="gpt-test")
        with pytest.raises(CapacityError, match=r"1001 tokens.*gpt-test allows 1000"):
            await limiter.acquire(1001)

    run_in_virtual_time(scenario())


def test_in_flight_cap_holds_until_done() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(max_in_flight=2)
        held = [await limiter.acquire(1), await limiter.acquire(1)]
        times: list[float] = []

        async def third() -> None:
            r = await limiter.acquire(1)
            times.append(loop.time())
            r.done()

        task = asyncio.create_task(third())
        await asyncio.sleep(5)
        assert not times
        held[0].done()
        held[0].done()  # idempotent: a double release must not free two slots
        await task
        assert limiter.in_flight == 1
        return times

    assert run_in_virtual_time(scenario()) == [5.0]


def test_penalize_pauses_the_whole_deployment() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=600, window=60.0)
        (await limiter.acquire(1)).done()
        limiter.penalize(7.5)
        grants = []
        for _ in range(3):
            (await limiter.acquire(1)).done()
            grants.append(loop.time())
        return grants

    assert run_in_virtual_time(scenario()) == pytest.approx([7.5, 7.6, 7.7])


def test_headers_that_show_outside_traffic_tighten_the_window() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=10, window=60.0, burst_requests=10)
        (await limiter.acquire(1)).done()
        # the server has 9 more requests on the books than we sent
        limiter.observe(RateLimitSnapshot(remaining_requests=0, reset_requests=30.0))
        (await limiter.acquire(1)).done()
        return loop.time()

    assert run_in_virtual_time(scenario()) == pytest.approx(30.0)


def test_a_lower_limit_from_the_server_is_adopted() -> None:
    async def scenario() -> None:
        limiter = LocalLimiter(tokens=10_000, window=60.0)
        limiter.observe(RateLimitSnapshot(limit_tokens=500))
        assert limiter.tokens_limit == 500
        with pytest.raises(CapacityError):
            await limiter.acquire(600)

    run_in_virtual_time(scenario())


def test_cancelled_waiter_does_not_block_the_queue() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=1, window=10.0)
        (await limiter.acquire(1)).done()
        stuck = asyncio.create_task(limiter.acquire(1))
        await asyncio.sleep(1)
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        (await limiter.acquire(1)).done()
        return loop.time()

    assert run_in_virtual_time(scenario()) == pytest.approx(10.0 + WINDOW_MARGIN)


def test_refund_returns_everything_for_a_request_never_sent() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=1, tokens=100, window=10.0)
        (await limiter.acquire(100)).refund()
        (await limiter.acquire(100)).done()
        return loop.time()

    assert run_in_virtual_time(scenario()) == 0.0


def test_repr_is_informative() -> None:
    limiter = LocalLimiter(requests=10, tokens=1000, max_in_flight=4, name="openai/gpt-4o-mini")
    text = repr(limiter)
    assert "openai/gpt-4o-mini" in text
    assert "requests=0/10" in text
    assert "tokens=0/1000" in text


@settings(max_examples=60, deadline=None)
@given(
    requests=st.one_of(st.none(), st.integers(1, 30)),
    tokens=st.one_of(st.none(), st.integers(500, 5000)),
    burst=st.integers(0, 5),
    jobs=st.lists(st.tuples(st.integers(1, 500), st.floats(0.0, 1.0), st.floats(0.0, 3.0)), min_size=1, max_size=60),
)
def test_property_no_window_ever_exceeds_either_limit(
    requests: int | None, tokens: int | None, burst: int, jobs: list[tuple[int, float, float]]
) -> None:
    """Random arrivals, costs, downward reconciliations and hold times."""
    window = 10.0

    async def scenario() -> list[Grant]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=requests, tokens=tokens, window=window, burst_requests=burst, max_in_flight=8)
        grants: list[Grant] = []

        async def one(cost: int, used: float, hold: float, delay: float) -> None:
            await asyncio.sleep(delay)
            r = await limiter.acquire(cost)
            actual = max(1, int(cost * used))
            grants.append((loop.time(), actual))
            r.reconcile(actual)
            await asyncio.sleep(hold)
            r.done()

        await asyncio.gather(*(one(c, u, h, i * 0.1) for i, (c, u, h) in enumerate(jobs)))
        return grants

    grants = run_in_virtual_time(scenario())
    assert len(grants) == len(jobs)
    if requests is not None:
        assert max_in_any_window(grants, window, tokens=False) <= requests
    if tokens is not None:
        assert max_in_any_window(grants, window, tokens=True) <= tokens
