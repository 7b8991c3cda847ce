"""The Files and Batches API of ``sluice serve``, driven by the official ``openai`` SDK.

The server is built in-process (a bare aiohttp app with ``setup_batch_api``) over a real
loopback socket; the provider is a :class:`~sluice.testing.FakeServer`. One test runs the
server in a subprocess and kills it with SIGKILL mid-batch.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from fake_provider import deployment_at
from polling import until

from sluice import Deployment, Engine, Price, RetryPolicy
from sluice._budget import Budget
from sluice.serve.batches._batches import Limits, setup_batch_api
from sluice.serve.core._keys import BATCH_ENGINE, CLIENT, ENGINE, STATE_DIR
from sluice.store import SqliteStore
from sluice.testing import FakeServer
from sluice.testing._embeddings import fake_vector
from sluice.tiers import BatchSettings, close_tiers, tier_deployments

CHAT_MODEL = "gpt-4o-mini"
EMBED_MODEL = "text-embedding-3-small"
FAST_RETRY = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02, attempt_timeout=10.0)
DONE = ("completed", "failed", "cancelled", "expired")


def chat_line(i: int, *, custom_id: str | None = None, url: str = "/v1/chat/completions") -> dict[str, Any]:
    return {
        "custom_id": custom_id or f"req-{i}",
        "method": "POST",
        "url": url,
        "body": {"model": CHAT_MODEL, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 5},
    }


def jsonl(records: list[Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def deployments(server: FakeServer, **limits: Any) -> list[Deployment]:
    price = Price(0.15, 0.60)
    return [
        deployment_at(server, f"openai/{CHAT_MODEL}", price=price, **limits),
        deployment_at(server, f"openai/{EMBED_MODEL}", price=price),
    ]


@dataclass
class Caller:
    name: str
    budget: Budget | None = None


@web.middleware
async def bearer_names_the_client(request: web.Request, handler: Any) -> web.StreamResponse:
    """A stand-in for the real auth middleware: ``Bearer <name>`` is client ``<name>``."""
    name = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    request[CLIENT] = CLIENTS.get(name, Caller(name))
    return await handler(request)


CLIENTS = {"carol": Caller("carol", Budget(0.0, name="carol's budget"))}


@contextlib.asynccontextmanager
async def serving(
    state: Path,
    engine: Engine,
    *,
    auth: bool = False,
    limits: Limits | None = None,
    client_named: Callable[[str], Caller | None] | None = None,
    resolve_model: Callable[[Any, str], str | None] | None = None,
    batch_engine: Engine | None = None,
) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """The Batch API on a loopback port: (base URL for the SDK, the runner)."""
    app = web.Application(middlewares=[bearer_names_the_client] if auth else [])
    app[ENGINE] = engine
    if batch_engine is not None:
        app[BATCH_ENGINE] = batch_engine
    app[STATE_DIR] = state
    setup_batch_api(app, limits=limits, grace=10.0, client_named=client_named, resolve_model=resolve_model)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1", runner
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def engine_for(server: FakeServer, state: Path, *, store: bool = True, **limits: Any) -> AsyncIterator[Engine]:
    """The server's engine as ``sluice serve`` builds it: with a store in the state dir
    (``store=False``: without, so only the batch's own records can prevent a resend)."""
    own = SqliteStore(state / "engine.db") if store else None
    try:
        async with Engine(deployments(server, **limits), retry=FAST_RETRY, store=own) as engine:
            yield engine
    finally:
        if own is not None:
            own.close()


@contextlib.asynccontextmanager
async def batch_api(
    server: FakeServer,
    state: Path,
    *,
    auth: bool = False,
    limits: Limits | None = None,
    store: bool = True,
    client_named: Callable[[str], Caller | None] | None = None,
    resolve_model: Callable[[Any, str], str | None] | None = None,
    **deployment: Any,
) -> AsyncIterator[str]:
    """The engine and the Batch API over it, as one: yields the base URL for the SDK."""
    async with (
        engine_for(server, state, store=store, **deployment) as engine,
        serving(state, engine, auth=auth, limits=limits, client_named=client_named, resolve_model=resolve_model) as (
            url,
            _,
        ),
    ):
        yield url


def sdk(url: str, key: str = "anyone") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)


