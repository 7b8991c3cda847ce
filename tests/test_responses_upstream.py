"""OpenAI's Responses API upstream: the fake's ``/v1/responses`` as the official SDK sees it,
and sluice sending a native Responses request to a deployment that speaks it (plain and
streamed), the chat translation to one that does not, limits and retries as for chat."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from fake_provider import deployment_at

from sluice import (
    BadRequestError,
    ConfigError,
    Deployment,
    Engine,
    InvalidRequestError,
    MalformedResponseError,
    Native,
    RateLimitError,
    Request,
    Result,
    RetryPolicy,
    ServerError,
)
from sluice.providers import AzureOpenAIProvider, Finish, HttpTransport, OpenAIProvider, TextDelta, ToolCallDelta
from sluice.providers._responses import ResponsesStreamDecoder, responses_reply
from sluice.providers._sse import SseEvent
from sluice.store import SqliteStore
from sluice.testing import FakeServer, run_in_virtual_time
from sluice.tiers._openai_api import OpenAIBatches

KEY = "sk-test"
SRC = str(Path(__file__).resolve().parents[1] / "src")
FAST = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=10.0)
PROMPT = "tell me about sluices and weirs today"
BODY: dict[str, Any] = {"model": "gpt-test", "instructions": "Be brief.", "input": PROMPT, "max_output_tokens": 64}
#: The same request as Chat Completions says it (what a translation would send).
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
STREAMED = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * 4,  # the answer in FakeServer.stream_pieces pieces
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def fake(**kwargs: Any) -> FakeServer:
    kwargs.setdefault("output_tokens", 20)
    return FakeServer(api_key=KEY, **kwargs)


def sdk(server: FakeServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key=KEY, max_retries=0)


def native(body: dict[str, Any] | None = None, model: str = "openai/gpt-test", **fields: Any) -> Request:
    """A Responses request as a client of sluice serve would hand it on: the body, and its chat translation."""
    body = body or BODY
    return Request(model, CHAT, max_tokens=body.get("max_output_tokens"), native=Native("responses", body), **fields)


# -- the fake, as the official SDK sees it ---------------------------------------------------


async def test_the_sdk_gets_the_chat_formats_answer_and_usage_in_responses_shape() -> None:
    async with fake() as server:
        client = sdk(server)
        chat = await client.chat.completions.create(model="gpt-test", messages=CHAT, max_tokens=64)  # type: ignore[arg-type]
        response = await client.responses.create(model="gpt-test", instructions="Be brief.", input=PROMPT)
        await client.close()
    assert response.status == "completed"
    assert response.output_text == chat.choices[0].message.content == f"echo: {PROMPT}"
    assert response.usage is not None
    assert chat.usage is not None
    # counted as its chat translation is: instructions a system message, the input a user one
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert (response.usage.output_tokens, response.usage.total_tokens) == (20, response.usage.input_tokens + 20)
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.instructions == "Be brief."
    assert server.stats.by_path == {"/v1/chat/completions": 1, "/v1/responses": 1}


async def test_input_items_are_counted_and_the_last_user_message_answered() -> None:
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "what is in the lock?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "lock"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "water, mostly"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Water."}]},
        {"type": "message", "role": "user", "content": "and in the weir?"},
    ]
    async with fake() as server:
        client = sdk(server)
        short = await client.responses.create(model="gpt-test", input=items[-1:])
        whole = await client.responses.create(model="gpt-test", input=items, tools=[TOOL])  # type: ignore[list-item]
        await client.close()
    assert whole.output_text == short.output_text == "echo: and in the weir?"
    assert whole.usage is not None
    assert short.usage is not None
    assert whole.usage.input_tokens > short.usage.input_tokens + 20  # the calls, their outputs and the tools count


async def test_max_output_tokens_cuts_the_answer_to_an_incomplete_response() -> None:
    async with fake(output_tokens=40) as server:
        client = sdk(server)
        response = await client.responses.create(model="gpt-test", input=PROMPT, max_output_tokens=16)
        await client.close()
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == 16
    assert response.output[0].type == "message"
    assert response.output[0].status == "incomplete"


async def test_a_stream_is_openais_event_sequence_numbered_in_order() -> None:
    async with fake() as server:
        client = sdk(server)
        stream = await client.responses.create(model="gpt-test", input=PROMPT, stream=True)
        events = [event async for event in stream]
        await client.close()
    assert [event.type for event in events] == STREAMED
    assert [event.sequence_number for event in events] == list(range(len(STREAMED)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == f"echo: {PROMPT}"
    last = events[-1]
    assert last.type == "response.completed"
    assert last.response.output_text == deltas
    assert last.response.usage is not None
    assert last.response.usage.output_tokens == 20
    created = events[0]
    assert created.type == "response.created"
    assert created.response.status == "in_progress"
    assert created.response.id == last.response.id


async def test_the_sdks_stream_helper_assembles_the_final_response() -> None:
    async with fake(output_tokens=40) as server:
        client = sdk(server)
        async with client.responses.stream(model="gpt-test", input=PROMPT) as stream:
            texts = [event.delta async for event in stream if event.type == "response.output_text.delta"]
            final = await stream.get_final_response()
        cut = await client.responses.create(model="gpt-test", input=PROMPT, stream=True, max_output_tokens=16)
        ended = [event async for event in cut][-1]
        await client.close()
    assert final.output_text == "".join(texts) == f"echo: {PROMPT}"
    assert ended.type == "response.incomplete"
    assert ended.response.incomplete_details is not None
    assert ended.response.incomplete_details.reason == "max_output_tokens"


async def test_a_forced_function_is_called_plain_and_streamed() -> None:
    async with fake() as server:
        client = sdk(server)
        plain = await client.responses.create(model="gpt-test", input=PROMPT, tools=[TOOL], tool_choice="required")  # type: ignore[list-item]
        stream = await client.responses.create(
            model="gpt-test",
            input=PROMPT,
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "lookup"},
            stream=True,
        )
        events = [event async for event in stream]
        await client.close()
    call = plain.output[0]
    assert call.type == "function_call"
    assert call.name == "lookup"
    assert json.loads(call.arguments) == {"echo": f"echo: {PROMPT}"}
    kinds = [event.type for event in events]
    assert "response.content_part.added" not in kinds
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    pieces = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    assert pieces == call.arguments


async def test_text_format_json_schema_is_answered_with_an_instance() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    text: Any = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    async with fake() as server:
        client = sdk(server)
        response = await client.responses.create(model="gpt-test", input=PROMPT, text=text)
        await client.close()
    assert json.loads(response.output_text) == {"name": "text"}
    assert server.structured.asked == 1


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_not_found", "previous_response_id"),
        ({"max_output_tokens": 8}, "integer_below_min_value", "max_output_tokens"),
        ({"input": None}, "missing_required_parameter", "input"),
        ({"input": 5}, "invalid_type", "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
            "invalid_value",
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
            "invalid_value",
            "input[0].content[0].type",
        ),
        ({"input": [{"role": "robot", "content": "x"}]}, "invalid_value", "input[0].role"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "missing_required_parameter", "tools[0].name"),
        ({"extra_body": {"response_format": {"type": "json_object"}}}, "unknown_parameter", "response_format"),
        (
            {"extra_body": {"stream_options": {"include_usage": True}}, "stream": True},
            "unknown_parameter",
            "stream_options.include_usage",
        ),
        (
            {"text": {"format": {"type": "json_schema", "json_schema": {"name": "x"}}}},
            "missing_required_parameter",
            "text.format.name",
        ),
    ],
)
async def test_a_malformed_body_is_a_400_naming_its_param(fields: dict[str, Any], code: str, param: str) -> None:
    fields = {"model": "gpt-test", "input": PROMPT, **fields}
    if fields["input"] is None:
        del fields["input"]
    async with fake() as server:
        client = sdk(server)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(**fields)
        await client.close()
    assert (caught.value.code, caught.value.param) == (code, param)
    assert caught.value.type == "invalid_request_error"
    assert server.stats.accepted == 0


async def test_a_wrong_key_a_rate_limit_and_a_broken_stream_raise_as_the_sdk_raises_them() -> None:
    async with fake(rpm=1, window=60.0) as server:
        client = sdk(server)
        wrong = openai.AsyncOpenAI(base_url=server.url, api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await wrong.responses.create(model="gpt-test", input=PROMPT)
        first = await client.responses.with_raw_response.create(model="gpt-test", input=PROMPT)
        assert first.headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(openai.RateLimitError) as limited:
            await client.responses.create(model="gpt-test", input=PROMPT)
        assert limited.value.response.headers["retry-after"]
        server.reset_limits()
        server.inject("stream_error", after=1)
        stream = await client.responses.create(model="gpt-test", input=PROMPT, stream=True)
        with pytest.raises(openai.APIError, match="server had an error"):
            async for _ in stream:
                pass
        await client.close()
        await wrong.close()


async def test_a_responses_batch_answers_each_line_with_a_response_sluice_reads() -> None:
    lines = [
        {"custom_id": f"l{i}", "method": "POST", "url": "/v1/responses", "body": {**BODY, "input": f"q{i}"}}
        for i in range(2)
    ]
    async with fake() as server:
        client = sdk(server)
        uploaded = await client.files.create(
            file=("in.jsonl", "\n".join(map(json.dumps, lines)).encode()), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
        )
        async with asyncio.timeout(30):
            while batch.status != "completed":
                await asyncio.sleep(0.02)
                batch = await client.batches.retrieve(batch.id)
        assert batch.output_file_id is not None
        output = (await client.files.content(batch.output_file_id)).text.splitlines()
        await client.close()
    provider = OpenAIProvider(HttpTransport())
    deployment = Deployment("openai/gpt-test", base_url=server.url, api_key=KEY)
    answers = {}
    for line in map(json.loads, output):
        body = line["response"]["body"]
        answers[line["custom_id"]] = provider.reply_of(json.dumps(body).encode(), None, None, deployment).text
    assert answers == {"l0": "echo: q0", "l1": "echo: q1"}


async def test_the_fake_in_its_own_process_serves_responses() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "sluice.testing", "--port", "0"]
    process = await asyncio.create_subprocess_exec(*command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 10)).decode().strip()
        base = line.removeprefix("listening on ")
        async with aiohttp.ClientSession() as session, session.post(f"{base}/v1/responses", json=BODY) as got:
            assert got.status == 200
            body = await got.json()
        assert (body["object"], body["status"]) == ("response", "completed")
        assert body["output"][0]["content"][0]["text"] == f"echo: {PROMPT}"
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0, stderr.decode()


# -- sluice sending a native Responses request -------------------------------------------------


async def test_a_native_request_goes_to_v1_responses_as_written() -> None:
    async with fake() as server, Engine(deployment_at(server), retry=FAST) as engine:
        result = await engine.complete(native())
        chat = await engine.complete("openai/gpt-test", CHAT, max_tokens=64)
    assert result.ok, result.error
    assert server.stats.by_path == {"/v1/responses": 1, "/v1/chat/completions": 1}
    assert result.text == chat.text == f"echo: {PROMPT}"
    assert (result.finish_reason, result.usage) == ("stop", chat.usage)  # counted alike by the fake
    assert result.usage.output_tokens == 20
    assert result.raw is not None
    assert (result.raw["object"], result.raw["status"]) == ("response", "completed")
    assert (result.raw["instructions"], result.raw["max_output_tokens"]) == ("Be brief.", 64)  # the body as written
    assert result.request_id == "req_1"


async def test_a_native_request_streams_the_responses_events() -> None:
    async with fake(latency=0.05) as server, Engine(deployment_at(server), retry=FAST) as engine:
        async with engine.stream(native()) as stream:
            deltas = [delta async for delta in stream]
        result = stream.result
    assert result.ok, result.error
    assert server.stats.by_path == {"/v1/responses": 1}
    assert len(deltas) > 1  # in pieces, as they came
    assert "".join(deltas) == result.text == f"echo: {PROMPT}"
    assert (result.finish_reason, result.usage.output_tokens) == ("stop", 20)
    assert result.usage.input_tokens > 0
    assert result.timings.first_token is not None
    assert result.raw is not None
    assert result.raw["object"] == "response"
    assert result.raw["output"][0]["content"][0]["text"] == result.text


async def test_an_incomplete_native_answer_finishes_with_length_plain_and_streamed() -> None:
    body = {**BODY, "max_output_tokens": 16}
    async with fake(output_tokens=40) as server, Engine(deployment_at(server), retry=FAST) as engine:
        plain = await engine.complete(native(body))
        async with engine.stream(native(body, id="streamed")) as stream:
            await stream.collect()
    for result in (plain, stream.result):
        assert result.ok, result.error
        assert (result.finish_reason, result.usage.output_tokens) == ("length", 16)
        assert result.raw is not None
        assert result.raw["status"] == "incomplete"


async def test_a_native_function_call_is_a_tool_call_plain_and_streamed() -> None:
    body = {**BODY, "tools": [TOOL], "tool_choice": "required"}
    async with fake() as server, Engine(deployment_at(server), retry=FAST) as engine:
        plain = await engine.complete(native(body))
        async with engine.stream(native(body, id="streamed")) as stream:
            events = [event async for event in stream.events()]
    assert (plain.ok, plain.finish_reason, plain.text) == (True, "tool_calls", None)
    result = stream.result
    assert (result.ok, result.finish_reason) == (True, "tool_calls")
    calls = stream.tool_calls
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("call_2", "lookup")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"echo": f"echo: {PROMPT}"}
    assert all(isinstance(event, ToolCallDelta) for event in events)


async def test_a_stored_native_answer_replays_its_function_call_as_a_stream(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    request = native({**BODY, "tools": [TOOL], "tool_choice": "required"})
    try:
        async with fake() as server, Engine(deployment_at(server), retry=FAST, store=store) as engine:
            answered = await engine.complete(request)
            async with engine.stream(request) as stream:
                await stream.collect()
        assert stream.result.cached
        assert server.stats.received == 1
        assert answered.raw is not None
        assert stream.tool_calls == [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": answered.raw["output"][0]["arguments"]},
            }
        ]
    finally:
        store.close()


async def test_a_bare_model_on_a_base_url_gets_the_chat_translation() -> None:
    async with fake() as server:
        deployment = Deployment("gpt-test", base_url=server.url, api_key=KEY)
        async with Engine(deployment, retry=FAST) as engine:
            result = await engine.complete(native(model="gpt-test"))
            async with engine.stream(native(model="gpt-test", id="streamed")) as stream:
                await stream.collect()
    assert result.ok
    assert stream.result.ok
    assert server.stats.by_path == {"/v1/chat/completions": 2}
    assert result.text == stream.result.text == f"echo: {PROMPT}"
    assert result.raw is not None
    assert result.raw["object"] == "chat.completion"


@pytest.mark.parametrize(
    ("model", "responses", "path"),
    [
        ("openai/gpt-test", False, "/v1/chat/completions"),
        ("gpt-test", True, "/v1/responses"),
        ("openai/gpt-test", None, "/v1/responses"),
    ],
)
async def test_options_responses_says_whether_a_deployment_speaks_it(
    model: str, responses: bool | None, path: str
) -> None:
    options = {} if responses is None else {"responses": responses}
    async with fake() as server:
        deployment = Deployment(model, base_url=server.url, api_key=KEY, options=options)
        async with Engine(deployment, retry=FAST) as engine:
            result = await engine.complete(native(model=model))
    assert result.ok, result.error
    assert server.stats.by_path == {path: 1}


def test_options_responses_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"options\.responses must be true or false"):
        Deployment("openai/gpt-test", options={"responses": "yes"})


async def test_a_lost_native_request_to_a_chat_only_deployment_is_refused_unsent() -> None:
    body = {**BODY, "reasoning": {"effort": "high", "summary": "auto"}}
    request = Request("gpt-test", CHAT, native=Native("responses", body, lost=("reasoning.summary",)))
    async with fake() as server:
        async with Engine(Deployment("gpt-test", base_url=server.url, api_key=KEY), retry=FAST) as engine:
            result = await engine.complete(request)
            async with engine.stream(request) as stream:
                await stream.collect()
        for refused in (result, stream.result):
            assert isinstance(refused.error, InvalidRequestError)
            assert "does not speak OpenAI's Responses API" in refused.error.message
            assert "reasoning.summary" in refused.error.message
        assert server.stats.received == 0


async def test_a_429_from_v1_responses_is_retried_after_retry_after_and_learned() -> None:
    loop = asyncio.get_running_loop()
    async with fake(rpm=600, window=60.0) as server:
        server.inject("429", times=1, retry_after=0.3)
        async with Engine(deployment_at(server), retry=FAST) as engine:
            began = loop.time()
            result = await engine.complete(native())
            waited = loop.time() - began
            server.inject("429", times=1, retry_after=0.3)
            async with engine.stream(native(id="streamed")) as stream:
                await stream.collect()
        assert result.ok
        assert stream.result.ok
        assert (result.attempts, stream.result.attempts) == (2, 2)
        assert waited >= 0.3
        assert server.stats.by_path == {"/v1/responses": 4}
        assert engine.stats.rate_limited == 2
        # it read the x-ratelimit headers /v1/responses sends, as chat's
        assert engine.limiter("openai/gpt-test").requests_limit == 600  # type: ignore[attr-defined]


async def test_a_stream_error_before_the_first_delta_is_retried() -> None:
    async with fake() as server, Engine(deployment_at(server), retry=FAST) as engine:
        server.inject("stream_error", after=0)
        async with engine.stream(native()) as stream:
            await stream.collect()
    assert stream.result.ok, stream.result.error
    assert stream.result.attempts == 2
    assert stream.result.text == f"echo: {PROMPT}"


def test_within_configured_limits_the_fake_never_says_429_to_native_requests() -> None:
    """In virtual time: a 0.5 s window on the wall clock of a loaded machine put the
    loop's own lag (tens of ms) against its 25 ms margin; the limits are what is tested."""

    async def scenario() -> tuple[FakeServer, Engine, list[Result]]:
        async with FakeServer(rpm=40, tpm=4_000, window=0.5, api_key=KEY) as server:
            deployment = deployment_at(server, rpm=40, tpm=4_000, window=0.5)
            requests = [native({**BODY, "input": f"question {i}"}, id=f"q{i}") for i in range(60)]
            async with Engine(deployment, retry=FAST) as engine:
                return server, engine, await engine.run(requests)

    server, engine, results = run_in_virtual_time(scenario())
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert [r.text for r in results] == [f"echo: question {i}" for i in range(60)]
    assert server.stats.rate_limited == 0
    assert server.stats.by_path == {"/v1/responses": 60}
    assert engine.stats.retries == 0


