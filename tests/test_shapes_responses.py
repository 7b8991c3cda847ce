"""OpenAI's Responses API served from Chat Completions answers: the body read and refused as
OpenAI reads it, the answer and the stream as OpenAI writes them, checked by the official
SDK's own models and read by the SDK itself from a loopback server."""

from __future__ import annotations

import contextlib
import copy
import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp.web
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from sluice import Usage
from sluice.providers._events import TextDelta, ToolCallDelta
from sluice.shapes._common import ChatView, ShapeError
from sluice.shapes.responses._api import (
    ResponsesEvents,
    chat_from_responses,
    conversation_items,
    new_id,
    response_from_chat,
)

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def chat(**body: Any) -> ChatView:
    body.setdefault("model", "gpt-test")
    return chat_from_responses(body)


def refused(body: Any, history: Any = ()) -> ShapeError:
    with pytest.raises(ShapeError) as caught:
        chat_from_responses(body, history)
    return caught.value


# -- the body, translated -------------------------------------------------------------------------


def test_a_string_input_is_a_user_message_after_the_instructions_as_system() -> None:
    view = chat(input="Hi there", instructions="Be brief.", max_output_tokens=64, temperature=0.2, top_p=0.9)
    assert view.lost == ()
    assert view.body == {
        "model": "gpt-test",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        "max_tokens": 64,
        "temperature": 0.2,
        "top_p": 0.9,
    }


def test_message_items_keep_their_roles_developer_as_system_and_their_parts() -> None:
    view = chat(
        input=[
            {"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Sys."}]},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"},
                    {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
                ],
            },
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "It is ", "annotations": [], "logprobs": []},
                    {"type": "output_text", "text": "a cat.", "annotations": []},
                ],
            },
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I won't say more."}]},
        ]
    )
    assert view.lost == ()
    assert view.body["messages"] == [
        {"role": "system", "content": "Answer in French."},
        {"role": "system", "content": "Sys."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"}},
                {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
            ],
        },
        {"role": "assistant", "content": "It is a cat."},
        {"role": "assistant", "content": "I won't say more."},
    ]


def test_consecutive_function_calls_are_one_assistant_message_with_its_text_and_outputs_follow() -> None:
    view = chat(
        input=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "get_weather", "arguments": "{}"},
            {"role": "user", "content": "(take your time)"},  # Responses lets items come between
            {"type": "function_call_output", "call_id": "call_b", "output": "rain"},
            {"type": "function_call_output", "call_id": "call_a", "output": [{"type": "input_text", "text": "sun"}]},
        ],
        tools=[WEATHER],
    )
    assert view.lost == ()
    assert view.body["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
        {"role": "tool", "tool_call_id": "call_a", "content": "sun"},
        {"role": "user", "content": "(take your time)"},
    ]


def test_a_call_made_after_outputs_is_a_new_assistant_message() -> None:
    view = chat(
        input=[
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
        ]
    )
    roles = [(m["role"], [c["id"] for c in m.get("tool_calls", ())]) for m in view.body["messages"]]
    assert roles == [("user", []), ("assistant", ["c1"]), ("tool", []), ("assistant", ["c2"]), ("tool", [])]


def test_function_tools_and_tool_choice_in_chat_words() -> None:
    strict = {**WEATHER, "name": "strict_one", "strict": True}
    view = chat(input="hi", tools=[WEATHER, strict], tool_choice={"type": "function", "name": "strict_one"})
    assert view.body["tools"] == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}},
        {
            "type": "function",
            "function": {**{k: v for k, v in WEATHER.items() if k != "type"}, "name": "strict_one", "strict": True},
        },
    ]
    assert "strict" not in view.body["tools"][0]["function"]  # Responses' "try strict" is chat's best effort
    assert view.body["tool_choice"] == {"type": "function", "function": {"name": "strict_one"}}
    assert chat(input="hi", tools=[WEATHER], tool_choice="required").body["tool_choice"] == "required"
    allowed = chat(
        input="hi",
        tools=[WEATHER],
        parallel_tool_calls=False,
        tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]},
    ).body
    assert allowed["tool_choice"] == {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "get_weather"}}]},
    }
    assert allowed["parallel_tool_calls"] is False


def test_tool_choice_and_parallel_tool_calls_go_only_with_tools() -> None:
    body = chat(input="hi", tool_choice="auto", parallel_tool_calls=True).body
    assert "tool_choice" not in body
    assert "parallel_tool_calls" not in body
    assert "tools" not in body


