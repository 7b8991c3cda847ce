"""Distributed jobs when Redis is trouble: it loses its data mid-job, refuses a worker's
or a coordinator's password, or holds settings a hostile writer put there; and a
coordinator with no workers yet, a worker stopped with requests still at the provider.
Keys never leave a worker's own config; every line still ends with one record. Against
a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from clitools import MODEL, env_for, questions, read_output, start_cli, wait_until, write_jsonl
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
        got, last = 0, "0"
        async with asyncio.timeout(30):
            while got < until:  # a blocking read: woken by each result
                reply = await probe.xread({f"sluice:job:{job_id}:results": last}, block=1000)
                for _stream, entries in reply or ():
                    got += len(entries)
                    last = entries[-1][0]
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


PRICE = 1000.0  # USD per million tokens, in and out


def _worker(server: FakeServer, url: str, name: str) -> subprocess.Popen[str]:
    env = env_for(server, OPENAI_API_KEY=KEY)
    return start_cli(server, "worker", "--redis", url, "--concurrency", "4", "--name", name, env=env)


def _end(process: subprocess.Popen[str]) -> str:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=30)[1] or ""
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_a_job_s_budget_holds_when_redis_loses_its_data_mid_job(
    redis_server: RedisServer, honest: FakeServer, tmp_path: Path
) -> None:
    """Redis restarted empty while two workers spend a job's budget: the coordinator
    counts again what its state says was spent (in-flight requests count when they
    settle); workers grant nothing meanwhile. Billed by the provider stays within it."""
    honest.prices = {"*": (PRICE, PRICE)}
    honest.latency = 0.2
    budget = 0.6
    source = write_jsonl(tmp_path / "in.jsonl", questions(200, max_tokens=20))
    out = tmp_path / "out.jsonl"
    args = ["run", source, "-o", out, "--model", MODEL, "--redis", redis_server.url, "--no-local-worker"]
    args += ["--budget", str(budget), "--price", f"{PRICE},{PRICE}", "--log-every", "1"]
    workers = [_worker(honest, redis_server.url, f"w{i}") for i in (1, 2)]
    coordinator = start_cli(honest, *args, env=env_for(honest, OPENAI_API_KEY=KEY))
    try:
        wait_until(lambda: honest.total_billed_usd >= budget / 2, timeout=40)
        redis.Redis.from_url(redis_server.url).flushall()  # as a restart without persistence
        _, err = coordinator.communicate(timeout=60)
    finally:
        _end(coordinator)
        for worker in workers:
            _end(worker)
    assert coordinator.returncode in (0, 4), err  # 4: lines refused for want of money
    assert honest.total_billed_usd <= budget + 1e-9
    assert len(read_output(out)) == 200


def test_a_coordinator_blocked_on_its_results_survives_redis_losing_the_job(
    redis_server: RedisServer, honest: FakeServer, tmp_path: Path
) -> None:
    """The coordinator spends its time blocked reading results; Redis losing the job then
    (a flush, an eviction, a restart without persistence) ends that read with UNBLOCKED,
    which must mean "register the job again", not an internal error."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(20))
    out = tmp_path / "out.jsonl"
    args = ["run", source, "-o", out, "--model", MODEL, "--redis", redis_server.url, "--no-local-worker"]
    coordinator = start_cli(honest, *args, env=env_for(honest, OPENAI_API_KEY=KEY))
    worker = None
    try:
        client = redis.Redis.from_url(redis_server.url)
        wait_until(lambda: bool(client.keys("sluice:job:*:requests")), timeout=30)
        for _ in range(3):  # no worker: it is blocked on the results stream nearly always
            wait_until(lambda: _blocked(client))
            client.flushall()
            wait_until(lambda: bool(client.keys("sluice:job:*:requests")) or coordinator.poll() is not None, 30)
        worker = _worker(honest, redis_server.url, "late")
        _, err = coordinator.communicate(timeout=60)
    finally:
        _end(coordinator)
        if worker is not None:
            _end(worker)
    assert coordinator.returncode == 0, err
    assert "internal error" not in err
    assert len(read_output(out)) == 20


def _blocked(client: redis.Redis) -> bool:
    """Whether a client of Redis (the coordinator: there is no worker) is blocked on a read."""
    return any("b" in entry["flags"] for entry in client.client_list())


