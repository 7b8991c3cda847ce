"""``sluice serve`` with ``batch_tier = "batch"``, a client budget and a ``kill -9``: the
restarted server collects what its provider batches answer, as ``sluice run --tier
batch`` does, delivers every line the provider billed, and charges the client for exactly
those (the worst case the killed server held for them is not spent twice)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from polling import until
from prometheus_client.parser import text_string_to_metric_families
from servetools import ALICE_KEY, UPSTREAM_KEY, fake

LINES = 200
MAX_TOKENS = 200
#: Every line's worst case at once (the batch price is half): a budget of a little more,
#: or of less than twice it, runs out in a restart that counts the killed server's holds
#: as spent and then holds them again.
WORST = LINES * (MAX_TOKENS * 8.0 + 10 * 2.0) / 1e6 * 0.5

_CONFIG = """
[serve]
batch_tier = "batch"
batch_poll_every = 0.2

[[deployment]]
model = "openai/gpt-test"
base_url = "{url}"
api_key_env = "UPSTREAM_KEY"
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0 }}

[[client]]
name = "alice"
key_env = "ALICE_KEY"
budget_usd = {budget}
"""


@contextlib.asynccontextmanager
async def sluice_serve(config: Path, state: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``sluice serve`` in its own process: (the process, its base URL)."""
    env = {**os.environ, "UPSTREAM_KEY": UPSTREAM_KEY, "ALICE_KEY": ALICE_KEY}
    args = ["-m", "sluice", "serve", "--config", str(config), "--port", "0", "--state", str(state)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        ready = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert "listening on" in ready, ready
        yield process, ready.split("listening on ")[1].split()[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def _records() -> bytes:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-test",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": MAX_TOKENS,
            },
        }
        for i in range(LINES)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def _finished(client: openai.AsyncOpenAI, batch_id: str) -> Any:
    batch = None

    async def done() -> bool:
        nonlocal batch
        batch = await client.batches.retrieve(batch_id)
        return batch.status in ("completed", "failed", "expired", "cancelled")

    await until(done, timeout=120)
    return batch


async def _spent(url: str) -> float:
    """What the server counts alice as having spent (``/metrics``)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluice_client_spent_usd" and sample.labels.get("client") == "alice":
                return float(sample.value)
    raise AssertionError("no sluice_client_spent_usd for alice")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("budget", [1.05 * WORST, 1.5 * WORST], ids=["tight", "roomy"])
async def test_a_restart_after_kill_9_collects_the_provider_batch_and_charges_exactly_what_it_billed(
    tmp_path: Path, budget: float
) -> None:
    async with fake() as upstream:
        upstream.batches.lines_per_second = 20.0  # ~10 s for the batch: the kill lands mid-way
        config = tmp_path / "sluice.toml"
        config.write_text(_CONFIG.format(url=upstream.url, budget=budget))
        state = tmp_path / "state"
        async with sluice_serve(config, state) as (process, url):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=ALICE_KEY, max_retries=0)
            upload = await client.files.create(file=("in.jsonl", _records()), purpose="batch")
            batch = await client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            await upstream.until(lambda: len(upstream.ledger) >= 20, timeout=120)  # a provider batch at work
            process.send_signal(signal.SIGKILL)
            assert await process.wait() == -signal.SIGKILL
            await client.close()
        assert len(upstream.batches.batches) == 1
        async with sluice_serve(config, state) as (_, url):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=ALICE_KEY, max_retries=0)
            done = await _finished(client, batch.id)
            output = [] if done.output_file_id is None else (await client.files.content(done.output_file_id)).text
            errors = [] if done.error_file_id is None else (await client.files.content(done.error_file_id)).text
            await client.close()
            charged = await _spent(url)
        async with sluice_serve(config, state) as (_, url):  # killed again: what it counts back
            charged_after_restart = await _spent(url)
        billed = upstream.total_billed_usd
        ledger = list(upstream.ledger)
    delivered = {json.loads(line)["custom_id"] for line in output.splitlines()} if output else set()
    failed = [json.loads(line) for line in errors.splitlines()] if errors else []
    assert done.status == "completed"
    assert failed == []  # none lost to a budget the killed server's holds ate
    assert len(delivered) == LINES
    assert len(ledger) == LINES  # each line billed once: the restart followed the batch, sent nothing twice
    assert upstream.stats.duplicate_successes == 0
    assert charged == pytest.approx(billed, rel=1e-6)  # charged exactly what was billed
    assert charged_after_restart == pytest.approx(billed, rel=1e-6)
