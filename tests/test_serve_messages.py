"""``sluice serve`` speaking Anthropic's Messages API: the official anthropic SDK as the
client, over loopback, in front of an OpenAI-compatible deployment (translated) and an
Anthropic deployment (passed through), the fake provider behind both."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from servetools import ALICE_KEY, PRICE, UPSTREAM_KEY, deployment, fake, plain_server, serving

from sluice import Deployment
from sluice.serve.core._settings import ClientSpec

ALICE = ClientSpec("alice", key_env="ALICE_KEY")
HELLO = [{"role": "user", "content": "Say hello to the proxy"}]


def claude(upstream: Any, **kwargs: Any) -> Deployment:
    """``anthropic/claude-test`` at the fake's Messages endpoint, priced."""
    kwargs.setdefault("price", PRICE)
    return Deployment("anthropic/claude-test", base_url=upstream.anthropic_url, api_key=UPSTREAM_KEY, **kwargs)


_OPENED: list[anthropic.AsyncAnthropic] = []


def sdk(url: str, key: str | None = ALICE_KEY, **kwargs: Any) -> anthropic.AsyncAnthropic:
    """The official client (closed after the test, with its connections)."""
    kwargs.setdefault("max_retries", 0)
    client = anthropic.AsyncAnthropic(base_url=url, api_key=key, **kwargs)
    _OPENED.append(client)
    return client


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _OPENED:
        await _OPENED.pop().close()


@contextlib.asynccontextmanager
async def both(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Any, str]]:
    """The fake upstream, and the proxy serving ``gpt-test`` (chat) and ``claude-test``."""
    async with fake(**settings) as upstream:
        deployments = [deployment(upstream), claude(upstream)]
        async with serving(deployments, tmp_path, clients=(ALICE,)) as url:
            yield upstream, url


@pytest.mark.parametrize("model", ["gpt-test", "claude-test"])
async def test_messages_create_through_the_proxy(tmp_path: Path, model: str) -> None:
    async with both(tmp_path) as (upstream, url):
        client = sdk(url)
        message = await client.messages.create(model=model, max_tokens=50, messages=HELLO, system="be brief")
        assert message.type == "message"
        assert message.role == "assistant"
        assert message.content[0].type == "text"
        assert message.content[0].text == "echo: Say hello to the proxy"
        assert message.stop_reason == "end_turn"
        assert message.usage.input_tokens > 0
        assert message.usage.output_tokens > 0
        assert upstream.stats.received == 1


@pytest.mark.parametrize("model", ["gpt-test", "claude-test"])
async def test_messages_stream_through_the_proxy(tmp_path: Path, model: str) -> None:
    async with both(tmp_path) as (_, url):
        client = sdk(url)
        pieces: list[str] = []
        async with client.messages.stream(model=model, max_tokens=50, messages=HELLO) as stream:
            async for text in stream.text_stream:
                pieces.append(text)
            final = await stream.get_final_message()
        assert "".join(pieces) == "echo: Say hello to the proxy"
        assert final.content[0].type == "text"
        assert final.content[0].text == "".join(pieces)
        assert final.stop_reason == "end_turn"
        assert final.usage.output_tokens > 0
        assert final.usage.input_tokens > 0


@pytest.mark.parametrize("model", ["gpt-test", "claude-test"])
async def test_usage_and_cost_are_the_upstreams(tmp_path: Path, model: str) -> None:
    """The tokens the client is told are the ones the upstream billed."""
    async with both(tmp_path) as (upstream, url):
        message = await sdk(url).messages.create(model=model, max_tokens=50, messages=HELLO)
        billed = upstream.ledger[-1]
        assert message.usage.input_tokens == billed.input_tokens
        assert message.usage.output_tokens == billed.output_tokens


@pytest.mark.parametrize("model", ["gpt-test", "claude-test"])
async def test_count_tokens(tmp_path: Path, model: str) -> None:
    async with both(tmp_path) as (upstream, url):
        counted = await sdk(url).messages.count_tokens(model=model, messages=HELLO)
        assert counted.input_tokens > 0
        if model == "claude-test":  # the provider's own count: what the message is billed
            await sdk(url).messages.create(model=model, max_tokens=50, messages=HELLO)
            assert counted.input_tokens == upstream.ledger[-1].input_tokens


async def test_a_wrong_key_is_an_anthropic_401(tmp_path: Path) -> None:
    async with both(tmp_path) as (upstream, url):
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await sdk(url, key="sk-wrong-0123456789").messages.create(model="gpt-test", max_tokens=5, messages=HELLO)
        assert caught.value.status_code == 401
        assert caught.value.body["type"] == "error"
        assert caught.value.body["error"]["type"] == "authentication_error"
        assert upstream.stats.received == 0