def test_a_coordinator_without_workers_says_it_waits_for_them(
    redis_server: RedisServer, honest: FakeServer, tmp_path: Path
) -> None:
    """``--no-local-worker`` and no worker yet: the job must not look hung (0/N, ETA ?)
    but say what it waits for."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(5))
    out, log = tmp_path / "out.jsonl", tmp_path / "stderr.txt"
    args = ["run", source, "-o", out, "--model", MODEL, "--redis", redis_server.url, "--no-local-worker"]
    with log.open("w") as sink:
        coordinator = start_cli(honest, *args, env=env_for(honest, OPENAI_API_KEY=KEY), stderr=sink)
        worker = None
        try:
            wait_until(lambda: "waiting for workers: none is connected" in log.read_text(), timeout=30)
            worker = _worker(honest, redis_server.url, "w1")
            coordinator.communicate(timeout=60)
        finally:
            _end(coordinator)
            if worker is not None:
                _end(worker)
    assert coordinator.returncode == 0, log.read_text()
    assert len(read_output(out)) == 5


@pytest.fixture
def locked_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server that wants a password (the URL given is the wrong one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen([*args, "--requirepass", "right-one"], stdout=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_until(lambda: _answers(port), timeout=10)
        yield f"redis://:{WRONG}@127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


WRONG = "wrong-pass-5b2c"


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def test_a_worker_refused_by_redis_says_so_and_exits_without_the_password(
    locked_redis: str, honest: FakeServer
) -> None:
    """Wrong credentials are a configuration error, not an outage to wait out for ever."""
    run = subprocess.run(
        [sys.executable, "-m", "sluice", "worker", "--redis", locked_redis],
        env=env_for(honest, OPENAI_API_KEY=KEY),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2, run.stderr
    assert "refused this worker's credentials" in run.stderr
    assert WRONG not in run.stderr + run.stdout


def test_a_coordinator_refused_by_redis_says_so_without_the_password(
    locked_redis: str, honest: FakeServer, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    args = ["run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--redis", locked_redis]
    run = subprocess.run(
        [sys.executable, "-m", "sluice", *map(str, args)],
        env=env_for(honest, OPENAI_API_KEY=KEY),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode not in (0, 70), run.stderr  # an error said, not a hang or a crash
    assert "refused the credentials" in run.stderr
    assert WRONG not in run.stderr + run.stdout


def test_a_claim_after_written_to_redis_cannot_make_workers_steal_requests_in_flight(
    redis_server: RedisServer, honest: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's ``claim_after`` of a millisecond (a hostile or mistaken entry in Redis) would
    let two live workers take each other's requests in flight over and over, sending each
    again every time; workers keep the CLI's floor (0.5 s) whatever Redis says."""
    monkeypatch.setenv("OPENAI_BASE_URL", honest.url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    honest.latency = 1.5

    async def main() -> None:
        client = connect(redis_server.url)
        queue = JobQueue(client, "greedy")
        await queue.register(JobSettings(claim_after=0.001, max_deliveries=50, name="greedy"))
        lines = [Request.from_prompt("openai/gpt-x", f"q{i}", max_tokens=8) for i in range(4)]
        await queue.feed([{"line": i, "key": f"k{i}", "body": request_fields(r)} for i, r in enumerate(lines)])
        workers = [
            Worker(redis_server.url, JobConfig(), concurrency=4, name=f"w{i}", only_job="greedy") for i in (1, 2)
        ]
        tasks = [asyncio.ensure_future(w.run()) for w in workers]
        try:
            async with asyncio.timeout(30):
                while await client.xlen(queue.results) < 4:
                    await client.xread({queue.results: "$"}, block=500)
        finally:
            for worker in workers:
                worker.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()

    asyncio.run(main())
    assert honest.stats.received == 4  # each line sent once


def test_a_stopped_worker_gives_back_what_is_still_in_flight_after_its_grace(
    redis_server: RedisServer, honest: FakeServer, tmp_path: Path
) -> None:
    """``sluice worker --grace 0.3`` and SIGTERM: requests still at the provider after the
    grace are cut off and given back (another worker answers them), instead of the worker
    waiting for them however long they take."""
    honest.latency = 30.0
    source = write_jsonl(tmp_path / "in.jsonl", questions(4))
    out = tmp_path / "out.jsonl"
    args = ["run", source, "-o", out, "--model", MODEL, "--redis", redis_server.url, "--no-local-worker"]
    env = env_for(honest, OPENAI_API_KEY=KEY)
    coordinator = start_cli(honest, *args, env=env)
    slow = start_cli(honest, "worker", "--redis", redis_server.url, "--concurrency", "4", "--grace", "0.3", env=env)
    second = None
    try:
        wait_until(lambda: honest.in_flight >= 4, timeout=30)
        slow.send_signal(signal.SIGTERM)
        _, err = slow.communicate(timeout=15)  # not the 30 s its requests would take
        assert slow.returncode == 0, err
        assert "0 answered here" in err
        honest.latency = 0.0
        second = _worker(honest, redis_server.url, "second")
        _, cerr = coordinator.communicate(timeout=60)
    finally:
        for process in (coordinator, slow):
            if process.poll() is None:
                process.kill()
                process.communicate()
        if second is not None:
            _end(second)
    assert coordinator.returncode == 0, cerr
    records = read_output(out)
    assert sorted(r["line"] for r in records) == [1, 2, 3, 4]
    assert all(r["ok"] for r in records)