async def test_a_flex_deployment_asks_for_flex_in_the_native_body() -> None:
    async with fake() as server, Engine(deployment_at(server, tier="flex"), retry=FAST) as engine:
        result = await engine.complete(native())
    assert result.ok, result.error
    assert server.ledger[-1].tier == "flex"
    assert result.raw is not None
    assert result.raw["service_tier"] == "flex"


# -- the provider's pieces ---------------------------------------------------------------------


def test_responses_urls_of_openai_and_azure() -> None:
    request = native()
    openai_deployment = Deployment("openai/gpt-4.1", base_url="https://api.openai.com/v1", api_key=KEY)
    assert OpenAIProvider(HttpTransport()).url_of(request, openai_deployment) == "https://api.openai.com/v1/responses"
    azure = Deployment("azure/my-gpt", base_url="https://me.openai.azure.com/", api_key=KEY)
    provider = AzureOpenAIProvider(HttpTransport())
    assert provider.url_of(request, azure) == "https://me.openai.azure.com/openai/v1/responses"
    assert provider.body_of(request, azure)["model"] == "my-gpt"  # the Azure deployment, in the body
    plain = Request("azure/my-gpt", CHAT)
    assert "/openai/deployments/my-gpt/chat/completions?api-version=" in provider.url_of(plain, azure)


