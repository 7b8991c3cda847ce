"""Anthropic's Message Batches on ``sluice serve``, driven by the official anthropic SDK
(``client.messages.batches``) over loopback, in front of an OpenAI-compatible deployment
(``gpt-test``: each request translated) and an Anthropic one (``claude-test``: sent as
written), the fake provider behind both. One test runs ``sluice serve`` in a subprocess
and kills it with SIGKILL mid-batch."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
import servetools
from polling import until
from servetools import ALICE_KEY, BOB_KEY, PRICE, UPSTREAM_KEY, deployment, fake, serving

from sluice import Deployment
from sluice.serve.batches._message_shapes import message_batch
from sluice.serve.core._settings import ClientSpec
from sluice.serve.files._ctx import new_batch
from sluice.testing import FakeServer

ALICE = ClientSpec("alice", key_env="ALICE_KEY")
BOB = ClientSpec("bob", key_env="BOB_KEY")
MODELS = ["gpt-test", "claude-test"]
#: Where each model's requests reach the fake.
UPSTREAM_PATH = {"gpt-test": "/v1/chat/completions", "claude-test": "/v1/messages"}
WEB_SEARCH = [{"type": "web_search_20250305", "name": "web_search"}]

_OPENED: list[anthropic.AsyncAnthropic | openai.AsyncOpenAI] = []


def sdk(url: str, key: str = ALICE_KEY) -> anthropic.AsyncAnthropic:
    """The official client (closed after the test, with its connections)."""
    client = anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
    _OPENED.append(client)
    return client


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _OPENED:
        await _OPENED.pop().close()


def claude(upstream: FakeServer, **kwargs: Any) -> Deployment:
    kwargs.setdefault("price", PRICE)
    return Deployment("anthropic/claude-test", base_url=upstream.anthropic_url, api_key=UPSTREAM_KEY, **kwargs)


@contextlib.asynccontextmanager
async def proxy(
    tmp_path: Path,
    *,
    clients: tuple[ClientSpec, ...] = (ALICE, BOB),
    in_flight: int | None = None,
    latency: float = 0.0,
    **settings: Any,
) -> AsyncIterator[tuple[FakeServer, str]]:
    """The fake upstream (answering after ``latency``), and the proxy serving ``gpt-test``
    and ``claude-test`` (``settings``: its ``[serve]`` table)."""
    limits = {"max_in_flight": in_flight} if in_flight else {}
    async with fake(latency=latency) as upstream:
        deployments = [deployment(upstream, **limits), claude(upstream, **limits)]
        async with serving(deployments, tmp_path, clients=clients, **settings) as url:
            yield upstream, url


def request(i: int, model: str, **params: Any) -> dict[str, Any]:
    """A request of its own (identical ones would be answered from the server's state)."""
    body = {"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": f"question {i}"}], **params}
    return {"custom_id": f"req-{i}", "params": body}


async def ended(client: anthropic.AsyncAnthropic, batch_id: str, timeout: float = 30.0) -> Any:  # noqa: ASYNC109
    found: list[Any] = []

    async def done() -> bool:
        found[:] = [await client.messages.batches.retrieve(batch_id)]
        return bool(found[0].processing_status == "ended")

    await until(done, timeout=timeout)
    return found[0]


async def results(client: anthropic.AsyncAnthropic, batch_id: str) -> dict[str, Any]:
    """custom_id -> its result (each custom_id once)."""
    got: dict[str, Any] = {}
    async for line in await client.messages.batches.results(batch_id):
        assert line.custom_id not in got
        got[line.custom_id] = line.result
    return got


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
async def test_a_message_batch_round_trip_as_anthropic_clients_expect(tmp_path: Path, model: str) -> None:
    n = 12
    async with proxy(tmp_path) as (upstream, url):
        client = sdk(url)
        batch = await client.messages.batches.create(requests=[request(i, model) for i in range(n)])  # type: ignore[misc]
        assert batch.id.startswith("msgbatch_")
        assert batch.type == "message_batch"
        assert batch.processing_status == "in_progress"
        assert batch.results_url is None
        assert batch.request_counts.processing == n
        assert batch.expires_at > batch.created_at
        done = await ended(client, batch.id)
        got = await results(client, batch.id)
        listed = [b.id async for b in client.messages.batches.list()]
        async with servetools.sdk(url, ALICE_KEY) as oai:  # what OpenAI's API shows of it: nothing
            openai_batches = [b.id async for b in oai.batches.list()]
            files = [f.id async for f in oai.files.list()]
        deleted = await client.messages.batches.delete(batch.id)
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.batches.retrieve(batch.id)
    counts = done.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, n, 0, 0, 0)
    assert done.ended_at is not None
    assert done.results_url == f"/v1/messages/batches/{batch.id}/results"
    assert sorted(got) == sorted(f"req-{i}" for i in range(n))
    for custom_id, result in got.items():
        assert result.type == "succeeded"
        message = result.message
        assert message.type == "message"
        assert message.model == model
        assert message.content[0].text == f"echo: question {custom_id.removeprefix('req-')}"
        assert message.stop_reason == "end_turn"
        assert message.usage.output_tokens > 0
    assert upstream.stats.received == n  # every request answered once
    assert upstream.stats.by_path[UPSTREAM_PATH[model]] == n
    assert upstream.stats.duplicate_successes == 0
    assert listed == [batch.id]
    assert openai_batches == []
    assert files == []
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")


