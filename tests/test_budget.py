"""Money: costs from usage, and budgets that concurrency cannot overshoot."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib
from typing import Any

import pytest
from fake_provider import deployment_at

from sluice import (
    Budget,
    BudgetExhaustedError,
    CheaperModel,
    ConfigError,
    Deployment,
    Engine,
    Price,
    Request,
    Result,
    RetryPolicy,
    UnknownPriceError,
    Usage,
)
from sluice._budget import BudgetLedger
from sluice._pricing import Pricing, cost_of, worst_case_cost
from sluice.testing import FakeServer, run_in_virtual_time

PRICE = Price(input_per_mtok=2.0, output_per_mtok=8.0)


@pytest.mark.parametrize(
    ("usage", "price", "expected"),
    [
        (Usage(1_000_000, 0), PRICE, 2.0),
        (Usage(0, 1_000_000), PRICE, 8.0),
        (Usage(500, 250), PRICE, (500 * 2 + 250 * 8) / 1e6),
        (Usage(1000, 0, cached_input_tokens=400), Price(2.0, 8.0, 0.5), (600 * 2 + 400 * 0.5) / 1e6),
        (Usage(1000, 0, cached_input_tokens=400), PRICE, 1000 * 2 / 1e6),  # no cached rate: full price
        (Usage(100, 300, reasoning_tokens=200), PRICE, (100 * 2 + 300 * 8) / 1e6),  # reasoning is in output
        (Usage(10, 0, cached_input_tokens=50), Price(2.0, 8.0, 1.0), 10 * 1.0 / 1e6),  # cached capped at input
        (Usage(1000, 0, cache_write_tokens=900), Price(3.0, 15.0, 0.3, 3.75), (100 * 3 + 900 * 3.75) / 1e6),
        (
            Usage(1000, 0, cached_input_tokens=500, cache_write_tokens=500),
            Price(3.0, 15.0, 0.3, 3.75),
            (500 * 0.3 + 500 * 3.75) / 1e6,
        ),
    ],
)
def test_cost_table(usage: Usage, price: Price, expected: float) -> None:
    assert cost_of(price, usage) == pytest.approx(expected)


def test_worst_case_is_every_token_at_full_price() -> None:
    assert worst_case_cost(PRICE, 1000, 500) == pytest.approx((1000 * 2 + 500 * 8) / 1e6)
    dearer_writes = Price(3.0, 15.0, 0.3, 3.75)
    assert worst_case_cost(dearer_writes, 1000, 0) == pytest.approx(1000 * 3.75 / 1e6)


@pytest.mark.parametrize(
    "bad", [{"input_per_mtok": -1, "output_per_mtok": 1}, {"input_per_mtok": "x", "output_per_mtok": 1}]
)
def test_bad_prices_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="USD per million tokens"):
        Price(**bad)


def test_prices_come_from_genai_prices_or_the_config() -> None:
    pricing = Pricing()
    mini = Deployment("openai/gpt-4o-mini")
    assert pricing.cost(mini, Usage(1_000_000, 1_000_000)) == pytest.approx(0.15 + 0.60)
    assert "genai-prices" in pricing.describe(mini)
    overridden = Deployment("openai/gpt-4o-mini", price={"input_per_mtok": 1.0, "output_per_mtok": 1.0})
    assert pricing.cost(overridden, Usage(1_000_000, 0)) == pytest.approx(1.0)
    assert pricing.cost(Deployment("openai/my-finetune-nobody-knows"), Usage(10, 10)) is None
    assert pricing.cost(Deployment("simulate/demo"), Usage(10, 10)) is None
    claude = Deployment("anthropic/claude-sonnet-4")
    assert pricing.cost(claude, Usage(1_000_000, 0)) == pytest.approx(3.0)
    assert pricing.cost(claude, Usage(1_000_000, 0, cache_write_tokens=1_000_000)) == pytest.approx(3.75)


def test_ledger_never_lets_reservations_pass_the_limit_and_refuses_only_when_nothing_can_free() -> None:
    async def scenario() -> list[str]:
        ledger = BudgetLedger()
        budget = Budget(1.0)
        outcomes: list[str] = []

        async def job(i: int) -> None:
            try:
                hold = await ledger.reserve(budget, 0.3)
            except BudgetExhaustedError:
                outcomes.append(f"refused {i}")
                return
            assert budget.spent() + budget.reserved() <= budget.limit + 1e-12
            await asyncio.sleep(1 + i * 0.01)
            hold.commit(0.1)  # cheaper than its worst case: money comes back
            outcomes.append(f"done {i}")

        await asyncio.gather(*(job(i) for i in range(20)))
        assert budget.spent() <= budget.limit
        assert budget.remaining() < 0.3  # nothing affordable was left undone
        return outcomes

    outcomes = run_in_virtual_time(scenario())
    done = [o for o in outcomes if o.startswith("done")]
    refused = [o for o in outcomes if o.startswith("refused")]
    assert len(done) == 8  # 0.8 spent; then 0.2 left, less than one worst case
    assert len(refused) == 12


def test_nested_budgets_count_against_both() -> None:
    async def scenario() -> None:
        ledger = BudgetLedger()
        engine_budget = Budget(1.0, name="engine")
        task = Budget(0.25, parent=engine_budget, name="task")
        hold = await ledger.reserve(task, 0.2)
        assert engine_budget.reserved() == pytest.approx(0.2)
        assert task.remaining() == pytest.approx(0.05)
        hold.commit(0.15)
        assert engine_budget.spent() == pytest.approx(0.15)
        with pytest.raises(BudgetExhaustedError, match="task"):
            await ledger.reserve(task, 0.2)
        other = await ledger.reserve(engine_budget, 0.8)  # the engine still has room
        other.release()

    run_in_virtual_time(scenario())


PROMPT = [{"role": "user", "content": "what does a sluice gate do?"}]


async def test_a_thousand_concurrent_requests_never_overshoot_a_budget_for_a_hundred() -> None:
    max_tokens = 500
    async with FakeServer(api_key="sk-test", output_tokens=50, prices={"gpt-test": (2.0, 8.0)}, latency=0.01) as server:
        probe = Engine(deployment_at(server, price=PRICE), budget_usd=100.0)
        _, worst = probe.spending.prepare(
            Request("openai/gpt-test", PROMPT, max_tokens=max_tokens), probe.deployments[0], probe.spending.budget
        )
        limit = 100 * worst  # at worst case, exactly 100 fit
        results: list[Result] = []
        violations: list[str] = []

        def check(result: Result) -> None:
            results.append(result)
            budget = engine.spending.budget
            assert budget is not None
            if budget.spent() + budget.reserved() > limit + 1e-9:
                violations.append(f"{budget!r}")

        engine = Engine(deployment_at(server, price=PRICE), budget_usd=limit, concurrency=1000, on_result=check)
        requests = [Request("openai/gpt-test", PROMPT, max_tokens=max_tokens, id=f"r{i}") for i in range(1000)]
        async with engine:
            await asyncio.gather(*(engine.complete(r) for r in requests))
        assert not violations
        ok = [r for r in results if r.ok]
        refused = [r for r in results if isinstance(r.error, BudgetExhaustedError)]
        assert len(ok) + len(refused) == 1000
        assert len(ok) > 100  # actual cost is far below the worst case: the freed money was used
        assert engine.spent() <= limit
        assert engine.remaining() < worst  # not one more could have been afforded
        # what we say each answer cost is what the provider billed, to the cent and below
        assert sum(r.cost_usd or 0 for r in ok) == pytest.approx(server.total_billed_usd, rel=1e-9)
        assert sorted(r.cost_usd or 0 for r in ok) == pytest.approx(sorted(e.cost_usd for e in server.ledger))
        assert server.stats.accepted == len(ok)


async def test_costs_match_the_server_ledger_without_a_budget() -> None:
    async with FakeServer(api_key="sk-test", output_tokens=33, prices={"gpt-test": (2.0, 8.0)}) as server:
        async with Engine(deployment_at(server, price=PRICE)) as engine:
            results = await engine.run([Request.from_prompt("openai/gpt-test", f"q {i}" * i) for i in range(1, 30)])
        assert all(r.cost_usd is not None for r in results)
        assert engine.stats.cost_usd == pytest.approx(server.total_billed_usd)
        assert engine.spent() == pytest.approx(server.total_billed_usd)
        assert engine.remaining() == float("inf")


async def test_timed_out_attempts_are_charged_to_the_budget() -> None:
    async with FakeServer(api_key="sk-test", latency=1.0, prices={"gpt-test": (2.0, 8.0)}) as server:
        policy = RetryPolicy(max_attempts=2, base_delay=0.01, attempt_timeout=0.2)
        async with Engine(deployment_at(server, price=Price(2.0, 8.0)), budget_usd=1.0, retry=policy) as engine:
            result = await engine.complete("openai/gpt-test", "slow", max_tokens=100)
            spent = engine.spent()
        await server.until(lambda: server.in_flight == 0)  # the server finishes (and bills) what we gave up on
        assert not result.ok
        assert result.cost_usd is not None
        assert result.cost_usd > 0
        assert spent >= server.total_billed_usd  # never less than what was billed


async def test_unknown_prices_are_reported_never_zero() -> None:
    async with FakeServer(api_key="sk-test") as server:
        unpriced = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test")
        async with Engine(unpriced) as engine:
            result = await engine.complete("openai/gpt-test", "hi")
        assert result.ok
        assert result.cost_usd is None
        assert engine.stats.unpriced == 1
        assert engine.spending.unpriced_models == {"openai/gpt-test"}

        with pytest.raises(UnknownPriceError, match="no known price"):  # refused before anything starts
            async with Engine(unpriced, budget_usd=1.0):
                pass
        async with Engine(budget_usd=1.0) as engine:  # a model met on the way, with no price
            with pytest.raises(UnknownPriceError, match="no known price"):
                await engine.complete("openai/gpt-test-unlisted", "hi")
            results = await engine.run(["a", "b"], model="openai/gpt-test-unlisted")
        assert all(isinstance(r.error, UnknownPriceError) for r in results)

        async with Engine(unpriced, budget_usd=1.0, allow_unpriced=True) as engine:
            result = await engine.complete("openai/gpt-test", "hi")
        assert result.ok
        assert result.cost_usd is None
        assert server.stats.accepted == 2


async def test_a_session_has_its_own_budget_inside_the_engine_budget() -> None:
    async with (
        FakeServer(api_key="sk-test", output_tokens=10) as server,
        Engine(deployment_at(server, price=PRICE), budget_usd=1.0) as engine,
    ):
        one = await engine.complete("openai/gpt-test", "hi", max_tokens=100)
        task = engine.session(budget_usd=0.002, name="install-helper")
        _, worst = engine.spending.prepare(
            Request("openai/gpt-test", PROMPT, max_tokens=100), engine.deployments[0], task.budget
        )
        answers = await task.run([Request("openai/gpt-test", PROMPT, max_tokens=100, id=str(i)) for i in range(30)])
        assert one.ok
        ok = [a for a in answers if a.ok]
        assert 0 < len(ok) < 30
        assert all(isinstance(a.error, BudgetExhaustedError) for a in answers if not a.ok)
        assert "install-helper" in str(next(a.error for a in answers if not a.ok))
        assert task.spent() <= 0.002
        assert task.remaining() < worst
        assert engine.spent() == pytest.approx((one.cost_usd or 0) + task.spent())
        later = await engine.complete("openai/gpt-test", "still fine", max_tokens=100)  # the engine has money
        assert later.ok


async def test_a_cheaper_model_takes_over_as_money_runs_low() -> None:
    async with FakeServer(api_key="sk-test", output_tokens=10) as server:
        big = deployment_at(server, "openai/gpt-big", price=Price(20.0, 80.0))
        small = deployment_at(server, "openai/gpt-small", price=Price(0.2, 0.8))
        rule = CheaperModel({"openai/gpt-big": "openai/gpt-small"}, below_usd=0.009)
        async with Engine([big, small], budget_usd=0.01, cheaper=rule) as engine:
            results = [await engine.complete("openai/gpt-big", f"q{i}", max_tokens=20) for i in range(6)]
    used = [r.deployment for r in results]
    assert used[0] == "openai/gpt-big"
    assert used[-1] == "openai/gpt-small"
    assert all(r.ok for r in results)


async def test_budget_reservation_caps_requests_without_max_tokens() -> None:
    async with (
        FakeServer(api_key="sk-test") as server,
        Engine(deployment_at(server, price=PRICE, default_max_tokens=64), budget_usd=1.0) as engine,
    ):
        result = await engine.complete("openai/gpt-test", "no max_tokens given")
    assert result.request is not None
    assert result.request.max_tokens == 64  # sent with a cap, so the worst case is real


def test_float_drift_never_leaves_a_waiter_hanging() -> None:
    """0.1 + 0.2 - 0.1 - 0.2 is not 0.0 in floats; 'nothing in flight' must still be exact."""

    async def scenario() -> None:
        ledger = BudgetLedger()
        budget = Budget(1.0)
        for amount in (0.1, 0.2, 0.7, 0.3) * 5:
            hold = await ledger.reserve(budget, amount)
            hold.commit(0.0)
        first = await ledger.reserve(budget, 0.6)
        waiting = asyncio.create_task(ledger.reserve(budget, 0.6))
        await asyncio.sleep(1)
        first.commit(0.5)  # 0.5 left: the waiter can never fit, and nothing else is in flight
        with pytest.raises(BudgetExhaustedError):
            await waiting  # in virtual time a hang would raise a deadlock error instead

    run_in_virtual_time(scenario())


# -- the budget is a bound on what the provider bills -------------------------------------


def _png_url(width: int, height: int) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\0" * (1 + (width + 7) // 8)) * height
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(raw).decode()


_CODE = "for (let i = 0; i < n; i++) { total += values[i] * weights[i]; }\n"
_CJK = "水門は水の流れを調整し、下流の町を洪水から守る。"
_EMOJI = "🌊🚪💧🏞️⛵🌧️"
_WIDE = _png_url(2048, 768)  # 8 tiles: 1,445 tokens on gpt-4o, where 765 was assumed


def _dense(i: int) -> list[dict[str, Any]]:
    """~1,500 characters of code, CJK or emoji: one token per byte for a byte-level worst case."""
    filler = (_CODE, _CJK, _EMOJI)[i % 3]
    return [{"role": "user", "content": f"Request {i}. " + filler * (1500 // len(filler))}]


def _pictures(i: int) -> list[dict[str, Any]]:
    parts = [{"type": "text", "text": f"Request {i}: what is in these pictures?"}]
    parts += [{"type": "image_url", "image_url": {"url": _WIDE}}] * 2
    return [{"role": "user", "content": parts}]


@pytest.mark.parametrize(("prompt", "budget_usd"), [(_dense, 0.4), (_pictures, 0.3)], ids=["dense-text", "images"])
async def test_what_the_provider_bills_never_exceeds_the_budget(prompt: Any, budget_usd: float) -> None:
    """The fake bills with its own tokenizer (one token per UTF-8 byte, images by their
    pixels), including garbled and cut answers it generated; sluice must stay inside."""
    async with FakeServer(
        api_key="sk-test",
        tokenizer="bytes",
        output_tokens=40,
        prices={"gpt-4o": (2.5, 10.0)},
        latency=0.05,
        fault_rates={"malformed": 0.1, "truncated": 0.1},
        seed=3,
    ) as server:
        deployment = deployment_at(server, "openai/gpt-4o", price=Price(2.5, 10.0))
        policy = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05)
        requests = [Request("openai/gpt-4o", prompt(i), max_tokens=40, id=f"r{i}") for i in range(300)]
        async with Engine(deployment, budget_usd=budget_usd, concurrency=100, retry=policy) as engine:
            results = await engine.run(requests)
        ok = [r for r in results if r.ok]
        assert any(isinstance(r.error, BudgetExhaustedError) for r in results)  # the budget stopped the run
        assert len(ok) >= 20  # and the bound is not so loose that it stopped it at once
        assert any(not entry.delivered for entry in server.ledger)  # lost answers were billed too
        assert server.total_billed_usd <= budget_usd
        assert engine.spent() >= server.total_billed_usd - 1e-12  # sluice never counts less than was billed


def test_parked_holds_keep_their_worst_case_reserved_until_asked_again() -> None:
    """Parked requests' holds merge into one per budget; each comes back whole, in any order,
    and the budget ends exactly where it began (no float drift left reserved)."""
    from sluice._spending import Spending

    async def main() -> None:
        spending = Spending(1.0)
        budget = spending.budget
        assert budget is not None
        session = spending.session(0.5, "a session")
        amounts = [0.01 * (i % 7 + 1) / 3 for i in range(60)]
        for i, amount in enumerate(amounts):
            hold = await spending.reserve(session if i % 2 else budget, amount)
            assert hold is not None
            spending.park(f"key-{i}", hold)
        assert budget.reserved() == pytest.approx(sum(amounts))
        assert session.reserved() == pytest.approx(sum(a for i, a in enumerate(amounts) if i % 2))
        assert budget.remaining() == pytest.approx(1.0 - sum(amounts))
        assert spending.unpark(budget, "never-parked", 0.01) is None
        assert spending.unpark(session, "key-0", amounts[0]) is None  # parked under the other budget
        order = list(range(60))
        order.reverse()
        for i in order:
            hold = spending.unpark(session if i % 2 else budget, f"key-{i}", amounts[i])
            assert hold is not None
            assert hold.amount == pytest.approx(amounts[i])
            hold.commit(amounts[i] / 2)  # answered below its worst case
        assert spending.unpark(budget, "key-3", amounts[3]) is None  # given back once
        assert budget.reserved() == 0.0
        assert session.reserved() == 0.0
        assert budget.spent() == pytest.approx(sum(amounts) / 2)
        ledger = BudgetLedger()
        assert await ledger.reserve(budget, 1.0 - sum(amounts) / 2 - 1e-9)  # all of the rest is free again

    asyncio.run(main())


def test_a_parked_hold_smaller_than_the_new_worst_case_is_given_back() -> None:
    from sluice._spending import Spending

    async def main() -> None:
        spending = Spending(1.0)
        assert spending.budget is not None
        hold = await spending.reserve(spending.budget, 0.2)
        assert hold is not None
        spending.park("k", hold)
        assert spending.unpark(spending.budget, "k", 0.3) is None  # it costs more now: reserved afresh
        assert spending.budget.reserved() == 0.0

    asyncio.run(main())


def test_a_request_what_is_spent_leaves_no_room_for_is_refused_at_once() -> None:
    """Money held in flight may come back; money spent never does. A request that does not
    fit even if every hold came back whole is refused now, not left waiting on a hold
    (a parked batch line's may be held for hours)."""

    async def scenario() -> str:
        ledger = BudgetLedger()
        budget = Budget(1.0)
        (await ledger.reserve(budget, 0.8)).commit(0.8)
        held = await ledger.reserve(budget, 0.1)  # in flight, never settled here
        try:
            await asyncio.wait_for(ledger.reserve(budget, 0.3), timeout=3600)
        except BudgetExhaustedError:
            outcome = "refused"
        except TimeoutError:
            outcome = "waited an hour"
        fits = await ledger.reserve(budget, 0.1)  # what the hold in flight may still give back fits
        held.release()
        fits.release()
        return outcome

    assert run_in_virtual_time(scenario()) == "refused"


def test_a_parked_hold_settles_when_its_batch_ends_and_its_line_is_not_charged_again() -> None:
    """``settle_parked``: the batch's bill counts when its results come; the line, asked
    again, holds nothing more and its answer read back costs the budget nothing more
    (though its record still says what it cost)."""
    from sluice._spending import Spending

    async def main() -> None:
        spending = Spending(1.0)
        budget = spending.budget
        assert budget is not None
        for key in ("answered", "unanswered"):
            hold = await spending.reserve(budget, 0.2)
            assert hold is not None
            spending.park(key, hold)
        assert budget.reserved() == pytest.approx(0.4)
        spending.settle_parked("answered", 0.05)  # its batch answered it, for $0.05
        spending.settle_parked("unanswered", None)  # its batch did not: not billed
        spending.settle_parked("never-parked", 0.5)  # nothing to settle
        assert budget.reserved() == 0.0
        assert budget.spent() == pytest.approx(0.05)
        again = spending.unpark(budget, "answered", 0.2)
        assert again is not None
        assert again.amount == 0.0  # nothing more is held for it
        again.commit(0.05)  # its answer read back: already counted
        assert budget.spent() == pytest.approx(0.05)
        assert spending.unpark(budget, "unanswered", 0.2) is None  # asked again, it reserves afresh
        assert not spending.holds_parked

    asyncio.run(main())
