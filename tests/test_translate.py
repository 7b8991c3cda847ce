"""OpenAI-shaped requests translated to Anthropic Messages and the replies back: table
tests of the pure functions both ways, every untranslatable field refused before anything
is sent, and round trips over loopback to the fake's strict ``/v1/messages``."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from fake_provider import deployment_at

from sluice import Engine, InvalidRequestError, MalformedResponseError, Request
from sluice.providers._translate import (
    JSON_TOOL_NAME,
    LEADING_USER_TEXT,
    anthropic_body,
    anthropic_reply,
)
from sluice.testing import FakeServer

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    },
}
ANTHROPIC_TOOL = {
    "name": "weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "description": "Weather in a city",
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
USE = {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}}


def body(messages: list[dict[str, Any]], *, default: int = 1024, **fields: Any) -> dict[str, Any]:
    return anthropic_body(Request("anthropic/claude", messages, **fields), model="claude", default_max_tokens=default)


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


# -- messages --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "system", "turns"),
    [
        pytest.param([user("hi")], None, [user("hi")], id="a string stays a string"),
        pytest.param(
            [{"role": "system", "content": "be brief"}, {"role": "developer", "content": "be kind"}, user("hi")],
            "be brief\n\nbe kind",
            [user("hi")],
            id="system and developer messages lifted and joined",
        ),
        pytest.param(
            [{"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, user("hi")],
            "a\n\nb",
            [user("hi")],
            id="system text parts",
        ),
        pytest.param(
            [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "long", "cache_control": {"type": "ephemeral"}}],
                },
                user("hi"),
            ],
            [{"type": "text", "text": "long", "cache_control": {"type": "ephemeral"}}],
            [user("hi")],
            id="a cached system part stays a block",
        ),
        pytest.param(
            [
                user("hi"),
                {"role": "assistant", "content": "yes?"},
                {"role": "system", "content": "now in French"},
                user("go"),
            ],
            "now in French",
            [user("hi"), {"role": "assistant", "content": "yes?"}, user("go")],
            id="a later system message is lifted too",
        ),
        pytest.param(
            [user("one"), user([{"type": "text", "text": "two"}])],
            None,
            [user([{"type": "text", "text": "one"}, {"type": "text", "text": "two"}])],
            id="consecutive user messages merged",
        ),
        pytest.param(
            [user("q"), {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}, user("q2")],
            None,
            [
                user("q"),
                {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                user("q2"),
            ],
            id="consecutive assistant messages merged",
        ),
        pytest.param(
            [{"role": "assistant", "content": "How can I help?"}, user("hi")],
            None,
            [user(LEADING_USER_TEXT), {"role": "assistant", "content": "How can I help?"}, user("hi")],
            id="a leading assistant message gets a user turn before it",
        ),
        pytest.param(
            [user("count"), {"role": "assistant", "content": "1, 2, "}],
            None,
            [user("count"), {"role": "assistant", "content": "1, 2,"}],
            id="a prefill loses its trailing whitespace",
        ),
        pytest.param(
            [user("count"), {"role": "assistant", "content": "  "}],
            None,
            [user("count")],
            id="an empty prefill is dropped",
        ),
        pytest.param(
            [user([{"type": "text", "text": ""}, {"type": "text", "text": "x"}])],
            None,
            [user([{"type": "text", "text": "x"}])],
            id="empty text parts dropped",
        ),
        pytest.param(
            [{"role": "user", "content": "hi", "name": "alice"}],
            None,
            [user("hi")],
            id="a participant name is dropped",
        ),
    ],
)
def test_messages_map_to_turns(messages: list[dict[str, Any]], system: Any, turns: list[dict[str, Any]]) -> None:
    out = body(messages)
    assert out.get("system") == system
    assert out["messages"] == turns


@pytest.mark.parametrize(
    ("part", "block"),
    [
        ({"type": "text", "text": "look"}, {"type": "text", "text": "look"}),
        (
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "high"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
        ),
        (
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ),
        (
            {"type": "image_url", "image_url": "data:IMAGE/JPEG;base64,AAAA"},  # a bare string, any case
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}},
        ),
        (
            {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "a.pdf"}},
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
                "title": "a.pdf",
            },
        ),
        (
            {
                "type": "file",
                "file": {"file_data": "data:text/plain;charset=utf-8;base64," + base64.b64encode(b"notes").decode()},
            },
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
        ),
        (
            {"type": "file", "file": {"file_data": f"data:image/png;base64,{PNG}"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ),
        # already Anthropic: passed through untouched
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lG"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lG"}},
        ),
        (
            {
                "type": "document",
                "source": {"type": "url", "url": "https://example.com/a.pdf"},
                "citations": {"enabled": True},
            },
            {
                "type": "document",
                "source": {"type": "url", "url": "https://example.com/a.pdf"},
                "citations": {"enabled": True},
            },
        ),
    ],
)
def test_user_content_parts_map_to_blocks(part: dict[str, Any], block: dict[str, Any]) -> None:
    assert body([user([part])])["messages"] == [user([block])]


def test_tool_calls_and_results_map_to_tool_use_and_tool_result() -> None:
    out = body(
        [
            user("weather in Oslo and Rome?"),
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [CALL, {**CALL, "id": "call_2", "function": {"name": "weather", "arguments": ""}}],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "sun"}]},
            user("so?"),
        ],
        params={"tools": [TOOL]},
    )
    assert out["messages"] == [
        user("weather in Oslo and Rome?"),
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                USE,
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {}},
            ],
        },
        user(
            [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "sun"}]},
                {"type": "text", "text": "so?"},
            ]
        ),
    ]
    assert out["tools"] == [ANTHROPIC_TOOL]  # strict dropped, parameters -> input_schema


def test_tool_results_open_their_turn_whatever_the_order() -> None:
    messages = [
        user("q"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        user("first this"),
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ]
    kinds = [block["type"] for block in body(messages)["messages"][2]["content"]]
    assert kinds == ["tool_result", "text"]


def test_whitespace_only_text_is_dropped_as_anthropic_refuses_it() -> None:
    """ "text content blocks must contain non-whitespace text" (the API's 400)."""
    messages = [user([{"type": "text", "text": " \n"}, {"type": "text", "text": "hi"}])]
    assert body(messages)["messages"] == [user([{"type": "text", "text": "hi"}])]
    tool = [
        user("q"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "  "},
    ]
    assert body(tool)["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "call_1"}]
    with pytest.raises(InvalidRequestError, match="empty"):
        body([user("   ")])


def test_a_tool_message_may_hold_an_image_as_an_anthropic_tool_result_does() -> None:
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    messages = [
        user("q"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": [image]},
    ]
    (block,) = body(messages)["messages"][2]["content"]
    assert block["content"] == [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]


def test_already_anthropic_messages_pass_through() -> None:
    messages = [
        user([{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]),
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, USE]},
        user([{"type": "tool_result", "tool_use_id": "call_1", "content": "rain", "is_error": False}]),
    ]
    out = body(messages, params={"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any"}, "top_k": 5, "system": "s"})
    assert out["messages"] == messages
    assert (out["tools"], out["tool_choice"], out["top_k"], out["system"]) == (
        [ANTHROPIC_TOOL],
        {"type": "any"},
        5,
        "s",
    )


# -- parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"max_tokens": 777}),
        ({"max_tokens": 50}, {"max_tokens": 50}),
        ({"max_tokens": 50, "params": {"max_tokens": 60}}, {"max_tokens": 60}),
        ({"params": {"max_completion_tokens": 70, "max_tokens": 60}}, {"max_tokens": 70}),
        ({"params": {"stop": "END"}}, {"stop_sequences": ["END"]}),
        ({"params": {"stop": ["a", "b"]}}, {"stop_sequences": ["a", "b"]}),
        ({"params": {"stop": ["a"], "stop_sequences": ["z"]}}, {"stop_sequences": ["z", "a"]}),
        ({"temperature": 0.3}, {"temperature": 0.3}),
        ({"temperature": 1.7}, {"temperature": 1.0}),  # OpenAI's 0..2 clamped into Anthropic's 0..1
        ({"temperature": 0.3, "params": {"temperature": 2}}, {"temperature": 1.0}),
        ({"params": {"top_p": 0.9, "top_k": 40}}, {"top_p": 0.9, "top_k": 40}),
        ({"temperature": 0.5, "params": {"top_p": 1}}, {"temperature": 0.5}),  # top_p's default: dropped
        ({"temperature": 0.5, "params": {"top_p": 0.9}}, {"temperature": 0.5}),  # newer Claude takes one, not both
        ({"params": {"user": "user-123"}}, {"metadata": {"user_id": "user-123"}}),
        ({"params": {"safety_identifier": "h-9", "user": "u"}}, {"metadata": {"user_id": "h-9"}}),
        ({"params": {"user": "alice@example.com"}}, {}),  # identifying: Anthropic refuses it, dropped
        ({"params": {"metadata": {"user_id": "u7"}, "user": "u"}}, {"metadata": {"user_id": "u7"}}),
        ({"params": {"metadata": {"project": "x"}}}, {}),  # OpenAI's stored-completion tags
        ({"params": {"service_tier": "default"}}, {"service_tier": "standard_only"}),
        ({"params": {"service_tier": "flex"}}, {}),
        (
            {"params": {"thinking": {"type": "enabled", "budget_tokens": 2048}}},
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
        ),
        # harmless or at their defaults: dropped
        ({"params": {"seed": 7, "store": True, "n": 1, "logprobs": False, "presence_penalty": 0}}, {}),
        ({"params": {"frequency_penalty": 0.0, "logit_bias": {}, "modalities": ["text"], "prediction": {}}}, {}),
    ],
)
def test_parameters_map(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    out = body([user("hi")], default=777, **fields)
    translated = {k: v for k, v in out.items() if k not in ("model", "messages")}
    assert translated == {"max_tokens": expected.get("max_tokens", fields.get("max_tokens", 777)), **expected}


@pytest.mark.parametrize(
    ("params", "tools", "choice"),
    [
        ({"tool_choice": "auto"}, [ANTHROPIC_TOOL], {"type": "auto"}),
        ({"tool_choice": "none"}, [ANTHROPIC_TOOL], {"type": "none"}),
        ({"tool_choice": "required"}, [ANTHROPIC_TOOL], {"type": "any"}),
        (
            {"tool_choice": {"type": "function", "function": {"name": "weather"}}},
            [ANTHROPIC_TOOL],
            {"type": "tool", "name": "weather"},
        ),
        ({"parallel_tool_calls": False}, [ANTHROPIC_TOOL], {"type": "auto", "disable_parallel_tool_use": True}),
        (
            {"tool_choice": "required", "parallel_tool_calls": False},
            [ANTHROPIC_TOOL],
            {"type": "any", "disable_parallel_tool_use": True},
        ),
        ({"tool_choice": "none", "parallel_tool_calls": False}, [ANTHROPIC_TOOL], {"type": "none"}),
        ({"parallel_tool_calls": True}, [ANTHROPIC_TOOL], None),
    ],
)
def test_tool_choice_maps(params: dict[str, Any], tools: list[Any], choice: Any) -> None:
    out = body([user("hi")], params={"tools": [TOOL], **params})
    assert out["tools"] == tools
    assert out.get("tool_choice") == choice


def test_no_tools_means_no_tool_choice() -> None:
    out = body([user("hi")], params={"tool_choice": "auto", "parallel_tool_calls": False, "tools": []})
    assert "tools" not in out
    assert "tool_choice" not in out


@pytest.mark.parametrize(
    ("params", "schema", "choice"),
    [
        (
            {"response_format": {"type": "json_object"}},
            {"type": "object", "additionalProperties": True},
            {"type": "tool", "name": JSON_TOOL_NAME},
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": {"properties": {"a": {"type": "integer"}}}},
                }
            },
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            {"type": "tool", "name": JSON_TOOL_NAME},
        ),
        (  # with tools of its own the model must call one of them, or answer through the JSON tool
            {"response_format": {"type": "json_object"}, "tools": [TOOL]},
            {"type": "object", "additionalProperties": True},
            {"type": "any"},
        ),
        (
            {"response_format": {"type": "json_object"}, "tools": [TOOL], "tool_choice": "none"},
            {"type": "object", "additionalProperties": True},
            {"type": "tool", "name": JSON_TOOL_NAME},
        ),
    ],
)
def test_json_mode_is_a_forced_tool(params: dict[str, Any], schema: dict[str, Any], choice: dict[str, Any]) -> None:
    out = body([user("hi")], params=params)
    assert out["tools"][-1]["name"] == JSON_TOOL_NAME
    assert out["tools"][-1]["input_schema"] == schema
    assert out["tool_choice"] == choice
    assert "response_format" not in out


