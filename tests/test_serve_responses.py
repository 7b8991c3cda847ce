"""``sluice serve`` speaking OpenAI's Responses API: the official openai SDK as the client
over loopback, in front of a deployment that speaks Responses (forwarded as it is), a
Chat-only one and an Anthropic one (both translated), the fake provider behind them."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import servetools
from servetools import ALICE_KEY, BOB_KEY, PRICE, UPSTREAM_KEY, fake, plain_server, serving

from sluice import Deployment, RetryPolicy
from sluice.cli._config import JobConfig
from sluice.serve._app import build_app
from sluice.serve.core._settings import ClientSpec, ServeSettings
from sluice.serve.responses._db import RESPONSES_DB, ResponsesDB

_OPENED: list[openai.AsyncOpenAI] = []


def sdk(url: str, key: str) -> openai.AsyncOpenAI:
    """The official client (closed after the test, with its connections)."""
    client = servetools.sdk(url, key)
    _OPENED.append(client)
    return client


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _OPENED:
        await _OPENED.pop().close()


CLIENTS = (ClientSpec("alice", key_env="ALICE_KEY"), ClientSpec("bob", key_env="BOB_KEY"))
MODELS = ["gpt-test", "chat-test", "claude-test"]


def deployments(upstream: Any) -> list[Deployment]:
    """``openai/gpt-test`` (Responses), ``chat-test`` (an OpenAI-compatible server: chat
    only) and ``anthropic/claude-test``, all at the fake, priced."""
    return [
        Deployment("openai/gpt-test", base_url=upstream.url, api_key=UPSTREAM_KEY, price=PRICE),
        Deployment("chat-test", base_url=upstream.url, api_key=UPSTREAM_KEY, price=PRICE),
        Deployment("anthropic/claude-test", base_url=upstream.anthropic_url, api_key=UPSTREAM_KEY, price=PRICE),
    ]


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Any, str]]:
    async with fake(**settings) as upstream, serving(deployments(upstream), tmp_path, clients=CLIENTS) as url:
        yield upstream, url


@pytest.mark.parametrize("model", MODELS)
async def test_responses_create(tmp_path: Path, model: str) -> None:
    async with proxy(tmp_path) as (upstream, url):
        response = await sdk(url, ALICE_KEY).responses.create(
            model=model, input="Say hello to the proxy", instructions="be brief", max_output_tokens=50
        )
        assert response.object == "response"
        assert response.status == "completed"
        assert response.output_text == "echo: Say hello to the proxy"
        assert response.usage is not None
        billed = upstream.ledger[-1]
        assert response.usage.input_tokens == billed.input_tokens
        assert response.usage.output_tokens == billed.output_tokens
        assert response.id.startswith("resp_")


@pytest.mark.parametrize("model", MODELS)
async def test_responses_stream(tmp_path: Path, model: str) -> None:
    async with proxy(tmp_path) as (_, url):
        client = sdk(url, ALICE_KEY)
        pieces: list[str] = []
        async with client.responses.stream(model=model, input="Say hello to the proxy") as stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    pieces.append(event.delta)
            final = await stream.get_final_response()
        assert "".join(pieces) == "echo: Say hello to the proxy" == final.output_text
        assert final.status == "completed"
        assert final.usage is not None
        assert final.usage.output_tokens > 0
        stored = await client.responses.retrieve(final.id)
        assert stored.output_text == final.output_text


async def test_the_responses_deployment_is_sent_a_responses_request(tmp_path: Path) -> None:
    async with proxy(tmp_path) as (upstream, url):
        client = sdk(url, ALICE_KEY)
        await client.responses.create(model="gpt-test", input="one")
        await client.responses.create(model="chat-test", input="two")
        assert upstream.stats.by_path["/v1/responses"] == 1
        assert upstream.stats.by_path["/v1/chat/completions"] == 1


@pytest.mark.parametrize("model", MODELS)
async def test_previous_response_id_continues_the_conversation(tmp_path: Path, model: str) -> None:
    async with proxy(tmp_path) as (upstream, url):
        client = sdk(url, ALICE_KEY)
        first = await client.responses.create(model=model, input="My name is Ada.")
        first_bill = upstream.ledger[-1]
        second = await client.responses.create(model=model, input="What is my name?", previous_response_id=first.id)
        assert second.output_text == "echo: What is my name?"
        assert second.previous_response_id == first.id
        # the whole first turn went upstream again: sluice keeps the conversation, not the upstream
        assert upstream.ledger[-1].input_tokens > first_bill.input_tokens + first_bill.output_tokens
        items = await client.responses.input_items.list(second.id)
        assert [item.type for item in items.data] == ["message"]


async def test_a_conversation_moves_between_deployments(tmp_path: Path) -> None:
    async with proxy(tmp_path) as (_, url):
        client = sdk(url, ALICE_KEY)
        turn = await client.responses.create(model="claude-test", input="first")
        for model in ("gpt-test", "chat-test", "claude-test"):
            turn = await client.responses.create(model=model, input=f"on {model}", previous_response_id=turn.id)
            assert turn.output_text == f"echo: on {model}"


async def test_store_false_is_honoured_and_clients_see_only_their_own(tmp_path: Path) -> None:
    async with proxy(tmp_path) as (_, url):
        alice, bob = sdk(url, ALICE_KEY), sdk(url, BOB_KEY)
        kept = await alice.responses.create(model="gpt-test", input="keep me")
        gone = await alice.responses.create(model="gpt-test", input="forget me", store=False)
        assert (await alice.responses.retrieve(kept.id)).id == kept.id
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(gone.id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve(kept.id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.create(model="gpt-test", input="steal", previous_response_id=kept.id)
        await alice.responses.delete(kept.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(kept.id)


async def test_stored_responses_survive_a_restart(tmp_path: Path) -> None:
    async with fake() as upstream:
        async with serving(deployments(upstream), tmp_path, clients=CLIENTS) as url:
            first = await sdk(url, ALICE_KEY).responses.create(model="chat-test", input="remember")
        async with serving(deployments(upstream), tmp_path, clients=CLIENTS) as url:
            client = sdk(url, ALICE_KEY)
            assert (await client.responses.retrieve(first.id)).output_text == "echo: remember"
            again = await client.responses.create(model="chat-test", input="later", previous_response_id=first.id)
            assert again.output_text == "echo: later"


async def test_function_calls_and_their_outputs_through_a_chat_deployment(tmp_path: Path) -> None:
    """A function_call item and its function_call_output reach a chat deployment as a tool
    call and a tool message (the fake refuses a tool message that answers no call)."""
    async with proxy(tmp_path) as (upstream, url):
        tools: Any = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
        items: Any = [
            {"role": "user", "content": "weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ]
        response = await sdk(url, ALICE_KEY).responses.create(model="chat-test", input=items, tools=tools)
        assert response.status == "completed"
        assert upstream.stats.received == 1


async def test_what_a_chat_deployment_cannot_be_told_is_refused_naming_it(tmp_path: Path) -> None:
    async with proxy(tmp_path) as (upstream, url):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk(url, ALICE_KEY).responses.create(
                model="chat-test", input="search", tools=[{"type": "web_search"}]
            )
        assert "web_search" in str(caught.value)
        assert upstream.stats.received == 0


async def test_errors_are_openais(tmp_path: Path) -> None:
    async with proxy(tmp_path) as (upstream, url):
        with pytest.raises(openai.AuthenticationError):
            await sdk(url, "sk-wrong-0123456789abc").responses.create(model="gpt-test", input="x")
        with pytest.raises(openai.NotFoundError):
            await sdk(url, ALICE_KEY).responses.create(model="gpt-nope", input="x")
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk(url, ALICE_KEY).responses.create(model="gpt-test", input="x", previous_response_id="resp_nope")
        assert caught.value.code == "previous_response_not_found"
        async with aiohttp.ClientSession() as http:
            headers = {"authorization": f"Bearer {ALICE_KEY}"}
            async with http.post(f"{url}/v1/responses", json={"model": "gpt-test"}, headers=headers) as response:
                assert response.status == 400
                assert "input" in (await response.json())["error"]["message"]
        assert upstream.stats.received == 0


async def test_a_text_format_json_schema_reaches_a_chat_deployment(tmp_path: Path) -> None:
    """text.format becomes response_format: the fake answers JSON when asked for it."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    async with proxy(tmp_path) as (_, url):
        response = await sdk(url, ALICE_KEY).responses.create(
            model="chat-test",
            input="answer in JSON",
            text={"format": {"type": "json_schema", "name": "reply", "schema": schema, "strict": True}},
        )
        assert response.text.format.type == "json_schema"  # echoed as the client asked
        assert response.output_text.lstrip().startswith("{")


