"""A job whose coordinator is long gone is dropped by workers (not joined forever), and
the coordinator's rerun brings it back with what was left in Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

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


async def _run_worker_until(url: str, done: Callable[[list[str]], bool]) -> list[str]:
    """Run a worker until what it has said satisfies ``done``; what it said."""
    said: list[str] = []
    heard = asyncio.Event()

    def say(line: str) -> None:
        said.append(line)
        if done(said):
            heard.set()

    worker = Worker(url, JobConfig(), concurrency=2, name="w-abandon", grace=1.0, say=say)
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        await asyncio.wait_for(heard.wait(), 30)
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await task
    return said


def _both_jobs_seen(said: list[str]) -> bool:
    """The worker has dealt with both jobs: dropped the orphan, joined the live one."""
    return any("taken off the running jobs" in line for line in said) and any(
        "joined job alive" in line for line in said
    )


async def test_workers_drop_a_job_whose_coordinator_is_long_gone_and_a_rerun_brings_it_back(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url
    gone = await _registered(url, "gone")
    alive = await _registered(url, "alive")
    await gone.client.delete(gone.coordinator)  # its key expired: not heard from for an hour
    said = await _run_worker_until(url, _both_jobs_seen)
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