def test_text_response_format_is_nothing() -> None:
    assert "tools" not in body([user("hi")], params={"response_format": {"type": "text"}})


# -- what cannot be translated -----------------------------------------------------------------

UNTRANSLATABLE: list[Any] = [
    # parameters Anthropic has no equivalent of, at a non-default value
    ({"params": {"n": 2}}, r"params\.n: 2: .*one choice"),
    ({"params": {"logprobs": True}}, r"params\.logprobs"),
    ({"params": {"top_logprobs": 3}}, r"params\.top_logprobs"),
    ({"params": {"logit_bias": {"50256": -100}}}, r"params\.logit_bias"),
    ({"params": {"presence_penalty": 0.5}}, r"params\.presence_penalty"),
    ({"params": {"frequency_penalty": 1}}, r"params\.frequency_penalty"),
    ({"params": {"n": True}}, r"params\.n"),
    ({"params": {"audio": {"voice": "alloy", "format": "wav"}}}, r"params\.audio"),
    ({"params": {"modalities": ["text", "audio"]}}, r"params\.modalities"),
    ({"params": {"functions": [{"name": "f"}]}}, r"params\.functions"),
    ({"params": {"function_call": "auto"}}, r"params\.function_call"),
    ({"params": {"reasoning_effort": "low"}}, r"params\.reasoning_effort"),
    ({"params": {"verbosity": "high"}}, r"params\.verbosity"),
    ({"params": {"web_search_options": {}}}, r"params\.web_search_options"),
    ({"params": {"stop": "\n"}}, r"params\.stop: .*whitespace"),
    ({"params": {"stop": 5}}, r"params\.stop"),
    ({"params": {"max_completion_tokens": 0}}, r"params\.max_completion_tokens"),
    ({"params": {"temperature": -1}}, r"temperature"),
    (
        {"params": {"tools": [{"type": "custom", "custom": {"name": "grammar"}}]}},
        r"params\.tools\[0\]: only function tools",
    ),
    ({"params": {"tools": [{**TOOL, "function": {"name": JSON_TOOL_NAME}}]}}, r"reserved for JSON mode"),
    ({"params": {"tools": [{**TOOL, "function": {"name": "f", "parameters": {"type": "array"}}}]}}, r"parameters"),
    ({"params": {"tool_choice": "required"}}, r"params\.tool_choice: .*no tools"),
    ({"params": {"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}}, r"tool_choice"),
    (
        {"params": {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "array"}}}}},
        r"response_format",
    ),
    ({"params": {"response_format": {"type": "json_schema"}}}, r"response_format"),
    (
        {
            "params": {
                "response_format": {"type": "json_object"},
                "thinking": {"type": "enabled", "budget_tokens": 1024},
            }
        },
        r"thinking",
    ),
]
UNTRANSLATABLE_MESSAGES: list[Any] = [
    (
        [user([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])],
        r"messages\[0\]\.content\[0\]: .*audio",
    ),
    ([user([{"type": "file", "file": {"file_id": "file-abc"}}])], r"messages\[0\]\.content\[0\]: an OpenAI file_id"),
    ([user([{"type": "file", "file": {"file_data": "data:application/zip;base64,AAAA"}}])], r"application/zip"),
    ([user([{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}])], r"image/bmp"),
    ([user([{"type": "image_url", "image_url": {"url": "data:image/png,%89PNG"}}])], r"must be base64"),
    ([user([{"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}])], r"https://"),
    ([user([{"type": "video_url", "video_url": "https://x"}])], r"'video_url' has no Anthropic equivalent"),
    (
        [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}, user("hi")],
        r"messages\[0\]\.content\[0\]: a system message may hold only text",
    ),
    ([user("hi"), {"role": "function", "name": "f", "content": "x"}], r"messages\[1\]: role 'function'"),
    ([{"role": "critic", "content": "meh"}], r"messages\[0\]: role 'critic'"),
    (
        [
            user("q"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**CALL, "function": {"name": "weather", "arguments": "{oops"}}],
            },
        ],
        r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: is not valid JSON",
    ),
    (
        [
            user("q"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**CALL, "function": {"name": "weather", "arguments": "[1]"}}],
            },
        ],
        r"must be a JSON object",
    ),
    (
        [user("q"), {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "content": "rain"}],
        r"messages\[2\]: a tool message needs a 'tool_call_id'",
    ),
    ([user("q"), {"role": "assistant", "content": "x", "audio": {"id": "a1"}}], r"messages\[1\]\.audio"),
    ([{"role": "system", "content": "only instructions"}], r"no user or assistant message"),
    ([user("a"), {"role": "assistant", "content": ""}, user("b")], r"messages\[1\]: the message is empty"),
]