def test_text_format_is_response_format() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    body = chat(
        input="hi",
        text={"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}, "verbosity": "low"},
    ).body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    assert body["verbosity"] == "low"
    assert chat(input="Answer in JSON", text={"format": {"type": "json_object"}}).body["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in chat(input="hi", text={"format": {"type": "text"}}).body


def test_the_rest_of_the_settings_go_where_chat_has_them() -> None:
    body = chat(
        input="hi",
        reasoning={"effort": "high", "summary": "auto"},
        safety_identifier="user-123",
        service_tier="flex",
        prompt_cache_key="k1",
        store=False,
        metadata={"a": "b"},
        truncation="auto",
        previous_response_id="resp_x",
        include=["reasoning.encrypted_content"],
        prompt_cache_retention="24h",
        background=False,
        max_tool_calls=3,
        top_logprobs=4,
    ).body
    assert body == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
        "reasoning_effort": "high",
        "user": "user-123",
        "service_tier": "flex",
        "prompt_cache_key": "k1",
    }
    assert chat(input="hi", user="u", safety_identifier="s").body["user"] == "u"


def test_logprobs_included_are_asked_for_and_stream_asks_for_usage() -> None:
    body = chat(input="hi", include=["message.output_text.logprobs"], top_logprobs=3).body
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)
    streamed = chat(input="hi", stream=True, stream_options={"include_obfuscation": False})
    assert streamed.body["stream"] is True
    assert streamed.body["stream_options"] == {"include_usage": True}
    assert streamed.lost == ()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]: the web_search tool"),
        ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "https://x"}]}, "tools[0]: the mcp tool"),
        ({"tools": [{"type": "custom", "name": "grammar"}]}, "tools[0]: the custom tool"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "code_interpreter"),
        ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading"),
        ({"tool_choice": {"type": "file_search"}, "tools": [{"type": "file_search"}]}, "tool_choice: the file_search"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}, {"role": "user", "content": "x"}]}, "item_reference"),
        ({"input": [{"id": "msg_1"}, {"role": "user", "content": "x"}]}, "input[0]: an item_reference"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}, {"role": "user", "content": "x"}]}, "web_search_call"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "file_id"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x", "detail": "original"}],
                    }
                ]
            },
            "original",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}]}]}, "file_url"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"background": True}, "background"),
        ({"reasoning": {"mode": "pro"}}, "reasoning.mode"),
        ({"stream": True, "include": ["message.output_text.logprobs"]}, "logprobs with stream"),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_image", "image_url": "https://x"}],
                    },
                ]
            },
            "input[1].output[0]: an image in a tool's output",
        ),
    ],
)
def test_what_a_chat_deployment_cannot_be_told_is_lost_in_words(extra: dict[str, Any], words: str) -> None:
    body = {"model": "gpt-test", "input": "hi", **extra}
    view = chat_from_responses(body)
    assert any(words in entry for entry in view.lost), view.lost


# -- refusals -------------------------------------------------------------------------------------


def base(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "input": "hi", **extra}