async def finished(client: openai.AsyncOpenAI, batch_id: str) -> Any:
    batch = None

    async def done() -> bool:
        nonlocal batch
        batch = await client.batches.retrieve(batch_id)
        return batch.status in DONE

    await until(done)
    return batch


async def submit(client: openai.AsyncOpenAI, records: list[Any], endpoint: str = "/v1/chat/completions") -> Any:
    upload = await client.files.create(file=("in.jsonl", jsonl(records)), purpose="batch")
    return await client.batches.create(
        input_file_id=upload.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        metadata={"job": "test"},
    )


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines()]


# -- round trips -------------------------------------------------------------------------------


async def test_a_chat_batch_round_trip_as_openai_clients_expect(server: FakeServer, tmp_path: Path) -> None:
    n = 30
    async with engine_for(server, tmp_path) as engine, serving(tmp_path, engine) as (url, _), sdk(url) as client:
        batch = await submit(client, [chat_line(i) for i in range(n)])
        assert batch.id.startswith("batch_")
        assert batch.status in ("validating", "in_progress")
        assert batch.metadata == {"job": "test"}
        assert batch.endpoint == "/v1/chat/completions"
        done = await finished(client, batch.id)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (n, n, 0)
        assert done.error_file_id is None
        assert done.output_file_id is not None
        assert done.in_progress_at is not None
        assert done.completed_at is not None
        output = await lines_of(client, done.output_file_id)
        listed = [b.id async for b in client.batches.list()]
        out_file = await client.files.retrieve(done.output_file_id)
        purposes = sorted([f.purpose async for f in client.files.list()])
        only_batch = [f.id async for f in client.files.list(purpose="batch")]
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(n))
    for line in output:
        assert line["id"].startswith("batch_req_")
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["request_id"]
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        number = line["custom_id"].removeprefix("req-")
        assert body["choices"][0]["message"]["content"].startswith(f"echo: question {number}")
        assert body["usage"]["total_tokens"] > 0
    assert len({line["id"] for line in output}) == n
    assert server.stats.received == n
    assert listed == [batch.id]
    assert out_file.purpose == "batch_output"
    assert out_file.bytes > 0
    assert purposes == ["batch", "batch_output"]
    assert only_batch == [batch.input_file_id]


async def test_a_chat_batch_through_the_providers_batch_api_at_half_price(server: FakeServer, tmp_path: Path) -> None:
    """``[serve] batch_tier = "batch"``: the client's batch becomes a provider batch (no
    synchronous request), billed at half the price, under the client's budget: both
    engines spend from one purse."""
    n = 12
    server.prices = {"*": (1.0, 2.0)}
    async with engine_for(server, tmp_path) as engine:
        assert engine.store is not None
        settings = BatchSettings(poll_every=0.2, linger=0.2)
        tiered = tier_deployments(deployments(server), "batch", engine.store, settings)  # type: ignore[arg-type]
        batch_engine = Engine(tiered, retry=FAST_RETRY, store=engine.store, spending=engine.spending)
        try:
            async with (
                batch_engine,
                serving(tmp_path, engine, batch_engine=batch_engine) as (url, _),
                sdk(url) as client,
            ):
                batch = await submit(client, [chat_line(i) for i in range(n)])
                done = await finished(client, batch.id)
                output = await lines_of(client, done.output_file_id)
        finally:
            await close_tiers(tiered)
    assert done.status == "completed"
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(n))
    assert all(line["response"]["status_code"] == 200 for line in output)
    assert server.stats.received == 0  # nothing synchronous
    assert server.stats.accepted == n
    assert [(b.status, len(b.lines)) for b in server.batches.batches.values()] == [("completed", n)]  # one batch
    assert {e.tier for e in server.ledger} == {"batch"}
    assert batch_engine.spending is engine.spending