@pytest.mark.parametrize(("fields", "match"), UNTRANSLATABLE)
def test_untranslatable_parameters_are_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        body([user("hi")], **fields)


@pytest.mark.parametrize(("messages", "match"), UNTRANSLATABLE_MESSAGES)
def test_untranslatable_messages_are_refused(messages: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        body(messages)


# -- the reply -------------------------------------------------------------------------------


def anthropic_message(content: list[dict[str, Any]], stop: str | None = "end_turn", **usage: int) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5, **usage},
    }


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),  # no OpenAI word for it: as it is
        (None, None),
    ],
)
def test_stop_reasons_map_to_finish_reasons(stop: str | None, finish: str | None) -> None:
    reply = anthropic_reply(anthropic_message([{"type": "text", "text": "x"}], stop), created=1)
    assert reply.finish_reason == finish
    assert reply.raw is not None
    assert reply.raw["choices"][0]["finish_reason"] == finish


def test_reply_becomes_a_chat_completion() -> None:
    anthropic = anthropic_message(
        [{"type": "text", "text": "Let me "}, {"type": "text", "text": "check."}, USE],
        "tool_use",
        cache_read_input_tokens=100,
        cache_creation_input_tokens=20,
    )
    reply = anthropic_reply(anthropic, created=1_700_000_000)
    assert reply.text == "Let me check."
    assert reply.finish_reason == "tool_calls"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (130, 5)
    assert (reply.usage.cached_input_tokens, reply.usage.cache_write_tokens) == (100, 20)
    assert reply.raw == {
        "id": "msg_1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "claude-x",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me check.",
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 130,
            "completion_tokens": 5,
            "total_tokens": 135,
            "prompt_tokens_details": {"cached_tokens": 100},
        },
        "provider_response": anthropic,
    }


