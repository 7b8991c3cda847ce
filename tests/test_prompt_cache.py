"""The prompt-cache planner against the fake's caches, which follow the providers' documents
(``sluice.testing``'s own rules, tokenizer and bills): ``Engine.map`` over real loopback
HTTP, in virtual time where the limits make a job take minutes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from cachejobs import document_qa, unshared
from fake_provider import deployment_at

import sluice
from sluice.testing import FakeServer, run_in_virtual_time

PRICES = {"claude-sonnet-4-5": (3.0, 15.0), "gpt-4o-mini": (0.15, 0.6)}
CLAUDE = "anthropic/claude-sonnet-4-5"
GPT = "openai/gpt-4o-mini"


def asked(lines: Sequence[Mapping[str, Any]], model: str) -> list[dict[str, Any]]:
    return [{**line, "model": model} for line in lines]


async def run_job(
    lines: Sequence[Mapping[str, Any]],
    model: str,
    mode: str,
    *,
    fake_cache: str = "auto",
    latency: float = 0.2,
    concurrency: int = 64,
    limits: Mapping[str, float] | None = None,
) -> tuple[list[sluice.Result], FakeServer, float, sluice.Engine]:
    """The job through ``Engine.map`` with ``prompt_cache=mode``: its results, the fake
    (its ledger and cache stats), and the job's time on the loop's clock."""
    limits = dict(limits or {})
    async with FakeServer(api_key="sk-x", prices=PRICES, latency=latency, prompt_cache=fake_cache, **limits) as server:  # type: ignore[arg-type]
        d = deployment_at(server, model, **limits)
        async with sluice.Engine(d, prompt_cache=mode, concurrency=concurrency) as engine:
            loop = asyncio.get_running_loop()
            began = loop.time()
            results = [r async for r in engine.map(asked(lines, model))]
            took = loop.time() - began
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    return results, server, took, engine


def billed(server: FakeServer) -> float:
    return sum(entry.cost_usd for entry in server.ledger)


def test_document_qa_on_anthropic_bills_at_most_035_of_the_job_uncached() -> None:
    lines = document_qa("claude-sonnet-4-5")

    async def both() -> tuple[float, float, list[sluice.Result], FakeServer]:
        _, off, _, _ = await run_job(lines, CLAUDE, "off")
        results, on, _, _ = await run_job(lines, CLAUDE, "auto")
        return billed(off), billed(on), results, on

    uncached, cached, results, server = run_in_virtual_time(both())
    assert cached <= 0.35 * uncached, (cached, uncached)
    assert sum(r.cost_usd or 0.0 for r in results) == pytest.approx(cached)  # what the fake billed
    stats = server.prompt_cache.stats
    assert stats.duplicate_writes <= 2
    assert stats.hits >= 200


def test_document_qa_on_openai_reads_at_least_080_of_its_prompt_tokens_from_the_cache() -> None:
    """OpenAI caches every prompt by itself (the fake's ``"on"``): what the plan adds is the
    order, priming and a key per group, sharded so no key passes ~15 requests a minute."""
    lines = document_qa("gpt-4o-mini")

    async def both() -> tuple[list[sluice.Result], FakeServer, list[sluice.Result], FakeServer]:
        plain, off, _, _ = await run_job(lines, GPT, "off", fake_cache="on")
        results, on, _, _ = await run_job(lines, GPT, "auto", fake_cache="on")
        return plain, off, results, on

    plain, off, results, server = run_in_virtual_time(both())
    prompt = sum(r.usage.input_tokens for r in results)
    read = sum(r.usage.cached_input_tokens for r in results)
    assert read >= 0.8 * prompt, (read, prompt)
    assert server.prompt_cache.stats.spills == 0
    assert sum(r.cost_usd or 0.0 for r in results) == pytest.approx(billed(server))
    assert billed(server) < billed(off)
    assert sum(r.usage.cached_input_tokens for r in plain) < 0.5 * prompt  # one route for all: it spills


def test_an_itpm_bound_job_takes_a_third_of_its_uncached_time_without_429s() -> None:
    """80 lines (10 documents x 8 questions) under 20,000 input tokens per 10 s: cache reads
    are free of ITPM, so a reservation leaves out the read the plan expects."""
    lines = document_qa("claude-sonnet-4-5", documents=10)
    limits = {"itpm": 20_000.0, "window": 10.0}

    async def both() -> tuple[float, float, FakeServer]:
        _, _, uncached, _ = await run_job(lines, CLAUDE, "off", latency=1.0, limits=limits)
        _, server, cached, _ = await run_job(lines, CLAUDE, "auto", latency=1.0, limits=limits)
        return uncached, cached, server

    uncached, cached, server = run_in_virtual_time(both())
    assert uncached > 80  # every token counted: ~217,000 of them at 2,000 a second
    assert cached <= uncached / 3, (cached, uncached)
    assert server.stats.rate_limited <= 2


@pytest.mark.parametrize("model", [CLAUDE, GPT])
def test_a_job_whose_lines_share_nothing_costs_and_runs_as_with_the_planner_off(model: str) -> None:
    lines = unshared(model.partition("/")[2])

    async def both() -> tuple[tuple[float, float], tuple[float, float], FakeServer]:
        _, off, off_took, _ = await run_job(lines, model, "off", latency=1.0, concurrency=8)
        _, on, on_took, engine = await run_job(lines, model, "auto", latency=1.0, concurrency=8)
        assert engine.attempts.caching is not None
        assert engine.attempts.caching.total.requests == 0
        return (billed(off), off_took), (billed(on), on_took), on

    (off_bill, off_time), (on_bill, on_time), server = run_in_virtual_time(both())
    assert on_bill == pytest.approx(off_bill)
    assert on_time == pytest.approx(off_time, abs=0.01)  # no priming delay
    assert server.prompt_cache.stats.requests == 0  # no breakpoint, no cache key: nothing asked the cache


def test_reads_that_do_not_come_teach_the_limiter_to_reserve_them_again() -> None:
    """The ITPM-bound job against a fake whose entries live 1.5 s (the plan counts on 5
    minutes): the reads it left out of its reservations are not there, every miss is
    written and counted in full; the share of a predicted read that answers bear out falls,
    and the reservations cover the prompts again, so the fake's limit is not overrun."""
    from sluice.testing._prompt_cache import PromptCacheSettings

    lines = document_qa("claude-sonnet-4-5", documents=10)
    limits = {"itpm": 20_000.0, "window": 10.0}
    short = PromptCacheSettings("auto", ttl_5m=1.5)

    async def job() -> tuple[list[sluice.Result], FakeServer, sluice.Engine]:
        async with FakeServer(api_key="sk-x", prices=PRICES, latency=1.0, prompt_cache=short, **limits) as server:  # type: ignore[arg-type]
            d = deployment_at(server, CLAUDE, **limits)
            async with sluice.Engine(d, concurrency=64) as engine:
                results = [r async for r in engine.map(asked(lines, CLAUDE))]
        return results, server, engine

    results, server, engine = run_in_virtual_time(job())
    assert all(r.ok for r in results)
    assert server.prompt_cache.stats.duplicate_writes > 0  # the plan's reads did miss
    assert server.stats.rate_limited <= 2
    assert engine.attempts.caching is not None
    assert engine.attempts.caching.borne_out < 0.5


def test_entries_that_go_sooner_than_planned_are_learnt_so_the_job_costs_no_more_than_uncached() -> None:
    """The fake's entries live 1.5 s, the plan counts on 5 minutes: the reads that miss teach
    the planner the deployment's lifetime (halving it at most per miss), a group whose entry
    may have gone is primed again one line first, and a reader kept past it by the ITPM
    limit goes unmarked, at the plain price. Without that, every reader wrote the prefix
    again at the write premium (34 duplicate writes, 1.10x the uncached bill)."""
    from sluice.testing._prompt_cache import PromptCacheSettings

    lines = document_qa("claude-sonnet-4-5", documents=10)
    limits = {"itpm": 20_000.0, "window": 10.0}
    short = PromptCacheSettings("auto", ttl_5m=1.5)

    async def job(mode: str) -> tuple[FakeServer, sluice.Engine]:
        async with FakeServer(api_key="sk-x", prices=PRICES, latency=1.0, prompt_cache=short, **limits) as server:  # type: ignore[arg-type]
            d = deployment_at(server, CLAUDE, **limits)
            async with sluice.Engine(d, concurrency=64, prompt_cache=mode) as engine:
                results = [r async for r in engine.map(asked(lines, CLAUDE))]
        assert all(r.ok for r in results)
        return server, engine

    async def both() -> tuple[FakeServer, FakeServer, sluice.Engine]:
        off, _ = await job("off")
        on, engine = await job("auto")
        return off, on, engine

    off, on, engine = run_in_virtual_time(both())
    assert billed(on) <= 1.05 * billed(off), (billed(on), billed(off))
    assert on.prompt_cache.stats.duplicate_writes <= 10
    assert on.stats.rate_limited <= 2
    assert engine.attempts.caching is not None
    assert engine.attempts.caching.lifetimes[CLAUDE] < 10.0


async def on_deployments(
    lines: Sequence[Mapping[str, Any]], count: int, **limits: float
) -> tuple[float, list[FakeServer]]:
    """The job through ``Engine.map`` over ``count`` deployments of one model, each its own
    fake (its own cache and limits): the job's time on the loop's clock, and the fakes."""
    servers = [
        FakeServer(api_key="sk-x", prices=PRICES, latency=1.0, prompt_cache="auto", **limits) for _ in range(count)
    ]  # type: ignore[arg-type]
    async with contextlib.AsyncExitStack() as stack:
        for server in servers:
            await stack.enter_async_context(server)
        routes = [deployment_at(s, CLAUDE, name=f"east-{n}", **limits) for n, s in enumerate(servers)]
        async with sluice.Engine(routes, concurrency=64) as engine:
            loop = asyncio.get_running_loop()
            began = loop.time()
            results = [r async for r in engine.map(asked(lines, CLAUDE))]
            took = loop.time() - began
    assert all(r.ok for r in results)
    assert sum(r.cost_usd or 0.0 for r in results) == pytest.approx(sum(billed(s) for s in servers))
    return took, servers


@pytest.mark.parametrize(
    ("documents", "limits"),
    [(12, {}), (10, {"itpm": 20_000.0, "window": 10.0})],
    ids=["room-on-one", "itpm-bound"],
)
def test_a_group_is_read_on_the_deployment_that_holds_it_not_written_on_another(
    documents: int, limits: dict[str, float]
) -> None:
    """Two deployments of one model have separate caches: a line sent to the one that does
    not hold its group's entry writes it there again, at the write premium (and, under an
    ITPM limit, counts the whole prefix against it). Where the deployment that holds it has
    room soon, the job costs what it costs on one deployment. Before: readers spread by load
    wrote each document on both (the 12-document job: 30 duplicate writes, 2.3x the bill)."""
    lines = document_qa("claude-sonnet-4-5", documents=documents)

    async def both() -> tuple[tuple[float, list[FakeServer]], tuple[float, list[FakeServer]]]:
        return await on_deployments(lines, 1, **limits), await on_deployments(lines, 2, **limits)

    (one_took, one), (two_took, two) = run_in_virtual_time(both())
    assert sum(billed(s) for s in two) <= 1.05 * billed(one[0])
    assert sum(s.prompt_cache.stats.duplicate_writes for s in two) == 0
    assert two_took <= one_took + 0.5
    assert sum(s.stats.rate_limited for s in two) == 0


def test_a_job_one_deployment_cannot_take_alone_uses_both_and_writes_each_prefix_on_few() -> None:
    """Under 60 requests a minute each, the 240-line job needs both deployments: a reader
    whose group's deployment has had no room for a while goes to the other one (writing the
    entry there, which then holds it too). Before, a write there was taken for the entry's
    expiry: the plan cut its lifetime, and 88 lines went uncached (3.6x the bill on one
    deployment; now 1.4x, in half the time)."""
    lines = document_qa("claude-sonnet-4-5")

    async def both() -> tuple[tuple[float, list[FakeServer]], tuple[float, list[FakeServer]]]:
        return await on_deployments(lines, 1, rpm=60), await on_deployments(lines, 2, rpm=60)

    (one_took, one), (two_took, two) = run_in_virtual_time(both())
    assert two_took <= 0.6 * one_took, (two_took, one_took)
    assert min(s.stats.accepted for s in two) >= 80
    assert sum(billed(s) for s in two) <= 1.6 * billed(one[0]), (sum(billed(s) for s in two), billed(one[0]))