def fc(call_id: str = "c1") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def out(call_id: str = "c1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


REFUSALS: list[tuple[Any, str | None, str, str]] = [
    # (body, param, code, words in the message)
    ([], None, "invalid_type", "must be a JSON object"),
    ({"input": "hi"}, "model", "missing_required_parameter", "Missing required parameter: 'model'."),
    (base(model=""), "model", "empty_string", "empty string"),
    (
        base(model=5),
        "model",
        "invalid_type",
        "Invalid type for 'model': expected a string, but got an integer instead.",
    ),
    ({"model": "m"}, "input", "missing_required_parameter", "'input'"),
    (base(input=[]), "input", "empty_array", "empty array"),
    (base(input={"role": "user"}), "input", "invalid_type", "expected one of a string or array of input items"),
    (base(temperature="hot"), "temperature", "invalid_type", "expected a decimal, but got a string"),
    (base(temperature=2.5), "temperature", "decimal_above_max_value", "Expected a value <= 2, but got 2.5 instead."),
    (base(temperature=-1), "temperature", "decimal_below_min_value", ">= 0"),
    (base(temperature=math.nan), "temperature", "invalid_value", "finite"),
    (base(temperature=math.inf), "temperature", "invalid_value", "finite"),
    (base(temperature=True), "temperature", "invalid_type", "boolean"),
    (base(top_p=1.5), "top_p", "decimal_above_max_value", "<= 1"),
    (base(max_output_tokens=15), "max_output_tokens", "integer_below_min_value", "Expected a value >= 16, but got 15"),
    (base(max_output_tokens=16.5), "max_output_tokens", "invalid_type", "expected an integer, but got a decimal"),
    (base(max_output_tokens="9"), "max_output_tokens", "invalid_type", "an integer"),
    (base(top_logprobs=21), "top_logprobs", "integer_above_max_value", "<= 20"),
    (base(max_output_tokens=2**64), "max_output_tokens", "integer_above_max_value", "9223372036854775807"),
    (
        base(input=[{"role": "user", "content": [{"type": -(2**70)}]}]),
        "input[0].content[0]",
        "invalid_value",
        "1180591620717411303424",
    ),
    (base(metadata={str(i): "v" for i in range(17)}), "metadata", "object_above_max_properties", "at most 16"),
    (base(metadata={"k": "v" * 513}), "metadata.k", "string_above_max_length", "maximum length 512"),
    (base(metadata={"k": 1}), "metadata.k", "invalid_type", "expected a string"),
    (base(metadata={"k" * 65: "v"}), "metadata", "string_above_max_length", "64"),
    (base(metadata=["a"]), "metadata", "invalid_type", "an object"),
    (base(safety_identifier="s" * 129), "safety_identifier", "string_above_max_length", "128"),
    (base(truncation="sometimes"), "truncation", "invalid_value", "Supported values are: 'auto' and 'disabled'."),
    (base(service_tier="turbo"), "service_tier", "invalid_value", "'flex'"),
    (base(include=["everything"]), "include[0]", "invalid_value", "message.output_text.logprobs"),
    (base(include="reasoning.encrypted_content"), "include", "invalid_type", "an array"),
    (base(reasoning={"effort": "extreme"}), "reasoning.effort", "invalid_value", "'minimal'"),
    (base(reasoning="high"), "reasoning", "invalid_type", "an object"),
    (base(store="yes"), "store", "invalid_type", "a boolean"),
    (base(stream="yes"), "stream", "invalid_type", "a boolean"),
    (base(stream_options={}), "stream_options", "invalid_value", "only allowed when 'stream' is true"),
    (base(instructions=["be nice"]), "instructions", "invalid_type", "a string"),
    (
        base(previous_response_id="resp_1", conversation="conv_1"),
        "conversation",
        "invalid_value",
        "previous_response_id",
    ),
    (base(text={"format": {"type": "yaml"}}), "text.format.type", "invalid_value", "'json_schema'"),
    (
        base(text={"format": {"type": "json_schema", "schema": {}}}),
        "text.format.name",
        "missing_required_parameter",
        "",
    ),
    (
        base(text={"format": {"type": "json_schema", "name": "a b", "schema": {}}}),
        "text.format.name",
        "invalid_value",
        "pattern",
    ),
    (
        base(text={"format": {"type": "json_schema", "name": "a"}}),
        "text.format.schema",
        "missing_required_parameter",
        "",
    ),
    (base(text={"format": {"type": "json_object"}}), "input", "invalid_value", "must contain the word 'json'"),
    (base(text={"verbosity": "loud"}), "text.verbosity", "invalid_value", "'low'"),
    (base(tools={"type": "function"}), "tools", "invalid_type", "an array"),
    (base(tools=[{"name": "f"}]), "tools[0].type", "missing_required_parameter", ""),
    (base(tools=[{"type": "spreadsheet"}]), "tools[0].type", "invalid_value", "'function'"),
    (base(tools=[{"type": "function"}]), "tools[0].name", "missing_required_parameter", ""),
    (base(tools=[{"type": "function", "name": "get weather"}]), "tools[0].name", "invalid_value", "^[a-zA-Z0-9_-]+$"),
    (base(tools=[{"type": "function", "name": "f" * 65}]), "tools[0].name", "string_above_max_length", "64"),
    (base(tools=[{"type": "function", "name": "f", "parameters": "{}"}]), "tools[0].parameters", "invalid_type", ""),
    (base(tools=[WEATHER], tool_choice="sometimes"), "tool_choice", "invalid_value", "'required'"),
    (
        base(tools=[WEATHER], tool_choice={"type": "function", "name": "nope"}),
        "tool_choice.name",
        "invalid_value",
        "nope",
    ),
    (base(tool_choice="required"), "tool_choice", "invalid_value", "only allowed when 'tools' are specified"),
    (base(tool_choice={"type": "teleport"}), "tool_choice.type", "invalid_value", "'allowed_tools'"),
    (base(input=[{"type": "telepathy"}]), "input[0]", "invalid_value", "Invalid value: 'telepathy'."),
    (base(input=[{"content": "hi"}]), "input[0].type", "missing_required_parameter", ""),
    (base(input=[{"type": "message", "content": "hi"}]), "input[0].role", "missing_required_parameter", ""),
    (base(input=[{"role": "tool", "content": "hi"}]), "input[0].role", "invalid_value", "'developer'"),
    (base(input=[{"role": "user"}]), "input[0].content", "missing_required_parameter", ""),
    (base(input=[{"role": "user", "content": 7}]), "input[0].content", "invalid_type", "an integer"),
    (base(input=[{"role": "user", "content": []}]), "input[0].content", "empty_array", ""),
    (base(input=["hi"]), "input[0]", "invalid_type", "an object"),
    (
        base(input=[{"role": "user", "content": [{"type": "input_video"}]}]),
        "input[0].content[0]",
        "invalid_value",
        "",
    ),
    (
        base(input=[{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]),
        "input[0].content[0]",
        "invalid_value",
        "'input_text'",
    ),
    (
        base(input=[{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]),
        "input[0].content[0]",
        "invalid_value",
        "Invalid value: 'input_text'. Supported values are: 'output_text' and 'refusal'.",  # OpenAI's own words
    ),
    (
        base(input=[{"role": "user", "content": [{"type": "input_text"}]}]),
        "input[0].content[0].text",
        "missing_required_parameter",
        "",
    ),
    (
        base(input=[{"role": "user", "content": [{"type": "input_image"}]}]),
        "input[0].content[0].image_url",
        "missing_required_parameter",
        "",
    ),
    (
        base(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "u", "detail": "max"}]}]),
        "input[0].content[0].detail",
        "invalid_value",
        "",
    ),
    (
        base(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
        "input[0].call_id",
        "missing_required_parameter",
        "",
    ),
    (base(input=[{**fc(), "arguments": {"a": 1}}, out()]), "input[0].arguments", "invalid_type", "a string"),
    (
        base(input=[out()]),
        "input[0].call_id",
        "invalid_value",
        "No tool call found for function call output with call_id c1.",
    ),
    (base(input=[fc(), fc(), out()]), "input[1].call_id", "invalid_value", "already used by input[0]"),
    (base(input=[fc(), out(), out()]), "input[2].call_id", "invalid_value", "already has an output"),
    (base(input=[fc()]), "input", "invalid_value", "No tool output found for function call c1."),
    (
        base(input=[fc(), {"type": "function_call_output", "call_id": "c1"}]),
        "input[1].output",
        "missing_required_parameter",
        "",
    ),
    (base(input=[{"type": "reasoning", "summary": "x"}]), "input[0].summary", "invalid_type", "an array"),
    (base(input="\ud800 hi"), "input", "invalid_value", "lone surrogate"),
    (
        base(input=[{"role": "user", "content": [{"type": "input_text", "text": "ok \udfff"}]}]),
        "input[0].content[0].text",
        "invalid_value",
        "lone surrogate",
    ),
    (base(metadata={"\ud83d": "v"}), "metadata.\\ud83d", "invalid_value", "lone surrogate"),
]


