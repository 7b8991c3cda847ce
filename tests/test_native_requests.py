"""Requests written for other APIs, in the library: ``sluice.shapes.native_request`` and
``Request.native``, on the engine against the fake (an Anthropic deployment is sent the
Messages body as written, a chat deployment its translation, a Responses deployment the
Responses body)."""

from __future__ import annotations

from typing import Any

import pytest

from sluice import Deployment, Engine, InvalidRequestError, Native, Request, request_key
from sluice.shapes import native_request
from sluice.testing import FakeServer

MESSAGES_BODY: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 40,
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": "hello there"}],
}


def engine(fake: FakeServer) -> Engine:
    return Engine(
        [
            Deployment("anthropic/claude-test", base_url=fake.anthropic_url, api_key=fake.api_key or "sk-test"),
            Deployment("chat-test", base_url=fake.url, api_key=fake.api_key or "sk-test"),
            Deployment("openai/gpt-test", base_url=fake.url, api_key=fake.api_key or "sk-test"),
        ]
    )


@pytest.mark.parametrize(
    ("model", "path"),
    [("anthropic/claude-test", "/v1/messages"), ("chat-test", "/v1/chat/completions")],
)
async def test_a_messages_body_goes_as_written_or_translated(server: FakeServer, model: str, path: str) -> None:
    async with engine(server) as eng:
        result = await eng.complete(native_request(MESSAGES_BODY, "anthropic", model=model))
    assert result.ok, result.error
    assert result.text == "echo: hello there"
    assert server.stats.by_path == {path: 1}


async def test_a_responses_body_goes_as_written_to_a_responses_deployment(server: FakeServer) -> None:
    body = {"model": "gpt-test", "input": "hello there", "instructions": "be brief"}
    async with engine(server) as eng:
        plain = await eng.complete(native_request(body, "responses", model="openai/gpt-test"))
        translated = await eng.complete(native_request(body, "responses", model="anthropic/claude-test"))
    assert plain.text == translated.text == "echo: hello there"
    assert plain.raw is not None
    assert plain.raw["object"] == "response"
    assert server.stats.by_path == {"/v1/responses": 1, "/v1/messages": 1}


async def test_a_native_stream(server: FakeServer) -> None:
    async with (
        engine(server) as eng,
        eng.stream(native_request(MESSAGES_BODY, "anthropic", model="anthropic/claude-test")) as stream,
    ):
        text = "".join([piece async for piece in stream])
    assert text == "echo: hello there"
    assert server.stats.by_path == {"/v1/messages": 1}


async def test_what_the_translation_lost_is_refused_before_sending(server: FakeServer) -> None:
    body = {**MESSAGES_BODY, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    request = native_request(body, "anthropic", model="chat-test")
    assert request.native is not None
    assert request.native.lost
    async with engine(server) as eng:
        result = await eng.complete(request)
    assert isinstance(result.error, InvalidRequestError)
    assert "web_search" in result.error.message
    assert server.stats.received == 0


def test_a_body_its_api_would_refuse_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        native_request({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "anthropic")
    with pytest.raises(InvalidRequestError, match="input"):
        native_request({"model": "m"}, "responses")
    with pytest.raises(InvalidRequestError, match="api"):
        native_request(MESSAGES_BODY, "gemini")


def test_the_native_body_is_part_of_the_requests_key() -> None:
    """Two bodies with one translation (they differ in what a chat model is not told) are
    two requests: the store never answers one with the other's answer."""
    cached = native_request(MESSAGES_BODY, "anthropic")
    plain = native_request({**MESSAGES_BODY, "system": "be brief"}, "anthropic")
    assert cached.messages == plain.messages
    assert request_key(cached) != request_key(plain)
    chat = Request(cached.model, cached.messages, max_tokens=cached.max_tokens, params=cached.params)
    assert request_key(chat) != request_key(cached)


def test_native_is_checked() -> None:
    with pytest.raises(InvalidRequestError, match="native api"):
        Native("gemini", {})
    with pytest.raises(InvalidRequestError, match="schema"):
        Request("m", [{"role": "user", "content": "x"}], schema={"type": "object"}, native=Native("responses", {}))