def test_json_mode_reply_is_the_json_text() -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": JSON_TOOL_NAME, "input": {"answer": 42, "city": "Øslo"}}
    reply = anthropic_reply(anthropic_message([use], "tool_use"), created=1)
    assert reply.text is not None
    assert json.loads(reply.text) == {"answer": 42, "city": "Øslo"}
    assert reply.finish_reason == "stop"
    assert reply.raw is not None
    message = reply.raw["choices"][0]["message"]
    assert message["content"] == reply.text
    assert "tool_calls" not in message


def test_a_reply_with_only_tool_use_has_no_text() -> None:
    reply = anthropic_reply(anthropic_message([USE], "tool_use"), created=1)
    assert reply.text is None
    assert reply.raw is not None
    assert reply.raw["choices"][0]["message"]["content"] is None


@pytest.mark.parametrize(
    "anthropic",
    [
        {"content": "text", "stop_reason": "end_turn"},
        {"content": [], "stop_reason": "max_tokens"},
        anthropic_message([{"type": "tool_use", "id": "t", "name": "f", "input": "not an object"}], "tool_use"),
    ],
)
def test_malformed_replies_are_refused(anthropic: dict[str, Any]) -> None:
    with pytest.raises(MalformedResponseError):
        anthropic_reply(anthropic, created=1)