@pytest.mark.parametrize(("body", "param", "code", "words"), REFUSALS)
def test_what_openai_refuses_is_refused_naming_the_field(body: Any, param: str | None, code: str, words: str) -> None:
    error = refused(body)
    assert (error.param, error.code) == (param, code), error.message
    assert words in error.message
    error.message.encode("utf-8")  # a message that can be sent, whatever the body held


def test_a_missing_output_for_a_stored_call_is_refused_on_the_next_request() -> None:
    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}, fc("c9")]
    error = refused(base(input="and now?"), history)
    assert error.message == "No tool output found for function call c9."
    assert refused(base(), "not items").param == "history"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
FIELDS = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "temperature",
    "reasoning",
    "include",
    "metadata",
]
ITEM_KEYS = ["type", "role", "content", "call_id", "name", "arguments", "output", "id", "summary"]
items = st.dictionaries(
    st.sampled_from(ITEM_KEYS), json_values | st.sampled_from(["message", "function_call", "user", "c1"])
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), json_values, max_size=6),
    input_items=st.lists(items, max_size=4),
    history=st.lists(items, max_size=2),
)
def test_a_malformed_body_raises_nothing_but_a_shape_error(
    body: dict[str, Any], input_items: list[Any], history: list[Any]
) -> None:
    for candidate in (body, {**body, "model": "m", "input": input_items}):
        try:
            view = chat_from_responses(candidate, history)
        except ShapeError as exc:
            exc.message.encode("utf-8")  # a str, that can be sent
        else:
            assert view.body["messages"]
            json.dumps(view.body, allow_nan=False)


RICH = {
    "model": "gpt-test",
    "instructions": "Be brief.",
    "input": [
        {"role": "developer", "content": "Answer in JSON."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look:"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"},
                {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"},
                {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "mp3"}},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Ok.", "annotations": []}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "sun"}]},
    ],
    "tools": [{**WEATHER, "strict": False, "allowed_callers": ["direct"]}],
    "tool_choice": {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_weather"}],
    },
    "text": {
        "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True},
        "verbosity": "high",
    },
    "reasoning": {"effort": "low", "summary": "concise", "mode": "standard"},
    "include": ["message.output_text.logprobs"],
    "metadata": {"k": "v"},
    "temperature": 0.5,
    "top_p": 0.5,
    "max_output_tokens": 100,
    "top_logprobs": 2,
    "stream": False,
}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if path else []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found.extend(_paths(child, (*path, key)))
    return found


PATHS = _paths(RICH)


def test_the_rich_body_is_valid_and_loses_nothing() -> None:
    view = chat_from_responses(RICH)
    assert view.lost == ()
    assert view.body["tool_choice"]["type"] == "allowed_tools"


@settings(max_examples=400, deadline=None)
@given(path=st.sampled_from(PATHS), value=json_values | st.just("\ud800") | st.just(math.nan), delete=st.booleans())
def test_any_field_of_a_rich_body_broken_raises_nothing_but_a_shape_error(
    path: tuple[Any, ...], value: Any, delete: bool
) -> None:
    body = copy.deepcopy(RICH)
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    error: ShapeError | None = None
    try:
        view = chat_from_responses(body)
    except ShapeError as exc:
        error = exc
    else:
        json.dumps(view.body, allow_nan=False).encode("utf-8")
    if error is not None:
        error.message.encode("utf-8")
        assert error.param is None or isinstance(error.param, str)


# -- any valid body: no error, and every word the user wrote is kept ------------------------------

