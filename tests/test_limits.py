"""The in-process limiter, in virtual time: a minute of limits runs in milliseconds."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice import CapacityError, LocalLimiter, RateLimitSnapshot
from sluice._limits import CATCH_UP, LEDGER_TICK, WINDOW_MARGIN, pace_factor
from sluice.testing import run_in_virtual_time

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
    """Acquire every cost at once and send each as the engine does; when each was sent."""
    loop = asyncio.get_running_loop()
    grants: list[Grant] = []

    async def one(i: int, cost: int) -> None:
        reservation = await limiter.acquire(cost)
        await asyncio.sleep(reservation.send_delay(loop.time()))  # as the engine sends: paced
        reservation.sent(loop.time())
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
    # 60 s / 10, never a burst; a little wider than that, so shorter windows hold too (PACE_MARGIN)
    assert gaps == {round(6.0 * pace_factor(60.0), 6)}
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


def test_a_token_burst_lets_that_many_tokens_go_at_once() -> None:
    limiter = LocalLimiter(tokens=1000, window=10.0, burst_tokens=500)
    grants = run_in_virtual_time(_take_all(limiter, [100] * 20))
    assert sum(1 for t, _ in grants if t == 0.0) == 6  # the first, and 500 tokens more
    assert max_in_any_window(grants, 10.0, tokens=True) <= 1000


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
    assert without == pytest.approx(60.0 * pace_factor(60.0))  # full until the pacer lets 1000 more go
    assert with_reconcile == pytest.approx(6.0 * pace_factor(60.0))  # only the pacer's share of 100 tokens


def test_reconciling_upward_delays_the_next_request() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(tokens=1000, window=60.0)
        r = await limiter.acquire(100)
        r.reconcile(900)
        r.done()
        await limiter.acquire(200)
        return loop.time()

    assert run_in_virtual_time(scenario()) == pytest.approx(max(60.0 + WINDOW_MARGIN, 54.0 * pace_factor(60.0)))


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

    step = 0.1 * pace_factor(60.0)
    assert run_in_virtual_time(scenario()) == pytest.approx([7.5, 7.5 + step, 7.5 + 2 * step])


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


# -- learnt limits keep their units -------------------------------------------------------


def _times(limiter: LocalLimiter, n: int, snapshot: RateLimitSnapshot, cost: int = 1) -> list[float]:
    """Grant times of ``n`` requests of ``cost`` tokens, after one ``observe(snapshot)``."""

    async def scenario() -> list[float]:
        limiter.observe(snapshot)
        return [t for t, _ in sorted(await _take_all(limiter, [cost] * n))]

    return run_in_virtual_time(scenario())


def test_a_per_minute_header_is_converted_into_a_six_second_window() -> None:
    # configured 300 per 6 s (50/s); the provider says 960 per minute, i.e. 96 per 6 s
    limiter = LocalLimiter(requests=300, window=6.0)
    times = _times(limiter, 400, RateLimitSnapshot(limit_requests=960, requests_window=60.0))
    assert limiter.requests_limit == 96
    grants = [(t, 1) for t in times]
    assert max_in_any_window(grants, 6.0, tokens=False) <= 96
    assert max_in_any_window(grants, 60.0, tokens=False) <= 960
    # and not throttled below it: 16 a second, evenly (0.5 % wider in a 6 s window)
    assert times[-1] == pytest.approx(399 / 16, rel=0.01)
    gap = 0.0625 * pace_factor(6.0)
    assert all(b - a == pytest.approx(gap, abs=1e-6) for a, b in itertools.pairwise(times))


def test_a_limit_learnt_from_headers_paces_at_limit_over_60_per_second() -> None:
    limiter = LocalLimiter(window=6.0)  # nothing configured
    times = _times(limiter, 200, RateLimitSnapshot(limit_requests=960, remaining_requests=960, reset_requests=0.0))
    assert limiter.requests_limit == 96  # per 6 s
    gap = 0.0625 * pace_factor(6.0)  # 960 / 60 per second, paced a little wider
    assert all(b - a == pytest.approx(gap, abs=1e-6) for a, b in itertools.pairwise(times))
    assert max_in_any_window([(t, 1) for t in times], 6.0, tokens=False) <= 96


def test_a_learnt_token_limit_paces_tokens_at_limit_over_60_per_second() -> None:
    limiter = LocalLimiter(window=6.0)
    times = _times(limiter, 100, RateLimitSnapshot(limit_tokens=48_000, tokens_window=60.0), cost=100)
    assert limiter.tokens_limit == 4800  # per 6 s
    gap = 0.125 * pace_factor(6.0)  # 48,000 / 60 = 800 tokens a second, 100 each
    assert all(b - a == pytest.approx(gap, abs=1e-6) for a, b in itertools.pairwise(times))


def test_an_hourly_window_is_not_throttled_by_a_per_minute_figure() -> None:
    # 10,000 per hour configured; the provider allows 200 a minute (12,000 an hour): not lower
    limiter = LocalLimiter(requests=10_000, window=3600.0)
    times = _times(limiter, 500, RateLimitSnapshot(limit_requests=200, requests_window=60.0))
    assert limiter.requests_limit == 10_000
    assert times[-1] == pytest.approx(499 * 0.36, rel=0.01)


def test_an_hourly_window_adopts_a_lower_per_minute_limit_in_its_own_units() -> None:
    limiter = LocalLimiter(requests=10_000, window=3600.0)
    times = _times(limiter, 300, RateLimitSnapshot(limit_requests=120, requests_window=60.0))
    assert limiter.requests_limit == 7200  # 120 a minute, per hour
    grants = [(t, 1) for t in times]
    assert max_in_any_window(grants, 60.0, tokens=False) <= 120  # the provider's real limit holds
    assert times[-1] == pytest.approx(299 * 0.5 * pace_factor(3600.0))  # two a second, not slower


def test_per_minute_remaining_is_converted_before_it_counts_as_outside_traffic() -> None:
    async def scenario() -> int:
        limiter = LocalLimiter(requests=300, window=6.0, burst_requests=300)
        # 3000 a minute is our 300 per 6 s; 1000 left this minute is 100 left in our window
        limiter.observe(RateLimitSnapshot(limit_requests=3000, remaining_requests=1000, reset_requests=3.0))
        grants = await _take_all(limiter, [1] * 300)
        assert max_in_any_window(grants, 6.0, tokens=False) <= 300
        return sum(1 for t, _ in grants if t < 3.0)

    assert run_in_virtual_time(scenario()) == 100


def test_a_request_larger_than_our_window_share_of_a_learnt_limit_goes_alone() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(window=6.0)
        limiter.observe(RateLimitSnapshot(limit_tokens=30_000, tokens_window=60.0))
        assert limiter.tokens_limit == 3000  # per 6 s, but one request may hold up to 30,000
        with pytest.raises(CapacityError, match=r"40000 tokens.*allows 30000 tokens per 60 s"):
            await limiter.acquire(40_000)
        times = []
        for _ in range(3):
            (await limiter.acquire(5000)).done()
            times.append(loop.time())
        return times

    # each goes alone in its window, spaced by the pacer at 500 tokens a second
    step = 10.0 * pace_factor(6.0)
    assert run_in_virtual_time(scenario()) == pytest.approx([0.0, step, 2 * step])


def test_a_learnt_limit_under_one_request_per_window_is_paced_not_refused() -> None:
    limiter = LocalLimiter(window=1.0)
    times = _times(limiter, 5, RateLimitSnapshot(limit_requests=30, requests_window=60.0))  # 0.5 per second
    step = 2.0 * pace_factor(1.0)
    assert times == pytest.approx([i * step for i in range(5)])


@pytest.mark.parametrize("window", [0.0, -60.0, float("nan"), float("inf")])
def test_counts_over_a_nonsense_window_are_ignored(window: float) -> None:
    async def scenario() -> None:
        limiter = LocalLimiter(requests=100, tokens=1000, window=60.0)
        limiter.observe(
            RateLimitSnapshot(
                limit_requests=1,
                remaining_requests=0,
                reset_requests=30.0,
                requests_window=window,
                limit_tokens=1,
                remaining_tokens=0,
                reset_tokens=30.0,
                tokens_window=window,
            )
        )
        assert (limiter.requests_limit, limiter.tokens_limit) == (100, 1000)
        (await limiter.acquire(500)).done()
        assert asyncio.get_running_loop().time() == 0.0

    run_in_virtual_time(scenario())


@pytest.mark.parametrize("start", [0.01, 0.02, 0.08, 25.50690257394217])  # where floats round unluckily
def test_an_entry_is_gone_from_the_counts_at_the_instant_a_waiter_is_granted_for_its_leaving(start: float) -> None:
    """Found by the property test: the ledger expired an entry at ``t <= now - window -
    margin`` but the wake-up time was ``t + window + margin``; for some ``t`` the two round
    differently, so at the instant B was granted because A had left, A still counted.
    A header read at that instant then saw no outside traffic where there was some, and
    the next request went at once into a server that had just said "0 remaining"."""

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(tokens=1000, window=10.0, burst_tokens=1000)
        await asyncio.sleep(start)
        (await limiter.acquire(600)).done()  # A
        b = await limiter.acquire(600)  # granted the instant A leaves the window
        granted = loop.time()
        # the server has counted 1000 (B and 400 from elsewhere): nothing left for 5 s
        limiter.observe(RateLimitSnapshot(limit_tokens=1000, remaining_tokens=0, reset_tokens=5.0, tokens_window=10.0))
        (await limiter.acquire(400)).done()
        b.done()
        return loop.time() - granted

    assert run_in_virtual_time(scenario()) == pytest.approx(5.0)


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

    assert run_in_virtual_time(scenario()) == pytest.approx(10.0 * pace_factor(10.0))


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


def test_refund_returns_everything_for_a_request_never_sent() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=1, tokens=100, window=10.0)
        (await limiter.acquire(100)).refund()
        (await limiter.acquire(100)).done()
        return loop.time()

    assert run_in_virtual_time(scenario()) == 0.0


def test_a_request_stopped_after_taking_its_send_slot_gives_the_slot_back() -> None:
    """Paced at one a second: the second request took its send place, then was not sent
    (a stop, the store failing): the third leaves in its place, not a second later."""

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=60, window=60.0)
        left = []
        for i in range(3):
            grant = await limiter.acquire(1)
            await asyncio.sleep(grant.send_delay(loop.time()))
            if i == 1:
                grant.refund()
                continue
            grant.sent(loop.time())
            left.append(loop.time())
            grant.done()
        return left

    assert run_in_virtual_time(scenario()) == pytest.approx([0.0, 1.0], abs=0.01)


def test_repr_is_informative() -> None:
    limiter = LocalLimiter(requests=10, tokens=1000, max_in_flight=4, name="openai/gpt-4o-mini")
    text = repr(limiter)
    assert "openai/gpt-4o-mini" in text
    assert "requests=0/10" in text
    assert "tokens=0/1000" in text


# -- the property test: random interleavings, checked against a model ---------------------

WINDOW = 10.0
EPS = 1e-9


class _Recorded(LocalLimiter):
    """A LocalLimiter that notes each grant at the instant it is made, in order.

    It changes nothing. The test needs the exact order of grants relative to the
    reconciles, refunds and observations around them; a waiting task only resumes
    later in the same tick, after other callbacks may have run.
    """

    def __init__(self, log: list[tuple[object, ...]], **kwargs: float | int | None) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.log = log

    def _grant(self, tokens: int, now: float, output: int = 0) -> object:  # type: ignore[override]
        grant = super()._grant(tokens, now, output)
        self.log.append(("grant", now, grant, tokens))
        return grant


def _quarter(high: int) -> st.SearchStrategy[float]:
    """Times on a 0.25 s grid, so many things happen at the same instant."""
    return st.integers(0, high).map(lambda k: k * 0.25)


_JOBS = st.lists(
    st.tuples(
        _quarter(12),  # gap after the previous job's arrival
        st.integers(0, 2),  # priority lane
        st.integers(1, 600),  # estimated tokens
        st.sampled_from(["reconcile", "reconcile", "refund"]),  # how the attempt settles
        st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.5, 2.5]),  # actual / estimate (down and up)
        _quarter(12),  # held before it settles
        st.one_of(  # headers read the instant it is granted: (remaining requests, tokens, reset)
            st.none(),
            st.tuples(
                st.one_of(st.none(), st.integers(0, 30)), st.one_of(st.none(), st.integers(0, 5000)), _quarter(40)
            ),
        ),
    ),
    min_size=1,
    max_size=40,
)
_SNAPSHOT_WINDOW = st.sampled_from([WINDOW, 60.0, 5.0])
_EVENTS = st.lists(
    st.one_of(
        st.tuples(  # tighten: lower limits, in the server's unit
            st.just("limit"),
            _quarter(120),
            st.one_of(st.none(), st.integers(1, 40)),
            st.one_of(st.none(), st.integers(300, 30_000)),
            _SNAPSHOT_WINDOW,
        ),
        st.tuples(  # outside traffic: less remaining than we account for
            st.just("outside"),
            _quarter(120),
            st.one_of(st.none(), st.integers(0, 40)),
            st.one_of(st.none(), st.integers(0, 30_000)),
            _SNAPSHOT_WINDOW,
            _quarter(60),  # reset
        ),
        st.tuples(st.just("penalize"), _quarter(120), _quarter(60)),
    ),
    max_size=8,
)


class _Model:
    """What the limiter promises, replayed from the event log in the order things happened."""

    def __init__(self, requests: int | None, tokens: int | None, max_in_flight: int | None) -> None:
        self.requests_limit: float | None = requests
        self.tokens_limit: float | None = tokens
        self.hard_tokens: float | None = tokens
        self.max_in_flight = max_in_flight
        self.entries: dict[int, list[float]] = {}  # id(grant) -> [time, requests, tokens]
        self.open: set[int] = set()
        self.paused_until = -math.inf
        self.ext_requests = (0.0, -math.inf)
        self.ext_tokens = (0.0, -math.inf)

    def used(self, now: float, *, tokens: bool, margin: float) -> float:
        """Requests (or tokens) granted in the window ending at ``now`` (the ledger's, with
        ``margin=WINDOW_MARGIN``: an entry leaves it at exactly ``t + WINDOW + margin``)."""
        return sum(e[2] if tokens else e[1] for e in self.entries.values() if e[0] + (WINDOW + margin) > now)

    def grant(self, now: float, key: int, amount: int) -> None:
        assert now >= self.paused_until, f"granted at {now} during a pause until {self.paused_until}"
        if self.max_in_flight is not None:
            assert len(self.open) < self.max_in_flight, "more in flight than max_in_flight"
        if self.hard_tokens is not None:
            assert amount <= self.hard_tokens, f"granted {amount} tokens, more than any window allows"
        if self.requests_limit is not None:
            cap = max(1.0, self.requests_limit)
            assert self.used(now, tokens=False, margin=0.0) + 1 <= cap + EPS, f"requests over {cap} at {now}"
            ext, until = self.ext_requests
            if now < until:
                assert self.used(now, tokens=False, margin=WINDOW_MARGIN) + ext + 1 <= cap + EPS, "outside traffic"
        if self.tokens_limit is not None and amount:
            cap = max(float(amount), self.tokens_limit)
            assert self.used(now, tokens=True, margin=0.0) + amount <= cap + EPS, f"tokens over {cap} at {now}"
            ext, until = self.ext_tokens
            if now < until:
                assert self.used(now, tokens=True, margin=WINDOW_MARGIN) + ext + amount <= cap + EPS, "outside tokens"
        self.entries[key] = [now, 1, amount]
        self.open.add(key)

    def observe(self, now: float, snapshot: RateLimitSnapshot) -> None:
        """The documented reading of a snapshot: limits and remaining counts in our window."""
        if snapshot.limit_requests is not None and snapshot.limit_requests >= 1:
            learnt = snapshot.limit_requests * WINDOW / snapshot.requests_window
            if self.requests_limit is None or learnt < self.requests_limit:
                self.requests_limit = learnt
        if snapshot.limit_tokens is not None and snapshot.limit_tokens >= 1:
            learnt = snapshot.limit_tokens * WINDOW / snapshot.tokens_window
            if self.tokens_limit is None or learnt < self.tokens_limit:
                self.tokens_limit = learnt
            if self.hard_tokens is None or snapshot.limit_tokens < self.hard_tokens:
                self.hard_tokens = snapshot.limit_tokens
        if (
            self.requests_limit is not None
            and snapshot.remaining_requests is not None
            and snapshot.reset_requests is not None
        ):
            remaining = snapshot.remaining_requests * WINDOW / snapshot.requests_window
            unseen = self.requests_limit - self.used(now, tokens=False, margin=WINDOW_MARGIN) - remaining
            if unseen > 0:
                self.ext_requests = (unseen, now + snapshot.reset_requests)
        if (
            self.tokens_limit is not None
            and snapshot.remaining_tokens is not None
            and snapshot.reset_tokens is not None
        ):
            remaining = snapshot.remaining_tokens * WINDOW / snapshot.tokens_window
            unseen = self.tokens_limit - self.used(now, tokens=True, margin=WINDOW_MARGIN) - remaining
            if unseen > 0:
                self.ext_tokens = (unseen, now + snapshot.reset_tokens)


@settings(max_examples=400, deadline=None)
@given(
    requests=st.one_of(st.none(), st.integers(1, 30)),
    tokens=st.one_of(st.none(), st.integers(300, 5000)),
    burst_requests=st.integers(0, 5),
    burst_tokens=st.sampled_from([0, 0, 200, 1000]),
    max_in_flight=st.one_of(st.none(), st.integers(1, 8)),
    jobs=_JOBS,
    events=_EVENTS,
)
def test_property_no_window_ever_exceeds_either_limit(
    requests: int | None,
    tokens: int | None,
    burst_requests: int,
    burst_tokens: int,
    max_in_flight: int | None,
    jobs: list[tuple[float, int, int, str, float, float, tuple[int | None, int | None, float] | None]],
    events: list[tuple[object, ...]],
) -> None:
    """Random arrivals, priorities, costs, reconciliations up and down, refunds, pauses,
    and headers that tighten the limits or report outside traffic, all interleaved.

    After each run: no window held more than the limit in force (the reconciled amounts
    counting), no grant fell in a pause or broke max_in_flight, every acquire finished
    (granted, or refused with CapacityError because it could never fit), and each
    priority lane was served first come, first served.
    """
    log: list[tuple[object, ...]] = []
    outcome: dict[int, str] = {}
    job_of: dict[int, int] = {}

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        limiter = _Recorded(
            log,
            requests=requests,
            tokens=tokens,
            window=WINDOW,
            burst_requests=burst_requests,
            burst_tokens=burst_tokens,
            max_in_flight=max_in_flight,
        )

        def observe(snapshot: RateLimitSnapshot) -> None:
            log.append(("observe", loop.time(), snapshot))
            limiter.observe(snapshot)

        async def job(
            i: int,
            start: float,
            priority: int,
            cost: int,
            settle: str,
            ratio: float,
            hold: float,
            report: tuple[int | None, int | None, float] | None,
        ) -> None:
            await asyncio.sleep(start)
            log.append(("call", loop.time(), i, priority, cost))
            try:
                grant = await limiter.acquire(cost, priority=priority)
            except CapacityError:
                log.append(("refused", loop.time(), i, cost))
                outcome[i] = "refused"
                return
            job_of[id(grant)] = i
            outcome[i] = "granted"
            if report is not None:  # at the very instant of the grant, as a fast reply would
                remaining_requests, remaining_tokens, reset = report
                observe(
                    RateLimitSnapshot(
                        remaining_requests=remaining_requests,
                        reset_requests=reset,
                        remaining_tokens=remaining_tokens,
                        reset_tokens=reset,
                        requests_window=WINDOW,
                        tokens_window=WINDOW,
                    )
                )
            await asyncio.sleep(hold)
            if settle == "refund":
                log.append(("refund", loop.time(), grant))
                grant.refund()
                return
            actual = round(cost * ratio)
            log.append(("reconcile", loop.time(), grant, actual))
            grant.reconcile(actual)
            log.append(("done", loop.time(), grant))
            grant.done()

        async def event(spec: tuple[object, ...]) -> None:
            kind, at = spec[0], spec[1]
            assert isinstance(at, float)
            await asyncio.sleep(at)
            if kind == "penalize":
                seconds = spec[2]
                assert isinstance(seconds, float)
                log.append(("penalize", loop.time(), seconds))
                limiter.penalize(seconds)
                return
            if kind == "limit":
                _, _, lim_r, lim_t, per = spec
                snapshot = RateLimitSnapshot(
                    limit_requests=lim_r,
                    limit_tokens=lim_t,
                    requests_window=per,
                    tokens_window=per,  # type: ignore[arg-type]
                )
            else:
                _, _, rem_r, rem_t, per, reset = spec
                snapshot = RateLimitSnapshot(
                    remaining_requests=rem_r,  # type: ignore[arg-type]
                    reset_requests=reset,  # type: ignore[arg-type]
                    remaining_tokens=rem_t,  # type: ignore[arg-type]
                    reset_tokens=reset,  # type: ignore[arg-type]
                    requests_window=per,  # type: ignore[arg-type]
                    tokens_window=per,  # type: ignore[arg-type]
                )
            observe(snapshot)

        starts = list(itertools.accumulate(gap for gap, *_ in jobs))
        tasks = [job(i, starts[i], *spec[1:]) for i, spec in enumerate(jobs)]
        try:
            async with asyncio.timeout(100_000):  # virtual seconds: a stuck waiter ends the run here
                await asyncio.gather(*tasks, *(event(e) for e in events))
        except TimeoutError:
            stuck = sorted(set(range(len(jobs))) - set(outcome))
            pytest.fail(f"jobs {stuck} waited forever: {limiter!r}")
        assert limiter.waiting == 0
        assert limiter.in_flight == 0

    run_in_virtual_time(scenario())
    assert len(outcome) == len(jobs)  # every acquire finished

    model = _Model(requests, tokens, max_in_flight)
    call_order: dict[int, int] = {}
    lanes: dict[int, list[int]] = {}
    for record in log:
        kind, now = record[0], record[1]
        assert isinstance(now, float)
        if kind == "call":
            _, _, i, priority, _ = record
            assert isinstance(i, int)
            assert isinstance(priority, int)
            call_order[i] = len(call_order)
            lanes.setdefault(priority, []).append(i)
        elif kind == "grant":
            _, _, grant, amount = record
            assert isinstance(amount, int)
            model.grant(now, id(grant), amount)
        elif kind == "refused":
            _, _, i, amount = record
            assert model.hard_tokens is not None
            assert isinstance(amount, int)
            assert amount > model.hard_tokens, f"job {i} ({amount} tokens) refused though it fits"
        elif kind == "reconcile":
            _, _, grant, actual = record
            assert isinstance(actual, int)
            model.entries[id(grant)][2] = actual
        elif kind == "refund":
            entry = model.entries[id(record[2])]
            entry[1] = entry[2] = 0
            model.open.discard(id(record[2]))
        elif kind == "done":
            model.open.discard(id(record[2]))
        elif kind == "penalize":
            seconds = record[2]
            assert isinstance(seconds, float)
            model.paused_until = max(model.paused_until, now + max(0.0, seconds))
        elif kind == "observe":
            snapshot = record[2]
            assert isinstance(snapshot, RateLimitSnapshot)
            model.observe(now, snapshot)

    # first come, first served within each lane (refused jobs drop out of the line)
    granted_order = [job_of[id(record[2])] for record in log if record[0] == "grant"]
    position = {i: n for n, i in enumerate(granted_order)}
    for lane in lanes.values():
        served = [i for i in lane if outcome[i] == "granted"]
        assert sorted(served, key=position.__getitem__) == served, f"lane served out of order: {served}"


class _CountingLimiter(LocalLimiter):
    __slots__ = ("grants",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.grants = 0

    def _grant(self, tokens: int, now: float, output: int = 0) -> Any:
        self.grants += 1
        return super()._grant(tokens, now, output)


def test_a_claim_shared_by_two_waits_is_granted_once() -> None:
    """The router waits on every deployment of a group at once: when two limiters could
    grant the same request in the same tick, only one does (no grant to hand back)."""
    from sluice._limits import Claim

    async def scenario() -> tuple[int, int]:
        east, west = _CountingLimiter(requests=1, window=1.0), _CountingLimiter(requests=1, window=1.0)
        (await east.acquire(1)).done()
        (await west.acquire(1)).done()  # both paced: the next slot opens at the same instant on each
        claim = Claim()
        waits = [asyncio.ensure_future(limiter.acquire(1, claim=claim)) for limiter in (east, west)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.5)
        granted = sum(1 for w in waits if w.done() and not w.cancelled())
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        return granted, east.grants + west.grants

    granted, grants = run_in_virtual_time(scenario())
    assert granted == 1
    assert grants == 3  # the two first requests and one shared grant, never a second one


def test_grants_in_one_millisecond_share_a_ledger_entry_and_settle_apart() -> None:
    """A fast server's grants are folded per millisecond (the ledger stays small for the
    garbage collector), yet each grant's refund and reconcile move only its own part."""

    async def scenario() -> tuple[int, int, int, int]:
        limiter = LocalLimiter(requests=100, tokens=10_000, window=60.0, burst_requests=100, burst_tokens=10_000)
        grants = [limiter.try_acquire(100) for _ in range(5)]
        assert all(g is not None for g in grants)
        entries = len(limiter._ledger)
        a, b = grants[0], grants[1]
        assert a is not None
        assert b is not None
        a.refund()
        a.refund()  # twice: nothing more
        b.reconcile(40)
        b.reconcile(40)  # the same figure again: no change
        return entries, limiter.used[0], limiter.used[1], limiter.in_flight

    entries, used_requests, used_tokens, in_flight = run_in_virtual_time(scenario())
    assert entries == 1
    assert used_requests == 4  # the refunded grant left; the other four stay counted
    assert used_tokens == 3 * 100 + 40
    assert in_flight == 4


