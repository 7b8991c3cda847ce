"""Adversarial review of the Redis scale-out (issue 10): each test pins a bug found by
attacking the promises (keys never leave a worker's own config, the shared budget as
the provider bills it, Redis trouble explicit), against a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
import redis
from redis_server import RedisServer

from sluice import Request
from sluice.cli._config import JobConfig
from sluice.redis._job_entries import request_fields
from sluice.redis._job_worker import Worker
from sluice.redis._jobs import JobQueue, JobSettings, connect
from sluice.testing import FakeServer

pytestmark = pytest.mark.timeout(60)

KEY = "sk-test-review-7d1e"


@pytest.fixture
def honest() -> Iterator[FakeServer]:
    with FakeServer(api_key=KEY).running_in_thread() as fake:
        yield fake


@pytest.fixture
def evil() -> Iterator[FakeServer]:
    with FakeServer().running_in_thread() as fake:
        yield fake


async def _work_one_job(url: str, job_id: str, until: int) -> Worker:
    """An in-process worker on ``job_id`` until ``until`` results are in Redis."""
    worker = Worker(url, JobConfig(), concurrency=2, name="w-review", only_job=job_id, grace=1.0)
    task = asyncio.get_running_loop().create_task(worker.run())
    probe = redis.asyncio.Redis.from_url(url)
    try:
        async with asyncio.timeout(30):
            while await probe.xlen(f"sluice:job:{job_id}:results") < until:
                await asyncio.sleep(0.05)
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await task
        await probe.aclose()
    return worker


def test_job_defaults_written_to_redis_cannot_send_a_workers_key_elsewhere(
    redis_server: RedisServer, honest: FakeServer, evil: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can write to Redis must not redirect a worker's requests, with its API key,
    to another host: a job's ``defaults`` are limits and prices only, as its deployments
    are (a base URL, a key variable or headers found there are ignored)."""
    monkeypatch.setenv("OPENAI_BASE_URL", honest.url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    async def main() -> None:
        client = connect(redis_server.url)
        queue = JobQueue(client, "attacked")
        hostile = {
            "base_url": evil.url,
            "api_key_env": "OPENAI_API_KEY",
            "headers": {"x-exfil": "1"},
            "provider": "openai",
            "rpm": 600,
        }
        await queue.register(JobSettings(defaults=hostile, name="attacked"))
        request = Request.from_prompt("openai/gpt-unconfigured", "hello", max_tokens=8)
        await queue.feed([{"line": 1, "key": "k1", "body": request_fields(request)}])
        await _work_one_job(redis_server.url, "attacked", until=1)
        await client.aclose()

    asyncio.run(main())
    assert evil.stats.received == 0
    assert honest.stats.received == 1