words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    texts: list[str] = []
    input_items: list[dict[str, Any]] = []
    for n in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["user", "parts", "assistant", "developer", "call"]))
        text = draw(words)
        texts.append(text)
        if kind == "user":
            input_items.append({"role": "user", "content": text})
        elif kind == "parts":
            more = draw(words)
            texts.append(more)
            parts = [{"type": "input_text", "text": text}, {"type": "input_text", "text": more}]
            if draw(st.booleans()):
                parts.append({"type": "input_image", "image_url": "https://example.com/x.png", "detail": "auto"})
            input_items.append({"type": "message", "role": "user", "content": parts})
        elif kind == "assistant":
            input_items.append(
                {"role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}
            )
        elif kind == "developer":
            input_items.append({"role": draw(st.sampled_from(["developer", "system"])), "content": text})
        else:
            call_id = f"call_{n}"
            input_items.append({"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": "{}"})
            input_items.append({"type": "function_call_output", "call_id": call_id, "output": text})
    body: dict[str, Any] = {"model": draw(words), "input": input_items}
    if draw(st.booleans()):
        body["instructions"] = draw(words)
        texts.append(body["instructions"])
    optional = {
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "max_output_tokens": st.integers(16, 10**6),
        "tools": st.just([WEATHER]),
        "parallel_tool_calls": st.booleans(),
        "store": st.booleans(),
        "stream": st.booleans(),
        "metadata": st.dictionaries(st.text(max_size=64), st.text(max_size=512), max_size=16),
        "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["low", "medium", "high"])}),
        "truncation": st.sampled_from(["auto", "disabled"]),
        "user": words,
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            body[name] = draw(strategy)
    return body, texts


def _all_text(messages: list[dict[str, Any]]) -> str:
    found = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            found.append(content)
        for part in content if isinstance(content, list) else ():
            found.append(part.get("text", ""))
    return "\x00".join(found)


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_any_valid_body_translates_and_keeps_all_its_text(case: tuple[dict[str, Any], list[str]]) -> None:
    body, texts = case
    view = chat_from_responses(body)
    assert view.lost == ()
    everything = _all_text(view.body["messages"])
    for text in texts:
        assert text in everything
    assert view.body["model"] == body["model"]
    json.dumps(view.body, allow_nan=False)


# -- the answer -----------------------------------------------------------------------------------


def completion(
    content: str | None = "Hello!", calls: Sequence[tuple[str, str, str]] = (), finish: str = "stop", **message: Any
) -> dict[str, Any]:
    tool_calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-test-2025",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    **({"tool_calls": tool_calls} if calls else {}),
                    **message,
                },
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 100},
            "completion_tokens_details": {"reasoning_tokens": 7},
        },
    }
    return body


def answer(comp: dict[str, Any], request: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    request = request or base()
    return response_from_chat(comp, response_id="resp_abc", request=request, created_at=1700000001, **kwargs)


def test_a_text_answer_is_a_response_the_sdk_reads() -> None:
    body = answer(completion())
    response = Response.model_validate(body)
    assert (response.id, response.object, response.status, response.error) == (
        "resp_abc",
        "response",
        "completed",
        None,
    )
    assert response.output_text == "Hello!"
    assert "output_text" not in body
    [message] = body["output"]
    assert message["type"] == "message"
    assert message["id"].startswith("msg_")
    assert message["content"] == [{"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}]
    assert body["usage"] == {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 0},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 7},
        "total_tokens": 150,
    }
    assert body["model"] == "gpt-test-2025"
    assert body["completed_at"] is not None


def test_tool_calls_are_function_call_items_after_the_text() -> None:
    comp = completion(
        "Let me look.", [("call_1", "get_weather", '{"city":"Paris"}'), ("call_2", "get_weather", "{}")], "tool_calls"
    )
    body = answer(comp, base(tools=[WEATHER]))
    response = Response.model_validate(body)
    kinds = [item.type for item in response.output]
    assert kinds == ["message", "function_call", "function_call"]
    calls = body["output"][1:]
    assert [(c["call_id"], c["name"], c["arguments"], c["status"]) for c in calls] == [
        ("call_1", "get_weather", '{"city":"Paris"}', "completed"),
        ("call_2", "get_weather", "{}", "completed"),
    ]
    assert all(c["id"].startswith("fc_") for c in calls)
    only_calls = answer(completion(None, [("call_1", "f", "{}")], "tool_calls"))
    assert [item["type"] for item in only_calls["output"]] == ["function_call"]


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_a_cut_answer_is_incomplete_with_its_reason(finish: str, reason: str) -> None:
    body = answer(completion("Once upon a", finish=finish), base(max_output_tokens=16))
    response = Response.model_validate(body)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == reason
    assert body["output"][-1]["status"] == "incomplete"
    assert body["completed_at"] is None
    assert body["max_output_tokens"] == 16


def test_a_refusal_is_a_refusal_part() -> None:
    body = answer(completion(None, refusal="I can't help with that."))
    Response.model_validate(body)
    assert body["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]


def test_the_request_is_echoed_as_openai_echoes_it() -> None:
    fmt = {"type": "json_schema", "name": "thing", "schema": {"type": "object"}}
    request = base(
        instructions="Be brief.",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0.3,
        top_p=0.5,
        max_output_tokens=500,
        parallel_tool_calls=False,
        previous_response_id="resp_prev",
        reasoning={"effort": "low", "summary": "auto"},
        text={"format": fmt},
        truncation="auto",
        metadata={"k": "v"},
        store=False,
        user="u1",
        service_tier="flex",
    )
    body = answer(completion(), request)
    response = Response.model_validate(body)
    assert response.instructions == "Be brief."
    assert [(t.type, t.name, t.strict) for t in response.tools] == [("function", "get_weather", False)]
    assert (response.tool_choice, response.temperature, response.top_p, response.max_output_tokens) == (
        "required",
        0.3,
        0.5,
        500,
    )
    assert (response.parallel_tool_calls, response.previous_response_id, response.truncation) == (
        False,
        "resp_prev",
        "auto",
    )
    assert response.reasoning is not None
    assert (response.reasoning.effort, response.reasoning.summary) == ("low", "auto")
    assert body["text"]["format"] == {**fmt, "description": None, "strict": False}
    assert (response.metadata, response.store, response.user, response.service_tier) == (
        {"k": "v"},
        False,
        "u1",
        "flex",
    )
    defaults = answer(completion())
    assert {
        k: defaults[k] for k in ("temperature", "top_p", "tool_choice", "truncation", "store", "metadata", "tools")
    } == {
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "truncation": "disabled",
        "store": True,
        "metadata": {},
        "tools": [],
    }


def test_logprobs_reasoning_and_sluices_own_usage() -> None:
    logprobs = {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.1,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.1, "bytes": None}],
            }
        ]
    }
    comp = completion("Hi", reasoning_content="The user greets me.")
    comp["choices"][0]["logprobs"] = logprobs
    body = answer(comp, usage=Usage(10, 5, 2, 1, 3))
    response = Response.model_validate(body)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "The user greets me."}]
    assert body["output"][1]["content"][0]["logprobs"] == [
        {
            "token": "Hi",
            "bytes": [72, 105],
            "logprob": -0.1,
            "top_logprobs": [{"token": "Hi", "bytes": [], "logprob": -0.1}],
        }
    ]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.input_tokens_details.cache_write_tokens) == (10, 3)


