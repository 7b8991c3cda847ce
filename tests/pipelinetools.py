"""What the Ray Data and Dask tests share: the fake provider limited as the issue says, one
redis-server per module, the job's arguments, and killing a worker that has rows in flight.

Each check runs the same way on both engines, so the seam is shown to be general: only
how the pipeline is started differs (``run`` in each test module)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis_server import RedisServer

from sluice.testing import FakeServer

KEY = "sk-test-pipelines-41c2"
KEY_ENV = "SLUICE_TEST_PIPELINE_KEY"
MODEL = "openai/gpt-test"
PRICE = (1.0, 2.0)  # USD per million tokens in, out: what the fake bills and sluice reserves at


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One redis-server for a module (each test uses jobs of its own)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.kill()


@contextlib.contextmanager
def fake_provider(**limits: Any) -> Iterator[FakeServer]:
    """The fake, answering from a thread (the test blocks on the engine), its key in the
    environment the engine's workers inherit."""
    os.environ[KEY_ENV] = KEY
    with FakeServer(api_key=KEY, prices={"*": PRICE}, **limits).running_in_thread() as fake:
        yield fake


def job_args(fake: FakeServer, redis_url: str, job: str, **more: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "redis": redis_url,
        "job": job,
        "base_url": fake.url,
        "api_key_env": KEY_ENV,
        "price": PRICE,
        **more,
    }


def prompts(n: int) -> list[dict[str, Any]]:
    return [{"prompt": f"question number {i}", "i": i} for i in range(n)]


def sent_twice(fake: FakeServer) -> int:
    """Requests the fake received more than once (the same body: the same row)."""
    return sum(n - 1 for n in fake.stats.by_key.values() if n > 1)


def billed(fake: FakeServer) -> float:
    return sum(entry.cost_usd for entry in fake.ledger)


def arrival_span(fake: FakeServer) -> float:
    """Seconds from the first request the fake admitted to the last, on its own clock."""
    times = [at for at, _ in fake.stats.arrivals]
    return max(times) - min(times)


def workers(redis_url: str, job: str) -> dict[str, dict[str, Any]]:
    """The workers' notes (``sluice.pipelines``: host, pid, rows in flight...)."""
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.hgetall(f"sluice:rows:{{{job}}}:workers")
    finally:
        client.close()
    return {name.decode(): json.loads(value) for name, value in raw.items()}


class Killer:
    """Kills (SIGKILL) the first worker of ``job`` seen with at least ``at_least`` rows in
    flight, once the fake has answered ``after`` requests: a worker dying mid-batch."""

    def __init__(self, redis_url: str, job: str, fake: FakeServer, *, after: int, at_least: int = 1) -> None:
        self.redis_url = redis_url
        self.job = job
        self.fake = fake
        self.after = after
        self.at_least = at_least
        self.killed: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.fake.stats.accepted >= self.after:
                for note in workers(self.redis_url, self.job).values():
                    if note["in_flight"] >= self.at_least and time.time() - note["at"] < 2:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(note["pid"], signal.SIGKILL)
                            self.killed = note
                            return
            time.sleep(0.05)


def wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition did not come true in time")
        time.sleep(0.05)


# -- the checks, the same for every engine (``run(rows, args, *, workers, batch_size)``) ---------

Run = Callable[..., list[dict[str, Any]]]