async def test_a_request_a_deployment_cannot_take_errors_alone(tmp_path: Path) -> None:
    """A web_search tool cannot be told to a chat deployment: that request errors, the
    Anthropic deployment takes it as written, a model the client may not use is a
    not_found_error, and the rest succeed."""
    limited = ClientSpec("alice", key_env="ALICE_KEY", models=("gpt-test", "claude-test"))
    requests = [
        request(0, "gpt-test"),
        request(1, "gpt-test", tools=WEB_SEARCH),
        request(2, "claude-test", tools=WEB_SEARCH),
        request(3, "claude-nope"),
        request(4, "claude-test"),
    ]
    async with proxy(tmp_path, clients=(limited,)) as (upstream, url):
        client = sdk(url)
        batch = await client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        done = await ended(client, batch.id)
        got = await results(client, batch.id)
    assert {k: v.type for k, v in got.items()} == {
        "req-0": "succeeded",
        "req-1": "errored",
        "req-2": "succeeded",
        "req-3": "errored",
        "req-4": "succeeded",
    }
    refused = got["req-1"].error
    assert refused.type == "error"
    assert refused.error.type == "invalid_request_error"
    assert "web_search" in refused.error.message
    assert got["req-3"].error.error.type == "not_found_error"
    assert "claude-nope" in got["req-3"].error.error.message
    assert (done.request_counts.succeeded, done.request_counts.errored) == (3, 2)
    assert upstream.stats.received == 3  # what could not be sent was not


async def test_a_budget_refuses_the_requests_in_anthropics_words(tmp_path: Path) -> None:
    broke = ClientSpec("alice", key_env="ALICE_KEY", budget_usd=0.0)
    async with proxy(tmp_path, clients=(broke,)) as (upstream, url):
        client = sdk(url)
        batch = await client.messages.batches.create(requests=[request(i, "claude-test") for i in range(3)])  # type: ignore[misc]
        done = await ended(client, batch.id)
        got = await results(client, batch.id)
    assert {r.type for r in got.values()} == {"errored"}
    assert {r.error.error.type for r in got.values()} == {"billing_error"}
    assert "--" not in next(iter(got.values())).error.error.message  # no CLI advice for API clients
    assert done.request_counts.errored == 3
    assert upstream.stats.received == 0


async def test_a_batch_anthropic_would_refuse_is_a_400_naming_the_field(tmp_path: Path) -> None:
    good = request(0, "gpt-test")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"requests": []}, "requests: List should have at least 1 item"),
        ({"requests": [{**good, "custom_id": "has space"}]}, "requests.0.custom_id: String should match pattern"),
        ({"requests": [{**good, "custom_id": "x" * 65}]}, "requests.0.custom_id"),
        ({"requests": [good, good]}, "requests.1.custom_id"),
        ({"requests": [{"custom_id": "a"}]}, "requests.0.params: Field required"),
        ({"requests": [{"custom_id": "a", "params": {"model": "gpt-test", "messages": []}}]}, "requests.0.params.max_tokens"),
        ({"requests": [request(0, "gpt-test", stream=True)]}, "requests.0.params.stream"),
        ({"requests": [{**good, "extra": 1}]}, "requests.0.extra: Extra inputs are not permitted"),
        ({"requests": [request(0, "gpt-test", max_tokens=0)]}, "requests.0.params.max_tokens"),
    ]  # fmt: skip
    async with proxy(tmp_path) as (upstream, url), aiohttp.ClientSession() as http:
        headers = {"x-api-key": ALICE_KEY, "anthropic-version": "2023-06-01"}
        for body, said in cases:
            async with http.post(f"{url}/v1/messages/batches", json=body, headers=headers) as response:
                payload = await response.json()
                assert response.status == 400, payload
                assert payload["type"] == "error"
                assert payload["error"]["type"] == "invalid_request_error"
                assert said in payload["error"]["message"], payload
        async with http.post(f"{url}/v1/messages/batches", data=b"{nope", headers=headers) as response:
            assert response.status == 400
            assert (await response.json())["type"] == "error"
        with pytest.raises(anthropic.BadRequestError):
            await sdk(url).messages.batches.create(requests=[{**good, "custom_id": "a/b"}])  # type: ignore[list-item]
        listed = [b async for b in sdk(url).messages.batches.list()]
    assert listed == []
    assert upstream.stats.received == 0