def test_a_limiter_that_knows_no_limit_keeps_a_window_of_ledger_and_counts_it_when_it_learns_one() -> None:
    """No limit known: grants skip the meters, but the ledger still forgets what left the
    window (it must stay small for the garbage collector), and a limit learnt from the
    headers starts from what the window holds, not from every grant ever made."""

    async def scenario() -> tuple[int, int, int]:
        limiter = LocalLimiter(window=1.0)
        longest = 0
        for _ in range(300):  # 30 s of virtual time, a grant every 0.1 s
            grant = limiter.try_acquire(10)
            assert grant is not None
            grant.done()
            longest = max(longest, len(limiter._ledger))
            await asyncio.sleep(0.1)
        limiter.observe(RateLimitSnapshot(limit_requests=1000.0, remaining_requests=1000.0, requests_window=1.0))
        return longest, limiter.used[0], len(limiter._ledger)

    longest, used, kept = run_in_virtual_time(scenario())
    assert longest <= 13  # a window's grants (10) and the margin, never the 300
    assert used == kept
    assert used <= 11


# -- grants that reach the server late: the window counts from the send ------------------


def _late_sends(limiter: LocalLimiter, n: int, seed: int) -> tuple[list[float], float]:
    """Grant ``n`` requests and hand each on as the engine does (``send_delay``, then
    ``sent``) after a delay such as the loop or a commit brings: most within 20 ms, 1 % up
    to 50 ms, and now and then a stall of 0.1-0.6 s that holds every grant made meanwhile.
    Each reaches the server up to 10 ms after it left. The arrivals, and how long stalls
    and delays past ``CATCH_UP`` held sends back in all (at most: some overlap)."""
    rng = random.Random(seed)

    async def scenario() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        arrivals: list[float] = []
        stall_until = stalled = 0.0

        async def one() -> None:
            nonlocal stall_until, stalled
            reservation = await limiter.acquire(1)
            now = loop.time()
            if rng.random() < 0.002:
                until = now + rng.uniform(0.1, 0.6)
                stalled += until - max(now, stall_until)
                stall_until = max(stall_until, until)
            jitter = rng.uniform(0.0, 0.05) if rng.random() < 0.01 else rng.uniform(0.0, 0.02)
            stalled += max(0.0, jitter - CATCH_UP)
            await asyncio.sleep(max(stall_until - now, jitter))
            await asyncio.sleep(reservation.send_delay(loop.time()))
            reservation.sent(loop.time())
            arrivals.append(loop.time() + rng.uniform(0.0, 0.01))
            reservation.done()

        await asyncio.gather(*(one() for _ in range(n)))
        return sorted(arrivals), stalled

    return run_in_virtual_time(scenario())