def check_300_rows_then_a_rerun(run: Run, redis_url: str, job: str) -> None:
    """300 rows, 3 workers, a provider taking 100 requests per 10 s: all answered, no 429
    beyond 1%, in 1.2x the ideal time (on the fake's own clock: the engine's start-up
    apart), no row sent twice; the same pipeline again sends nothing and answers every row
    from the store."""
    from sluice.pipelines import read_progress

    with fake_provider(rpm=100, window=10) as fake:
        args = job_args(fake, redis_url, job, rpm=100, window=10)
        rows = run(prompts(300), args, workers=3, batch_size=50)
        assert [row["i"] for row in rows] == list(range(300))
        assert all(row["ok"] for row in rows), [r["error"] for r in rows if not r["ok"]][:3]
        assert [row["text"] for row in rows[:2]] == ["echo: question number 0", "echo: question number 1"]
        assert fake.stats.rate_limited <= 3
        assert fake.stats.accepted == 300
        assert fake.stats.duplicate_successes == 0  # no row answered twice
        assert sent_twice(fake) <= fake.stats.rate_limited  # only a 429's retry goes again
        ideal = 300 / (100 / 10)  # seconds at the provider's own pace
        assert arrival_span(fake) <= 1.2 * ideal
        assert sum(row["attempts"] - 1 for row in rows) <= fake.stats.rate_limited  # retried: only a 429
        assert not any(row["cached"] for row in rows)
        progress = read_progress(redis_url, job)
        assert progress["answered"] == 300
        assert progress["failed"] == {}
        assert progress["cost_usd"] == pytest.approx(billed(fake))

        fake.reset_stats()
        again = run(prompts(300), args, workers=3, batch_size=50)
        assert fake.stats.received == 0
        assert all(row["ok"] and row["cached"] for row in again)
        assert [row["text"] for row in again] == [row["text"] for row in rows]


def check_a_budget_of_half_the_bill(run: Run, redis_url: str, job: str) -> None:
    """``budget_usd`` at half of what the job would cost: the provider's bill stays within
    it over every worker, the other rows end ``budget_exhausted``, nothing raises."""
    with fake_provider() as fake:
        # the bill of one row, measured: every prompt here is as long as the others
        run(prompts(1), job_args(fake, redis_url, f"{job}-price", max_tokens=16), workers=1, batch_size=1)
        one = billed(fake)
        fake.ledger.clear()
        budget = 60 * one / 2
        args = job_args(fake, redis_url, job, max_tokens=16, budget_usd=budget)
        rows = run(prompts(60), args, workers=3, batch_size=10)
        assert len(rows) == 60
        assert billed(fake) <= budget + 1e-12
        assert {row["error_type"] for row in rows if not row["ok"]} == {"budget_exhausted"}
        assert 20 <= sum(row["ok"] for row in rows) <= 30  # worst cases reserved: about half, never more


def check_a_killed_worker(run: Run, redis_url: str, job: str) -> None:
    """A worker SIGKILLed mid-batch: the engine reruns its batch elsewhere; every row
    comes back once, answered; rows sent twice are at most what that worker had at the
    provider (its engine's concurrency, 4)."""
    with fake_provider(latency=0.4) as fake:
        args = job_args(fake, redis_url, job, concurrency=4)
        with Killer(redis_url, job, fake, after=20, at_least=2) as killer:
            rows = run(prompts(80), args, workers=2, batch_size=10)
        assert killer.killed is not None, "no worker was killed: the test did not test"
        assert [row["i"] for row in rows] == list(range(80))
        assert all(row["ok"] for row in rows)
        assert sent_twice(fake) <= 4
        assert fake.stats.duplicate_successes <= 4


def check_bad_rows_fail_alone(run: Run, redis_url: str, job: str) -> None:
    with fake_provider() as fake:
        rows = [
            {"i": 0, "messages": [{"role": "user", "content": "hi"}]},
            {"i": 1, "body": {"messages": [{"role": "user", "content": "a body"}], "max_tokens": 5}, "custom_id": "b"},
            {"i": 2, "prompt": None, "messages": None, "body": None},
            {"i": 3, "prompt": "fine"},
        ]
        out = run(rows, job_args(fake, redis_url, job), workers=1, batch_size=4)
        assert [row["ok"] for row in out] == [True, True, False, True], [r["error"] for r in out]
        assert out[2]["error_type"] == "invalid_input"
        assert "no value in 'messages', 'body' or 'prompt'" in out[2]["error"]
