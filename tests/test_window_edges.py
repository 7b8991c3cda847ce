"""The edge of a window (issue 34, points 20 and 26): where the window binds (a burst at
its start, a token limit whose unused output came back), the next window's requests go
the moment the last window's leave sluice's ledger; they must not reach the server before
those have left its own count. An entry counts from when its request left and, when it
reached the server late, from its answer (the server had counted it by then; up to
``answer_bound`` after it left). Checked against the fake's own limit clock."""

from __future__ import annotations

import asyncio

from fake_provider import deployment_at

from sluice import Engine, Result, RetryPolicy
from sluice.testing import FakeServer, run_in_virtual_time

ONCE = RetryPolicy(max_attempts=1)  # a 429 is a failed result here, not a quiet retry


def test_a_request_the_server_counts_late_does_not_bring_the_next_window_early() -> None:
    """10 per 10 s; the server counts the first request 0.15 s after it arrived. The 11th
    goes a window after sluice's count of the first: before, that was a window after it
    left (10.03 s, at the pace), while the server held it until 10.15 s: a 429."""

    async def scenario() -> list[Result]:
        async with FakeServer(rpm=10, window=10.0, slice=None) as server:
            server.inject("late", delay=0.15)
            async with Engine(deployment_at(server, rpm=10, window=10.0), retry=ONCE) as engine:
                results = [r async for r in engine.map([f"q{i}" for i in range(25)], model="openai/gpt-test")]
            assert server.stats.rate_limited == 0
            return results

    assert all(r.ok for r in run_in_virtual_time(scenario()))


def test_a_token_window_counted_late_meets_no_tpm_429() -> None:
    """600 tokens per 5 s, matched by the deployment's ``tpm``. Answers give their unused
    output back, so the window (not the pacer) sets the pace, to the millisecond; the
    server counts four requests 80 ms late. Before, one request a run met a TPM 429
    (requests never did: their pacer keeps 0.3 % of the window spare)."""

    async def scenario() -> list[Result]:
        async with FakeServer(tpm=600, window=5.0) as server:
            server.inject("late", times=4, delay=0.08)
            async with Engine(deployment_at(server, tpm=600, window=5.0), retry=ONCE) as engine:
                asks = (
                    {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 20} for i in range(80)
                )
                results = [r async for r in engine.map(asks, model="openai/gpt-test")]
            assert server.stats.rate_limited == 0
            return results

    assert all(r.ok for r in run_in_virtual_time(scenario()))


async def test_bursts_at_each_window_start_meet_no_429() -> None:
    """Two deployments on one loop, each a plain window of 20 per 4 s (``burst_requests``
    = its rpm), three windows of 20 at once each. The first window's requests open new
    connections, and (Python 3.11) aiohttp writes their bodies on a later turn of a busy
    loop: they reach the server tens of ms after sluice counts them sent. Before, the next
    window (on warm connections) came to the server while it still held them: on a loaded
    machine 2 to 11 429s a run (on a quiet one the lag is smaller and it passed either
    way; the two tests above show it in virtual time). Now each is counted from its answer."""
    rpm, window = 20, 4.0
    async with (
        FakeServer(rpm=rpm, window=window, slice=None) as one,
        FakeServer(rpm=rpm, window=window, slice=None) as other,
    ):
        limits = {"rpm": rpm, "window": window, "burst_requests": rpm}
        deployments = [deployment_at(one, "openai/one", **limits), deployment_at(other, "openai/other", **limits)]
        async with Engine(deployments, retry=ONCE) as engine:
            for wave in range(3):
                results = await asyncio.gather(
                    *(
                        engine.complete(f"openai/{name}", f"wave {wave}, {name} {i}", max_tokens=4)
                        for i in range(rpm)
                        for name in ("one", "other")
                    )
                )
                assert [str(r.error) for r in results if not r.ok] == []
        assert one.stats.rate_limited == other.stats.rate_limited == 0
        assert one.stats.accepted == other.stats.accepted == 3 * rpm