def test_a_stream_of_a_native_request_asks_for_no_chat_stream_options() -> None:
    provider = OpenAIProvider(HttpTransport())
    deployment = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    body = provider.stream_body(native(), deployment)
    assert body == {**BODY, "stream": True}
    assert "stream_options" in provider.stream_body(Request("openai/gpt-test", CHAT), deployment)


def test_a_batch_line_of_a_native_request_is_its_chat_translation() -> None:
    provider = OpenAIProvider(HttpTransport())
    deployment = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    batches = OpenAIBatches(provider, deployment, None)  # type: ignore[arg-type]  # no call is made
    body = batches.body_of(native())
    assert body["messages"] == CHAT
    assert "input" not in body
    lost = Request("openai/gpt-test", CHAT, native=Native("responses", BODY, lost=("reasoning",)))
    with pytest.raises(InvalidRequestError, match="reasoning"):
        batches.body_of(lost)
    # a /v1/responses batch line's result is a Response: read as one
    response = {"object": "response", "status": "completed", "output": [], "usage": {"input_tokens": 3}}
    reply = provider.reply_of(json.dumps(response).encode(), "req_b1", None, deployment)
    assert (reply.text, reply.usage.input_tokens, reply.finish_reason, reply.raw) == ("", 3, "stop", response)


