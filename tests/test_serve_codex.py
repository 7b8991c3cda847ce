"""OpenAI's Codex CLI through ``sluice serve`` to a deployment that does not speak
Responses: its ``client_metadata`` (sent on every request) is dropped like ``metadata``,
and its ``namespace`` tools (groups of its own function tools) are flattened into their
functions, named back in the answer as the client named them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import servetools
from servetools import ALICE_KEY, PRICE, UPSTREAM_KEY, fake, plain_server, serving

from sluice import Deployment
from sluice.serve.core._settings import ClientSpec
from sluice.shapes.responses._api import chat_from_responses, response_from_chat

CLIENTS = (ClientSpec("alice", key_env="ALICE_KEY"),)
LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Find a customer by name.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
}
SHELL = {"type": "function", "name": "shell", "description": "Run a command.", "parameters": {"type": "object"}}
CRM = {"type": "namespace", "name": "crm", "description": "The customer records.", "tools": [LOOKUP]}
#: What Codex adds to every body (not in the SDK's types).
CODEX = {"client_metadata": {"originator": "codex_cli_rs", "session_id": "s-1"}}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[Any, openai.AsyncOpenAI]]:
    async with (
        fake() as upstream,
        serving(
            [Deployment("chat-test", base_url=upstream.url, api_key=UPSTREAM_KEY, price=PRICE)],
            tmp_path,
            clients=CLIENTS,
        ) as url,
    ):
        sdk = servetools.sdk(url, ALICE_KEY)
        yield upstream, sdk
        await sdk.close()


async def test_a_streamed_call_of_a_namespaced_function_is_named_as_the_client_named_it(
    client: tuple[Any, openai.AsyncOpenAI],
) -> None:
    _, sdk = client
    tools: Any = [CRM, SHELL]
    stream = await sdk.responses.create(
        model="chat-test", input="who is Ada?", tools=tools, tool_choice="required", stream=True, extra_body=CODEX
    )
    events = [event async for event in stream]
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert [(item.name, item.namespace) for item in added] == [("lookup", "crm")]
    final = events[-1]
    assert final.type == "response.completed"
    calls = [item for item in final.response.output if item.type == "function_call"]
    assert [(c.name, c.namespace) for c in calls] == [("lookup", "crm")]


class Recorder:
    """A chat upstream that keeps the bodies it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        self.bodies.append(body)
        message: dict[str, Any] = {"role": "assistant", "content": "ok"}
        if body.get("tool_choice") == "required":  # a call of the first tool, as the fake's streams make
            name = body["tools"][0]["function"]["name"]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": name, "arguments": "{}"}}],
            }
        return aiohttp.web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )


async def test_codex_bodies_reach_a_chat_deployment_flat_and_calls_come_back_in_their_namespace(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    app = aiohttp.web.Application()
    app.router.add_post("/v1/chat/completions", recorder.handle)
    tools: Any = [CRM, SHELL]
    async with plain_server(app) as upstream_url:
        chat = Deployment("chat-real", base_url=f"{upstream_url}/v1", api_key=UPSTREAM_KEY)
        async with serving([chat], tmp_path, clients=CLIENTS) as url:
            sdk = servetools.sdk(url, ALICE_KEY)
            asked = await sdk.responses.create(
                model="chat-real", input="who is Ada?", tools=tools, tool_choice="required", extra_body=CODEX
            )
            calls = [item for item in asked.output if item.type == "function_call"]
            # the next turn carries the call back as Codex does: its name in its namespace
            items: Any = [
                {"role": "user", "content": "who is Ada?"},
                {"type": "function_call", "call_id": "c1", "name": "lookup", "namespace": "crm", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "Ada Lovelace"},
            ]
            after = await sdk.responses.create(model="chat-real", input=items, tools=tools, extra_body=CODEX)
            await sdk.close()
    assert [(c.name, c.namespace) for c in calls] == [("lookup", "crm")]  # the client's own names
    assert after.status == "completed"
    for sent in recorder.bodies:
        assert "client_metadata" not in sent
        functions = [tool["function"] for tool in sent["tools"]]
        assert [f["name"] for f in functions] == ["crm__lookup", "shell"]
        assert functions[0]["description"] == "The customer records.\n\nFind a customer by name."
        assert functions[0]["parameters"] == LOOKUP["parameters"]
    assert recorder.bodies[1]["messages"][1]["tool_calls"][0]["function"]["name"] == "crm__lookup"


def test_a_long_flattened_name_fits_and_is_named_back() -> None:
    from sluice.shapes.responses._tools import flat_name

    namespace, name = "mcp__" + "n" * 40, "f" * 40
    flat = flat_name(namespace, name)
    assert len(flat) == 64
    assert flat != flat_name(namespace, name[:-1] + "g")
    body: dict[str, Any] = {
        "model": "m",
        "input": "x",
        "tools": [{"type": "namespace", "name": namespace, "description": "d", "tools": [{**LOOKUP, "name": name}]}],
    }
    assert chat_from_responses(body).body["tools"][0]["function"]["name"] == flat
    call = {"id": "c1", "type": "function", "function": {"name": flat, "arguments": "{}"}}
    completion = {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}, "finish_reason": "tool_calls"}]}
    answer = response_from_chat(completion, response_id="resp_1", request=body, created_at=0)
    assert [(item["name"], item["namespace"]) for item in answer["output"]] == [(name, namespace)]


async def test_a_flattened_name_that_is_another_tools_is_refused(client: tuple[Any, openai.AsyncOpenAI]) -> None:
    upstream, sdk = client
    clash: Any = [CRM, {**SHELL, "name": "crm__lookup"}]
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.responses.create(model="chat-test", input="x", tools=clash)
    assert "crm__lookup" in caught.value.message
    assert upstream.stats.received == 0