@pytest.mark.parametrize(
    "comp",
    [
        {},
        {"choices": []},
        {"choices": [None]},
        {"choices": [{"message": "x"}]},
        {
            "choices": [{"message": {"tool_calls": [1, {"function": 2}]}}],
            "usage": {"prompt_tokens": "x", "prompt_tokens_details": 3},
        },
    ],
)
def test_a_strange_completion_still_makes_a_valid_response(comp: dict[str, Any]) -> None:
    Response.model_validate(answer(comp))


# -- the stream -----------------------------------------------------------------------------------


def parse(stream: bytes) -> list[dict[str, Any]]:
    """The SSE bytes as events, each checked: its ``event:`` line is its type."""
    events = []
    assert stream.endswith(b"\n\n")
    for block in stream.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        assert lines[0].startswith("event: ")
        assert lines[1].startswith("data: ")
        assert len(lines) == 2
        data = json.loads(lines[1][6:])
        assert data["type"] == lines[0][7:]
        EVENTS.validate_python(data)  # the SDK's own model of that event
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def text_and_two_calls(events: ResponsesEvents) -> bytes:
    return (
        events.start()
        + events.delta(TextDelta("Let me "))
        + events.delta(TextDelta("check."))
        + events.delta(ToolCallDelta(0, "call_p", "get_weather", ""))
        + events.delta(ToolCallDelta(0, None, None, '{"city":'))
        + events.delta(ToolCallDelta(0, None, None, '"Paris"}'))
        + events.delta(ToolCallDelta(1, "call_r", "get_weather", '{"city":"Rome"}'))
        + events.finish("tool_calls", Usage(50, 20, 10, 0))
    )


def test_the_stream_writes_openais_events_in_order_with_consistent_ids() -> None:
    request = base(tools=[WEATHER], stream=True)
    encoder = ResponsesEvents(request, response_id="resp_s", created_at=1700000001)
    events = parse(text_and_two_calls(encoder))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = events[0]["response"]
    assert (created["status"], created["output"], created["id"]) == ("in_progress", [], "resp_s")
    final = events[-1]["response"]
    assert final == encoder.response
    Response.model_validate(final)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [a["id"] for a in added] == [d["id"] for d in done]
    assert (added[1]["arguments"], added[1]["status"]) == ("", "in_progress")
    for event in events:  # every event names its item by the id the final response has at its index
        if "item_id" in event:
            assert event["item_id"] == done[event["output_index"]]["id"]
    assert final["output"][0]["content"][0]["text"] == "Let me check."
    assert [(c["call_id"], c["arguments"]) for c in final["output"][1:]] == [
        ("call_p", '{"city":"Paris"}'),
        ("call_r", '{"city":"Rome"}'),
    ]
    same = response_from_chat(
        completion(
            "Let me check.",
            [("call_p", "get_weather", '{"city":"Paris"}'), ("call_r", "get_weather", '{"city":"Rome"}')],
            "tool_calls",
        ),
        response_id="resp_s",
        request=request,
        created_at=1700000001,
        usage=Usage(50, 20, 10, 0),
        completed_at=final["completed_at"],
    )
    assert _without_ids(final) == _without_ids({**same, "model": "gpt-test"})


