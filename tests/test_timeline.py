"""Issue 23: the timeline a store keeps for ``sluice report`` — every attempt the provider
saw (with its outcome, tokens, cost, time to first token), every cooldown, each run —
written by a real engine over loopback; and a report of a long job stays small."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest
from fake_provider import deployment_at

from sluice import Cooldown, Deployment, Engine, Price, Request
from sluice.report import build_report, render_html
from sluice.store import SqliteStore
from sluice.testing import FakeServer

PRICE = Price(input_per_mtok=2.0, output_per_mtok=8.0)


def _rows(path: Path, table: str) -> list[tuple[object, ...]]:
    store = SqliteStore(path, readonly=True)
    try:
        assert store.has_timeline()
        return list(store.report_rows(table))
    finally:
        store.close()


async def test_every_attempt_and_every_429_pause_is_in_the_timeline(server: FakeServer, tmp_path: Path) -> None:
    server.inject("429", times=2, retry_after=0.1)
    server.inject("503", times=1)
    server.inject("400", times=1)
    path = tmp_path / "state.db"
    store = SqliteStore(path, timeline=True)
    began = time.time()
    engine = Engine(deployment_at(server, price=PRICE), store=store, concurrency=1)
    async with engine:
        results = [
            r
            async for r in engine.map(Request.from_prompt("openai/gpt-test", f"q {i}", max_tokens=8) for i in range(12))
        ]
    store.close()
    ended = time.time()
    attempts = _rows(path, "attempts")
    assert len(attempts) == server.stats.received == engine.stats.attempts
    outcomes = Counter((row[4], row[5]) for row in attempts)
    assert outcomes == {(None, None): 11, ("rate_limited", 429): 2, ("server_error", 503): 1, ("bad_request", 400): 1}
    assert all(began <= row[0] <= row[0] + row[1] <= ended for row in attempts)  # wall clock, seconds
    assert sum(row[3] > 1 for row in attempts) == engine.stats.retries == 3  # attempts after a request's first
    answered = [row for row in attempts if row[4] is None]
    assert sum(row[6] for row in answered) == sum(r.usage.input_tokens for r in results)
    assert sum(row[7] for row in answered) == sum(r.usage.output_tokens for r in results)
    assert sum(row[8] for row in attempts) == sum(r.cost_usd or 0 for r in results)
    assert all(row[9] is None for row in attempts)  # no stream, no first token
    cooldowns = _rows(path, "cooldowns")
    assert [why for *_, why in cooldowns] == ["429: paused 0.1 s"] * 2
    assert [end - start for _, start, end, _ in cooldowns] == pytest.approx([0.1, 0.1], abs=1e-5)  # type: ignore[operator]
    (deployment,) = _rows(path, "deployments")
    assert deployment[1:4] == ("openai/gpt-test", "openai/gpt-test", "sync")


async def test_a_stream_notes_its_time_to_first_token(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.05
    path = tmp_path / "state.db"
    store = SqliteStore(path, timeline=True)
    engine = Engine(deployment_at(server), store=store)
    async with engine, engine.stream("openai/gpt-test", "tell me", max_tokens=8) as stream:
        async for _ in stream:
            pass
    store.close()
    ((_, seconds, _, number, outcome, _, _, output_tokens, _, ttft),) = _rows(path, "attempts")
    assert (outcome, number, output_tokens) == (None, 1, 8)
    assert isinstance(ttft, float)
    assert 0 < ttft < seconds  # type: ignore[operator]  # the first delta, before the answer ended


async def test_a_deployment_taken_out_by_failures_is_a_cooldown(server: FakeServer, tmp_path: Path) -> None:
    """A group of two providers: the first fails three times in a row and cools down (the
    circuit breaker; each request's retry goes to the second); the timeline says for how
    long and why."""
    path = tmp_path / "state.db"
    store = SqliteStore(path, timeline=True)
    async with FakeServer(api_key="sk-test") as failing:
        failing.inject("503", times=20)
        deployments = [deployment_at(failing, name="first"), deployment_at(server, name="second")]
        engine = Engine(deployments, store=store, cooldown=Cooldown(after_failures=3, seconds=30), concurrency=1)
        async with engine:
            for i in range(6):
                assert (await engine.complete("openai/gpt-test", f"q {i}", max_tokens=8)).ok
    store.close()
    names = {row[0]: row[1] for row in _rows(path, "deployments")}
    cooled = [(names[row[0]], row[3], row[2] - row[1]) for row in _rows(path, "cooldowns")]  # type: ignore[operator]
    assert cooled == [("first", "3 failures in a row (server_error)", pytest.approx(30.0, abs=0.01))]


def test_a_store_without_a_timeline_writes_none(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "plain.db")
    assert store.timeline is None
    assert not store.has_timeline()
    store.close()


async def test_the_report_of_a_long_busy_job_stays_small(tmp_path: Path) -> None:
    """200,000 attempts over ten hours, three deployments, 429s and cooldowns: the report
    has at most 240 points per series and its page stays well under a megabyte."""
    path = tmp_path / "big.db"
    store = SqliteStore(path, timeline=True)
    timeline = store.timeline
    assert timeline is not None
    deployments = [Deployment(f"openai/m{i}", name=f"d{i}", rpm=600) for i in range(3)]
    now = asyncio.get_running_loop().time()
    from sluice import RateLimitError

    limited = RateLimitError("slow down")
    for i in range(200_000):
        sent = now + i * 0.18
        deployment = deployments[i % 3]
        error = limited if i % 97 == 0 else None
        timeline.attempt(deployment, sent, sent + 0.5 + (i % 13) / 10, 1 + (i % 5 == 0), error, None, 1e-5, None)
        if error is not None and i % 970 == 0:
            timeline.cooldown(deployment, 2.0, "429: paused 2 s")
    store.close()
    report = build_report(path)
    assert report["attempts"]["total"] == 200_000
    assert len(report["time"]["t"]) <= 240
    assert report["time"]["end"] - report["time"]["start"] > 9.9 * 3600
    page = render_html(report)
    assert len(page.encode()) < 400_000


async def test_the_buffer_keeps_no_error_alive(tmp_path: Path) -> None:
    """Until the flush, a failed attempt's buffered row holds its kind and status, not the
    error (with its traceback and what that holds)."""
    import gc
    import weakref

    from sluice import RateLimitError

    store = SqliteStore(tmp_path / "buffer.db", timeline=True)
    timeline = store.timeline
    assert timeline is not None
    deployment = Deployment("openai/m", name="d", rpm=600)
    now = asyncio.get_running_loop().time()
    error = RateLimitError("slow down")
    seen = weakref.ref(error)
    timeline.attempt(deployment, now, now + 0.1, 1, error, None, 0.0, None)
    del error
    gc.collect()
    assert seen() is None  # nothing buffered refers to it
    store.close()
    report = build_report(tmp_path / "buffer.db")
    assert report["attempts"]["by_kind"] == {"rate_limited": 1}