class Recorder:
    """A chat upstream that keeps the bodies it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.bodies.append(await request.json())
        return aiohttp.web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )


async def test_a_chat_deployment_is_sent_the_conversation_in_order(tmp_path: Path) -> None:
    recorder = Recorder()
    app = aiohttp.web.Application()
    app.router.add_post("/v1/chat/completions", recorder.handle)
    async with plain_server(app) as upstream_url:
        chat = Deployment("chat-real", base_url=f"{upstream_url}/v1", api_key=UPSTREAM_KEY)
        async with serving([chat], tmp_path, clients=CLIENTS) as url:
            client = sdk(url, ALICE_KEY)
            first = await client.responses.create(model="chat-real", input="one", instructions="rules")
            await client.responses.create(model="chat-real", input="two", previous_response_id=first.id)
    sent = recorder.bodies[1]["messages"]
    assert [(m["role"], m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]) for m in sent][
        -3:
    ] == [("user", "one"), ("assistant", "ok"), ("user", "two")]
    assert "previous_response_id" not in recorder.bodies[1]
    assert "store" not in recorder.bodies[1]


# -- how long, and how much, is kept -----------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def kept(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[str, ResponsesDB, _Clock]]:
    """The server with its stored responses on a clock the test moves."""
    async with fake() as upstream:
        config = JobConfig(tuple(deployments(upstream)), retry=RetryPolicy(max_attempts=1))
        app = build_app(config, ServeSettings(**settings), CLIENTS, tmp_path, environ=servetools.ENV)
        db = app[RESPONSES_DB]
        clock = _Clock()
        db.clock = clock
        async with servetools.listening(app) as url:
            yield url, db, clock


def _rows(db: ResponsesDB, client: str) -> tuple[int, int]:
    with sqlite3.connect(db.path) as plain:
        count, size = plain.execute(
            "SELECT COUNT(*), COALESCE(SUM(length(response) + length(turn)), 0) FROM responses WHERE client = ?",
            (client,),
        ).fetchone()
    return int(count), int(size)


async def test_a_stored_response_expires_after_its_time_to_live(tmp_path: Path) -> None:
    async with kept(tmp_path, responses_ttl_days=30) as (url, db, clock):
        alice = sdk(url, ALICE_KEY)
        first = await alice.responses.create(model="gpt-test", input="remember this")
        clock.now += 29 * 86400
        assert (await alice.responses.retrieve(first.id)).id == first.id  # still kept
        later = await alice.responses.create(model="gpt-test", input="and this", previous_response_id=first.id)
        clock.now += 1 * 86400 + 1  # first is 30 days and a second old; later is a day old
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.input_items.list(first.id)
        with pytest.raises(openai.NotFoundError) as caught:
            await alice.responses.create(model="gpt-test", input="go on", previous_response_id=first.id)
        assert caught.value.code == "previous_response_not_found"
        assert (await alice.responses.retrieve(later.id)).id == later.id
        assert _rows(db, "alice")[0] == 2  # not yet swept: not found all the same
        await alice.responses.create(model="gpt-test", input="a write sweeps")
        assert _rows(db, "alice")[0] == 2  # the expired one is gone from the file


async def test_a_clients_stored_responses_stay_within_its_cap(tmp_path: Path) -> None:
    """30 responses of ~2 KB against a 16 KB cap: alice's oldest go, her newest stay, her
    total stays under the cap, and bob's are not touched; one larger than the cap alone is
    not kept, and pushes nothing out."""
    cap_mb = 16 / 1024
    async with kept(tmp_path, responses_mb_per_client=cap_mb) as (url, db, clock):
        alice, bob = sdk(url, ALICE_KEY), sdk(url, BOB_KEY)
        bobs = await bob.responses.create(model="gpt-test", input="bob's own")
        ids = []
        for i in range(30):
            clock.now += 1
            made = await alice.responses.create(model="gpt-test", input=f"{i:03d} " + "x" * 900)
            ids.append(made.id)
        count, size = _rows(db, "alice")
        huge = await alice.responses.create(model="gpt-test", input="y" * 20_000)
        after_huge = _rows(db, "alice")
        assert (await alice.responses.retrieve(ids[-1])).id == ids[-1]
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(ids[0])
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(huge.id)
        assert (await bob.responses.retrieve(bobs.id)).id == bobs.id
    assert 3 <= count < 30
    assert size <= 16 * 1024
    assert after_huge == (count, size)


def test_a_responses_file_made_before_the_cap_is_read_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "responses.db"
    with sqlite3.connect(path) as old:  # the table as it was made before sizes were kept
        old.execute(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, client TEXT NOT NULL, previous TEXT, "
            "created_at REAL NOT NULL, response TEXT NOT NULL, turn TEXT NOT NULL)"
        )
        old.execute(
            "INSERT INTO responses VALUES ('resp_old', 'alice', NULL, ?, ?, ?)",
            (time.time(), json.dumps({"id": "resp_old", "output": []}), json.dumps({"input": [], "output": []})),
        )
    db = ResponsesDB(path, max_bytes=200)
    try:
        assert db.response("alice", "resp_old") == {"id": "resp_old", "output": []}
        assert db.put("alice", {"id": "resp_new", "output": [], "pad": "z" * 100}, [], [], None)
        assert db.response("alice", "resp_old") is None  # counted: it made room for the new one
        assert db.response("alice", "resp_new") is not None
    finally:
        db.close()
