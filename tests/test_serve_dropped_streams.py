"""A client of ``sluice serve`` that leaves a stream before its first byte (or part-way):
the upstream answer goes on and is billed, so sluice reads it to its end and charges the
client exactly what the provider billed, not the worst case."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import pytest
from polling import until
from servetools import ALICE_KEY, ask, deployment, fake, serving

from sluice.serve.core._clients import SpendStore
from sluice.serve.core._settings import ClientSpec
from sluice.testing import FakeServer

ALICE = ClientSpec("alice", "ALICE_KEY", budget_usd=5.0)
#: Streams at once (within the engine's connections to one upstream).
STREAMS = 6


async def _leave(url: str, body: dict[str, object], upstream: FakeServer, *, after_bytes: int) -> None:
    """Post a stream and close the connection once ``after_bytes`` bytes came (0: before any,
    once every stream is at the upstream)."""
    async with aiohttp.ClientSession(headers={"authorization": f"Bearer {ALICE_KEY}"}) as http:
        if after_bytes == 0:
            task = asyncio.ensure_future(http.post(f"{url}/v1/chat/completions", json=body))
            await upstream.until(lambda: upstream.in_flight == STREAMS, timeout=30)
            assert not task.done()  # no byte yet: the first piece comes 2 s after the request
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return
        async with http.post(f"{url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            await response.content.readexactly(after_bytes)
        # leaving the block closes the connection part-way


@pytest.mark.parametrize("after_bytes", [0, 1])
async def test_a_stream_the_client_left_is_charged_what_the_provider_billed(tmp_path: Path, after_bytes: int) -> None:
    """Streams left before (or just after) their first byte were charged their worst
    case ($0.63 against $0.35 billed): the upstream answers go on and are billed."""
    async with (
        fake(latency=4.0, output_tokens=40) as upstream,
        serving([deployment(upstream)], tmp_path, clients=(ALICE,), cache=False) as url,
    ):
        bodies = [{"model": "gpt-test", "messages": ask(i), "max_tokens": 4000, "stream": True} for i in range(STREAMS)]
        upstream.stream_pieces = 2
        await asyncio.gather(*(_leave(url, body, upstream, after_bytes=after_bytes) for body in bodies))
        await upstream.until(lambda: len(upstream.ledger) == STREAMS and upstream.in_flight == 0, timeout=30)
        billed = upstream.total_billed_usd
        assert billed > 0
        spend = SpendStore(tmp_path / "clients.db")

        async def settled() -> bool:  # once each upstream stream has ended
            return abs(spend.load("alice") - billed) < 1e-9

        try:
            with contextlib.suppress(TimeoutError):
                await until(settled, timeout=20)
        finally:
            spend.close()
    worst = STREAMS * (4000 * 8.0 + 3 * 2.0) / 1e6  # far above what was billed
    assert billed < worst / 10
    spend = SpendStore(tmp_path / "clients.db")
    try:
        assert spend.load("alice") == pytest.approx(billed, rel=1e-9)
    finally:
        spend.close()