def _without_ids(response: dict[str, Any]) -> dict[str, Any]:
    copied = copy.deepcopy(response)
    for item in copied["output"]:
        item.pop("id")
    return copied


def test_a_stream_without_deltas_is_one_empty_message_and_start_is_written_once() -> None:
    encoder = ResponsesEvents(base(), response_id="resp_e", created_at=1)
    first = encoder.start()
    assert encoder.start() == b""
    events = parse(first + encoder.finish("stop", Usage(3, 0)))
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""
    with pytest.raises(RuntimeError):
        encoder.delta(TextDelta("late"))


def test_text_after_a_call_is_a_new_message_and_a_late_fragment_still_counts() -> None:
    encoder = ResponsesEvents(base(), response_id="resp_l", created_at=1)
    stream = (
        encoder.delta(ToolCallDelta(0, "c0", "f", "{"))
        + encoder.delta(TextDelta("between"))
        + encoder.delta(ToolCallDelta(0, None, None, "}"))
        + encoder.delta(TextDelta(""))
        + encoder.finish("stop", None)
    )
    final = parse(stream)[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["function_call", "message"]
    assert final["output"][0]["arguments"] == "{}"
    assert final["usage"] is None


def test_an_incomplete_stream_and_a_failed_one() -> None:
    cut = ResponsesEvents(base(max_output_tokens=16), response_id="resp_i", created_at=1)
    events = parse(cut.delta(TextDelta("Once upon")) + cut.finish("length", Usage(5, 16)))
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"
    assert [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"] == ["incomplete"]
    broken = ResponsesEvents(base(), response_id="resp_f", created_at=1)
    events = parse(broken.delta(TextDelta("Hal")) + broken.failed("upstream_error", "The deployment went away."))
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert {k: events[-2][k] for k in ("code", "message", "param")} == {
        "code": "upstream_error",
        "message": "The deployment went away.",
        "param": None,
    }
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "The deployment went away."}
    assert failed["output"][0]["status"] == "incomplete"
    Response.model_validate(failed)


def test_a_lone_surrogate_in_a_models_text_is_escaped_not_fatal() -> None:
    encoder = ResponsesEvents(base(), response_id="resp_u", created_at=1)
    events = parse(encoder.delta(TextDelta("bad \ud800 text")) + encoder.finish("stop", Usage()))
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "bad \ud800 text"


# -- the official SDK, over HTTP ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serve(handler: Callable[[dict[str, Any]], Any]) -> AsyncIterator[openai.AsyncOpenAI]:
    """An SDK client of a loopback server whose ``POST /v1/responses`` answers ``handler(body)``:
    JSON for a dict, the bytes as an event stream for bytes."""

    async def responses(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        body = await request.json()
        made = handler(body)
        if isinstance(made, bytes):
            response = aiohttp.web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
            await response.prepare(request)
            await response.write(made)
            await response.write_eof()
            return response
        return aiohttp.web.json_response(made)

    app = aiohttp.web.Application()
    app.router.add_post("/v1/responses", responses)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    try:
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        async with openai.AsyncOpenAI(base_url=f"http://{host}:{port}/v1", api_key="x", max_retries=0) as client:
            yield client
    finally:
        await runner.cleanup()


def streamed(write: Callable[[ResponsesEvents], bytes]) -> Callable[[dict[str, Any]], bytes]:
    def handler(body: dict[str, Any]) -> bytes:
        chat_from_responses(body)  # what the SDK sent is a body sluice takes
        return write(ResponsesEvents(body, response_id=new_id("resp"), created_at=1700000001))

    return handler


async def test_the_sdk_reads_a_streamed_answer_with_text_and_two_calls() -> None:
    async with serve(streamed(text_and_two_calls)) as client:
        stream = await client.responses.create(
            model="gpt-test", input="Weather in Paris and Rome?", tools=[WEATHER], stream=True
        )
        events = [event async for event in stream]
    assert events[-1].type == "response.completed"
    final = events[-1].response
    assert final.output_text == "Let me check."
    assert [(i.type, getattr(i, "call_id", None)) for i in final.output] == [
        ("message", None),
        ("function_call", "call_p"),
        ("function_call", "call_r"),
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Let me check."
    assert final.usage is not None
    assert final.usage.input_tokens_details.cached_tokens == 10


async def test_the_sdks_stream_helper_gets_the_final_response() -> None:
    async with (
        serve(streamed(text_and_two_calls)) as client,
        client.responses.stream(model="gpt-test", input="Weather?", tools=[WEATHER]) as stream,
    ):
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == "Let me check."
    assert final.output_text == "Let me check."
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city":"Paris"}'),
        ("get_weather", '{"city":"Rome"}'),
    ]
    assert final.status == "completed"


async def test_the_sdk_reads_an_incomplete_stream_and_a_failed_one() -> None:
    def cut(encoder: ResponsesEvents) -> bytes:
        return encoder.delta(TextDelta("Once upon a")) + encoder.finish("length", Usage(5, 16))

    async with serve(streamed(cut)) as client:
        stream = await client.responses.create(model="gpt-test", input="A story", max_output_tokens=16, stream=True)
        events = [event async for event in stream]
        async with client.responses.stream(model="gpt-test", input="A story") as helper:
            helped = [event async for event in helper]
            with pytest.raises(
                RuntimeError
            ):  # the SDK's helper holds only response.completed as final, from OpenAI too
                await helper.get_final_response()
    assert helped[-1].type == "response.incomplete"
    assert helped[-1].response.output_text == "Once upon a"
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == "Once upon a"

    def broken(encoder: ResponsesEvents) -> bytes:
        return encoder.delta(TextDelta("Hal")) + encoder.failed("server_error", "The deployment went away.")

    async with serve(streamed(broken)) as client:
        stream = await client.responses.create(model="gpt-test", input="Hi", stream=True)
        events = [event async for event in stream]
        async with client.responses.stream(model="gpt-test", input="Hi") as helper:
            helped = [event async for event in helper]
    assert [e.type for e in helped[-2:]] == ["error", "response.failed"]
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].message == "The deployment went away."
    assert events[-1].response.error.code == "server_error"


async def test_the_sdk_reads_a_plain_answer() -> None:
    def handler(body: dict[str, Any]) -> dict[str, Any]:
        view = chat_from_responses(body)
        assert view.body["messages"] == [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Hello"},
        ]
        return response_from_chat(completion(), response_id=new_id("resp"), request=body, created_at=1700000001)

    async with serve(handler) as client:
        response = await client.responses.create(
            model="gpt-test", input="Hello", instructions="Be kind.", temperature=0.5
        )
    assert response.output_text == "Hello!"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (120, 30, 150)
    assert response.usage.output_tokens_details.reasoning_tokens == 7
    assert response.temperature == 0.5


# -- previous_response_id: a call answered in the next request ------------------------------------


async def test_a_function_call_answered_in_the_next_request_continues_the_conversation() -> None:
    stored: dict[str, list[dict[str, Any]]] = {}
    seen: list[list[dict[str, Any]]] = []

    def model(messages: list[dict[str, Any]]) -> dict[str, Any]:
        """A deployment: asks for the weather, then says what the tool said."""
        seen.append(messages)
        if messages[-1]["role"] == "tool":
            return completion(f"It is {messages[-1]['content']} in Paris.")
        if messages[-1]["content"] == "Thanks!":
            return completion("You're welcome.")
        return completion(None, [("call_w1", "get_weather", '{"city":"Paris"}')], "tool_calls")

    def handler(body: dict[str, Any]) -> Any:
        previous = body.get("previous_response_id")
        history = stored[previous] if previous else []
        view = chat_from_responses(body, history)
        response_id = new_id("resp")
        reply = model(view.body["messages"])
        if body.get("stream"):
            choice = reply["choices"][0]
            encoder = ResponsesEvents(body, response_id=response_id, created_at=1700000001)
            stream = encoder.delta(TextDelta(choice["message"]["content"])) + encoder.finish(
                choice["finish_reason"], Usage(9, 4)
            )
            assert encoder.response is not None
            stored[response_id] = conversation_items(body, encoder.response, history)
            return stream
        response = response_from_chat(reply, response_id=response_id, request=body, created_at=1700000001)
        stored[response_id] = conversation_items(body, response, history)
        return response

    async with serve(handler) as client:
        first = await client.responses.create(
            model="gpt-test", input="Weather in Paris?", tools=[WEATHER], instructions="Use tools."
        )
        [call] = [item for item in first.output if item.type == "function_call"]
        assert (call.name, call.call_id) == ("get_weather", "call_w1")
        second = await client.responses.create(
            model="gpt-test",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=[WEATHER],
        )
        assert second.output_text == "It is sunny in Paris."
        third = await client.responses.create(
            model="gpt-test", previous_response_id=second.id, input="Thanks!", stream=True
        )
        events = [event async for event in third]
    assert events[-1].type == "response.completed"
    assert seen[0] == [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}]
    assert seen[1] == [  # the instructions are not carried over, as OpenAI does not carry them
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_w1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_w1", "content": "sunny"},
    ]
    assert seen[2][3:] == [
        {"role": "assistant", "content": "It is sunny in Paris."},
        {"role": "user", "content": "Thanks!"},
    ]
    last = next(iter(reversed(stored.values())))
    assert [item["type"] for item in last] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
        "message",
    ]


def test_an_unknown_parameter_is_lost_not_refused() -> None:
    """Newer than sluice (or a typo): a Responses deployment is sent it and judges it; a
    chat deployment refuses the request naming it."""
    view = chat_from_responses(base(modle="x"))
    assert any("modle" in reason for reason in view.lost)
    assert "modle" not in view.body