async def test_the_key_may_come_as_a_bearer_token(tmp_path: Path) -> None:
    async with both(tmp_path) as (_, url):
        client = sdk(url, key=None, auth_token=ALICE_KEY)
        message = await client.messages.create(model="claude-test", max_tokens=20, messages=HELLO)
        assert message.content[0].text.startswith("echo:")


async def test_an_unknown_model_is_an_anthropic_404(tmp_path: Path) -> None:
    async with both(tmp_path) as (_, url):
        with pytest.raises(anthropic.NotFoundError) as caught:
            await sdk(url).messages.create(model="claude-nope", max_tokens=5, messages=HELLO)
        assert caught.value.body["error"]["type"] == "not_found_error"


async def test_a_malformed_body_is_an_anthropic_400_naming_the_field(tmp_path: Path) -> None:
    async with both(tmp_path) as (upstream, url), aiohttp.ClientSession() as http:
        headers = {"x-api-key": ALICE_KEY, "anthropic-version": "2023-06-01"}
        for body, field in (
            ({"model": "gpt-test", "messages": HELLO}, "max_tokens"),
            ({"model": "gpt-test", "max_tokens": 5, "messages": "hi"}, "messages"),
            ({"model": "gpt-test", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "role"),
        ):
            async with http.post(f"{url}/v1/messages", json=body, headers=headers) as response:
                assert response.status == 400
                payload = await response.json()
                assert payload["type"] == "error"
                assert payload["error"]["type"] == "invalid_request_error"
                assert field in payload["error"]["message"]
        async with http.post(f"{url}/v1/messages", data=b"{not json", headers=headers) as response:
            assert response.status == 400
            assert (await response.json())["type"] == "error"
        assert upstream.stats.received == 0


async def test_models_are_listed_as_anthropic_lists_them(tmp_path: Path) -> None:
    async with both(tmp_path) as (_, url):
        page = await sdk(url).models.list()
        ids = {model.id for model in page.data}
        assert {"claude-test", "gpt-test"} <= ids
        assert all(model.type == "model" for model in page.data)
        one = await sdk(url).models.retrieve("claude-test")
        assert one.id == "claude-test"


async def test_an_upstream_429_becomes_rate_limit_error_with_retry_after(tmp_path: Path) -> None:
    async with fake(rpm=1, window=30) as upstream:
        deployments = [claude(upstream, rpm=1, window=30)]
        async with serving(deployments, tmp_path, clients=(ALICE,), max_wait_s=0.5) as url:
            client = sdk(url)
            await client.messages.create(model="claude-test", max_tokens=5, messages=HELLO)
            with pytest.raises(anthropic.RateLimitError) as caught:
                await client.messages.create(
                    model="claude-test", max_tokens=5, messages=[{"role": "user", "content": "again"}]
                )
            assert caught.value.body["error"]["type"] == "rate_limit_error"
            assert int(caught.value.response.headers["retry-after"]) >= 1
            assert upstream.stats.received == 1  # refused by sluice: the upstream never saw it


async def test_a_spent_budget_is_a_billing_error(tmp_path: Path) -> None:
    async with fake() as upstream:
        spender = ClientSpec("alice", key_env="ALICE_KEY", budget_usd=1e-9)
        async with serving([claude(upstream)], tmp_path, clients=(spender,)) as url:
            client = sdk(url)
            with contextlib.suppress(anthropic.APIStatusError):
                await client.messages.create(model="claude-test", max_tokens=5, messages=HELLO)
            with pytest.raises(anthropic.APIStatusError) as caught:
                await client.messages.create(model="claude-test", max_tokens=5, messages=HELLO)
            assert caught.value.status_code == 402
            assert caught.value.body["error"]["type"] == "billing_error"


# -- what passes through, what is translated, what is refused ---------------------------------------


class Recorder:
    """An Anthropic upstream that keeps the bodies it was sent and answers one message."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.bodies.append(await request.json())
        return aiohttp.web.json_response(
            {
                "id": "msg_recorded",
                "type": "message",
                "role": "assistant",
                "model": "claude-recorded",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "done"},
                ],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": 2},
            }
        )


async def test_an_anthropic_deployment_is_sent_the_body_as_the_client_wrote_it(tmp_path: Path) -> None:
    recorder = Recorder()
    app = aiohttp.web.Application()
    app.router.add_post("/v1/messages", recorder.handle)
    async with plain_server(app) as upstream_url:
        claude_there = Deployment("anthropic/claude-real", base_url=upstream_url, api_key=UPSTREAM_KEY)
        async with serving([claude_there], tmp_path, clients=(ALICE,)) as url:
            body: dict[str, Any] = {
                "model": "claude-real",
                "max_tokens": 2048,
                "system": [{"type": "text", "text": "long context", "cache_control": {"type": "ephemeral"}}],
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "look it up", "cache_control": {"type": "ephemeral"}},
                        ],
                    }
                ],
            }
            message = await sdk(url).messages.create(**body)
    sent = recorder.bodies[0]
    assert sent == {**body, "model": "claude-real"}  # nothing lost, nothing added
    assert [block.type for block in message.content] == ["thinking", "text"]  # the upstream's own body
    assert message.usage.cache_read_input_tokens == 2


async def test_what_a_chat_deployment_cannot_be_told_is_refused_naming_it(tmp_path: Path) -> None:
    async with both(tmp_path) as (upstream, url):
        with pytest.raises(anthropic.BadRequestError) as caught:
            await sdk(url).messages.create(
                model="gpt-test",
                max_tokens=50,
                messages=HELLO,
                tools=[{"type": "web_search_20250305", "name": "web_search"}],
            )
        assert "web_search" in caught.value.body["error"]["message"]
        assert upstream.stats.received == 0


async def test_tool_use_round_trip_through_a_chat_deployment(tmp_path: Path) -> None:
    """An assistant tool_use and the user's tool_result reach a chat deployment as a tool
    call and a tool message (the fake refuses a tool message that answers no call)."""
    async with both(tmp_path) as (upstream, url):
        tools = [{"name": "weather", "description": "the weather", "input_schema": {"type": "object"}}]
        conversation = [
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        ]
        message = await sdk(url).messages.create(model="gpt-test", max_tokens=50, tools=tools, messages=conversation)
        assert message.content[0].type == "text"
        assert upstream.stats.received == 1


async def test_an_error_mid_stream_is_an_anthropic_error_event(tmp_path: Path) -> None:
    """The upstream's stream breaks after its first piece (text already sent on): the
    client reads that text, then Anthropic's ``error`` event, which the SDK raises."""
    async with fake() as upstream, serving([claude(upstream)], tmp_path, clients=(ALICE,)) as url:
        upstream.inject("stream_cut", times=5)
        pieces: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as caught:
            await _read_all(sdk(url), pieces)
        assert pieces  # the error came after text, as an event, not as a status
        assert "echo: Say hello to the proxy".startswith("".join(pieces))
        assert caught.value.body["type"] == "error"


async def _read_all(client: anthropic.AsyncAnthropic, pieces: list[str]) -> None:
    async with client.messages.stream(model="claude-test", max_tokens=50, messages=HELLO) as stream:
        async for text in stream.text_stream:
            pieces.append(text)


async def test_concurrent_anthropic_and_openai_clients_share_one_limit(tmp_path: Path) -> None:
    """One rpm for both APIs' clients: together they meet no upstream 429."""
    async with fake(rpm=12, window=1.0) as upstream:
        async with serving([claude(upstream, rpm=12, window=1.0)], tmp_path, clients=(ALICE,)) as url:
            client = sdk(url)
            replies = await asyncio.gather(
                *(
                    client.messages.create(
                        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": f"q{i}"}]
                    )
                    for i in range(24)
                )
            )
        assert len(replies) == 24
        assert upstream.stats.rate_limited == 0


async def test_the_servers_own_refusals_are_anthropic_shaped(tmp_path: Path) -> None:
    """An unknown route, a wrong method, a body over the cap: Anthropic's shape and type."""
    async with fake() as upstream, serving([claude(upstream)], tmp_path, clients=(ALICE,), max_body_mb=0.01) as url:
        headers = {"x-api-key": ALICE_KEY, "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as http:
            for method, path, data, status, kind in (
                ("POST", "/v1/messages/nope", b"{}", 404, "not_found_error"),
                ("GET", "/v1/messages", None, 405, "invalid_request_error"),
                ("POST", "/v1/messages", b"x" * 20_000, 413, "request_too_large"),
            ):
                async with http.request(method, f"{url}{path}", data=data, headers=headers) as response:
                    assert response.status == status
                    payload = await response.json()
                    assert payload["type"] == "error"
                    assert payload["error"]["type"] == kind


def test_unavailable_is_overloaded_for_an_anthropic_client() -> None:
    """sluice's 503 (it cannot take the request now: Redis down, shutting down) is the 529
    an Anthropic client retries; its Retry-After stays."""
    from sluice.serve.core._errors import openai_error
    from sluice.serve.messages._anthropic import anthropic_shaped

    shaped = anthropic_shaped(openai_error(503, "later", type="server_error", headers={"retry-after": "2"}))
    assert shaped.status == 529
    assert json.loads(shaped.body)["error"]["type"] == "overloaded_error"  # type: ignore[arg-type]
    assert shaped.headers["retry-after"] == "2"