# -- over loopback ---------------------------------------------------------------------------


#: An OpenAI-shaped conversation with a system message, images by URL and by base64, a
#: tool definition, a tool call and its result: what a fallback from OpenAI would carry.
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer briefly."},
    user(
        [
            {"type": "text", "text": "What is in these pictures, and the weather there?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/oslo.png", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]
    ),
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain, 8 C"},
    user("And tomorrow?"),
]
PARAMS: dict[str, Any] = {"tools": [TOOL], "tool_choice": "auto", "stop": ["\n\nHuman:"], "top_p": 1, "user": "u-1"}


async def test_an_openai_shaped_conversation_round_trips(server: FakeServer) -> None:
    async with Engine(deployment_at(server, "anthropic/claude-test")) as engine:
        result = await engine.complete(
            "anthropic/claude-test", CONVERSATION, max_tokens=100, temperature=1.2, params=PARAMS
        )
    assert result.ok, result.error
    assert result.text == "echo: And tomorrow?"
    assert result.finish_reason == "stop"
    assert server.stats.by_status == {200: 1}
    assert result.raw is not None
    assert result.raw["object"] == "chat.completion"
    assert result.raw["choices"][0]["message"]["content"] == "echo: And tomorrow?"
    assert result.raw["usage"]["prompt_tokens"] == result.usage.input_tokens > 346  # the tools were counted
    provider = result.raw["provider_response"]
    assert (provider["type"], provider["stop_reason"]) == ("message", "end_turn")