def _response(status: str = "completed", **fields: Any) -> dict[str, Any]:
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}
    refusal = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    second = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]}
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 60},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 12},
    }
    reasoning = {"type": "reasoning", "summary": []}
    return {
        "object": "response",
        "status": status,
        "output": [reasoning, message, refusal, second],
        "usage": usage,
        **fields,
    }


def test_a_response_reads_as_text_usage_and_finish_reason() -> None:
    reply = responses_reply(_response())
    assert (reply.text, reply.finish_reason) == ("ab", "stop")
    assert (reply.usage.input_tokens, reply.usage.cached_input_tokens) == (100, 60)
    assert (reply.usage.output_tokens, reply.usage.reasoning_tokens) == (30, 12)
    for reason, finish in (("max_output_tokens", "length"), ("content_filter", "content_filter")):
        cut = responses_reply(_response("incomplete", incomplete_details={"reason": reason}))
        assert cut.finish_reason == finish
    calls = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    assert responses_reply({**_response(), "output": [calls]}).finish_reason == "tool_calls"
    with pytest.raises(ValueError, match="tokens"):
        responses_reply(_response(usage={"input_tokens": -5}))


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"code": "rate_limit_exceeded", "message": "slow down"}, RateLimitError),
        ({"code": "server_error", "message": "oops"}, ServerError),
        ({"code": "invalid_prompt", "message": "flagged"}, BadRequestError),
    ],
)
def test_a_failed_response_raises_its_error(error: dict[str, Any], kind: type[Exception]) -> None:
    with pytest.raises(kind, match=error["message"]):
        responses_reply(_response("failed", error=error))