async def test_an_embeddings_batch(server: FakeServer, tmp_path: Path) -> None:
    records = [
        {"custom_id": "one", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED_MODEL, "input": "alpha", "dimensions": 4}},
        {"custom_id": "two", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED_MODEL, "input": ["beta", "gamma"], "dimensions": 4}},
        {"custom_id": "b64", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED_MODEL, "input": "delta", "dimensions": 4, "encoding_format": "base64"}},
        {"custom_id": "empty", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED_MODEL, "input": ""}},
    ]  # fmt: skip
    async with engine_for(server, tmp_path) as engine, serving(tmp_path, engine) as (url, _), sdk(url) as client:
        batch = await submit(client, records, endpoint="/v1/embeddings")
        done = await finished(client, batch.id)
        output = {line["custom_id"]: line for line in await lines_of(client, done.output_file_id)}
        errors = await lines_of(client, done.error_file_id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)

    def vector(text: str) -> list[float]:
        return array("f", fake_vector(text, 4)).tolist()

    def body(custom_id: str) -> dict[str, Any]:
        return output[custom_id]["response"]["body"]  # type: ignore[no-any-return]

    assert body("one")["object"] == "list"
    assert body("one")["model"] == EMBED_MODEL
    assert [d["embedding"] for d in body("one")["data"]] == [vector("alpha")]
    assert [(d["index"], d["embedding"]) for d in body("two")["data"]] == [(0, vector("beta")), (1, vector("gamma"))]
    packed = base64.b64decode(body("b64")["data"][0]["embedding"])
    assert array("f", packed).tolist() == vector("delta")
    assert body("two")["usage"]["prompt_tokens"] > 0
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("empty", "invalid_input")]
    assert "empty" in errors[0]["error"]["message"]  # a body the API refuses fails alone
    assert done.model == EMBED_MODEL
    assert done.usage is not None
    assert done.usage.input_tokens > 0


def responses_line(custom_id: str, model: str, text: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": model, "input": text, "max_output_tokens": 16, **body},
    }


async def test_a_responses_batch_answers_with_response_objects(server: FakeServer, tmp_path: Path) -> None:
    """OpenAI's Batch API takes ``endpoint: "/v1/responses"``: a deployment that speaks
    Responses is sent each line as written (its own Response comes back), a chat-only one
    the translation (its chat completion comes back as a Response), and a line a chat
    deployment cannot be told (a tool OpenAI runs itself) fails alone."""
    chat_only = Deployment("chat-mini", base_url=server.url, api_key="sk-test", price=Price(0.15, 0.60))
    records = [
        responses_line("native", CHAT_MODEL, "question 0", instructions="be brief"),
        responses_line("translated", "chat-mini", "question 1", instructions="be brief"),
        responses_line("lost", "chat-mini", "question 2", tools=[{"type": "web_search"}]),
    ]
    async with (
        Engine([*deployments(server), chat_only], retry=FAST_RETRY) as engine,
        serving(tmp_path, engine) as (url, _),
        sdk(url) as client,
    ):
        batch = await submit(client, records, endpoint="/v1/responses")
        assert batch.endpoint == "/v1/responses"
        done = await finished(client, batch.id)
        output = {line["custom_id"]: line for line in await lines_of(client, done.output_file_id)}
        errors = await lines_of(client, done.error_file_id)
        # a chat line in a Responses batch is not one of its requests: the batch fails
        mixed = await finished(client, (await submit(client, [chat_line(0)], endpoint="/v1/responses")).id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    for custom_id, number in (("native", 0), ("translated", 1)):
        body = output[custom_id]["response"]["body"]
        assert body["object"] == "response"
        assert body["status"] == "completed"
        assert body["id"].startswith("resp_")
        assert body["output"][-1]["content"][0]["text"] == f"echo: question {number}"
        assert body["usage"]["output_tokens"] > 0
    assert output["translated"]["response"]["body"]["instructions"] == "be brief"  # a Response echoes its request
    assert [(e["custom_id"], "web_search" in e["error"]["message"]) for e in errors] == [("lost", True)]
    assert server.stats.by_path["/v1/responses"] == 1
    assert server.stats.by_path["/v1/chat/completions"] == 1
    assert server.stats.received == 2
    assert mixed.status == "failed"
    assert {e.code for e in mixed.errors.data} == {"url_mismatch"}


async def test_a_file_with_lines_that_are_not_requests_fails_the_batch_listing_each(
    server: FakeServer, tmp_path: Path
) -> None:
    """As at OpenAI: the upload is taken, the batch fails while validating, nothing is
    sent, and ``errors.data`` names each line that is not a request it can run."""
    records: list[Any] = [
        chat_line(0),
        chat_line(1, url="/v1/embeddings"),  # another endpoint than the batch's
        {"messages": [{"role": "user", "content": "no custom_id"}], "model": CHAT_MODEL},  # not a Batch line
        chat_line(3, custom_id="req-0"),  # a duplicate custom_id
        {"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions", "body": "hi"},
        {"custom_id": "get", "method": "GET", "url": "/v1/chat/completions", "body": {"model": CHAT_MODEL}},
        {"custom_id": "no-model", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}},
    ]
    raw = jsonl(records) + b"this line is not JSON\n"
    async with engine_for(server, tmp_path) as engine, serving(tmp_path, engine) as (url, _), sdk(url) as client:
        upload = await client.files.create(file=("in.jsonl", raw), purpose="batch")  # taken, as OpenAI takes it
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await finished(client, batch.id)
    assert done.status == "failed"
    assert done.failed_at is not None
    assert done.output_file_id is None
    assert done.error_file_id is None
    found = {(e.line, e.code, e.param) for e in done.errors.data}
    assert found == {
        (2, "url_mismatch", "url"),
        (3, "missing_required_parameter", "custom_id"),
        (3, "invalid_request", "method"),
        (3, "url_mismatch", "url"),
        (3, "missing_required_parameter", "body"),
        (4, "duplicate_custom_id", "custom_id"),
        (5, "missing_required_parameter", "body"),
        (6, "invalid_request", "method"),
        (7, "missing_required_parameter", "body.model"),
        (8, "invalid_json_line", None),
    }
    assert all(e.message and "--" not in e.message for e in done.errors.data)  # no CLI flags for API clients
    assert server.stats.received == 0


