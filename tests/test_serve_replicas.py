"""``sluice serve --redis``: any replica answers for any file or batch.

Two in-process replicas on two loopback ports (each its own state dir) in front of one
FakeServer, sharing a real redis-server; the official ``openai`` SDK is the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
import redis.asyncio as aioredis
from click.testing import CliRunner
from polling import until
from redis_server import RedisServer
from servetools import ALICE_KEY, BOB_KEY, ENV, UPSTREAM_KEY, ask, deployment, fake, listening, sdk

from sluice import Deployment, RetryPolicy
from sluice.cli._config import JobConfig
from sluice.serve._app import build_app
from sluice.serve.core._replicas import REPLICAS
from sluice.serve.core._settings import ClientSpec, ServeSettings
from sluice.testing import FakeServer

CLIENTS = (ClientSpec("alice", "ALICE_KEY"), ClientSpec("bob", "BOB_KEY"))
DONE = ("completed", "failed", "cancelled", "expired")


class Replica:
    """One running replica: its URL, its app, and how many responses it has begun."""

    def __init__(self, url: str, app: aiohttp.web.Application) -> None:
        self.url = url
        self.app = app
        self.responses = 0


@contextlib.asynccontextmanager
async def replica(deployments: list[Deployment], state: Path, redis_url: str) -> AsyncIterator[Replica]:
    config = JobConfig(tuple(deployments), retry=RetryPolicy(max_attempts=2, base_delay=0.01))
    app = build_app(config, ServeSettings(), CLIENTS, state, environ=ENV, redis_url=redis_url)
    counted: list[Replica] = []

    async def count(request: aiohttp.web.Request, response: aiohttp.web.StreamResponse) -> None:
        counted[0].responses += 1

    app.on_response_prepare.append(count)
    async with listening(app) as url:
        app[REPLICAS].set_address(url)
        counted.append(Replica(url, app))
        await _registered(redis_url, app[REPLICAS].id)
        yield counted[0]


async def _registered(redis_url: str, replica_id: str) -> None:
    """Wait for the replica's first heartbeat (the lists ask only registered replicas)."""
    client = aioredis.Redis.from_url(redis_url)

    async def beating() -> bool:
        return bool(await client.exists(f"sluice:serve:replica:{replica_id}"))

    try:
        await until(beating, timeout=5)
    finally:
        await client.aclose()


def batch_file(n: int, tag: str) -> bytes:
    lines = [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-test", "messages": [{"role": "user", "content": f"{tag} question {i}"}]},
        }
        for i in range(n)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def upload(client: openai.AsyncOpenAI, n: int, tag: str) -> str:
    made = await client.files.create(file=(f"{tag}.jsonl", io.BytesIO(batch_file(n, tag))), purpose="batch")
    return made.id


async def create(client: openai.AsyncOpenAI, file_id: str) -> str:
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    return batch.id


async def lines_of(client: openai.AsyncOpenAI, file_id: str) -> list[dict[str, Any]]:
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.content.splitlines() if line.strip()]


@pytest.fixture
async def upstream() -> AsyncIterator[FakeServer]:
    async with fake() as server:
        yield server


# -- a batch across replicas ------------------------------------------------------------------------


