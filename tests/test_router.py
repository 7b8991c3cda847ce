"""The router over real loopback servers: several deployments of one model share the load
by headroom, a dead one cools down and is probed, and requests fall back to other models
and other providers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fake_provider import dead_url, deployment_at

from sluice import (
    ConfigError,
    Cooldown,
    Deployment,
    Engine,
    Price,
    Request,
    Result,
    RetryPolicy,
)
from sluice.testing import FakeServer, run_in_virtual_time

MODEL = "openai/gpt-test"
FAST = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=5)
QUICK_COOLDOWN = Cooldown(after_failures=2, seconds=0.2, max_seconds=1.0)
#: Six attempts: the policy the probe, group and fallback tests below were written with.
FAST_SIX = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05, attempt_timeout=5)


def prompts(n: int, model: str = MODEL) -> list[Request]:
    return [Request.from_prompt(model, f"question {i}", max_tokens=10) for i in range(n)]


def states(engine: Engine) -> dict[str, str]:
    return {s.deployment: s.state for s in engine.deployment_status()}


@pytest.fixture
async def pair() -> AsyncIterator[tuple[FakeServer, FakeServer]]:
    async with FakeServer(api_key="sk-test") as east, FakeServer(api_key="sk-test") as west:
        yield east, west


def test_two_deployments_share_the_load_by_headroom_without_a_429() -> None:
    """In virtual time: a 1 s window on a loaded machine's wall clock set the loop's lag
    against the window's 25 ms margin (a 429 now and then); the sharing is what is tested."""

    async def scenario() -> tuple[FakeServer, FakeServer, list[Result]]:
        async with (
            FakeServer(api_key="sk-test", rpm=20, window=1.0) as east,
            FakeServer(api_key="sk-test", rpm=20, window=1.0) as west,
        ):
            deployments = [
                deployment_at(east, name="east", rpm=20, window=1.0),
                deployment_at(west, name="west", rpm=20, window=1.0),
            ]
            async with Engine(deployments, retry=FAST) as engine:
                return east, west, await engine.run(prompts(80))

    east, west, results = run_in_virtual_time(scenario())
    assert all(r.ok for r in results)
    assert east.stats.rate_limited == west.stats.rate_limited == 0
    served = {"east": east.stats.accepted, "west": west.stats.accepted}
    assert sum(served.values()) == 80
    assert min(served.values()) >= 30, served  # neither waited while the other had room
    assert {r.deployment for r in results} == {"east", "west"}
    assert {r.model for r in results} == {MODEL}


async def test_a_retry_goes_to_another_deployment(pair: tuple[FakeServer, FakeServer]) -> None:
    east, west = pair
    east.inject("503", times=1)
    async with Engine(
        [deployment_at(east, name="east", weight=1000.0), deployment_at(west, name="west")], retry=FAST
    ) as engine:
        result = await engine.complete(MODEL, "hello")
    assert result.ok, result.error
    assert result.attempts == 2
    assert result.deployment == "west"  # at once, not after a backoff on the same one
    assert east.stats.received == 1


def test_a_dead_deployment_cools_down_and_is_probed_before_it_is_trusted() -> None:
    """In virtual time: on a loaded machine's wall clock the first run could outlast the
    0.2 s cooldown, and west was found ready for a probe ("ok") rather than cooling down."""
    run_in_virtual_time(_dead_deployment_cools_down())


async def _dead_deployment_cools_down() -> None:
    async with FakeServer(api_key="sk-test") as east, FakeServer(api_key="sk-test") as west:
        west.fault_rates = {"503": 1.0}
        east.latency = 0.01
        deployments = [deployment_at(east, name="east"), deployment_at(west, name="west")]
        async with Engine(deployments, retry=FAST, cooldown=QUICK_COOLDOWN, concurrency=4) as engine:
            results = await engine.run(prompts(40))
            assert all(r.ok for r in results)
            (status,) = [s for s in engine.deployment_status() if s.deployment == "west"]
            assert status.state in ("cooling down", "probing")
            assert "west cooling down" in status.describe() or status.state == "probing"
            # taken out after 2 failures (with at most the concurrency already placed there),
            # then one probe per cooldown
            assert west.stats.received <= 4 + 2 + 4
            west.fault_rates = {}
            await asyncio.sleep(1.1)  # the longest cooldown (max_seconds)
            later = await engine.run(prompts(40))
            assert all(r.ok for r in later)
            assert west.stats.accepted > 0  # probed, then trusted again
            (status,) = [s for s in engine.deployment_status() if s.deployment == "west"]
            assert status.state == "ok"