@pytest.mark.parametrize("seed", range(5))
def test_late_sends_never_put_more_in_any_window_at_the_server_than_the_limit(seed: int) -> None:
    """600 a minute, paced: at the server no 60 s window holds more than 600 and no 10 s
    window more than 100, however the sends straggle. What it costs: the pace margin
    (0.3 %) and the time sends were held back, nothing more; within 2 % of the ideal."""
    limiter = LocalLimiter(requests=600, window=60.0)
    arrivals, stalled = _late_sends(limiter, 1300, seed)
    grants = [(t, 1) for t in arrivals]
    assert max_in_any_window(grants, 60.0, tokens=False) <= 600
    assert max_in_any_window(grants, 10.0, tokens=False) <= 100
    ideal = 1299 * 0.1
    last = arrivals[-1]
    assert last <= ideal * pace_factor(60.0) + stalled + 0.25  # (0.2 %: the ledger dated by sends)
    assert last <= 1.02 * ideal


def test_requests_all_a_little_late_keep_their_pace() -> None:
    """A send that is late by the same 25 ms each time (a commit before each) is no stall:
    the requests keep their spacing and the job its rate."""

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=600, window=60.0)
        last = 0.0

        async def one() -> None:
            nonlocal last
            reservation = await limiter.acquire(1)
            await asyncio.sleep(0.025)
            await asyncio.sleep(reservation.send_delay(loop.time()))
            reservation.sent(loop.time())
            last = max(last, loop.time())
            reservation.done()

        await asyncio.gather(*(one() for _ in range(600)))
        return last

    assert run_in_virtual_time(scenario()) == pytest.approx(599 * 0.1 * pace_factor(60.0) + 0.025, abs=0.01)