def test_a_background_response_is_refused_as_unfinished() -> None:
    with pytest.raises(BadRequestError, match="background"):
        responses_reply(_response("queued"))


def _sse(data: dict[str, Any]) -> SseEvent:
    return SseEvent(str(data["type"]), json.dumps(data))


def test_the_decoder_reads_text_calls_usage_and_ignores_what_it_does_not_know() -> None:
    decoder = ResponsesStreamDecoder("dep", "req_1")
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_9", "name": "f", "arguments": ""}
    completed = _response()
    feed = [
        {"type": "response.created", "response": {"id": "resp_1", "model": "gpt-x", "status": "in_progress"}},
        {"type": "response.reasoning_summary_text.delta", "delta": "thinking"},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "hi"},
        {"type": "response.output_item.added", "output_index": 2, "item": call},
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": '{"a"'},
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": ": 1}"},
        {"type": "response.output_item.done", "output_index": 2, "item": {**call, "arguments": '{"a": 1}'}},
        {"type": "response.web_search_call.searching", "output_index": 3},
        {"type": "response.completed", "response": completed},
    ]
    events = [event for data in feed for event in decoder.feed(_sse(data))]
    assert events[0].id == "resp_1"
    assert events[0].model == "gpt-x"
    assert events[1] == TextDelta("hi")
    assert events[2:5] == [
        ToolCallDelta(0, id="call_9", name="f"),
        ToolCallDelta(0, arguments='{"a"'),
        ToolCallDelta(0, arguments=": 1}"),
    ]
    assert events[-1] == Finish("tool_calls", raw=completed)
    assert decoder.close() == []
    assert decoder.feed(SseEvent("message", "[DONE]")) == []