async def test_requests_refused_by_the_provider_or_the_server_fail_alone(server: FakeServer, tmp_path: Path) -> None:
    records: list[Any] = [
        chat_line(0),
        {**chat_line(1), "body": {"model": CHAT_MODEL, "messages": []}},  # a body the API refuses
        chat_line(2, custom_id="refused"),
        chat_line(3),
        {**chat_line(4), "body": {**chat_line(4)["body"], "model": "gpt-4o"}},  # a model this client may not use
    ]
    server.inject("400")
    served = {CHAT_MODEL: f"openai/{CHAT_MODEL}"}  # what sluice serve's [[client]] models check would say
    async with (
        engine_for(server, tmp_path) as engine,
        serving(tmp_path, engine, resolve_model=lambda _, model: served.get(model)) as (url, _),
        sdk(url) as client,
    ):
        engine_deployments = [d for d in engine.deployments if d.base_url]
        batch = await submit(client, records)
        done = await finished(client, batch.id)
        output = await lines_of(client, done.output_file_id)
        errors = await lines_of(client, done.error_file_id)
        raw_errors = (await client.files.content(done.error_file_id)).text
    assert done.status == "completed"  # such lines fail alone, never the batch
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 2, 3)
    assert done.model == CHAT_MODEL
    assert done.usage is not None
    assert done.usage.total_tokens == sum(line["response"]["body"]["usage"]["total_tokens"] for line in output)
    assert server.stats.received == 3  # the three it could send, one of them refused by the provider
    by_id = {e["custom_id"]: e for e in errors}
    assert set(by_id) == {"req-1", "req-4", next(e["custom_id"] for e in errors if e["response"] is not None)}
    assert by_id["req-4"]["error"]["code"] == "model_not_found"
    assert by_id["req-1"]["error"]["code"] == "invalid_input"
    assert "--" not in by_id["req-1"]["error"]["message"]
    refused = next(e for e in errors if e["response"] is not None)  # the one the provider refused
    assert refused["custom_id"] in ("req-0", "refused", "req-3")
    assert {line["custom_id"] for line in output} | {refused["custom_id"]} == {"req-0", "refused", "req-3"}
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["message"]
    assert refused["error"]["code"] == "bad_request"
    for deployment in engine_deployments:
        assert deployment.base_url is not None
        assert deployment.base_url.split("//")[1].split("/")[0] not in raw_errors
    assert "sk-test" not in raw_errors


# -- cancel, clients, limits -------------------------------------------------------------------


