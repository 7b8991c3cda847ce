"""``POST /v1/messages/count_tokens`` on ``sluice serve``: inside the client's own limits
(one request of its rpm), an Anthropic deployment's count sent through that deployment's
limiter, and sluice's estimate when the upstream has no such endpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import pytest
from servetools import ALICE_KEY, PRICE, UPSTREAM_KEY, fake, serving

from sluice import Deployment
from sluice.serve.core._settings import ClientSpec

HELLO: Any = [{"role": "user", "content": "Say hello to the proxy"}]


def claude(upstream: Any, **kwargs: Any) -> Deployment:
    return Deployment(
        "anthropic/claude-test", base_url=upstream.anthropic_url, api_key=UPSTREAM_KEY, price=PRICE, **kwargs
    )


def sdk(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=ALICE_KEY, max_retries=0)


@pytest.mark.parametrize("model", ["claude-test", "gpt-test"])
async def test_count_tokens_counts_against_the_clients_rpm(tmp_path: Path, model: str) -> None:
    """A 5-rpm client got 30 of 30 counts (sluice's own estimate, for a deployment that is
    not Anthropic's, counts too: nothing is sent, but it is a request)."""
    limited = ClientSpec("alice", "ALICE_KEY", rpm=5)
    async with fake() as upstream:
        chat = Deployment("openai/gpt-test", base_url=upstream.url, api_key=UPSTREAM_KEY, price=PRICE)
        async with serving([claude(upstream), chat], tmp_path, clients=(limited,)) as url:
            client = sdk(url)
            outcomes = await asyncio.gather(
                *(
                    client.messages.count_tokens(model=model, messages=HELLO, extra_headers={"x-sluice-max-wait": "0"})
                    for _ in range(12)
                ),
                return_exceptions=True,
            )
            await client.close()
    counted = [o for o in outcomes if isinstance(o, anthropic.types.MessageTokensCount)]
    refused = [o for o in outcomes if isinstance(o, anthropic.RateLimitError)]
    assert len(counted) == 5
    assert len(refused) == 7
    assert all("client 'alice'" in str(error) for error in refused)
    assert len(upstream.count_tokens.calls) == (5 if model == "claude-test" else 0)  # a refused count is not sent
    assert upstream.stats.received == 0


async def test_an_anthropic_deployments_count_goes_through_its_limiter(tmp_path: Path) -> None:
    """The count call went upstream outside the deployment's limiter."""
    window = 2.0
    async with (
        fake() as upstream,
        serving([claude(upstream, rpm=3, window=window)], tmp_path, clients=(ClientSpec("alice", "ALICE_KEY"),)) as url,
    ):
        client = sdk(url)
        counts = await asyncio.gather(
            *(client.messages.count_tokens(model="claude-test", messages=HELLO) for _ in range(6))
        )
        await client.close()
    assert len({c.input_tokens for c in counts}) == 1
    calls = sorted(upstream.count_tokens.calls)
    assert len(calls) == 6
    # never more than 3 in a window: the 4th waited for the first one's window to pass
    assert all(later - earlier >= window * 0.9 for earlier, later in zip(calls, calls[3:], strict=False))


async def test_an_upstream_without_count_tokens_gets_sluices_estimate(tmp_path: Path) -> None:
    async with (
        fake() as upstream,
        serving([claude(upstream)], tmp_path, clients=(ClientSpec("alice", "ALICE_KEY"),)) as url,
    ):
        upstream.count_tokens.served = False  # an Anthropic-compatible server: a 404
        client = sdk(url)
        counted = await client.messages.count_tokens(model="claude-test", messages=HELLO)
        await client.close()
    assert counted.input_tokens > 0
    assert upstream.count_tokens.calls == []