async def test_upload_on_one_replica_create_and_poll_on_either_download_from_the_other(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    n = 30
    upstream.latency = 0.01
    async with (
        replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a,
        replica([deployment(upstream)], tmp_path / "b", redis_server.url) as b,
    ):
        on_a, on_b = sdk(a.url, key=ALICE_KEY), sdk(b.url, key=ALICE_KEY)
        try:
            file_id = await upload(on_a, n, "x")
            assert (await on_b.files.retrieve(file_id)).bytes == len(batch_file(n, "x"))
            batch_id = await create(on_b, file_id)  # B holds no such file: A takes the batch
            seen: set[str] = set()
            async with asyncio.timeout(30):
                for turn in range(10_000):
                    batch = await (on_a if turn % 2 else on_b).batches.retrieve(batch_id)
                    seen.add(batch.status)
                    if batch.status in DONE:
                        break
                    await asyncio.sleep(0.02)
            assert batch.status == "completed", batch
            assert batch.output_file_id is not None
            output = await lines_of(on_b, batch.output_file_id)
        finally:
            await on_a.close()
            await on_b.close()
    assert sorted(line["custom_id"] for line in output) == sorted(f"x-{i}" for i in range(n))
    assert all(line["response"]["status_code"] == 200 for line in output)
    assert upstream.stats.received == n  # each line sent once, by one replica
    assert batch.request_counts is not None
    assert batch.request_counts.completed == n


async def test_a_message_batch_made_on_one_replica_is_answered_by_the_other(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    """Anthropic's Message Batches forward as OpenAI's batches do (its key as x-api-key)."""
    n = 5
    claude = Deployment("anthropic/claude-test", base_url=upstream.anthropic_url, api_key=UPSTREAM_KEY)
    requests = [
        {"custom_id": f"m-{i}", "params": {"model": "claude-test", "max_tokens": 9, "messages": ask(i)}}
        for i in range(n)
    ]
    async with (
        replica([claude], tmp_path / "a", redis_server.url) as a,
        replica([claude], tmp_path / "b", redis_server.url) as b,
        anthropic.AsyncAnthropic(base_url=a.url, api_key=ALICE_KEY, max_retries=0) as on_a,
        anthropic.AsyncAnthropic(base_url=b.url, api_key=ALICE_KEY, max_retries=0) as on_b,
        anthropic.AsyncAnthropic(base_url=b.url, api_key=BOB_KEY, max_retries=0) as bob_on_b,
    ):
        batch = await on_a.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        ended: list[Any] = []

        async def done() -> bool:
            ended[:] = [await on_b.messages.batches.retrieve(batch.id)]
            return bool(ended[0].processing_status == "ended")

        await until(done)
        results = {line.custom_id: line.result.type async for line in await on_b.messages.batches.results(batch.id)}
        listed = [x.id async for x in on_b.messages.batches.list()]
        with pytest.raises(anthropic.NotFoundError):
            await bob_on_b.messages.batches.retrieve(batch.id)
        assert (await on_b.messages.batches.delete(batch.id)).type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            await on_a.messages.batches.retrieve(batch.id)
    assert results == {f"m-{i}": "succeeded" for i in range(n)}
    assert ended[0].request_counts.succeeded == n
    assert listed == [batch.id]
    assert upstream.stats.received == n


async def test_file_content_is_streamed_through_the_other_replica_and_delete_reaches_the_holder(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    async with (
        replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a,
        replica([deployment(upstream)], tmp_path / "b", redis_server.url) as b,
    ):
        on_a, on_b = sdk(a.url, key=ALICE_KEY), sdk(b.url, key=ALICE_KEY)
        try:
            file_id = await upload(on_a, 2000, "big")
            content = await on_b.files.content(file_id)
            assert content.content == batch_file(2000, "big")
            deleted = await on_b.files.delete(file_id)
            assert deleted.deleted
            for client in (on_a, on_b):
                with pytest.raises(openai.NotFoundError):
                    await client.files.retrieve(file_id)
        finally:
            await on_a.close()
            await on_b.close()


# -- lists ----------------------------------------------------------------------------------------------


async def test_lists_on_either_replica_show_both_replicas_objects_once_and_only_the_callers(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    async with (
        replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a,
        replica([deployment(upstream)], tmp_path / "b", redis_server.url) as b,
    ):
        alice = {a.url: sdk(a.url, key=ALICE_KEY), b.url: sdk(b.url, key=ALICE_KEY)}
        bob = {a.url: sdk(a.url, key=BOB_KEY), b.url: sdk(b.url, key=BOB_KEY)}
        try:
            files = [await upload(alice[a.url], 1, "a1"), await upload(alice[b.url], 1, "b1")]
            files.append(await upload(alice[a.url], 1, "a2"))
            batches = [await create(alice[a.url], files[0]), await create(alice[b.url], files[1])]
            batches.append(await create(alice[a.url], files[2]))
            bobs_file = await upload(bob[b.url], 1, "bob")
            for url in (a.url, b.url):
                listed = [f.id async for f in alice[url].files.list(purpose="batch")]
                assert sorted(listed) == sorted(files)
                paged = [x.id async for x in alice[url].batches.list(limit=1)]  # one per page: `after` crosses replicas
                assert sorted(paged) == sorted(batches)
                page = await alice[url].batches.list(limit=2)
                assert len(page.data) == 2
                assert page.has_more
                assert [f.id async for f in bob[url].files.list()] == [bobs_file]
                assert [x.id async for x in bob[url].batches.list()] == []
                with pytest.raises(openai.NotFoundError):
                    await bob[url].batches.retrieve(batches[0])
        finally:
            for client in (*alice.values(), *bob.values()):
                await client.close()


# -- the holder away ------------------------------------------------------------------------------------


async def test_while_the_holder_is_down_the_other_replica_says_503_and_the_batch_resumes_when_it_is_back(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    n = 40
    upstream.latency = 0.05
    deployments = [deployment(upstream, max_in_flight=2)]
    async with replica(deployments, tmp_path / "b", redis_server.url) as b:
        on_b = sdk(b.url, key=ALICE_KEY)
        try:
            async with replica(deployments, tmp_path / "a", redis_server.url) as a:
                on_a = sdk(a.url, key=ALICE_KEY)
                try:
                    batch_id = await create(on_a, await upload(on_a, n, "r"))
                    await upstream.until(lambda: upstream.stats.received >= 4)
                finally:
                    await on_a.close()
            with pytest.raises(openai.InternalServerError) as down:
                await on_b.batches.retrieve(batch_id)
            assert down.value.status_code == 503
            assert f"the replica that holds batch {batch_id} is not reachable" in down.value.message
            stopped_at = upstream.stats.received
            assert stopped_at < n
            async with replica(deployments, tmp_path / "a", redis_server.url):  # same state, a new port
                async with asyncio.timeout(30):
                    while True:
                        batch = await on_b.batches.retrieve(batch_id)
                        if batch.status in DONE:
                            break
                        await asyncio.sleep(0.05)
                assert batch.status == "completed"
                assert batch.output_file_id is not None
                output = await lines_of(on_b, batch.output_file_id)
        finally:
            await on_b.close()
    assert sorted(line["custom_id"] for line in output) == sorted(f"r-{i}" for i in range(n))
    assert upstream.stats.received > stopped_at  # the rest was sent after the restart


# -- no loops -----------------------------------------------------------------------------------------------


async def _claim(redis_url: str, object_id: str, replica_id: str, address: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        record = {"replica": replica_id, "client": "alice"}
        await client.set(f"sluice:serve:owner:{object_id}", json.dumps(record))
        await client.set(f"sluice:serve:replica:{replica_id}", address, ex=60)  # it beats, there
    finally:
        await client.aclose()


async def test_a_replica_redis_names_as_holder_of_what_it_lacks_answers_404_itself(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    async with replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a:
        await _claim(redis_server.url, "batch_gone", a.app[REPLICAS].id, a.url)
        client = sdk(a.url, key=ALICE_KEY)
        try:
            async with asyncio.timeout(10):
                with pytest.raises(openai.NotFoundError):
                    await client.batches.retrieve("batch_gone")
        finally:
            await client.close()
    assert a.responses == 1  # answered, not sent to itself


async def test_a_forwarded_request_is_never_forwarded_again(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    """Redis names a replica that is not A, at A's address (a stale or crossed record): B
    forwards to A, and A, which lacks the batch, must answer rather than forward once more."""
    async with (
        replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a,
        replica([deployment(upstream)], tmp_path / "b", redis_server.url) as b,
    ):
        await _claim(redis_server.url, "batch_loop", "r-somebody-else", a.url)
        client = sdk(b.url, key=ALICE_KEY)
        try:
            async with asyncio.timeout(10):
                with pytest.raises(openai.NotFoundError):
                    await client.batches.retrieve("batch_loop")
        finally:
            await client.close()
    assert a.responses == 1
    assert b.responses == 1


# -- the CLI ----------------------------------------------------------------------------------------------


def test_a_wildcard_host_with_redis_needs_advertise_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.cli import main

    config = tmp_path / "sluice.toml"
    config.write_text(
        '[[deployment]]\nmodel = "openai/gpt-test"\napi_key_env = "UP_KEY"\n'
        '[[client]]\nname = "alice"\nkey_env = "ALICE_KEY"\n'
    )
    for name, value in {**ENV, "UP_KEY": "sk-up"}.items():
        monkeypatch.setenv(name, value)
    args = ["serve", "--config", str(config), "--host", "0.0.0.0", "--redis", "redis://127.0.0.1:1/0"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "needs --advertise-url" in result.output
    result = CliRunner().invoke(main, ["serve", "--config", str(config), "--advertise-url", "http://x:1"])
    assert result.exit_code == 2
    assert "needs --redis" in result.output


async def test_a_json_nesting_bomb_for_a_batch_is_a_400_on_a_replica_too(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The forwarding layer reads a batch's body before the handler does: the same 400."""
    async with (
        fake() as upstream,
        replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a,
        aiohttp.ClientSession() as http,
        http.post(
            f"{a.url}/v1/batches",
            data=b"[" * 100_000 + b"]" * 100_000,
            headers={"Authorization": f"Bearer {ALICE_KEY}"},
        ) as got,
    ):
        assert got.status == 400
    assert not [r for r in caplog.records if r.levelno >= 40]  # no traceback logged as an error


async def test_a_stopped_holders_old_address_never_gets_the_clients_key(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    """Once a replica stops beating, its last address may be anyone (a reused pod IP):
    the other replica answers 503 and sends nothing there, least of all the client's key."""
    async with replica([deployment(upstream)], tmp_path / "b", redis_server.url) as b:
        async with replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a:
            on_a = sdk(a.url, key=ALICE_KEY)
            try:
                file_id = await upload(on_a, 3, "x")
            finally:
                await on_a.close()
            old_port = int(a.url.rsplit(":", 1)[1])
        seen: list[str | None] = []

        async def stranger(request: aiohttp.web.Request) -> aiohttp.web.Response:
            seen.append(request.headers.get("Authorization"))
            return aiohttp.web.json_response({"id": file_id, "object": "file"})

        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", stranger)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        try:
            await aiohttp.web.TCPSite(runner, "127.0.0.1", old_port).start()
            on_b = sdk(b.url, key=ALICE_KEY)
            try:
                with pytest.raises(openai.InternalServerError) as down:
                    await on_b.files.retrieve(file_id)
            finally:
                await on_b.close()
        finally:
            await runner.cleanup()
    assert down.value.status_code == 503
    assert seen == []


# -- stored responses across replicas ----------------------------------------------------------------


async def test_a_conversation_continues_and_is_read_through_either_replica(
    tmp_path: Path, redis_server: RedisServer, upstream: FakeServer
) -> None:
    """A response stored by A is continued through B (B forwards the create to A, which
    holds the earlier turns), read and deleted through B; another client finds nothing."""
    async with (
        replica([deployment(upstream)], tmp_path / "a", redis_server.url) as a,
        replica([deployment(upstream)], tmp_path / "b", redis_server.url) as b,
    ):
        on_a, on_b, bob_b = sdk(a.url, key=ALICE_KEY), sdk(b.url, key=ALICE_KEY), sdk(b.url, key=BOB_KEY)
        try:
            first = await on_a.responses.create(model="gpt-test", input="My name is Ada.")
            second = await on_b.responses.create(model="gpt-test", input="Who am I?", previous_response_id=first.id)
            assert second.output_text == "echo: Who am I?"
            assert (await on_b.responses.retrieve(first.id)).output_text == first.output_text
            assert (await on_b.responses.retrieve(second.id)).previous_response_id == first.id
            with pytest.raises(openai.NotFoundError):
                await bob_b.responses.retrieve(first.id)
            with pytest.raises(openai.NotFoundError):
                await bob_b.responses.create(model="gpt-test", input="x", previous_response_id=first.id)
            await on_b.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                await on_a.responses.retrieve(first.id)
        finally:
            for client in (on_a, on_b, bob_b):
                await client.close()
    assert upstream.ledger[-1].input_tokens > upstream.ledger[0].input_tokens  # the first turn went again