async def test_cancel_stops_sending_and_keeps_what_finished(server: FakeServer, tmp_path: Path) -> None:
    n = 40
    server.latency = 0.1
    async with (
        engine_for(server, tmp_path, max_in_flight=2) as engine,
        serving(tmp_path, engine) as (url, _),
        sdk(url) as client,
    ):
        batch = await submit(client, [chat_line(i) for i in range(n)])
        await server.until(lambda: server.stats.received >= 4)
        cancelling = await client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling"
        assert cancelling.cancelling_at is not None
        done = await finished(client, batch.id)
        output = await lines_of(client, done.output_file_id)
        errors = await lines_of(client, done.error_file_id)
        with pytest.raises(openai.ConflictError):
            await client.batches.cancel(batch.id)
    assert done.status == "cancelled"
    assert done.cancelled_at is not None
    assert server.stats.received < n / 2  # sending stopped: what the engine had taken finished
    assert len(output) == done.request_counts.completed == server.stats.received
    assert all(e["error"]["code"] == "batch_cancelled" and e["response"] is None for e in errors)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"req-{i}" for i in range(n))


async def test_one_client_never_sees_anothers_files_or_batches(server: FakeServer, tmp_path: Path) -> None:
    async with (
        batch_api(server, tmp_path, auth=True) as url,
        sdk(url, "alice") as alice,
        sdk(url, "bob") as bob,
        sdk(url, "carol") as carol,
    ):
        batch = await submit(alice, [chat_line(i) for i in range(3)])
        done = await finished(alice, batch.id)
        assert done.status == "completed"
        file_id = batch.input_file_id
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: bob.files.retrieve(file_id),
            lambda: bob.files.content(file_id),
            lambda: bob.files.delete(file_id),
            lambda: bob.batches.retrieve(batch.id),
            lambda: bob.batches.cancel(batch.id),
            lambda: bob.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"),
        ]
        for attempt in attempts:
            with pytest.raises(openai.NotFoundError):
                await attempt()
        assert [f async for f in bob.files.list()] == []
        assert [b async for b in bob.batches.list()] == []
        assert len([f async for f in alice.files.list()]) == 2
        # carol's budget is $0: her lines are refused for money, not sent
        poor = await finished(carol, (await submit(carol, [chat_line(i) for i in range(2)])).id)
        codes = {e["error"]["code"] for e in await lines_of(carol, poor.error_file_id)}
        deleted = await alice.files.delete(batch.input_file_id)
    assert codes == {"budget_exhausted"}
    assert poor.request_counts.failed == 2
    assert deleted.deleted
    assert server.stats.received == 3


async def test_uploads_and_batches_that_cannot_be_taken_are_400s(server: FakeServer, tmp_path: Path) -> None:
    limits = Limits(max_file_bytes=4096, max_requests=5)
    async with (
        engine_for(server, tmp_path) as engine,
        serving(tmp_path, engine, limits=limits) as (url, _),
        sdk(url) as client,
    ):
        with pytest.raises(openai.BadRequestError) as too_large:
            await client.files.create(file=("in.jsonl", jsonl([chat_line(i) for i in range(40)])), purpose="batch")
        with pytest.raises(openai.BadRequestError):
            await client.files.create(file=("in.jsonl", b"{}\n"), purpose="nonsense")  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as other:  # a purpose the server has no use for
            await client.files.create(file=("notes.jsonl", b"{}\n"), purpose="user_data")
        good = await client.files.create(file=("in.jsonl", jsonl([chat_line(0)])), purpose="batch")
        for kwargs in (
            {"input_file_id": good.id, "endpoint": "/v1/completions"},  # an endpoint sluice does not run
            {"input_file_id": good.id, "endpoint": "/v1/chat/completions", "completion_window": "1h"},
        ):
            with pytest.raises(openai.BadRequestError):
                await client.batches.create(**{"completion_window": "24h", **kwargs})  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError):
            await client.batches.create(
                input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
            )
        # a file whose lines are not requests is taken, and a batch of it fails while validating
        failing = {
            "not JSONL": (b"custom_id,body\nreq-1,hello\n", "invalid_json_line"),
            "not UTF-8": (b'{"custom_id": "\xff"}\n', "invalid_json_line"),
            "a JSON array line": (b"[1, 2]\n", "invalid_json_line"),
            "too many requests": (jsonl([chat_line(i) for i in range(6)]), "too_many_tasks"),
            "empty": (b"\n\n", "empty_file"),
        }
        codes = {}
        for why, (data, _) in failing.items():
            upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
            batch = await client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = await finished(client, batch.id)
            assert done.status == "failed", why
            codes[why] = {e.code for e in done.errors.data}
        files = [f.id async for f in client.files.list()]
    assert "4,096 bytes" in str(too_large.value)
    assert "takes files of purpose 'batch'" in str(other.value)
    assert {why: code in codes[why] for why, (_, code) in failing.items()} == dict.fromkeys(failing, True)
    assert good.id in files
    assert not [p for p in (tmp_path / "files").iterdir() if p.name.startswith(".upload")]
    assert server.stats.received == 0


