"""Regressions from the adversarial review of issue 7: each once broke a promise."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest
from aiohttp import web

import sluice
from sluice import Deployment, Engine, InvalidRequestError, Request, RetryPolicy
from sluice.providers import CallableProvider
from sluice.store import SqliteStore
from sluice.testing import FakeServer


async def test_leaving_map_early_never_leaks_a_concurrency_slot() -> None:
    async def answer(request: Request) -> str:
        await asyncio.sleep(0)
        return "ok"

    deployment = Deployment("local/echo", provider=CallableProvider(answer, name="local"))
    async with Engine([deployment], concurrency=8, buffer=2) as engine:
        for round_ in range(60):
            prompts = [f"r{round_} q{i}" for i in range(40)]
            async with contextlib.aclosing(engine.map(prompts, model="local/echo")) as results:
                taken = 0
                async for _ in results:
                    taken += 1
                    if taken == 1 + round_ % 4:
                        break
        assert engine._gate.held == 0
        assert (await asyncio.wait_for(engine.complete("local/echo", "still here?"), 5)).ok


async def test_keys_never_follow_a_redirect_to_another_server() -> None:
    seen: list[dict[str, str]] = []

    async def other(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"error": {"message": "no"}}, status=400)

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        raise web.HTTPTemporaryRedirect(f"{other_url}{request.path_qs}")

    runners = []
    urls = []
    for handler in (other, redirect):
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
    other_url, redirect_url = urls
    try:
        deployments = [
            Deployment("openai/gpt-x", base_url=f"{redirect_url}/v1", api_key="sk-openai-secret"),
            Deployment("anthropic/claude-x", base_url=redirect_url, api_key="sk-ant-secret"),
            Deployment("azure/gpt-x", base_url=redirect_url, api_key="azure-secret"),
        ]
        async with Engine(deployments, retry=RetryPolicy(max_attempts=1)) as engine:
            results = [await engine.complete(d.model, "hi", max_tokens=5) for d in deployments]
    finally:
        for runner in runners:
            await runner.cleanup()
    assert seen == []  # nothing reached the other origin
    for result in results:
        assert result.error is not None
        assert "redirected to" in result.error.message
        assert "base_url" in result.error.message


async def test_an_absurd_usage_count_is_a_malformed_answer_not_a_dead_store(tmp_path: Path) -> None:
    async def huge(request: web.Request) -> web.Response:
        await request.read()
        body = {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2**64 - 1, "completion_tokens": -100000},
        }
        return web.json_response(body)

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
    store = SqliteStore(tmp_path / "state.db")
    try:
        deployment = Deployment("openai/gpt-x", base_url=url, api_key="sk-x", price=sluice.Price(1.0, 1.0))
        policy = RetryPolicy(max_attempts=2, base_delay=0.01)
        async with Engine(deployment, store=store, retry=policy, budget_usd=1.0) as engine:
            result = await asyncio.wait_for(engine.complete("openai/gpt-x", "hi", max_tokens=10), 10)
            assert result.error is not None
            assert result.error.kind == "malformed_response"
            assert engine.spent() > 0  # charged its worst case, never a negative cost
            assert engine.store_error is None
    finally:
        store.close()
        await runner.cleanup()


def test_a_store_writer_that_meets_an_unexpected_error_fails_its_waiters_cleanly(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")

    def bad(db: sqlite3.Connection) -> None:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    with pytest.raises(sluice.StoreError, match="OverflowError"):
        store._write().run_sync(bad)
    with pytest.raises(sluice.StoreError):  # broken for good: no silent partial writes after
        store.set_meta(after=1)
    store.close()


def test_a_foreign_database_is_never_changed(tmp_path: Path) -> None:
    app = tmp_path / "app.db"
    db = sqlite3.connect(app)
    db.execute("CREATE TABLE users (name TEXT)")
    db.execute("CREATE TABLE meta (k TEXT)")
    db.commit()
    db.close()
    before = app.read_bytes()
    with pytest.raises(sluice.ConfigError, match="not a sluice state file"):
        SqliteStore(app)
    assert app.read_bytes() == before


def test_damaged_notes_in_the_state_are_a_clear_error(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.set_meta(input="x")
    store.close()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE meta SET value = '{not json' WHERE name = 'input'")
    db.commit()
    db.close()
    store = SqliteStore(tmp_path / "state.db", readonly=True)
    with pytest.raises(sluice.ConfigError, match="damaged"):
        store.meta()
    store.close()


def test_a_request_id_that_is_not_valid_unicode_is_refused_clearly() -> None:
    with pytest.raises(InvalidRequestError, match="not valid Unicode"):
        Request.from_prompt("openai/gpt-x", "hi", id="file-\udcff.txt")


async def test_a_failing_store_stops_with_the_grace_not_after_hung_requests(tmp_path: Path) -> None:
    async with FakeServer(api_key="sk-test") as server:
        server.inject("hang", times=4)
        path = tmp_path / "state.db"
        store = SqliteStore(path)
        deployment = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test", max_in_flight=16)
        blocker = sqlite3.connect(path, timeout=0.1)
        engine = Engine(deployment, store=store, grace=0.5, retry=RetryPolicy(max_attempts=1))
        got = []
        async with engine:
            iterator = engine.map([Request.from_prompt("openai/gpt-test", f"q{i}") for i in range(40)])
            async for result in iterator:
                got.append(result)
                if len(got) == 1:
                    blocker.execute("BEGIN IMMEDIATE")  # the state file is locked by someone else
        blocker.rollback()
        blocker.close()
        store.close()
    assert engine.store_error is not None
    hung = [r for r in got if r.error is not None and "grace" in r.error.message]
    assert len(hung) == 4  # cut off after the grace, not after the 600 s attempt timeout