async def test_the_untranslated_body_is_what_the_fake_refuses(server: FakeServer) -> None:
    """The round trip above can fail: the same conversation sent as it is gets the 400
    the real API would send."""
    status, reply = await post_messages(server, {"max_tokens": 100, "messages": CONVERSATION, **PARAMS})
    assert status == 400
    assert reply["error"]["type"] == "invalid_request_error"


async def test_untranslatable_requests_fail_before_anything_is_sent(server: FakeServer) -> None:
    requests = [
        Request("anthropic/claude-test", [user("hi")], params=fields.get("params", {}), id=f"p{n}")
        for n, (fields, _) in enumerate(UNTRANSLATABLE)
    ] + [
        Request("anthropic/claude-test", messages, id=f"m{n}")
        for n, (messages, _) in enumerate(UNTRANSLATABLE_MESSAGES)
    ]
    async with Engine(deployment_at(server, "anthropic/claude-test")) as engine:
        results = [result async for result in engine.map(requests)]
    assert len(results) == len(requests)
    assert all(isinstance(r.error, InvalidRequestError) for r in results), [r.error for r in results if r.ok]
    assert all(r.attempts <= 1 for r in results)
    assert server.stats.received == 0
    by_id = {r.id: r for r in results}
    assert "params.n" in str(by_id["p0"].error)
    assert "messages[0].content[0]" in str(by_id["m0"].error)


# -- the fake is as strict as the API where it matters -------------------------------------