def test_arguments_given_only_when_the_call_is_done_are_not_lost() -> None:
    decoder = ResponsesStreamDecoder("dep", None)
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": ""}
    decoder.feed(_sse({"type": "response.output_item.added", "output_index": 0, "item": call}))
    done = decoder.feed(
        _sse({"type": "response.output_item.done", "output_index": 0, "item": {**call, "arguments": "{}"}})
    )
    assert done == [ToolCallDelta(0, arguments="{}")]


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (
            {"type": "error", "error": {"type": "too_many_requests", "code": "too_many_requests", "message": "busy"}},
            RateLimitError,
        ),
        ({"type": "error", "code": "server_error", "message": "busy", "param": None}, ServerError),
        (
            {"type": "error", "error": {"type": "invalid_request_error", "code": None, "message": "busy"}},
            BadRequestError,
        ),
        (
            {
                "type": "response.failed",
                "response": {"status": "failed", "error": {"code": "server_error", "message": "busy"}},
            },
            ServerError,
        ),
        (
            {
                "type": "response.failed",
                "response": {"status": "failed", "error": {"code": "rate_limit_exceeded", "message": "busy"}},
            },
            RateLimitError,
        ),
    ],
)
def test_error_events_raise_as_the_same_error_would_as_a_response(data: dict[str, Any], kind: type[Exception]) -> None:
    decoder = ResponsesStreamDecoder("dep", "req_1")
    with pytest.raises(kind, match="dep sent an error mid-stream: busy") as caught:
        decoder.feed(_sse(data))
    assert caught.value.maybe_billed  # type: ignore[attr-defined]
    assert caught.value.request_id == "req_1"  # type: ignore[attr-defined]


def test_a_stream_that_ends_before_its_response_is_malformed() -> None:
    decoder = ResponsesStreamDecoder("dep", None)
    decoder.feed(_sse({"type": "response.output_text.delta", "delta": "hi"}))
    with pytest.raises(MalformedResponseError, match=r"ended before response\.completed"):
        decoder.close()
    with pytest.raises(MalformedResponseError, match="not JSON"):
        decoder.feed(SseEvent("response.output_text.delta", "{broken"))
    with pytest.raises(MalformedResponseError, match="unexpected"):
        decoder.feed(_sse({"type": "response.function_call_arguments.delta", "output_index": 7, "delta": "x"}))