def test_a_refund_behind_an_entry_kept_by_a_late_send_leaves_no_phantom_request() -> None:
    """A late send keeps its ledger entry past its time, and so the entries after it: a
    refund of one of those still takes its request out of the counts."""

    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        limiter = LocalLimiter(requests=2, window=10.0)
        first = await limiter.acquire(1)
        second = await limiter.acquire(1)  # 5 s later, paced
        await asyncio.sleep(4.0)
        first.sent(loop.time())  # the first leaves only now, 9 s in (a stall): it counts from here
        await asyncio.sleep(7.0)  # 16 s: the second's own time is up; the first holds it in
        second.refund()  # never sent after all
        first.done()
        await asyncio.sleep(20.0)  # both have left the window
        (await limiter.acquire(1)).done()
        return limiter.in_flight, limiter.used[0]

    assert run_in_virtual_time(scenario()) == (0, 1)  # only the last grant is in the window


@pytest.mark.parametrize(
    ("limits", "before"),
    [
        ({"requests": 300, "window": 60.0}, 0),  # an even pace: 600 take two minutes
        ({"requests": 300, "window": 60.0, "burst_requests": 300}, 0),  # a plain window: 600 by ~60 s
        ({"requests": 300, "window": 60.0, "burst_requests": 300}, 100),  # with a window already in use
        ({"requests": 30, "window": 10.0, "burst_requests": 5}, 20),
        ({"tokens": 300, "window": 10.0}, 5),
        ({"tokens": 300, "window": 10.0, "burst_tokens": 300}, 5),
        ({"requests": 30, "tokens": 2000, "window": 10.0, "burst_requests": 30}, 30),
    ],
)
def test_forecast_is_when_the_limiter_grants(limits: dict[str, Any], before: int) -> None:
    """``forecast(tokens, ahead)`` works the limiter's own schedule out ahead (its window,
    pacer and burst): the nth of a queue of requests is granted when it says."""

    async def scenario() -> tuple[list[float], list[float]]:
        limiter = LocalLimiter(**limits)
        loop = asyncio.get_running_loop()
        for _ in range(before):
            grant = await limiter.acquire(10)
            grant.sent(loop.time())
            grant.done()
        await asyncio.sleep(1.3)
        predicted = [limiter.forecast(10, ahead) for ahead in range(200 if "tokens" in limits else 600)]
        granted: list[float] = []

        async def one() -> None:
            grant = await limiter.acquire(10)
            granted.append(loop.time())
            grant.sent(loop.time())
            grant.done()

        await asyncio.gather(*(one() for _ in predicted))
        return predicted, sorted(granted)

    predicted, granted = run_in_virtual_time(scenario())
    assert predicted == pytest.approx(granted, abs=LEDGER_TICK)


def test_forecast_of_a_plain_window_is_one_window_per_limit_of_requests() -> None:
    async def scenario() -> tuple[float, float, float]:
        limiter = LocalLimiter(requests=300, window=60.0, burst_requests=300)
        now = asyncio.get_running_loop().time()
        return limiter.forecast(1, 299) - now, limiter.forecast(1, 300) - now, limiter.forecast(1, 599) - now

    first, next_window, last = run_in_virtual_time(scenario())
    assert first == 0.0
    assert next_window == pytest.approx(60.0 + WINDOW_MARGIN)
    assert last == pytest.approx(60.0 + WINDOW_MARGIN)
