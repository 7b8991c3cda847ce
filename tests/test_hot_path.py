"""The hot path's machinery (issue 12): the shared attempt timer, one store write per
answer, one writer batch per loop tick, and the batch job's GC settings put back."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_provider import deployment_at

from sluice import Deployment, Engine, Price, Request, Result, RetryPolicy
from sluice._slot import AttemptTimer
from sluice.batch._runner import fewer_collections
from sluice.store import SqliteStore
from sluice.testing import FakeServer, run_in_virtual_time

# -- AttemptTimer ---------------------------------------------------------------------------


def test_an_attempt_that_ends_in_time_leaves_no_timer_behind() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timer = AttemptTimer()
        watch = timer.arm(loop, loop.time() + 600)
        await asyncio.sleep(0.5)
        assert timer.disarm(watch) is False
        # nothing pending: a virtual clock must not jump ten minutes ahead to a dead timer
        assert timer._handle is None
        assert timer._heap == []

    run_in_virtual_time(main())


def test_an_attempt_past_its_timeout_is_cancelled_by_the_timer() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timer = AttemptTimer()
        start = loop.time()
        watch = timer.arm(loop, start + 1.0)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(5)
        assert loop.time() - start == pytest.approx(1.0)
        assert timer.disarm(watch) is True  # the timer's own cancellation: a timeout
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0

    run_in_virtual_time(main())


def test_a_cancellation_from_elsewhere_is_not_a_timeout() -> None:
    async def attempt(timer: AttemptTimer, results: list[bool]) -> None:
        loop = asyncio.get_running_loop()
        watch = timer.arm(loop, loop.time() + 1.0)
        try:
            await asyncio.sleep(5)
        finally:
            results.append(timer.disarm(watch))

    async def main() -> None:
        timer = AttemptTimer()
        results: list[bool] = []
        task = asyncio.get_running_loop().create_task(attempt(timer, results))
        await asyncio.sleep(0.5)
        task.cancel()  # before the timeout
        with pytest.raises(asyncio.CancelledError):
            await task
        # cancelled from elsewhere *and* timed out in the same tick: still a cancellation
        task = asyncio.get_running_loop().create_task(attempt(timer, results))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert results == [False, False]

    run_in_virtual_time(main())


def test_finished_attempts_do_not_pile_up_behind_a_long_one() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timer = AttemptTimer()
        slow = timer.arm(loop, loop.time() + 600)  # stays armed throughout
        for _ in range(5_000):
            watch = timer.arm(loop, loop.time() + 600)
            timer.disarm(watch)
        assert len(timer._heap) < 600
        assert timer.disarm(slow) is False
        assert timer._heap == []

    run_in_virtual_time(main())


async def test_the_engine_still_times_out_a_hung_attempt() -> None:
    async with FakeServer(api_key="sk-test", latency=5.0) as server:
        deployment = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test")
        async with Engine(deployment, retry=RetryPolicy(max_attempts=1, attempt_timeout=0.2)) as engine:
            result = await engine.complete("openai/gpt-test", "hello")
            assert result.error is not None
            assert result.error.kind == "timeout"
            assert not engine.attempts.timer.scheduled
            again = await asyncio.wait_for(engine.complete("openai/gpt-test", "again", max_tokens=1), 10)
            assert again.error is not None  # the server still hangs: a timeout again, not a stuck call
            assert again.error.kind == "timeout"


# -- one store write per answer -----------------------------------------------------------


class _CountingStore(SqliteStore):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: dict[str, int] = {"begin": 0, "settle": 0, "put": 0, "put_settled": 0}

    async def begin(self, key: str, worst_usd: float) -> int:
        self.calls["begin"] += 1
        return await super().begin(key, worst_usd)

    def settle(self, intent: int, charged_usd: float, *, answered: bool) -> None:
        self.calls["settle"] += 1
        super().settle(intent, charged_usd, answered=answered)

    async def put(self, key: str, result: Result) -> None:
        self.calls["put"] += 1
        await super().put(key, result)

    async def put_settled(self, key: str, result: Result, intent: int, charged_usd: float, *, answered: bool) -> None:
        self.calls["put_settled"] += 1
        await super().put_settled(key, result, intent, charged_usd, answered=answered)


async def test_an_answer_and_its_intent_are_one_write(tmp_path: Path) -> None:
    store = _CountingStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        server.inject("500", times=1)  # the first attempt fails and is retried: settled on its own
        requests = [Request.from_prompt("openai/gpt-test", f"question {i}") for i in range(20)]
        async with Engine(
            deployment_at(server, price=Price(2.0, 8.0)), store=store, retry=RetryPolicy(base_delay=0.01)
        ) as engine:
            results = await engine.run(requests)
    assert all(r.ok for r in results)
    assert store.calls == {"begin": 21, "settle": 1, "put": 0, "put_settled": 20}
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT count(*) FROM intents").fetchone() == (0,)
    (answered,) = db.execute("SELECT sum(answered_usd) FROM charges").fetchone()
    assert answered == pytest.approx(sum(r.cost_usd or 0.0 for r in results))
    assert db.execute("SELECT count(*) FROM results WHERE ok = 1").fetchone() == (20,)
    db.close()
    store.close()


async def test_a_store_without_put_settled_still_settles_every_intent(tmp_path: Path) -> None:
    class Plain(SqliteStore):
        put_settled = None  # type: ignore[assignment]  # a store that does not offer it

    store = Plain(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        requests = [Request.from_prompt("openai/gpt-test", f"question {i}") for i in range(10)]
        async with Engine(deployment_at(server, price=Price(2.0, 8.0)), store=store) as engine:
            results = await engine.run(requests)
    assert all(r.ok for r in results)
    assert store.spend().in_flight == 0
    assert store.spend().answered == pytest.approx(sum(r.cost_usd or 0.0 for r in results))
    store.close()


# -- the writer thread: one batch per loop tick ---------------------------------------------


async def test_writes_of_one_loop_tick_are_one_commit(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    writer = store._write()
    applied: list[int] = []
    original = writer._apply

    def counting(db: Any, ops: Any) -> None:
        applied.append(len(ops))
        original(db, ops)

    writer._apply = counting  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Any]] = []
    for i in range(20):
        future: asyncio.Future[Any] = loop.create_future()
        row = (f"note {i}", "1")
        writer.submit(lambda db, row=row: db.execute("INSERT INTO meta VALUES (?, ?)", row), (loop, future))
        futures.append(future)
        time.sleep(0.002)  # noqa: ASYNC251 - on purpose: the writer thread runs meanwhile, yet must not commit
    await asyncio.gather(*futures)
    assert applied == [20]
    assert store.meta()["note 19"] == 1
    store.close()


def _batch_policy_allowed() -> bool:
    """Whether this OS lets a thread take SCHED_BATCH (tried in a thread of its own)."""
    allowed: list[bool] = []

    def attempt() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            allowed.append(True)
        except OSError:
            allowed.append(False)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return allowed == [True]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_the_writer_thread_waits_for_the_loop_and_only_it_does(tmp_path: Path) -> None:
    """The writer runs SCHED_BATCH (it does not preempt the loop on each hand-over);
    the thread that opened the store keeps its policy."""
    if not _batch_policy_allowed():
        pytest.skip("this system refuses SCHED_BATCH (the writer then keeps the default)")
    before = os.sched_getscheduler(0)
    if before == os.SCHED_BATCH:
        pytest.skip("the tests run SCHED_BATCH already: the writer would inherit it")
    store = SqliteStore(tmp_path / "state.db")
    writer = store._write()
    thread_id = writer._thread.native_id
    assert thread_id is not None
    try:
        assert os.sched_getscheduler(thread_id) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) == before
    finally:
        store.close()


# -- the batch job's GC settings ------------------------------------------------------------


def test_a_job_puts_the_gc_settings_back() -> None:
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold()[0] >= 70_000
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