VALID_TOOL_ROUND = [
    user("weather?"),
    {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, USE]},
    user([{"type": "tool_result", "tool_use_id": "call_1", "content": "rain"}, {"type": "text", "text": "so?"}]),
]


@pytest.mark.parametrize(
    ("extra", "messages"),
    [
        pytest.param({"system": "s"}, [user("a"), user("b")], id="consecutive user turns (the API merges them)"),
        pytest.param({"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "auto"}}, VALID_TOOL_ROUND, id="a tool round"),
        pytest.param({}, [user("q"), {"role": "assistant", "content": "The answer is"}], id="a prefill"),
        pytest.param(
            {"system": [{"type": "text", "text": "s"}], "temperature": 1, "stop_sequences": ["END"]},
            [user("q")],
            id="params",
        ),
    ],
)
async def test_the_fake_accepts_valid_anthropic_bodies(
    server: FakeServer, extra: dict[str, Any], messages: list[dict[str, Any]]
) -> None:
    status, _ = await post_messages(server, {"messages": messages, **extra})
    assert status == 200


@pytest.mark.parametrize(
    ("extra", "messages", "words"),
    [
        ({}, [{"role": "system", "content": "s"}, user("q")], "role: Input should be 'user' or 'assistant'"),
        ({}, [user("q"), {"role": "assistant", "content": None, "tool_calls": [CALL]}], "tool_calls: Extra inputs"),
        ({}, [user("q"), {"role": "tool", "tool_call_id": "call_1", "content": "x"}], "role: Input should be"),
        ({}, [user([{"type": "image_url", "image_url": {"url": "https://x/a.png"}}])], "Input tag 'image_url'"),
        (
            {},
            [user([{"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "x"}}])],
            "media_type",
        ),
        ({}, [user([{"type": "text", "text": ""}])], "text content blocks must be non-empty"),
        ({}, [user(""), user("q")], "non-empty content"),
        ({}, [user("q"), {"role": "assistant", "content": "trailing "}], "trailing whitespace"),
        ({"stop": ["x"]}, [user("q")], "stop: Extra inputs are not permitted"),
        ({"response_format": {"type": "json_object"}}, [user("q")], "response_format: Extra inputs"),
        ({"temperature": 1.5}, [user("q")], "temperature"),
        ({"stop_sequences": ["\n"]}, [user("q")], "stop_sequences"),
        ({"tools": [TOOL]}, [user("q")], "tools.0"),
        ({"tools": [ANTHROPIC_TOOL], "tool_choice": "auto"}, [user("q")], "tool_choice"),
        ({"metadata": {"tag": "x"}}, [user("q")], "metadata"),
        ({}, [*VALID_TOOL_ROUND[:2], user("so?")], "tool_use ids were found without tool_result blocks"),
        (
            {},
            [
                *VALID_TOOL_ROUND[:2],
                user([{"type": "text", "text": "so?"}, {"type": "tool_result", "tool_use_id": "call_1"}]),
            ],
            "Did not find 1 tool_result",
        ),
        ({}, [user([{"type": "tool_result", "tool_use_id": "nope", "content": "x"}])], "unexpected tool_use_id"),
        ({}, [user([USE])], "tool_use blocks may only appear in assistant messages"),
    ],
)
async def test_the_fake_refuses_what_anthropic_refuses(
    server: FakeServer, extra: dict[str, Any], messages: list[dict[str, Any]], words: str
) -> None:
    status, reply = await post_messages(server, {"messages": messages, **extra})
    assert status == 400
    assert reply["error"]["type"] == "invalid_request_error"
    assert words in reply["error"]["message"]


async def post_messages(server: FakeServer, fields: Mapping[str, Any]) -> tuple[int, Any]:
    payload = {"model": "claude-test", "max_tokens": 64, **fields}
    headers = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}
    url = f"{server.anthropic_url}/v1/messages"
    async with aiohttp.ClientSession() as session, session.post(url, json=payload, headers=headers) as response:
        return response.status, await response.json()