@pytest.mark.parametrize("model", MODELS)
async def test_with_batch_tier_a_message_batch_goes_through_the_providers_batch_api(tmp_path: Path, model: str) -> None:
    """``[serve] batch_tier = "batch"``: a Message Batch's requests become a provider
    batch (none is sent as a request of its own), as an OpenAI batch's chat lines do."""
    n = 6
    async with proxy(tmp_path, batch_tier="batch", batch_poll_every=0.2) as (upstream, url):
        client = sdk(url)
        batch = await client.messages.batches.create(requests=[request(i, model) for i in range(n)])  # type: ignore[misc]
        done = await ended(client, batch.id)
        got = await results(client, batch.id)
    assert done.request_counts.succeeded == n
    assert {r.type for r in got.values()} == {"succeeded"}
    assert got["req-3"].message.content[0].text == "echo: question 3"
    assert upstream.stats.received == 0  # nothing synchronous
    assert upstream.stats.accepted == n
    assert {e.tier for e in upstream.ledger} == {"batch"}


def test_a_batch_that_could_not_run_reads_as_ended_with_every_request_errored() -> None:
    failed = {
        **new_batch("msgbatch_x", "/v1/messages", "file-x", 7),
        "status": "failed",
        "failed_at": 1_700_000_000,
    }
    view = message_batch(failed)
    assert view["processing_status"] == "ended"
    assert view["ended_at"] == "2023-11-14T22:13:20Z"
    assert view["request_counts"] == {"processing": 0, "succeeded": 0, "errored": 7, "canceled": 0, "expired": 0}
    assert view["results_url"] == "/v1/messages/batches/msgbatch_x/results"


# -- cancel, clients, paging ---------------------------------------------------------------------


async def test_cancel_stops_sending_and_keeps_what_finished(tmp_path: Path) -> None:
    n = 40
    async with proxy(tmp_path, in_flight=2, latency=0.1) as (upstream, url):
        client = sdk(url)
        batch = await client.messages.batches.create(requests=[request(i, "claude-test") for i in range(n)])  # type: ignore[misc]
        await upstream.until(lambda: upstream.stats.received >= 4)
        with pytest.raises(anthropic.ConflictError):  # only an ended batch may be deleted
            await client.messages.batches.delete(batch.id)
        with pytest.raises(anthropic.ConflictError):  # nor its results read
            await client.get(f"/v1/messages/batches/{batch.id}/results", cast_to=object)
        canceling = await client.messages.batches.cancel(batch.id)
        assert canceling.processing_status == "canceling"
        assert canceling.cancel_initiated_at is not None
        done = await ended(client, batch.id)
        got = await results(client, batch.id)
        with pytest.raises(anthropic.ConflictError):
            await client.messages.batches.cancel(batch.id)
    counts = done.request_counts
    kinds = [r.type for r in got.values()]
    assert sorted(got) == sorted(f"req-{i}" for i in range(n))
    assert set(kinds) == {"succeeded", "canceled"}
    assert counts.succeeded == kinds.count("succeeded") == upstream.stats.received
    assert counts.canceled == kinds.count("canceled") == n - counts.succeeded
    assert upstream.stats.received < n / 2  # sending stopped: what was in flight finished
    assert counts.processing == counts.errored == counts.expired == 0


async def test_one_client_never_sees_anothers_message_batches(tmp_path: Path) -> None:
    async with proxy(tmp_path) as (_, url):
        alice, bob = sdk(url), sdk(url, BOB_KEY)
        batch = await alice.messages.batches.create(requests=[request(0, "gpt-test")])  # type: ignore[list-item]
        await ended(alice, batch.id)
        for attempt in (
            bob.messages.batches.retrieve,
            bob.messages.batches.cancel,
            bob.messages.batches.delete,
        ):
            with pytest.raises(anthropic.NotFoundError) as caught:
                await attempt(batch.id)
            assert caught.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.NotFoundError):
            await bob.get(f"/v1/messages/batches/{batch.id}/results", cast_to=object)
        assert [b async for b in bob.messages.batches.list()] == []
        async with servetools.sdk(url, ALICE_KEY) as oai:  # nor is it an OpenAI batch of alice's
            with pytest.raises(openai.NotFoundError):
                await oai.batches.retrieve(batch.id)
        assert [b.id async for b in alice.messages.batches.list()] == [batch.id]