# -- restarts ------------------------------------------------------------------------------------


async def test_a_batch_survives_a_graceful_restart_and_nothing_is_sent_twice(
    server: FakeServer, tmp_path: Path
) -> None:
    n = 30
    server.latency = 0.05
    records = [chat_line(i) for i in range(n)]
    # the engine keeps no store of its own here: only the batch's records can prevent resends
    async with batch_api(server, tmp_path, store=False, max_in_flight=3) as url, sdk(url) as client:
        batch = await submit(client, records)
        await server.until(lambda: server.stats.received >= 6)
    stopped_at = server.stats.received
    assert stopped_at < n
    async with batch_api(server, tmp_path, store=False, max_in_flight=3) as url, sdk(url) as client:
        done = await finished(client, batch.id)
        output = await lines_of(client, done.output_file_id)
    assert done.status == "completed"
    assert done.request_counts.completed == n
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(n))
    assert server.stats.received == n
    assert server.stats.duplicate_successes == 0


async def test_a_batch_resumed_at_startup_runs_under_its_clients_budget(server: FakeServer, tmp_path: Path) -> None:
    n = 20
    server.latency = 0.05
    async with (
        batch_api(server, tmp_path, auth=True, store=False, max_in_flight=2) as url,
        sdk(url, "dave") as dave,
    ):
        batch = await submit(dave, [chat_line(i) for i in range(n)])
        await server.until(lambda: server.stats.received >= 4)
    answered = server.stats.received
    broke = Caller("dave", Budget(0.0, name="dave's budget"))  # dave's budget ran out meanwhile
    async with (
        batch_api(server, tmp_path, auth=True, store=False, client_named={"dave": broke}.get) as url,
        sdk(url, "dave") as dave,
    ):
        done = await finished(dave, batch.id)
        codes = {e["error"]["code"] for e in await lines_of(dave, done.error_file_id)}
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (answered, n - answered)
    assert codes == {"budget_exhausted"}
    assert server.stats.received == answered


_CONFIG = """
[[deployment]]
model = "openai/gpt-4o-mini"
base_url = "{url}"
api_key_env = "SLUICE_TEST_FAKE_KEY"
max_in_flight = {in_flight}
price = {{ input_per_mtok = 0.15, output_per_mtok = 0.60 }}
"""


@contextlib.asynccontextmanager
async def sluice_serve(config: Path, state: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``sluice serve`` in its own process: (the process, the base URL for the SDK)."""
    env = {**os.environ, "SLUICE_TEST_FAKE_KEY": "sk-test"}
    args = ["-m", "sluice", "serve", "--config", str(config), "--port", "0", "--state", str(state)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        ready = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "listening on" in ready, ready
        yield process, ready.split("(base_url ")[1].split(")")[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def test_a_batch_survives_kill_9_of_sluice_serve_and_pays_at_most_the_in_flight_twice(
    server: FakeServer, tmp_path: Path
) -> None:
    n, in_flight = 40, 4
    server.latency = 0.05
    config = tmp_path / "sluice.toml"
    config.write_text(_CONFIG.format(url=server.url, in_flight=in_flight))
    state = tmp_path / "state"
    async with sluice_serve(config, state) as (process, url), sdk(url) as client:
        batch = await submit(client, [chat_line(i) for i in range(n)])
        await server.until(lambda: server.stats.received >= 12)
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL
    killed_at = server.stats.received
    assert killed_at < n
    async with sluice_serve(config, state) as (_, url), sdk(url) as client:
        done = await finished(client, batch.id)
        output = await lines_of(client, done.output_file_id)
    assert done.status == "completed"
    assert done.request_counts.completed == n
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(n))
    assert server.stats.received <= n + in_flight
    assert server.stats.duplicate_successes <= in_flight