async def test_a_cancelled_probe_frees_the_deployment() -> None:
    cooldown = Cooldown(after_failures=1, seconds=0.2, max_seconds=0.4)
    async with (
        FakeServer(api_key="sk-test") as west,
        FakeServer(api_key="sk-test") as east,
        Engine(
            [deployment_at(west, name="west"), deployment_at(east, name="east")], retry=FAST_SIX, cooldown=cooldown
        ) as engine,
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
        Engine(
            [deployment_at(west, name="west"), deployment_at(east, name="east")], retry=FAST_SIX, cooldown=cooldown
        ) as engine,
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


async def test_a_bad_key_on_one_deployment_does_not_fail_requests(pair: tuple[FakeServer, FakeServer]) -> None:
    east, west = pair
    broken = Deployment(MODEL, name="west", base_url=west.url, api_key="sk-wrong")
    async with Engine([deployment_at(east, name="east"), broken], retry=FAST, cooldown=QUICK_COOLDOWN) as engine:
        results = await engine.run(prompts(10))
    assert all(r.ok for r in results)
    assert all(r.deployment == "east" for r in results)


async def test_a_request_the_model_cannot_take_falls_back_to_another_provider() -> None:
    async with (
        FakeServer(api_key="sk-test", context_window=60) as small,
        FakeServer(api_key="sk-ant") as big,
    ):
        primary = Deployment(MODEL, base_url=small.url, api_key="sk-test", price=Price(1.0, 2.0))
        fallback = Deployment(
            "anthropic/claude-test", base_url=big.anthropic_url, api_key="sk-ant", price=Price(3.0, 15.0)
        )
        engine = Engine([primary, fallback], retry=FAST, fallbacks={MODEL: ["anthropic/claude-test"]})
        async with engine:
            short = await engine.complete(MODEL, "hi", max_tokens=10)
            long = await engine.complete(MODEL, "a long question " * 40, max_tokens=10)
    assert short.ok
    assert short.model == MODEL
    assert long.ok, long.error
    assert long.model == "anthropic/claude-test"
    assert long.text is not None
    assert long.text.startswith("echo: a long question")
    assert long.attempts == 2
    # cost: the 400 was free; the answer is priced at the fallback's rates
    assert long.cost_usd == pytest.approx((long.usage.input_tokens * 3.0 + long.usage.output_tokens * 15.0) / 1e6)
    assert engine.stats.fallbacks == 1
    assert small.stats.by_status[400] == 1


async def test_when_every_deployment_of_a_model_fails_the_request_moves_on(
    pair: tuple[FakeServer, FakeServer],
) -> None:
    east, west = pair
    east.fault_rates = {"503": 1.0}
    engine = Engine(
        [deployment_at(east, name="east"), deployment_at(west, "openai/gpt-backup", name="west")],
        retry=FAST,
        fallbacks={MODEL: ["openai/gpt-backup"]},
        cooldown=QUICK_COOLDOWN,
    )
    async with engine:
        results = await engine.run(prompts(10))
    assert all(r.ok for r in results)
    assert {r.model for r in results} == {"openai/gpt-backup"}


async def test_a_fallback_serves_a_model_whose_only_deployment_is_down_whatever_name_keys_it() -> None:
    """``big`` and ``openai/big`` are one model for its fallbacks too, as for its group."""
    for asked, keyed in (("big", "openai/big"), ("openai/big", "big"), ("big", "big")):
        async with FakeServer(api_key="sk-test") as good:
            dead = Deployment("big", base_url=dead_url(), api_key="sk-test")
            mini = Deployment("openai/gpt-4o-mini", base_url=good.url, api_key="sk-test")
            async with Engine([dead, mini], retry=FAST_SIX, fallbacks={keyed: ["openai/gpt-4o-mini"]}) as engine:
                results = await engine.run([Request.from_prompt(asked, f"q{i}", max_tokens=5) for i in range(30)])
                status = {s.deployment: s for s in engine.deployment_status()}
        assert all(r.ok for r in results), (asked, keyed, {r.error.kind for r in results if r.error})
        assert {r.model for r in results} == {"openai/gpt-4o-mini"}
        assert status["big"].state == "cooling down"  # cooled as in a group, not retried 30 times over
        assert status["big"].failed < 30  # only those placed before it cooled
        assert good.stats.accepted == 30


async def test_under_a_budget_the_worst_case_is_the_dearest_candidate(pair: tuple[FakeServer, FakeServer]) -> None:
    east, west = pair
    cheap = deployment_at(east, name="cheap", price=Price(0.1, 0.1))
    dear = deployment_at(west, "openai/gpt-dear", name="dear", price=Price(100.0, 100.0))
    async with Engine([cheap, dear], budget_usd=10.0, fallbacks={MODEL: ["openai/gpt-dear"]}) as engine:
        job = engine.attempts.job(Request.from_prompt(MODEL, "hi", max_tokens=100), 0)
        dear_alone = engine.spending.prepare(job.request, dear, job.budget)[1]
        assert job.worst_cost == pytest.approx(dear_alone)
        assert job.worst_cost > engine.spending.prepare(job.request, cheap, job.budget)[1] * 100


async def test_a_request_may_name_one_deployment(pair: tuple[FakeServer, FakeServer]) -> None:
    east, west = pair
    async with Engine([deployment_at(east, name="east"), deployment_at(west, name="west")], retry=FAST) as engine:
        results = [await engine.complete("west", f"q{i}") for i in range(5)]
    assert all(r.deployment == "west" for r in results)
    assert east.stats.received == 0


async def test_a_group_serves_a_request_only_one_of_its_deployments_can_take() -> None:
    async with FakeServer(api_key="sk-test") as small, FakeServer(api_key="sk-test") as big:
        deployments = [deployment_at(small, name="small", tpm=2_000), deployment_at(big, name="big", tpm=1_000_000)]
        async with Engine(deployments, retry=FAST_SIX) as engine:
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
        deployments = [
            deployment_at(east, name="east", max_in_flight=2),
            deployment_at(west, name="west", max_in_flight=2),
        ]
        async with Engine(deployments, retry=FAST_SIX) as engine:
            results = await engine.run([Request.from_prompt(MODEL, f"q{i}", max_tokens=5) for i in range(500)])
            group = engine.router.group(MODEL)
            assert all(r.ok for r in results)
            assert len(group.watchers) < 10  # was one per waited request


async def test_a_bare_model_name_uses_the_configured_deployment() -> None:
    async with FakeServer(api_key="sk-test") as server:
        deployment = Deployment("openai/gpt-test", base_url=server.url, api_key="sk-test", rpm=600)
        async with Engine(deployment) as engine:
            result = await engine.complete("gpt-test", "hi")
            assert result.deployment == "openai/gpt-test"
            assert len(engine.deployments) == 1


def test_two_deployments_need_distinct_names() -> None:
    with pytest.raises(ConfigError, match="distinct name"):
        Engine([Deployment(MODEL, base_url="http://a.example/v1"), Deployment(MODEL, base_url="http://b.example/v1")])
    with pytest.raises(ConfigError, match="names the model itself"):
        Engine(fallbacks={MODEL: [MODEL]})


def test_the_batch_command_routes_by_its_config(tmp_path: Any) -> None:
    """sluice.toml groups, weights and [fallbacks]; the records and `sluice report` name who answered."""
    from clitools import questions, read_output, run_cli, write_jsonl

    with (
        FakeServer(api_key="sk-east").running_in_thread() as east,
        FakeServer(api_key="sk-west", fault_rates={"503": 1.0}).running_in_thread() as west,
        FakeServer(api_key="sk-back").running_in_thread() as back,
    ):
        config = tmp_path / "sluice.toml"
        config.write_text(
            f"""
model = "{MODEL}"
[retry]
max_attempts = 6
base_delay = 0.01
[cooldown]
after_failures = 2
seconds = 30
[[deployment]]
model = "{MODEL}"
name = "east"
base_url = "{east.url}"
api_key_env = "EAST_KEY"
[[deployment]]
model = "{MODEL}"
name = "west"
base_url = "{west.url}"
api_key_env = "WEST_KEY"
[[deployment]]
model = "openai/gpt-backup"
base_url = "{back.url}"
api_key_env = "BACK_KEY"
[fallbacks]
"{MODEL}" = ["openai/gpt-backup"]
"""
        )
        env = {"EAST_KEY": "sk-east", "WEST_KEY": "sk-west", "BACK_KEY": "sk-back"}
        import os

        full_env = {**os.environ, "NO_COLOR": "1", **env}
        source = write_jsonl(tmp_path / "in.jsonl", questions(30))
        output = tmp_path / "out.jsonl"
        done = run_cli(east, "run", source, "-o", output, "--config", config, "--concurrency", "2", env=full_env)
        assert done.returncode == 0, done.stderr
        records = read_output(output)
        assert len(records) == 30
        assert {r["deployment"] for r in records} == {"east"}  # west failed and cooled down
        assert {r["model"] for r in records} == {MODEL}
        report = run_cli(east, "report", tmp_path / "out.sluice.db", env=full_env)
        assert "west" in report.stdout
        assert "cooling down" in report.stdout
        check = run_cli(east, "config", "check", "--config", config, env=full_env)
        assert f"fallbacks: {MODEL} -> openai/gpt-backup" in check.stdout
        east.fault_rates = {"503": 1.0}  # now the whole group fails: the fallback answers
        more = write_jsonl(tmp_path / "more.jsonl", questions(5, start=100))
        done = run_cli(east, "run", more, "-o", tmp_path / "more.out", "--config", config, env=full_env)
        assert done.returncode == 0, done.stderr
        assert {r["model"] for r in read_output(tmp_path / "more.out")} == {"openai/gpt-backup"}


def test_sluice_run_finishes_on_the_fallback_when_the_only_deployment_is_down(tmp_path: Path) -> None:
    from clitools import env_for, questions, read_output, run_cli, write_jsonl

    with FakeServer(api_key="sk-test").running_in_thread() as good:
        config = tmp_path / "sluice.toml"
        config.write_text(
            f'[[deployment]]\nmodel = "big"\nbase_url = "{dead_url()}"\n\n'
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


@pytest.mark.parametrize("adaptive", [True, False])
async def test_aimd_finds_a_self_hosted_servers_capacity(adaptive: bool) -> None:
    """A server that sends no limits (vLLM, Ollama) is driven at its capacity, not past it:
    beyond 8 at once its requests queue, and the adaptive cap settles near 8."""
    async with FakeServer(api_key="sk-test", capacity=8, latency=0.1) as server:
        extra = {} if adaptive else {"max_in_flight": 256}  # an explicit cap turns adaptation off
        async with Engine(deployment_at(server, name="vllm", **extra), retry=FAST) as engine:
            results = await engine.run(prompts(320 if adaptive else 260))
            route = engine.router.routes[0]
        assert all(r.ok for r in results)
        if not adaptive:  # the control: without adaptation everything queues at the server
            assert route.adaptive is None
            assert server.stats.max_in_flight > 200
            return
        assert route.adaptive is not None
        # the cap follows latency measured on the real clock: a loaded CI machine slows the
        # answers and the cap settles lower (3 seen twice in a day), never past the server
        assert 2 <= route.adaptive.cap <= 24, route.adaptive
        # slow start overshoots, then backs off: by one doubling on an idle machine (16-32 at
        # once), by up to three under a loaded CI run, where the first rounds' latency (the
        # floor it compares against) is inflated by the client's own delays (it failed twice in
        # a day at 40, once seen at 64, with four test workers on two cores); without
        # adaptation it is ~300
        assert server.stats.max_in_flight <= 64


async def test_aimd_steps_aside_once_the_server_says_its_limits() -> None:
    async with FakeServer(api_key="sk-test", rpm=600, window=1.0) as server:
        async with Engine(deployment_at(server, name="hosted"), retry=FAST) as engine:
            await engine.run(prompts(20))
            limiter = engine.limiter(MODEL)
        assert limiter.max_in_flight is None  # type: ignore[attr-defined]
        assert limiter.requests_limit is not None  # type: ignore[attr-defined]