async def test_the_list_pages_newest_first_both_ways(tmp_path: Path) -> None:
    async with proxy(tmp_path) as (_, url):
        client = sdk(url)
        made = [
            (await client.messages.batches.create(requests=[request(i, "gpt-test")])).id  # type: ignore[list-item]
            for i in range(5)
        ]
        newest_first = made[::-1]
        first = await client.messages.batches.list(limit=2)
        everything = [b.id async for b in await client.messages.batches.list(limit=2)]
        after = await client.messages.batches.list(limit=2, after_id=newest_first[1])
        before = await client.messages.batches.list(limit=2, before_id=newest_first[4])
        back = await client.messages.batches.list(limit=10, before_id=newest_first[1])
        with pytest.raises(anthropic.BadRequestError):
            await client.messages.batches.list(limit=0)
        for batch_id in made:
            await ended(client, batch_id)
    assert [b.id for b in first.data] == newest_first[:2]
    assert (first.has_more, first.first_id, first.last_id) == (True, newest_first[0], newest_first[1])
    assert everything == newest_first
    assert [b.id for b in after.data] == newest_first[2:4]
    assert after.has_more
    assert [b.id for b in before.data] == newest_first[2:4]
    assert before.has_more
    assert ([b.id for b in back.data], back.has_more) == ([newest_first[0]], False)


# -- restarts ------------------------------------------------------------------------------------


async def test_a_message_batch_survives_a_restart_and_nothing_is_sent_twice(tmp_path: Path) -> None:
    n = 30
    async with fake(latency=0.05) as upstream:
        deployments = [claude(upstream, max_in_flight=3)]
        async with serving(deployments, tmp_path, clients=(ALICE,)) as url:
            batch = await sdk(url).messages.batches.create(requests=[request(i, "claude-test") for i in range(n)])  # type: ignore[misc]
            await upstream.until(lambda: upstream.stats.received >= 6)
        stopped_at = upstream.stats.received
        async with serving(deployments, tmp_path, clients=(ALICE,)) as url:
            client = sdk(url)
            done = await ended(client, batch.id)
            got = await results(client, batch.id)
    assert stopped_at < n
    assert done.request_counts.succeeded == n
    assert sorted(got) == sorted(f"req-{i}" for i in range(n))
    assert {r.type for r in got.values()} == {"succeeded"}
    assert upstream.stats.received == n
    assert upstream.stats.duplicate_successes == 0


_CONFIG = """
[[deployment]]
model = "anthropic/claude-test"
base_url = "{url}"
api_key_env = "SLUICE_TEST_FAKE_KEY"
max_in_flight = {in_flight}
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0 }}
"""


@contextlib.asynccontextmanager
async def sluice_serve(config: Path, state: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``sluice serve`` in its own process: (the process, its base URL)."""
    env = {**os.environ, "SLUICE_TEST_FAKE_KEY": UPSTREAM_KEY}
    args = ["-m", "sluice", "serve", "--config", str(config), "--port", "0", "--state", str(state)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        ready = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "listening on" in ready, ready
        yield process, ready.split("(base_url ")[1].split(")")[0].removesuffix("/v1")
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def test_a_message_batch_survives_kill_9_and_pays_at_most_the_in_flight_twice(tmp_path: Path) -> None:
    n, in_flight = 40, 4
    config = tmp_path / "sluice.toml"
    state = tmp_path / "state"
    async with fake(latency=0.05) as upstream:
        config.write_text(_CONFIG.format(url=upstream.anthropic_url, in_flight=in_flight))
        async with sluice_serve(config, state) as (process, url):
            batch = await sdk(url, "anyone").messages.batches.create(
                requests=[request(i, "claude-test") for i in range(n)]  # type: ignore[misc]
            )
            await upstream.until(lambda: upstream.stats.received >= 12)
            process.send_signal(signal.SIGKILL)
            assert await process.wait() == -signal.SIGKILL
        killed_at = upstream.stats.received
        async with sluice_serve(config, state) as (_, url):
            client = sdk(url, "anyone")
            done = await ended(client, batch.id)
            got = await results(client, batch.id)
    assert killed_at < n
    assert done.request_counts.succeeded == n
    assert sorted(got) == sorted(f"req-{i}" for i in range(n))
    assert upstream.stats.received <= n + in_flight
    assert upstream.stats.duplicate_successes <= in_flight
