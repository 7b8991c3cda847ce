"""The SQLite store under the engine: resume, cache, identical requests sent once."""

from __future__ import annotations

from pathlib import Path

from sluice import BadRequestError, Deployment, Engine, Request, RetryPolicy
from sluice.store import SqliteStore
from sluice.testing import FakeServer


def _deployment(server: FakeServer) -> Deployment:
    return Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test")


def _requests(n: int) -> list[Request]:
    return [Request.from_prompt("openai/gpt-test", f"question {i}") for i in range(n)]


async def test_a_second_run_is_served_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with FakeServer(api_key="sk-test") as server:
        store = SqliteStore(path)
        async with Engine(_deployment(server), store=store) as engine:
            first = await engine.run(_requests(20))
        store.close()
        assert server.stats.received == 20

        store = SqliteStore(path)  # a new process would open the same file
        async with Engine(_deployment(server), store=store) as engine:
            second = await engine.run(_requests(25))
        store.close()
    assert server.stats.received == 25  # only the 5 new ones were sent
    assert [r.text for r in second[:20]] == [r.text for r in first]
    assert all(r.cached for r in second[:20])
    assert not any(r.cached for r in second[20:])
    assert engine.stats.cached == 20
    assert server.stats.duplicate_successes == 0


async def test_stored_failures_are_reused_unless_retry_failed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    policy = RetryPolicy(max_attempts=1)
    async with FakeServer(api_key="sk-test") as server:
        server.inject("400", times=1)
        async with Engine(_deployment(server), store=store, retry=policy) as engine:
            (failed,) = await engine.run(_requests(1))
        assert isinstance(failed.error, BadRequestError)
        async with Engine(_deployment(server), store=store, retry=policy) as engine:
            (again,) = await engine.run(_requests(1))
        assert isinstance(again.error, BadRequestError)
        assert again.cached
        assert str(again.error) == str(failed.error)
        assert again.error.status == 400
        assert server.stats.received == 1
        async with Engine(_deployment(server), store=store, retry_failed=True) as engine:
            (retried,) = await engine.run(_requests(1))
        assert retried.ok
        assert server.stats.received == 2
    assert store.summary()["succeeded"] == 1
    store.close()


async def test_identical_requests_in_flight_are_sent_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test", latency=0.05) as server:
        same = [Request.from_prompt("openai/gpt-test", "same question") for _ in range(5)]
        async with Engine(_deployment(server), store=store) as engine:
            results = await engine.run(same)
        assert server.stats.received == 1
    assert [r.ok for r in results] == [True] * 5
    assert sum(r.cached for r in results) == 4
    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    store.close()


async def test_a_given_id_is_part_of_the_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        twins = [Request.from_prompt("openai/gpt-test", "same", id=f"row-{i}") for i in range(3)]
        async with Engine(_deployment(server), store=store) as engine:
            await engine.run(twins)
        assert server.stats.received == 3  # three rows the user told apart
    store.close()


def test_summary_and_meta(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.set_meta(input="in.jsonl", total=3)
    assert store.meta() == {"input": "in.jsonl", "total": 3, "schema": 2}
    assert store.summary()["results"] == 0
    store.close()
    readonly = SqliteStore(tmp_path / "state.db", readonly=True)
    assert readonly.meta()["total"] == 3
    readonly.close()


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    import pytest

    from sluice import ConfigError

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ConfigError, match="not a usable sluice state file"):
        SqliteStore(junk)


async def test_every_attempt_of_one_request_carries_the_same_idempotency_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        server.inject("500", times=2)
        policy = RetryPolicy(max_attempts=5, base_delay=0.01)
        async with Engine(_deployment(server), store=store, retry=policy) as engine:
            (result,) = await engine.run(_requests(1))
        assert result.attempts == 3
        ((key, count),) = server.stats.by_key.items()
        assert key.startswith("sluice-")
        assert count == 3
    store.close()


def test_the_fresh_state_filter_never_forgets_a_key_it_was_given() -> None:
    """A first run skips the lookup for keys it never stored: no stored key may be missed."""
    from sluice.store._sqlite import _KeyFilter

    keys = [f"row-{i}\x1f{i:032x}" for i in range(20_000)]
    seen = _KeyFilter()
    for key in keys:
        seen.add(key)
    assert all(seen.may_hold(key) for key in keys)
    strangers = sum(seen.may_hold(f"other-{i}") for i in range(20_000))
    assert strangers < 20  # "maybe" for an absent key is rare (then the query decides)


async def test_a_first_run_serves_an_identical_request_that_landed_earlier(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        async with Engine(_deployment(server), store=store) as engine:
            first = await engine.complete(Request.from_prompt("openai/gpt-test", "same"))
            again = await engine.complete(Request.from_prompt("openai/gpt-test", "same"))
        assert first.ok
        assert again.cached
        assert server.stats.received == 1
    store.close()
