"""Regressions from the review of the router and the store's hot path: each once failed."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from sluice import Cooldown, Deployment, Engine, Price, Request, RetryPolicy
from sluice.store import SqliteStore
from sluice.testing import FakeServer

MODEL = "openai/gpt-test"
FAST = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05, attempt_timeout=5)


def at(server: FakeServer, name: str, **kwargs: Any) -> Deployment:
    return Deployment(MODEL, name=name, base_url=server.url, api_key="sk-test", **kwargs)


def states(engine: Engine) -> dict[str, str]:
    return {s.deployment: s.state for s in engine.deployment_status()}


async def test_a_cancelled_probe_frees_the_deployment() -> None:
    cooldown = Cooldown(after_failures=1, seconds=0.2, max_seconds=0.4)
    async with (
        FakeServer(api_key="sk-test") as west,
        FakeServer(api_key="sk-test") as east,
        Engine([at(west, "west"), at(east, "east")], retry=FAST, cooldown=cooldown) as engine,
    ):
        west.inject("503", times=1)
        await engine.complete(MODEL, "q0", max_tokens=5)
        await asyncio.sleep(0.5)  # west may be probed now
        west.latency = 1.0
        east.latency = 1.0  # so the probe is the one placed on west
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(engine.complete(MODEL, "probe", max_tokens=5), 0.2)
        west.latency = east.latency = 0.0
        assert states(engine)["west"] != "probing"  # the cancelled probe gave its slot back
        results = [await engine.complete(MODEL, f"q{i}", max_tokens=5) for i in range(10)]
    assert all(r.ok for r in results)
    assert "west" in {r.deployment for r in results}


async def test_a_success_placed_before_a_cooldown_does_not_end_it() -> None:
    cooldown = Cooldown(after_failures=2, seconds=30, max_seconds=300)
    async with (
        FakeServer(api_key="sk-test", output_tokens=40) as west,
        FakeServer(api_key="sk-test") as east,
        Engine([at(west, "west"), at(east, "east")], retry=FAST, cooldown=cooldown) as engine,
    ):
        async with engine.stream(MODEL, "a long story", max_tokens=40) as stream:
            await anext(stream)  # under way on one of them
            busy = west if stream._slot is not None and stream._slot.route.label == "west" else east
            busy.fault_rates = {"503": 1.0}  # its deployment goes down meanwhile
            await engine.run([{"model": MODEL, "messages": [{"role": "user", "content": f"a{i}"}]} for i in range(8)])
            down = "west" if busy is west else "east"
            assert states(engine)[down] == "cooling down"
            await stream.collect()  # the old stream still ends well
        assert states(engine)[down] == "cooling down"  # ...which says nothing of the deployment now


async def test_a_group_serves_a_request_only_one_of_its_deployments_can_take() -> None:
    async with FakeServer(api_key="sk-test") as small, FakeServer(api_key="sk-test") as big:
        deployments = [at(small, "small", tpm=2_000), at(big, "big", tpm=1_000_000)]
        async with Engine(deployments, retry=FAST) as engine:
            one = await engine.complete(MODEL, "hi", max_tokens=5_000)
            batch = await engine.run(
                [
                    {"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 5000}
                    for i in range(4)
                ]
            )
    assert one.ok, one.error
    assert all(r.ok and r.deployment == "big" for r in [one, *batch])


async def test_waiting_on_a_group_leaves_nothing_behind() -> None:
    async with FakeServer(api_key="sk-test") as east, FakeServer(api_key="sk-test") as west:
        deployments = [at(east, "east", max_in_flight=2), at(west, "west", max_in_flight=2)]
        async with Engine(deployments, retry=FAST) as engine:
            results = await engine.run([Request.from_prompt(MODEL, f"q{i}", max_tokens=5) for i in range(500)])
            group = engine.router.group(MODEL)
            assert all(r.ok for r in results)
            assert len(group.watchers) < 10  # was one per waited request


async def test_two_stores_on_one_file_find_each_others_answers(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    async with FakeServer(api_key="sk-test") as server:
        deployment = Deployment(MODEL, base_url=server.url, api_key="sk-test", price=Price(1, 1))
        first, second = SqliteStore(path), SqliteStore(path)
        async with Engine(deployment, store=first) as a, Engine(deployment, store=second) as b:
            await a.complete(MODEL, "the same question", max_tokens=10)
            again = await b.complete(MODEL, "the same question", max_tokens=10)
        first.close()
        second.close()
    assert again.cached
    assert server.stats.received == 1


async def test_a_request_whose_messages_grow_is_a_new_request() -> None:
    async with FakeServer(api_key="sk-test") as server:
        store_path = Path(__import__("tempfile").mkdtemp()) / "s.db"
        store = SqliteStore(store_path)
        async with Engine(Deployment(MODEL, base_url=server.url, api_key="sk-test"), store=store) as engine:
            request = Request(MODEL, [{"role": "user", "content": "first question"}], max_tokens=10)
            one = await engine.complete(request)
            request.messages.append({"role": "assistant", "content": one.text})  # type: ignore[attr-defined]
            request.messages.append({"role": "user", "content": "a follow-up"})  # type: ignore[attr-defined]
            two = await engine.complete(request)
        store.close()
    assert not two.cached
    assert two.text == "echo: a follow-up"
    assert server.stats.received == 2


def _dead_url() -> str:
    """A loopback URL with nothing listening (a port bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def test_a_fallback_serves_a_model_whose_only_deployment_is_down_whatever_name_keys_it() -> None:
    """``big`` and ``openai/big`` are one model for its fallbacks too, as for its group."""
    for asked, keyed in (("big", "openai/big"), ("openai/big", "big"), ("big", "big")):
        async with FakeServer(api_key="sk-test") as good:
            dead = Deployment("big", base_url=_dead_url(), api_key="sk-test")
            mini = Deployment("openai/gpt-4o-mini", base_url=good.url, api_key="sk-test")
            async with Engine([dead, mini], retry=FAST, fallbacks={keyed: ["openai/gpt-4o-mini"]}) as engine:
                results = await engine.run([Request.from_prompt(asked, f"q{i}", max_tokens=5) for i in range(30)])
                status = {s.deployment: s for s in engine.deployment_status()}
        assert all(r.ok for r in results), (asked, keyed, {r.error.kind for r in results if r.error})
        assert {r.model for r in results} == {"openai/gpt-4o-mini"}
        assert status["big"].state == "cooling down"  # cooled as in a group, not retried 30 times over
        assert status["big"].failed < 30  # only those placed before it cooled
        assert good.stats.accepted == 30


def test_sluice_run_finishes_on_the_fallback_when_the_only_deployment_is_down(tmp_path: Path) -> None:
    from clitools import env_for, questions, read_output, run_cli, write_jsonl

    with FakeServer(api_key="sk-test").running_in_thread() as good:
        config = tmp_path / "sluice.toml"
        config.write_text(
            f'[[deployment]]\nmodel = "big"\nbase_url = "{_dead_url()}"\n\n'
            f'[[deployment]]\nmodel = "openai/gpt-4o-mini"\nbase_url = "{good.url}"\n\n'
            '[fallbacks]\n"openai/big" = ["openai/gpt-4o-mini"]\n'
        )
        source = write_jsonl(tmp_path / "in.jsonl", questions(40))
        output = tmp_path / "out.jsonl"
        done = run_cli(good, "run", source, "-o", output, "--config", config, "--model", "big", env=env_for(good))
        assert done.returncode == 0, done.stderr
        records = read_output(output)
        assert len(records) == 40
        assert all(r["ok"] and r["deployment"] == "openai/gpt-4o-mini" for r in records)
        assert good.stats.accepted == 40
