"""The planner's parts by themselves: fingerprints, the index, marks, keys; and the money and
limits a cached answer counts for (hour-long writes, worst cases, ITPM on older models)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from cachejobs import text
from fake_provider import deployment_at

import sluice
from sluice import Deployment, Price, Request, Usage
from sluice._limits import LocalLimiter, usage_counts
from sluice._pricing import Pricing, cost_of, worst_case_cost
from sluice._spending import Spending
from sluice.caching import reads_counted, rules_for
from sluice.caching._fingerprint import Cut, fingerprint, marked_positions
from sluice.caching._groups import Group
from sluice.caching._index import PrefixIndex
from sluice.caching._marks import asks_an_hour, legal_ttls, with_breakpoints, with_key
from sluice.providers._translate import anthropic_body
from sluice.testing import FakeServer

RNG = random.Random(11)
INSTRUCTIONS = text(1200, RNG)
DOCUMENT = text(1500, RNG)


def qa(question: str, model: str = "anthropic/claude-sonnet-4-5", **params: Any) -> Request:
    return Request(
        model,
        [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": f"{DOCUMENT}\n\n{question}"}],
        params=params,
    )


# -- fingerprints ----------------------------------------------------------------------------


def test_two_questions_of_one_document_share_the_boundary_at_its_end_inside_the_user_text() -> None:
    one, two = fingerprint(qa("Question: who?")), fingerprint(qa("Question: where, and why?"))
    shared = {b.digest for b in one} & {b.digest for b in two}
    deepest = max((b for b in one if b.digest in shared), key=lambda b: b.tokens)
    assert deepest.cut == Cut(1, -1, len(DOCUMENT) + 2)  # the user message, split after the document
    assert 2600 <= deepest.tokens <= 2800  # ~1,200 + ~1,500, sluice's estimate
    system_end = next(b for b in one if b.cut == Cut(0))
    assert system_end.digest in shared
    assert not any(b.digest in shared for b in one if b.tokens > deepest.tokens)


def test_a_text_cut_at_a_point_hashes_as_a_text_that_ends_there() -> None:
    whole = fingerprint(Request("m", [{"role": "user", "content": DOCUMENT + "\n\n"}]))
    longer = fingerprint(Request("m", [{"role": "user", "content": DOCUMENT + "\n\nand more"}]))
    assert whole[-1].digest in {b.digest for b in longer}


def test_what_goes_in_the_prompt_is_in_the_hash_and_sampling_is_not() -> None:
    base = {b.digest for b in fingerprint(qa("q?"))}
    assert {b.digest for b in fingerprint(qa("q?", temperature=0.3, max_tokens=5))} == base
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert not {b.digest for b in fingerprint(qa("q?", tools=tools))} & base
    assert not {b.digest for b in fingerprint(qa("q?", model="anthropic/claude-opus-4-1"))} & base


async def test_a_short_prompt_is_never_fingerprinted() -> None:
    async with sluice.Engine(Deployment("anthropic/claude-sonnet-4-5", api_key="k")) as engine:
        cache = engine.attempts.caching
        assert cache is not None
        job = engine.attempts.job(Request.from_prompt("anthropic/claude-sonnet-4-5", "hi"), 0)
        assert cache.boundaries(job) is None
        assert cache.boundaries(engine.attempts.job(qa("q?"), 0)) is not None


async def test_a_miss_teaches_a_shorter_lifetime_halving_it_at_most_and_a_read_past_it_goes_unmarked() -> None:
    """A planned read that comes back a write says the deployment's entries had gone by
    that age; one odd miss does not teach seconds (at most half the lifetime per miss); a
    read at a greater age proves more and raises it again; a reader whose entry has gone
    by the time it is sent goes as written (a write would cost the premium)."""
    from sluice.caching._plan import Planned

    async with sluice.Engine(Deployment("anthropic/claude-sonnet-4-5", api_key="k")) as engine:
        cache = engine.attempts.caching
        assert cache is not None
        job = engine.attempts.job(qa("q?"), 0)
        group = Group(digest=1, tokens=2700, ttl=300.0)
        cut = (fingerprint(job.request)[-1].cut, "5m")
        label = job.route.deployment.label

        def answered(age: float, read: int, written: int) -> None:
            planned = Planned((cut,), (), group)
            planned.age = age
            cache._learn_lifetime(job, planned, Usage(2800, 10, cached_input_tokens=read, cache_write_tokens=written))

        answered(2.0, 0, 2700)  # one miss at 2 s: half of 5 minutes, not 2 s
        assert cache.lifetimes[label] == 150.0
        for _ in range(10):
            answered(2.0, 0, 2700)
        assert cache.lifetimes[label] == 2.0
        answered(1.5, 2700, 0)  # read younger than it: nothing learnt
        assert cache.lifetimes[label] == 2.0
        group.ttl = 300.0
        answered(40.0, 2700, 0)  # read at 40 s: it lives at least that
        assert cache.lifetimes[label] == 40.0

        group.ttl, group.last_used = 2.0, 100.0
        reader = Planned((cut,), (), group)
        assert reader.request_for(job.request, job.route.deployment, 101.0) is not job.request  # marked
        assert not reader.plain
        assert reader.request_for(job.request, job.route.deployment, 103.0) is job.request  # gone: as written
        assert reader.plain
        assert reader.age == 3.0


def test_the_index_keeps_flat_and_keeps_what_is_shared() -> None:
    index = PrefixIndex(most=1000)
    shared = fingerprint(qa("q?"))
    for i in range(5000):
        index.add(fingerprint(Request("m", [{"role": "user", "content": f"{i} " + DOCUMENT}])))
        if i % 50 == 0:
            index.add(shared)
    assert len(index) <= 1000
    assert index.count(shared[-1].digest) >= 50


# -- marks ------------------------------------------------------------------------------------


def test_a_breakpoint_inside_a_text_splits_it_and_reaches_anthropic() -> None:
    request = qa("Question: who?")
    marked = with_breakpoints(request, [(Cut(0), "5m"), (Cut(1, -1, len(DOCUMENT) + 2), "1h")])
    body = anthropic_body(marked, model="claude-sonnet-4-5", default_max_tokens=10)
    assert body["system"] == [{"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}}]
    first, second = body["messages"][0]["content"]
    assert first == {"type": "text", "text": DOCUMENT + "\n\n", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    assert second == {"type": "text", "text": "Question: who?"}
    assert request.messages[1]["content"] == f"{DOCUMENT}\n\nQuestion: who?"  # the caller's request is untouched


def test_a_requests_own_breakpoints_are_kept_and_counted() -> None:
    mark = {"type": "ephemeral", "ttl": "1h"}
    messages = [
        {"role": "system", "content": [{"type": "text", "text": INSTRUCTIONS, "cache_control": mark}]},
        {"role": "user", "content": DOCUMENT},
    ]
    request = Request("anthropic/claude-sonnet-4-5", messages, params={"cache_control": {"type": "ephemeral"}})
    assert marked_positions(request) == [(1, "1h"), (3, "5m")]
    assert asks_an_hour(request)
    assert not asks_an_hour(qa("q?"))
    assert legal_ttls([(0, "5m")], [(1, "1h")]) == ["1h"]  # never a 5-minute one before an hour
    assert legal_ttls([(2, "1h"), (3, "1h")], [(1, "5m")]) == ["5m", "5m"]


def test_an_openai_request_gets_a_key_unless_it_has_one() -> None:
    assert with_key(qa("q?", model="openai/gpt-4o-mini"), "g").params["prompt_cache_key"] == "g"
    mine = qa("q?", model="openai/gpt-4o-mini", prompt_cache_key="mine")
    assert with_key(mine, "g") is mine


def test_a_groups_keys_are_sharded_so_none_passes_15_requests_a_minute() -> None:
    group = Group(0xABC, 2000)
    keys = [group.key(now=i * 0.5) for i in range(40)]  # 40 in 20 s
    assert max(keys.count(k) for k in set(keys)) <= 15
    assert len(set(keys)) == 3
    assert group.key(now=100.0) == keys[0]  # a minute later the first shard has room again


def test_the_rules_follow_the_providers_documents() -> None:
    minimum = {m: rules_for(Deployment(f"anthropic/{m}")) for m in ("claude-sonnet-4-5", "claude-haiku-4-5")}
    assert {m: r.minimum for m, r in minimum.items() if r} == {"claude-sonnet-4-5": 1024, "claude-haiku-4-5": 4096}
    assert rules_for(Deployment("simulate/fast")) is None
    assert reads_counted(Deployment("anthropic/claude-3-5-haiku-20241022"))
    assert not reads_counted(Deployment("anthropic/claude-sonnet-4-5"))
    assert not reads_counted(Deployment("openai/gpt-4o-mini"))


# -- money -------------------------------------------------------------------------------------


def test_an_hour_long_write_is_priced_at_twice_the_input_where_a_5_minute_one_is_125() -> None:
    price = Price(3.0, 15.0, 0.3, 3.75)
    five = Usage(input_tokens=10_000, cache_write_tokens=10_000)
    hour = Usage(input_tokens=10_000, cache_write_tokens=10_000, cache_write_1h_tokens=10_000)
    assert cost_of(price, five) == pytest.approx(0.0375)
    assert cost_of(price, hour) == pytest.approx(0.06)
    assert worst_case_cost(price, 10_000, 0) == pytest.approx(0.0375)
    assert worst_case_cost(price, 10_000, 0, hour=True) == pytest.approx(0.06)
    sonnet = Deployment("anthropic/claude-sonnet-4-5")  # tiered: genai-prices' own calculation
    assert Pricing().cost(sonnet, hour) == pytest.approx(0.06)
    assert Pricing().worst_case(sonnet, 10_000, 0) == pytest.approx(0.0375)  # a 5-minute write: 1.25x
    assert Pricing().worst_case(sonnet, 10_000, 0, hour=True) == pytest.approx(0.06)


async def test_an_answer_with_hour_long_writes_costs_what_the_fake_billed() -> None:
    """Anthropic splits its writes by lifetime in ``cache_creation``; the 1-hour ones bill at
    twice the input price (they were priced as 5-minute ones: $0.01295 for $0.02056)."""
    mark = {"type": "ephemeral", "ttl": "1h"}
    messages = [
        {"role": "system", "content": [{"type": "text", "text": INSTRUCTIONS, "cache_control": mark}]},
        {"role": "user", "content": "q?"},
    ]
    async with FakeServer(api_key="sk-x", prices={"claude-sonnet-4-5": (3.0, 15.0)}) as server:
        d = deployment_at(server, "anthropic/claude-sonnet-4-5")
        async with sluice.Engine(d, prompt_cache="off") as engine:
            result = await engine.complete("anthropic/claude-sonnet-4-5", messages, max_tokens=16)
    assert result.ok, result.error
    assert result.cost_usd == pytest.approx(server.ledger[-1].cost_usd)
    assert result.usage.cache_write_1h_tokens == result.usage.cache_write_tokens > 1000


async def test_a_budget_reserves_an_hour_long_write_at_its_price() -> None:
    """The worst case of a request that asks for an hour-long entry is its prompt at twice
    the input price: the fake's ``bytes`` tokenizer bills as many tokens as the bound holds."""
    mark = {"type": "ephemeral", "ttl": "1h"}
    messages = [{"role": "user", "content": [{"type": "text", "text": INSTRUCTIONS, "cache_control": mark}]}]
    request = Request("anthropic/claude-sonnet-4-5", messages, max_tokens=16)
    async with FakeServer(api_key="sk-x", prices={"claude-sonnet-4-5": (3.0, 15.0)}, tokenizer="bytes") as server:
        d = deployment_at(server, "anthropic/claude-sonnet-4-5")
        spending = Spending(budget_usd=10.0)
        _, worst = spending.prepare(request, d, spending.budget)
        async with sluice.Engine(d, prompt_cache="off", budget_usd=10.0) as engine:
            result = await engine.complete(request)
    assert result.ok, result.error
    assert server.ledger[-1].cost_usd <= worst


async def test_cache_reads_count_against_itpm_on_the_models_that_count_them() -> None:
    """Claude 3.5 Haiku counts reads against ITPM (the fake does too): the limiter settles
    each answer at what the provider counted, reads included."""
    mark = {"type": "ephemeral"}
    messages = [
        {"role": "system", "content": [{"type": "text", "text": INSTRUCTIONS * 2, "cache_control": mark}]},
        {"role": "user", "content": "q?"},
    ]
    async with FakeServer(api_key="sk-x", itpm=1_000_000) as server:
        d = deployment_at(server, "anthropic/claude-3-5-haiku-20241022", itpm=1_000_000)
        async with sluice.Engine(d, prompt_cache="off") as engine:
            for _ in range(2):
                result = await engine.complete(d.model, messages, max_tokens=16)
                assert result.ok, result.error
            limiter = engine.limiter(d.model)
            assert isinstance(limiter, LocalLimiter)
            assert result.usage.cached_input_tokens > 2000
            assert limiter.used[2] == 2 * result.usage.input_tokens  # both prompts whole
    assert usage_counts(result.usage)[1] < usage_counts(result.usage, reads_counted=True)[1]
