"""A job whose coordinator is long gone is dropped by workers (not joined forever), and
the coordinator's rerun brings it back with what was left in Redis."""

from __future__ import annotations

import asyncio
import contextlib

import redis
from redis_server import RedisServer

from sluice.cli._config import JobConfig
from sluice.redis._job_worker import Worker
from sluice.redis._jobs import JobQueue, JobSettings, connect, running_jobs


async def _registered(url: str, job_id: str) -> JobQueue:
    queue = JobQueue(connect(url), job_id)
    await queue.register(JobSettings(name="in.jsonl"))
    await queue.client.xadd(queue.results, {"line": "1"})  # an answer waiting for the coordinator
    return queue


async def _run_worker_for(url: str, seconds: float) -> list[str]:
    said: list[str] = []
    worker = Worker(url, JobConfig(), concurrency=2, name="w-abandon", grace=1.0, say=said.append)
    task = asyncio.get_running_loop().create_task(worker.run())
    await asyncio.sleep(seconds)
    worker.stop()
    with contextlib.suppress(Exception):
        await task
    return said


async def test_workers_drop_a_job_whose_coordinator_is_long_gone_and_a_rerun_brings_it_back(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url
    gone = await _registered(url, "gone")
    alive = await _registered(url, "alive")
    await gone.client.delete(gone.coordinator)  # its key expired: not heard from for an hour
    said = await _run_worker_for(url, 2.5)
    probe = redis.asyncio.Redis.from_url(url)
    try:
        assert await running_jobs(gone.client) == ["alive"]
        assert await probe.hget(gone.meta, "status") == b"abandoned"
        assert 0 < await probe.ttl(gone.results) <= 7 * 24 * 3600  # kept a week for a rerun
        assert any("gone" in line and "taken off the running jobs" in line for line in said), said
        assert not any("joined job gone" in line for line in said), said
        assert await probe.hget(alive.meta, "status") == b"running"  # its coordinator lives: untouched
        # the coordinator's rerun registers it again; what waited in Redis is still there
        await gone.register(JobSettings(name="in.jsonl"))
        assert sorted(await running_jobs(gone.client)) == ["alive", "gone"]
        assert await probe.ttl(gone.results) == -1
        assert await probe.xlen(gone.results) == 1
    finally:
        await probe.aclose()
        await gone.client.aclose()
        await alive.client.aclose()
