"""Anthropic Messages <-> Chat Completions, the pure translations ``sluice serve`` speaks
Messages with: every rule and every refusal of a request body, hostile bodies that must
only ever raise ShapeError, round trips both ways through ``providers._translate``, and the
answers (a Message, an SSE stream, errors) read back by the official anthropic SDK from a
loopback server."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any

import anthropic
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice import InvalidRequestError, Request, Usage
from sluice.providers._events import TextDelta, ToolCallDelta
from sluice.providers._translate import JSON_TOOL_NAME, anthropic_body
from sluice.shapes._common import ChatView, ShapeError
from sluice.shapes.messages._errors import (
    ERROR_TYPES,
    anthropic_error_body,
    error_type_for,
    lost_message,
    status_for,
)
from sluice.shapes.messages._events import MessagesEvents
from sluice.shapes.messages._in import chat_from_messages, check_count_tokens
from sluice.shapes.messages._out import UNPARSED_ARGUMENTS, message_from_chat, tool_use_id, usage_from

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()
WEATHER = {"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}


def body(*messages: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 100, "messages": list(messages) or [user("hi")], **fields}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def result(call_id: str = "toolu_1", content: Any = "rain", **more: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **more}


def chat(**fields: Any) -> ChatView:
    view = chat_from_messages(body(*fields.pop("messages", ()), **fields))
    json.dumps(view.body, allow_nan=False, ensure_ascii=False).encode()  # strict JSON, always
    return view


def request_of(view: ChatView) -> Request:
    """The Request the server builds from a view (as ``serve/chat/_chat.parse_chat`` does)."""
    rest = dict(view.body)
    rest.pop("stream", None)
    return Request(
        rest.pop("model"),
        rest.pop("messages"),
        max_tokens=rest.pop("max_tokens", None),
        temperature=rest.pop("temperature", None),
        params=rest,
    )


# -- the request: what translates, and to what -------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("hi", "hi", id="a string stays a string"),
        pytest.param([{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}], "hi", id="one block"),
        pytest.param(
            [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            id="two blocks are two parts",
        ),
        pytest.param(
            [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}],
            [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}],
            id="a base64 image is a data URL",
        ),
        pytest.param(
            [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}],
            [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
            id="a URL image",
        ),
        pytest.param(
            [
                {
                    "type": "document",
                    "title": "q3.pdf",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
                }
            ],
            [{"type": "file", "file": {"filename": "q3.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}}],
            id="a PDF is a file part named by its title",
        ),
        pytest.param(
            [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}}],
            [{"type": "file", "file": {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}}],
            id="an untitled PDF",
        ),
        pytest.param(
            [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "the notes"}}],
            "the notes",
            id="a plain-text document is text",
        ),
        pytest.param(
            [
                {
                    "type": "document",
                    "title": "Notes",
                    "source": {"type": "text", "media_type": "text/plain", "data": "x"},
                }
            ],
            "Notes\n\nx",
            id="with its title",
        ),
        pytest.param(
            [
                {
                    "type": "document",
                    "source": {
                        "type": "content",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                }
            ],
            [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            id="a content document is its blocks",
        ),
        pytest.param(
            [{"type": "document", "context": "From the wiki.", "source": {"type": "content", "content": "the page"}}],
            [{"type": "text", "text": "From the wiki."}, {"type": "text", "text": "the page"}],
            id="a content document of a string, after its context",
        ),
        pytest.param(
            [
                {
                    "type": "document",
                    "source": {
                        "type": "content",
                        "content": [{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}],
                    },
                }
            ],
            [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
            id="a content document of an image",
        ),
    ],
)
def test_user_content(content: Any, expected: Any) -> None:
    view = chat(messages=[user(content)])
    assert view.body["messages"] == [{"role": "user", "content": expected}]
    assert view.lost == ()


def test_the_body_around_the_messages() -> None:
    view = chat(
        system=[
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be kind."},
        ],
        temperature=0.3,
        top_p=0.9,
        stop_sequences=["END", "STOP"],
        metadata={"user_id": "u-42"},
        stream=True,
    )
    assert view.body == {
        "model": "claude-test",
        "messages": [{"role": "system", "content": "Be brief.\n\nBe kind."}, user("hi")],
        "max_tokens": 100,
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["END", "STOP"],
        "user": "u-42",
        "stream": True,
    }
    assert chat(system="Be brief.").body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat(system="").body["messages"] == [user("hi")]
    assert "stream" not in chat(stream=False).body


def test_a_user_id_longer_than_openai_takes_is_its_digest() -> None:
    claude_code = "user_" + "a" * 64 + "_account_" + "b" * 36 + "_session_" + "c" * 36
    assert chat(metadata={"user_id": claude_code}).body["user"] == hashlib.sha256(claude_code.encode()).hexdigest()
    assert chat(metadata={"user_id": "u" * 64}).body["user"] == "u" * 64


def test_tool_use_and_results() -> None:
    view = chat(
        messages=[
            user("weather in Oslo and Rome?"),
            assistant(
                [{"type": "text", "text": "Checking."}, USE, {**USE, "id": "toolu_2", "input": {"city": "Rome"}}]
            ),
            user(
                [
                    {"type": "text", "text": "thanks"},
                    result("toolu_2", "sun"),
                    result("toolu_1", [{"type": "text", "text": "rain"}]),
                ]
            ),
        ]
    )
    assert view.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
                {"id": "toolu_2", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_2", "content": "sun"},  # results in order, before the user's words
        {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "text", "text": "rain"}]},
        user("thanks"),
    ]


def test_an_assistant_turn_of_only_tool_calls_has_null_content() -> None:
    view = chat(messages=[user("q"), assistant([USE]), user([result(content=None)])])
    assert view.body["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [view.body["messages"][1]["tool_calls"][0]],
    }
    assert view.body["messages"][2] == {"role": "tool", "tool_call_id": "toolu_1", "content": ""}


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("not found", "Error: not found"),
        ("Error: not found", "Error: not found"),
        (None, "Error"),
        ([{"type": "text", "text": "boom"}], [{"type": "text", "text": "Error:"}, {"type": "text", "text": "boom"}]),
    ],
)
def test_is_error_is_said_in_words(content: Any, said: Any) -> None:
    view = chat(messages=[user("q"), assistant([USE]), user([result(content=content, is_error=True)])])
    assert view.body["messages"][2]["content"] == said
    assert view.lost == ()


def test_images_of_a_tool_result_follow_in_the_user_turn() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    view = chat(
        messages=[
            user("q"),
            assistant([USE]),
            user(
                [result(content=[{"type": "text", "text": "a chart"}, image]), {"type": "text", "text": "what is it?"}]
            ),
        ]
    )
    assert view.body["messages"][2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "text", "text": "a chart"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "The result of tool call toolu_1 also holds:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "text", "text": "what is it?"},
            ],
        },
    ]


def test_a_pdf_of_a_tool_result_follows_and_a_text_document_stays_in_it() -> None:
    text_doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
    view = chat(
        messages=[user("q"), assistant([USE]), user([result(content=[{**PDF_BLOCK, "title": "r.pdf"}, text_doc])])]
    )
    assert view.body["messages"][2] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": [{"type": "text", "text": "notes"}],
    }
    assert view.body["messages"][3]["content"][1] == {
        "type": "file",
        "file": {"filename": "r.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
    }


def test_consecutive_messages_of_one_role_are_one_turn_as_anthropic_combines_them() -> None:
    view = chat(messages=[user("a"), user("b"), assistant("c"), assistant([USE]), user([result()])])
    assert view.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c", "tool_calls": [view.body["messages"][1]["tool_calls"][0]]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
    ]


def test_a_system_message_in_the_conversation_stays_where_it_is() -> None:
    view = chat(messages=[user("a"), assistant("b"), {"role": "system", "content": "Now in French."}, user("c")])
    assert [m["role"] for m in view.body["messages"]] == ["user", "assistant", "system", "user"]


def test_thinking_is_dropped_and_an_assistant_turn_of_only_thinking_with_it() -> None:
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    view = chat(
        max_tokens=4000,
        thinking={"type": "enabled", "budget_tokens": 2048},
        messages=[
            user("a"),
            assistant([thinking, {"type": "redacted_thinking", "data": "x"}]),
            user("b"),
            assistant([thinking, {"type": "text", "text": "c"}]),
            user("d"),
        ],
    )
    assert view.body["messages"] == [user("a"), user("b"), {"role": "assistant", "content": "c"}, user("d")]
    assert view.lost == ()
    assert "thinking" not in view.body


def test_tools_and_tool_choice() -> None:
    tools = [
        {**WEATHER, "description": "Weather", "cache_control": {"type": "ephemeral"}, "strict": True},
        {"name": "clock", "input_schema": {"type": "object"}, "type": "custom"},
    ]
    view = chat(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert view.body["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Weather", "parameters": WEATHER["input_schema"]},
        },
        {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}},
    ]
    assert view.body["tool_choice"] == "required"
    assert view.body["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "tool", "name": "weather"}, {"tool_choice": {"type": "function", "function": {"name": "weather"}}}),
        ({"type": "auto", "disable_parallel_tool_use": True}, {"tool_choice": "auto", "parallel_tool_calls": False}),
        ({"type": "auto", "disable_parallel_tool_use": False}, {"tool_choice": "auto"}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    view = chat(tools=[WEATHER], tool_choice=choice)
    assert {k: view.body[k] for k in ("tool_choice", "parallel_tool_calls") if k in view.body} == expected


def test_tool_choice_auto_or_none_without_tools_says_nothing() -> None:
    assert "tool_choice" not in chat(tool_choice={"type": "auto"}).body
    assert "tool_choice" not in chat(tool_choice={"type": "none"}).body


def test_a_tool_choice_naming_a_server_tool_says_nothing_to_a_chat_deployment() -> None:
    server = {"type": "web_search_20250305", "name": "web_search"}
    view = chat(tools=[WEATHER, server], tool_choice={"type": "tool", "name": "web_search"})
    assert "tool_choice" not in view.body
    assert len(view.lost) == 1


def test_structured_output_is_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    expected = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert (
        chat(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"}).body[
            "response_format"
        ]
        == expected
    )
    assert chat(output_format={"type": "json_schema", "schema": schema}).body["response_format"] == expected


@pytest.mark.parametrize(
    "fields",
    [
        {"top_k": 40},
        {"thinking": {"type": "disabled"}},
        {"thinking": {"type": "adaptive", "display": "omitted"}},
        {"service_tier": "standard_only"},
        {"speed": "fast"},
        {"cache_control": {"type": "ephemeral"}},
        {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        {"diagnostics": {"previous_message_id": "msg_1"}},
        {"user_profile_id": "up_1", "workspace_id": "wrkspc_1"},
        {"output_config": {"effort": "high"}},
        {"metadata": {"user_id": None}},
        {"container": None},
    ],
)
def test_dropped_fields_change_nothing(fields: dict[str, Any]) -> None:
    view = chat(**fields)
    assert view.body == chat().body
    assert view.lost == ()


def test_citations_of_an_earlier_answer_are_dropped_with_its_words_kept() -> None:
    cited = {
        "type": "text",
        "text": "Paris.",
        "citations": [
            {
                "type": "char_location",
                "cited_text": "x",
                "document_index": 0,
                "start_char_index": 0,
                "end_char_index": 1,
            }
        ],
    }
    view = chat(messages=[user("q"), assistant([cited]), user("and?")])
    assert view.body["messages"][1] == {"role": "assistant", "content": "Paris."}
    assert view.lost == ()


PDF_BLOCK = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}}


# fmt: off
LOST: list[Any] = [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, r"tools\[0\]: 'web_search_20250305' is a tool Anthropic defines"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, r"tools\[0\]: 'bash_20250124'"),
    ({"tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]}, "text_editor"),
    ({"tools": [{"type": "computer_20250124", "name": "computer", "display_width_px": 1, "display_height_px": 1}]}, "computer"),
    ({"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}, "code_execution"),
    ({"tools": [{**WEATHER, "name": "w" * 65}]}, r"tools\[0\]\.name: .* longer than the 64 characters"),
    ({"tools": [{**WEATHER, "allowed_callers": ["code_execution_20250825"]}]}, "allowed_callers"),
    ({"mcp_servers": [{"type": "url", "url": "https://mcp.example.com", "name": "x"}]}, "mcp_servers: MCP servers"),
    ({"container": "container_1"}, "container: a container"),
    ({"inference_geo": "us"}, "inference_geo"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences: 5 of them; Chat Completions takes at most 4"),
    ({"frobnicate": True}, "'frobnicate': a field sluice does not know"),
    ({"messages": [user([{"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "x"}]}])]}, r"messages\[0\]\.content\[0\]: a search_result block"),
    ({"messages": [user([{**PDF_BLOCK, "citations": {"enabled": True}}])]}, r"messages\[0\]\.content\[0\]\.citations: Claude cites"),
    ({"messages": [user([{"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}])]}, "a document by URL"),
    ({"messages": [user([{"type": "document", "source": {"type": "file", "file_id": "file_1"}}])]}, "by Anthropic file_id"),
    ({"messages": [user([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}])]}, "an image by Anthropic file_id"),
    ({"messages": [user("q"), assistant("The answer is")]}, r"messages\[1\]: a final assistant message \(a prefill\)"),
    ({"messages": [user("q"), assistant([{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}]), user("x")]}, "'server_tool_use' block of an Anthropic server tool"),
    ({"messages": [user("q"), assistant([{**USE, "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}}]), user([result()])]}, r"messages\[1\]\.content\[0\]\.caller: a call made by Anthropic's code execution tool"),
    ({"tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "tool", "name": "web_search"}}, "'web_search_20250305'"),
    ({"messages": [user([{"type": "container_upload", "file_id": "f"}])]}, "container_upload"),
    ({"messages": [user([{"type": "hologram"}])]}, "'hologram', unknown to sluice"),
    ({"messages": [user("q"), assistant([{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}]), user("x")]}, "an image in an assistant message"),
    ({"messages": [user("q"), assistant([USE]), user([result(content=[{"type": "tool_reference", "tool_name": "x"}])])]}, "a tool result holding a 'tool_reference' block"),
]
# fmt: on


@pytest.mark.parametrize(("fields", "said"), LOST)
def test_what_a_chat_deployment_cannot_be_told_is_lost(fields: dict[str, Any], said: str) -> None:
    view = chat(**fields)
    assert len(view.lost) == 1
    assert re.search(said, view.lost[0]), view.lost[0]
    assert lost_message(view.lost).startswith("this request cannot be sent to a Chat Completions model: ")


def test_an_empty_final_assistant_message_is_no_prefill() -> None:
    view = chat(messages=[user("q"), assistant("")])
    assert view.body["messages"] == [user("q")]
    assert view.lost == ()


# -- the request: what Anthropic refuses, refused with the field's path ------------------


def _with(**fields: Any) -> dict[str, Any]:
    return body(*fields.pop("messages", ()), **fields)


def _without(name: str) -> dict[str, Any]:
    given = body()
    del given[name]
    return given


# fmt: off
REFUSED: list[Any] = [
    pytest.param([], None, "the request body must be a JSON object", id="not an object"),
    pytest.param(_without("model"), "model", "must be a string, got null", id="no model"),
    pytest.param(_with(model=""), "model", "non-empty", id="empty model"),
    pytest.param(_with(model=5), "model", "must be a string, got a number", id="model a number"),
    pytest.param(_without("max_tokens"), "max_tokens", "Field required", id="no max_tokens"),
    pytest.param(_with(max_tokens=0), "max_tokens", "from 1 to", id="max_tokens 0"),
    pytest.param(_with(max_tokens=-5), "max_tokens", "from 1 to", id="max_tokens negative"),
    pytest.param(_with(max_tokens=True), "max_tokens", "must be an integer, got a boolean", id="max_tokens true"),
    pytest.param(_with(max_tokens=1.5), "max_tokens", "must be an integer, got a number", id="max_tokens float"),
    pytest.param(_with(max_tokens="100"), "max_tokens", "got a string", id="max_tokens string"),
    pytest.param(_with(max_tokens=10**40), "max_tokens", "from 1 to 2147483647", id="max_tokens huge"),
    pytest.param(_without("messages"), "messages", "Field required", id="no messages"),
    pytest.param({**body(), "messages": []}, "messages", "non-empty array", id="empty messages"),
    pytest.param({**body(), "messages": "hi"}, "messages", "must be an array", id="messages a string"),
    pytest.param(_with(messages=[5]), "messages[0]", "must be an object", id="message a number"),
    pytest.param(_with(messages=[{"role": "bot", "content": "x"}]), "messages[0].role", "'user', 'assistant' or 'system'", id="unknown role"),
    pytest.param(_with(messages=[{"content": "x"}]), "messages[0].role", "got None", id="no role"),
    pytest.param(_with(messages=[{"role": "user"}]), "messages[0].content", "is required", id="no content"),
    pytest.param(_with(messages=[user(5)]), "messages[0].content", "must be an array, got a number", id="content a number"),
    pytest.param(_with(messages=[user("")]), "messages[0]", "non-empty content except for an optional final assistant", id="empty string"),
    pytest.param(_with(messages=[user([])]), "messages[0]", "non-empty content", id="empty list"),
    pytest.param(_with(messages=[user("a"), assistant(""), user("b")]), "messages[1]", "non-empty content", id="empty assistant mid-way"),
    pytest.param(_with(messages=[user("  \n")]), "messages[0].content", "non-whitespace text", id="whitespace string"),
    pytest.param(_with(messages=[user([{"type": "text", "text": ""}])]), "messages[0].content[0]", "must be non-empty", id="empty text block"),
    pytest.param(_with(messages=[user([{"type": "text"}])]), "messages[0].content[0].text", "must be a string", id="text block without text"),
    pytest.param(_with(messages=[user([{"text": "x"}])]), "messages[0].content[0].type", "naming the block's type", id="block without type"),
    pytest.param(_with(messages=[user(["x"])]), "messages[0].content[0]", "must be an object", id="block a string"),
    pytest.param(_with(messages=[user("q"), assistant("a ")]), "messages[1].content", "trailing whitespace", id="prefill ending in whitespace"),
    pytest.param(_with(messages=[user([USE])]), "messages[0].content[0]", "tool_use blocks can only be in assistant messages", id="tool_use from the user"),
    pytest.param(_with(messages=[user("q"), assistant([result()]), user("x")]), "messages[1].content[0]", "tool_result blocks can only be in user", id="tool_result from the assistant"),
    pytest.param(_with(messages=[user([{"type": "thinking", "thinking": "x", "signature": "s"}])]), "messages[0].content[0]", "thinking blocks can only be in assistant", id="user thinking"),
    pytest.param(_with(messages=[user("q"), assistant([{"type": "thinking", "thinking": "x"}]), user("x")]), "messages[1].content[0].signature", "must be a string", id="thinking unsigned"),
    pytest.param(_with(messages=[user("q"), assistant([{**USE, "id": "toolu 1"}]), user([result("toolu 1")])]), "messages[1].content[0].id", r"\^\[a-zA-Z0-9_-\]\+\$", id="tool_use id pattern"),
    pytest.param(_with(messages=[user("q"), assistant([USE, USE]), user([result()])]), "messages[1].content[1].id", "must be unique", id="tool_use id twice"),
    pytest.param(_with(messages=[user("q"), assistant([{**USE, "input": "Oslo"}]), user([result()])]), "messages[1].content[0].input", "must be an object", id="input a string"),
    pytest.param(_with(messages=[user("q"), assistant([{**USE, "input": {"x": math.nan}}]), user([result()])]), "messages[1].content[0].input", "NaN", id="input NaN"),
    pytest.param(_with(messages=[user("q"), assistant([{**USE, "name": ""}]), user([result()])]), "messages[1].content[0].name", "non-empty", id="tool_use no name"),
    pytest.param(_with(messages=[user("q"), assistant([USE]), user("no result")]), "messages[1]", "tool_use ids were found without tool_result blocks immediately after: toolu_1", id="use unanswered"),
    pytest.param(_with(messages=[user("q"), assistant([USE]), user([result(), result("toolu_9")])]), "messages[2].content[1]", "unexpected tool_use_id found in tool_result blocks: toolu_9", id="result unasked"),
    pytest.param(_with(messages=[user([result()])]), "messages[0].content[0]", "unexpected tool_use_id", id="result first"),
    pytest.param(_with(messages=[user("q"), assistant([USE]), user([result(is_error="yes")])]), "messages[2].content[0].is_error", "boolean", id="is_error a string"),
    pytest.param(_with(messages=[user("q"), assistant([USE]), user([result(content=5)])]), "messages[2].content[0].content", "must be an array", id="result content a number"),
    pytest.param(_with(messages=[user([{"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "x"}}])]), "messages[0].content[0].source.media_type", "image/jpeg, image/png", id="bmp"),
    pytest.param(_with(messages=[user([{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}])]), "messages[0].content[0].source.data", "must be a string", id="image without data"),
    pytest.param(_with(messages=[user([{"type": "image", "source": {"type": "ftp", "url": "x"}}])]), "messages[0].content[0].source.type", "'base64', 'url' or 'file'", id="image source type"),
    pytest.param(_with(messages=[user([{"type": "image"}])]), "messages[0].content[0].source", "must be an object", id="image without source"),
    pytest.param(_with(messages=[user([{"type": "document", "source": {"type": "base64", "media_type": "text/csv", "data": "x"}}])]), "messages[0].content[0].source.media_type", "application/pdf", id="csv as base64"),
    pytest.param(_with(messages=[user([{"type": "document", "source": {"type": "text", "media_type": "text/html", "data": "x"}}])]), "messages[0].content[0].source.media_type", "text/plain", id="html as text"),
    pytest.param(_with(messages=[{"role": "system", "content": [{"type": "image", "source": {}}]}, user("x")]), "messages[0].content[0]", "system message holds only text", id="system image"),
    pytest.param(_with(messages=[user([{"type": "document", "source": {"type": "content", "content": [{"type": "document"}]}}])]), "messages[0].content[0].source.content[0].type", "text and image blocks", id="a document in a content document"),
    pytest.param(_with(messages=[user([{"type": "document", "source": {"type": "html", "data": "x"}}])]), "messages[0].content[0].source.type", "'base64', 'text', 'content'", id="document source type"),
    pytest.param(_with(system=5), "system", "must be an array", id="system a number"),
    pytest.param(_with(system=[{"type": "image"}]), "system[0].type", "only text blocks", id="system image block"),
    pytest.param(_with(system=[{"type": "text", "text": " "}]), "system[0]", "non-whitespace", id="system blank block"),
    pytest.param(_with(temperature=math.nan), "temperature", "finite", id="temperature NaN"),
    pytest.param(_with(temperature=math.inf), "temperature", "finite", id="temperature inf"),
    pytest.param(_with(temperature=1.5), "temperature", "from 0 to 1", id="temperature 1.5"),
    pytest.param(_with(temperature=-0.1), "temperature", "from 0 to 1", id="temperature negative"),
    pytest.param(_with(temperature="0.5"), "temperature", "got a string", id="temperature a string"),
    pytest.param(_with(temperature=True), "temperature", "got a boolean", id="temperature true"),
    pytest.param(_with(top_p=2), "top_p", "from 0 to 1", id="top_p 2"),
    pytest.param(_with(top_k=-1), "top_k", "from 0", id="top_k negative"),
    pytest.param(_with(top_k="x"), "top_k", "integer", id="top_k a string"),
    pytest.param(_with(stop_sequences="END"), "stop_sequences", "must be an array", id="stop a string"),
    pytest.param(_with(stop_sequences=[1]), "stop_sequences[0]", "must be a string", id="stop a number"),
    pytest.param(_with(stop_sequences=[""]), "stop_sequences[0]", "non-empty", id="stop empty"),
    pytest.param(_with(stop_sequences=["\n"]), "stop_sequences[0]", "non-whitespace", id="stop whitespace"),
    pytest.param(_with(tools={}), "tools", "must be an array", id="tools an object"),
    pytest.param(_with(tools=[5]), "tools[0]", "must be an object", id="tool a number"),
    pytest.param(_with(tools=[{**WEATHER, "name": "get weather"}]), "tools[0].name", "must match", id="tool name with a space"),
    pytest.param(_with(tools=[{"name": "x"}]), "tools[0].input_schema", "must be an object", id="no input_schema"),
    pytest.param(_with(tools=[{"name": "x", "input_schema": {"type": "array"}}]), "tools[0].input_schema.type", "must be 'object'", id="schema not an object"),
    pytest.param(_with(tools=[{"name": "x", "input_schema": {"properties": {}}}]), "tools[0].input_schema.type", "must be 'object'", id="schema without type"),
    pytest.param(_with(tools=[{"name": "x", "input_schema": {"type": "object", "default": math.inf}}]), "tools[0].input_schema", "NaN", id="schema with infinity"),
    pytest.param(_with(tools=[WEATHER, WEATHER]), "tools[1].name", "tool names must be unique", id="tool twice"),
    pytest.param(_with(tools=[{**WEATHER, "type": 5}]), "tools[0].type", "naming the tool's type", id="tool type a number"),
    pytest.param(_with(tools=[{**WEATHER, "description": 5}]), "tools[0].description", "must be a string", id="description a number"),
    pytest.param(_with(tools=[WEATHER], tool_choice={"type": "some"}), "tool_choice.type", "'auto', 'any', 'tool', 'none'", id="tool_choice type"),
    pytest.param(_with(tools=[WEATHER], tool_choice="auto"), "tool_choice", "must be an object", id="tool_choice a string"),
    pytest.param(_with(tools=[WEATHER], tool_choice={"type": "tool"}), "tool_choice.name", "must be a string", id="tool_choice no name"),
    pytest.param(_with(tools=[WEATHER], tool_choice={"type": "tool", "name": "clock"}), "tool_choice.name", "no tool named 'clock'", id="tool_choice unknown tool"),
    pytest.param(_with(tool_choice={"type": "any"}), "tool_choice", "only be specified while providing tools", id="any without tools"),
    pytest.param(_with(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": 1}), "tool_choice.disable_parallel_tool_use", "boolean", id="disable an int"),
    pytest.param(_with(thinking={"type": "on"}), "thinking.type", "'enabled', 'disabled'", id="thinking type"),
    pytest.param(_with(max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 1000}), "thinking.budget_tokens", "from 1024", id="budget too small"),
    pytest.param(_with(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}), "thinking.budget_tokens", r"less than max_tokens \(2000\)", id="budget not below max_tokens"),
    pytest.param(_with(max_tokens=2000, thinking={"type": "enabled"}), "thinking.budget_tokens", "integer", id="no budget"),
    pytest.param(_with(max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 1024}, tools=[WEATHER], tool_choice={"type": "any"}), "tool_choice", "Thinking may not be enabled when tool_choice forces tool use", id="thinking with a forced tool"),
    pytest.param(_with(thinking={"type": "adaptive", "display": "full"}), "thinking.display", "summarized", id="display"),
    pytest.param(_with(metadata="u1"), "metadata", "must be an object", id="metadata a string"),
    pytest.param(_with(metadata={"user_id": 5}), "metadata.user_id", "must be a string", id="user_id a number"),
    pytest.param(_with(metadata={"user_id": "u" * 257}), "metadata.user_id", "at most 256", id="user_id too long"),
    pytest.param(_with(stream="yes"), "stream", "boolean", id="stream a string"),
    pytest.param(_with(service_tier="priority"), "service_tier", "'auto', 'standard_only'", id="service tier"),
    pytest.param(_with(output_config={"format": {"type": "regex"}}), "output_config.format.type", "json_schema", id="format type"),
    pytest.param(_with(output_config={"format": {"type": "json_schema"}}), "output_config.format.schema", "must be an object", id="format no schema"),
    pytest.param(_with(output_config={"effort": "huge"}), "output_config.effort", "'low'", id="effort"),
    pytest.param(_with(output_config=[]), "output_config", "must be an object", id="output_config a list"),
    pytest.param(_with(messages=[user("\ud800")]), "messages[0].content.text", "lone surrogate", id="surrogate in text"),
    pytest.param(_with(system="\udfff"), "system", "lone surrogate", id="surrogate in system"),
    pytest.param(_with(tools=[{**WEATHER, "description": "a\ud800"}]), "tools[0].description", "lone surrogate", id="surrogate in a description"),
    pytest.param(_with(tools=[{"name": "x", "input_schema": {"type": "object", "title": "\ud800"}}]), "tools[0].input_schema", "lone surrogate", id="surrogate in a schema"),
    pytest.param(_with(messages=[user("q"), assistant([{**USE, "input": {"k": "\ud800"}}]), user([result()])]), "messages[1].content[0].input", "lone surrogate", id="surrogate in an input"),
    pytest.param(_with(messages=[user("q")] * 100_001), "messages", "100,000 messages", id="too many messages"),
    pytest.param(_with(messages=[assistant("")]), "messages", "nothing to answer", id="only an empty prefill"),
    pytest.param(_with(messages=[assistant([{"type": "thinking", "thinking": "t", "signature": "s"}])]), "messages", "nothing to answer", id="only thinking"),

]
# fmt: on


@pytest.mark.parametrize(("given", "param", "said"), REFUSED)
def test_refused_as_anthropic_refuses(given: Any, param: str | None, said: str) -> None:
    with pytest.raises(ShapeError, match=said) as refused:
        chat_from_messages(given)
    assert refused.value.param == param
    if param is not None:
        assert refused.value.message.startswith(f"{param}: ")


def test_count_tokens_takes_no_max_tokens_but_checks_the_rest() -> None:
    view = check_count_tokens(
        {
            "model": "claude-test",
            "messages": [user("hi")],
            "system": "s",
            "tools": [WEATHER],
            "thinking": {"type": "enabled", "budget_tokens": 2048},
        }
    )
    assert view.body == {
        "model": "claude-test",
        "messages": [{"role": "system", "content": "s"}, user("hi")],
        "tools": chat(tools=[WEATHER]).body["tools"],
    }
    assert "stream" not in check_count_tokens(body(stream=True)).body
    with pytest.raises(ShapeError, match="unexpected tool_use_id") as refused:
        check_count_tokens({"model": "m", "messages": [user([result()])]})
    assert refused.value.param == "messages[0].content[0]"
    with pytest.raises(ShapeError) as refused:
        check_count_tokens({"model": "m", "messages": [user("x")], "max_tokens": 0})
    assert refused.value.param == "max_tokens"


# -- hostile bodies: a ShapeError, never anything else ------------------------------------

_KEYS = st.sampled_from(
    [
        "model", "max_tokens", "messages", "role", "content", "type", "text", "source", "media_type", "data",
        "url", "id", "name", "input", "tool_use_id", "is_error", "system", "tools", "input_schema", "tool_choice",
        "thinking", "budget_tokens", "stop_sequences", "temperature", "top_p", "top_k", "metadata", "user_id",
        "stream", "title", "citations", "enabled", "disable_parallel_tool_use", "output_config", "format", "schema",
    ]
)  # fmt: skip
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(), max_size=6),
    st.sampled_from(["\ud800", "x\udfff", "user", "assistant", "system", "text", "image", "document", "tool_use"]),
    st.sampled_from(["tool_result", "base64", "image/png", "application/pdf", "object", "auto", "any", "tool", ""]),
)
JSON = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS | st.text(max_size=4), inner, max_size=5),
    max_leaves=40,
)
RICH = body(
    user(
        [
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ]
    ),
    assistant([{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "ok"}, USE]),
    user(
        [
            result(content=[{"type": "text", "text": "rain"}, {**PDF_BLOCK, "title": "r.pdf"}], is_error=False),
            {"type": "text", "text": "so?"},
        ]
    ),
    system=[{"type": "text", "text": "sys"}],
    tools=[WEATHER],
    tool_choice={"type": "tool", "name": "weather"},
    stop_sequences=["END"],
    metadata={"user_id": "u"},
    temperature=0.5,
    output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
)


def _survives(given: Any, read: Callable[[Any], ChatView] = chat_from_messages) -> None:
    """``given`` is read (into strict JSON) or refused with a ShapeError; a view without
    losses also translates back to Anthropic or is refused as an InvalidRequestError."""
    try:
        view = read(given)
    except ShapeError as refused:
        message = refused.message
    else:
        json.dumps(view.body, allow_nan=False, ensure_ascii=False).encode()
        if not view.lost and "max_tokens" in view.body:
            with suppress(InvalidRequestError):
                anthropic_body(request_of(view), model="claude", default_max_tokens=64)
        return
    assert message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_any_json_is_read_or_refused(given: Any) -> None:
    _survives(given)
    _survives({"model": "m", "max_tokens": 5, "messages": given})
    _survives(given, check_count_tokens)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*path, index))
    return found


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_valid_body_with_any_one_part_broken_is_read_or_refused(data: st.DataObject) -> None:
    given = json.loads(json.dumps(RICH))
    assert chat_from_messages(given).lost == ()
    path = data.draw(st.sampled_from(_paths(given)[1:]))
    parent = given
    for step in path[:-1]:
        parent = parent[step]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(JSON)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    _survives(given)
    _survives(given, check_count_tokens)


# -- round trips through providers._translate, both ways ----------------------------------

_WORDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=10).filter(str.strip)
_NAMES = st.from_regex(r"[a-zA-Z0-9_-]{1,64}", fullmatch=True).filter(lambda n: n != JSON_TOOL_NAME)
_INPUTS = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=4),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=8,
    ),
    max_size=3,
)
_SCHEMAS = st.builds(
    lambda props: {"type": "object", "properties": {p: {"type": "string"} for p in props}},
    st.lists(st.from_regex(r"[a-z]{1,5}", fullmatch=True), max_size=3),
)
_TEXT_BLOCKS = st.builds(lambda t: {"type": "text", "text": t}, _WORDS)
_IMAGE_BLOCKS = st.sampled_from(
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklGRg=="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        {
            "type": "document",
            "title": "brief.pdf",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
        },
    ]
)


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    tools = draw(
        st.lists(
            st.builds(
                lambda n, s, d: {"name": n, "input_schema": s, **d},
                _NAMES,
                _SCHEMAS,
                st.sampled_from([{}, {"description": "does it"}]),
            ),
            max_size=3,
            unique_by=lambda t: t["name"],
        )
    )
    names = [t["name"] for t in tools] or ["fn"]
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    exchanges = draw(st.integers(0, 3))
    for turn in range(exchanges + 1):
        results = [
            {
                "type": "tool_result",
                "tool_use_id": i,
                **draw(
                    st.sampled_from(
                        [
                            {},
                            {"content": "42"},
                            {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        ]
                    )
                ),
            }
            for i in pending
        ]
        more = draw(st.lists(_TEXT_BLOCKS | _IMAGE_BLOCKS, min_size=0 if results else 1, max_size=3))
        content: Any = draw(st.permutations([*results, *more]))
        messages.append(
            user(content[0]["text"] if len(content) == 1 and "text" in content[0] and draw(st.booleans()) else content)
        )
        if turn == exchanges:
            break
        texts = draw(st.lists(_TEXT_BLOCKS, max_size=2))
        pending = [f"toolu_{turn}_{n}" for n in range(draw(st.integers(0 if texts else 1, 2)))]
        uses = [
            {"type": "tool_use", "id": i, "name": draw(st.sampled_from(names)), "input": draw(_INPUTS)} for i in pending
        ]
        messages.append(assistant([*texts, *uses]))
    out: dict[str, Any] = {"model": "claude-test", "max_tokens": draw(st.integers(1, 10**6)), "messages": messages}
    system = draw(st.none() | _WORDS | st.lists(_TEXT_BLOCKS, min_size=1, max_size=3))
    if system is not None:
        out["system"] = system
    if draw(st.booleans()):
        out["temperature"] = draw(st.floats(0, 1))
    if draw(st.booleans()):
        out["top_p"] = draw(st.floats(0, 1, exclude_max=True))
    if draw(st.booleans()):
        out["stop_sequences"] = draw(st.lists(_WORDS, min_size=1, max_size=4))
    if tools:
        out["tools"] = tools
        choice = draw(
            st.sampled_from(
                [None, {"type": "auto"}, {"type": "any"}, {"type": "none"}, {"type": "tool", "name": names[0]}]
            )
        )
        if choice is not None:
            if choice["type"] != "none" and draw(st.booleans()):
                choice["disable_parallel_tool_use"] = draw(st.booleans())
            out["tool_choice"] = choice
    if draw(st.booleans()):
        out["metadata"] = {"user_id": f"user_{draw(st.uuids()).hex}"}
    return out


def canonical_anthropic(given: Mapping[str, Any]) -> dict[str, Any]:
    """The normalisations the translation documents: one text block is a string, system
    blocks one string, tool results open their turn (an empty one has no content), a
    top_p beside a temperature is not sent, disable_parallel_tool_use false is the default."""
    out = json.loads(json.dumps(given))
    if isinstance(out.get("system"), list):
        out["system"] = "\n\n".join(block["text"] for block in out["system"])
    for message in out["messages"]:
        content = message["content"]
        if isinstance(content, list):
            content.sort(key=lambda block: block["type"] != "tool_result")
            for block in content:
                if block["type"] == "tool_result" and not block.get("content"):
                    block.pop("content", None)
            if len(content) == 1 and content[0]["type"] == "text":
                message["content"] = content[0]["text"]
    if "temperature" in out:
        out.pop("top_p", None)
    if out.get("tool_choice", {}).get("disable_parallel_tool_use") is False:
        del out["tool_choice"]["disable_parallel_tool_use"]
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(anthropic_bodies())
def test_anthropic_to_chat_and_back_is_the_same_request(given: dict[str, Any]) -> None:
    view = chat_from_messages(given)
    assert view.lost == ()
    back = anthropic_body(request_of(view), model="claude-test", default_max_tokens=1)
    assert canonical_anthropic(back) == canonical_anthropic(given)


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    tools = draw(
        st.lists(
            st.builds(
                lambda n, s, d: {"type": "function", "function": {"name": n, "parameters": s, **d}},
                _NAMES,
                _SCHEMAS,
                st.sampled_from([{}, {"description": "does it"}]),
            ),
            max_size=3,
            unique_by=lambda t: t["function"]["name"],
        )
    )
    names = [t["function"]["name"] for t in tools] or ["fn"]
    parts = st.builds(lambda t: {"type": "text", "text": t}, _WORDS) | st.sampled_from(
        [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "file", "file": {"filename": "brief.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}},
        ]
    )
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_WORDS)})
    messages.append(user(draw(_WORDS | st.lists(parts, min_size=1, max_size=3))))
    for turn in range(draw(st.integers(0, 3))):
        calls = [
            {
                "id": f"call_{turn}_{n}",
                "type": "function",
                "function": {"name": draw(st.sampled_from(names)), "arguments": json.dumps(draw(_INPUTS))},
            }
            for n in range(draw(st.integers(0, 2)))
        ]
        said = draw(st.none() | _WORDS) if calls else draw(_WORDS)
        messages.append({"role": "assistant", "content": said, **({"tool_calls": calls} if calls else {})})
        for call in calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": draw(
                        _WORDS
                        | st.lists(st.builds(lambda t: {"type": "text", "text": t}, _WORDS), min_size=1, max_size=2)
                    ),
                }
            )
        if not calls or draw(st.booleans()):
            messages.append(user(draw(_WORDS | st.lists(parts, min_size=1, max_size=3))))
    out: dict[str, Any] = {"model": "claude-test", "messages": messages, "max_tokens": draw(st.integers(1, 10**6))}
    if draw(st.booleans()):
        out["temperature"] = draw(st.floats(0, 2))
    if draw(st.booleans()):
        out["top_p"] = draw(st.floats(0, 1, exclude_max=True))
    if draw(st.booleans()):
        out["stop"] = draw(_WORDS | st.lists(_WORDS, min_size=1, max_size=4))
    if tools:
        out["tools"] = tools
        choice = draw(
            st.sampled_from([None, "auto", "required", "none", {"type": "function", "function": {"name": names[0]}}])
        )
        if choice is not None:
            out["tool_choice"] = choice
        if draw(st.booleans()):
            out["parallel_tool_calls"] = draw(st.booleans())
    if draw(st.booleans()):
        out["user"] = f"user_{draw(st.uuids()).hex}"
    return out


def canonical_chat(given: Mapping[str, Any]) -> dict[str, Any]:
    """The normalisations: one text part is a string, arguments compact JSON, temperature
    at most 1 (Anthropic's range) and top_p not beside it, ``stop`` a list, tools with
    ``parallel_tool_calls: false`` say ``tool_choice: auto``, true is the default."""
    out = json.loads(json.dumps(given))
    for message in out["messages"]:
        content = message.get("content")
        if (
            message["role"] == "user"
            and isinstance(content, list)
            and len(content) == 1
            and content[0]["type"] == "text"
        ):
            message["content"] = content[0]["text"]
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(
                json.loads(call["function"]["arguments"]), separators=(",", ":"), ensure_ascii=False
            )
    if "temperature" in out:
        out["temperature"] = min(out["temperature"], 1.0)
        out.pop("top_p", None)
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    if out.get("parallel_tool_calls") is not False or out.get("tool_choice") == "none":
        out.pop("parallel_tool_calls", None)
    elif "tool_choice" not in out:
        out["tool_choice"] = "auto"
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_bodies())
def test_chat_to_anthropic_and_back_is_the_same_request(given: dict[str, Any]) -> None:
    rest = dict(given)
    request = Request(
        rest.pop("model"),
        rest.pop("messages"),
        max_tokens=rest.pop("max_tokens"),
        temperature=rest.pop("temperature", None),
        params=rest,
    )
    view = chat_from_messages(anthropic_body(request, model="claude-test", default_max_tokens=1))
    assert view.lost == ()
    assert canonical_chat(view.body) == canonical_chat(given)


# -- the answer: a chat.completion as an Anthropic Message ---------------------------------


def completion(message: dict[str, Any], finish: str | None = "stop", **usage: Any) -> dict[str, Any]:
    counts = {"prompt_tokens": 30, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 10}, **usage}
    return {
        "id": "chatcmpl-abc.1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": counts,
    }


def call(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_text_answer() -> None:
    message = message_from_chat(completion({"role": "assistant", "content": "Hello."}), model="claude-test")
    assert message == {
        "id": "msg_chatcmpl-abc_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": "Hello."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 10,
            "output_tokens": 7,
        },
    }
    assert anthropic.types.Message.model_validate(message).usage.input_tokens == 20


def test_tool_calls_are_tool_use_blocks_after_the_text() -> None:
    calls = [
        call("call_1", "weather", '{"city": "Oslo"}'),
        call("call:2/x", "clock", ""),
        call(None, "w", "[1, 2]"),
        call("c4", "w", '{"cut": '),
    ]
    message = message_from_chat(
        completion({"role": "assistant", "content": "Looking.", "tool_calls": calls}, "tool_calls"), model="m"
    )
    assert message["stop_reason"] == "tool_use"
    text, *uses = message["content"]
    assert text == {"type": "text", "text": "Looking."}
    assert [u["input"] for u in uses] == [
        {"city": "Oslo"},
        {},
        {UNPARSED_ARGUMENTS: "[1, 2]"},
        {UNPARSED_ARGUMENTS: '{"cut": '},
    ]
    assert [u["id"] for u in uses][:2] == ["call_1", "call_2_x"]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]+", u["id"]) for u in uses)
    anthropic.types.Message.model_validate(message)


@pytest.mark.parametrize(
    ("finish", "calls", "reason"),
    [
        ("stop", False, "end_turn"),
        ("length", False, "max_tokens"),
        ("tool_calls", True, "tool_use"),
        ("function_call", True, "tool_use"),
        ("content_filter", False, "refusal"),
        ("stop", True, "tool_use"),  # a provider that says "stop" but called tools
        ("length", True, "max_tokens"),
        (None, False, "end_turn"),
        ("pause_turn", False, "pause_turn"),
        ("something_new", False, "end_turn"),
    ],
)
def test_stop_reasons(finish: str | None, calls: bool, reason: str) -> None:
    said: dict[str, Any] = {"role": "assistant", "content": "x"}
    if calls:
        said["tool_calls"] = [call("c", "w", "{}")]
    assert message_from_chat(completion(said, finish), model="m")["stop_reason"] == reason


def test_a_refusal_is_the_answers_text() -> None:
    message = message_from_chat(
        completion({"role": "assistant", "content": None, "refusal": "I can't help with that."}), model="m"
    )
    assert message["content"] == [{"type": "text", "text": "I can't help with that."}]
    assert message["stop_reason"] == "refusal"


def test_the_usage_of_the_result_wins_it_knows_cache_writes() -> None:
    message = message_from_chat(
        completion({"role": "assistant", "content": "x"}), model="m", usage=Usage(100, 8, 30, 0, 50)
    )
    assert message["usage"] == {
        "input_tokens": 20,
        "cache_creation_input_tokens": 50,
        "cache_read_input_tokens": 30,
        "output_tokens": 8,
    }
    assert usage_from(Usage(5, 1, 9)) == {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 9,
        "output_tokens": 1,
    }


def test_an_anthropic_deployments_own_answer_is_returned_as_it_is() -> None:
    native = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-real",
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
        "usage": {"input_tokens": 3, "output_tokens": 1, "cache_creation_input_tokens": 9},
    }
    message = message_from_chat(
        {**completion({"role": "assistant", "content": "Hi"}), "provider_response": native}, model="claude-alias"
    )
    assert message == {**native, "model": "claude-alias"}
    counted = message_from_chat({"provider_response": native}, model="m", usage=Usage(12, 1, 0, 0, 9))
    assert counted["usage"] == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 9,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    json_mode = {**native, "content": [{"type": "tool_use", "id": "t", "name": JSON_TOOL_NAME, "input": {"a": 1}}]}
    built = message_from_chat(
        {**completion({"role": "assistant", "content": '{"a": 1}'}), "provider_response": json_mode}, model="m"
    )
    assert built["content"] == [{"type": "text", "text": '{"a": 1}'}]  # the client never defined sluice's JSON tool


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"choices": []},
        {"choices": [5]},
        {"choices": [{"message": None}]},
        {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]},
        {"id": 5, "usage": {"prompt_tokens": -3, "completion_tokens": "x"}},
        {"choices": [{"message": {"tool_calls": [5, {"function": None}, {"function": {"name": 5, "arguments": 7}}]}}]},
    ],
)
def test_odd_completions_still_make_a_valid_message(raw: dict[str, Any]) -> None:
    anthropic.types.Message.model_validate(message_from_chat(raw, model="m"))


def test_the_deprecated_function_call_is_a_tool_use() -> None:
    message = message_from_chat(
        completion(
            {"role": "assistant", "content": None, "function_call": {"name": "w", "arguments": '{"a":1}'}},
            "function_call",
        ),
        model="m",
    )
    assert [(b["type"], b["name"], b["input"]) for b in message["content"]] == [("tool_use", "w", {"a": 1})]
    assert message["content"][0]["id"].startswith("toolu_")


def test_arguments_a_provider_gave_as_an_object_are_the_input() -> None:
    message = message_from_chat(
        completion({"role": "assistant", "tool_calls": [call("c", "w", {"a": 1})]}, "tool_calls"), model="m"
    )
    assert message["content"][0]["input"] == {"a": 1}


def test_tool_use_ids() -> None:
    assert tool_use_id("toolu_01ABC") == "toolu_01ABC"
    assert tool_use_id("functions.Bash:0") == "functions_Bash_0"
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", tool_use_id(None))


# -- the stream: sluice's deltas as Anthropic's events --------------------------------------


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        if chunk:
            head, data = chunk.split("\n")
            assert head.startswith("event: ")
            assert data.startswith("data: ")
            event = json.loads(data.removeprefix("data: "))
            assert event["type"] == head.removeprefix("event: ")
            out.append((event["type"], event))
    return out


def mixed_stream() -> bytes:
    """Text, two tool calls (the second with an id Anthropic would refuse), more text."""
    stream = MessagesEvents("chatcmpl-xyz")
    return b"".join(
        [
            stream.start("claude-test", Usage(input_tokens=120, cached_input_tokens=100)),
            stream.ping(),
            stream.delta(TextDelta("Let me ")),
            stream.delta(TextDelta("check.")),
            stream.delta(ToolCallDelta(0, "call_a", "weather", "")),
            stream.delta(ToolCallDelta(0, arguments='{"ci')),
            stream.delta(ToolCallDelta(0, arguments='ty": "Oslo"}')),
            stream.delta(ToolCallDelta(1, "call:b", "clock")),
            stream.delta(ToolCallDelta(1, arguments="{}")),
            stream.finish("tool_calls", Usage(120, 33, 100)),
        ]
    )


def test_the_events_and_their_block_indexes() -> None:
    kinds = [
        (kind, event.get("index"), (event.get("content_block") or event.get("delta") or {}).get("type"))
        for kind, event in events_of(mixed_stream())
    ]
    assert kinds == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "tool_use"),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    start, end = events_of(mixed_stream())[0][1], events_of(mixed_stream())[-2][1]
    assert start["message"]["usage"] == {
        "input_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 100,
        "output_tokens": 0,
    }
    assert end == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {
            "input_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 100,
            "output_tokens": 33,
        },
    }


def test_text_after_a_tool_call_is_a_new_block_and_empty_text_nothing() -> None:
    stream = MessagesEvents()
    stream.start("m")
    assert stream.delta(TextDelta("")) == b""
    stream.delta(ToolCallDelta(0, "c", "w", "{}"))
    kinds = [(k, e.get("index")) for k, e in events_of(stream.delta(TextDelta("done")))]
    assert kinds == [("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1)]
    assert events_of(stream.finish("stop"))[1][1]["delta"]["stop_reason"] == "tool_use"


def test_the_stream_is_used_in_order() -> None:
    stream = MessagesEvents()
    with pytest.raises(ValueError, match="start"):
        stream.delta(TextDelta("x"))
    stream.start("m")
    with pytest.raises(ValueError, match="already started"):
        stream.start("m")
    stream.delta(ToolCallDelta(0, "a", "w"))
    stream.delta(ToolCallDelta(1, "b", "w"))
    assert stream.delta(ToolCallDelta(0)) == b""  # nothing more of call 0
    with pytest.raises(ValueError, match="cannot interleave"):
        stream.delta(ToolCallDelta(0, arguments="{}"))
    assert events_of(stream.error("overloaded_error", "Overloaded")) == [
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    ]
    with pytest.raises(ValueError, match="ended"):
        stream.finish("stop")
    with pytest.raises(ValueError, match="ended"):
        stream.error("api_error", "again")


def test_a_lone_surrogate_from_a_provider_still_makes_valid_json() -> None:
    stream = MessagesEvents()
    stream.start("m")
    (_, _), (_, delta) = events_of(stream.delta(TextDelta("a\ud800b")))
    assert delta["delta"]["text"] == "a\ud800b"


# -- read by the official anthropic SDK from a loopback server ------------------------------


@asynccontextmanager
async def answering(status: int, payload: bytes, content_type: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """An SDK client whose /v1/messages answers ``payload`` (and records what was asked)."""
    asked: list[Any] = []

    async def messages(request: web.Request) -> web.Response:
        asked.append(await request.json())
        return web.Response(status=status, body=payload, content_type=content_type)

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with anthropic.AsyncAnthropic(
            base_url=f"http://{host}:{port}", api_key="x", max_retries=0, _strict_response_validation=True
        ) as client:
            yield client
    finally:
        await runner.cleanup()


ASK: dict[str, Any] = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


async def test_the_sdk_reads_a_stream_of_text() -> None:
    stream = MessagesEvents("chatcmpl-1")
    raw = (
        stream.start("claude-test", Usage(12, 0, 2))
        + stream.delta(TextDelta("Hel"))
        + stream.ping()
        + stream.delta(TextDelta("lo"))
        + stream.finish("stop", Usage(12, 5, 2))
    )
    async with answering(200, raw, "text/event-stream") as client, client.messages.stream(**ASK) as reading:
        texts = [text async for text in reading.text_stream]
        message = await reading.get_final_message()
    assert "".join(texts) == "Hello"
    assert message.id == "msg_chatcmpl-1"
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (
        10,
        2,
        5,
    )


async def test_the_sdk_reads_text_and_two_tool_calls() -> None:
    async with answering(200, mixed_stream(), "text/event-stream") as client, client.messages.stream(**ASK) as reading:
        message = await reading.get_final_message()
    text, weather, clock = message.content
    assert text.type == "text"
    assert text.text == "Let me check."
    assert weather.type == "tool_use"
    assert (weather.id, weather.name, weather.input) == ("call_a", "weather", {"city": "Oslo"})
    assert clock.type == "tool_use"
    assert (clock.id, clock.name, clock.input) == ("call_b", "clock", {})
    assert message.stop_reason == "tool_use"
    assert message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (
        20,
        100,
        33,
    )


async def test_the_sdk_reads_the_raw_events_of_create_stream_true() -> None:
    async with answering(200, mixed_stream(), "text/event-stream") as client:
        events = [event async for event in await client.messages.create(**ASK, stream=True)]
    assert [event.type for event in events] == [kind for kind, _ in events_of(mixed_stream()) if kind != "ping"]
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta" and e.index == 1
    )
    assert json.loads(partial) == {"city": "Oslo"}


async def test_the_sdk_raises_on_an_error_event_mid_stream() -> None:
    stream = MessagesEvents()
    raw = (
        stream.start("claude-test")
        + stream.delta(TextDelta("partial"))
        + stream.error("overloaded_error", "Overloaded")
    )
    seen: list[str] = []

    async def read(client: anthropic.AsyncAnthropic) -> None:
        async with client.messages.stream(**ASK) as reading:
            async for text in reading.text_stream:
                seen.append(text)

    async with answering(200, raw, "text/event-stream") as client:
        with pytest.raises(anthropic.APIStatusError) as failed:
            await read(client)
    assert seen == ["partial"]
    assert failed.value.body == anthropic_error_body("overloaded_error", "Overloaded")


async def test_the_sdk_reads_a_whole_message() -> None:
    built = message_from_chat(
        completion(
            {"role": "assistant", "content": "Sure.", "tool_calls": [call("call_9", "weather", '{"city":"Rome"}')]},
            "tool_calls",
        ),
        model="claude-test",
    )
    async with answering(200, json.dumps(built).encode(), "application/json") as client:
        message = await client.messages.create(**ASK)
    assert message.model_dump(exclude_none=True) == anthropic.types.Message.model_validate(built).model_dump(
        exclude_none=True
    )
    assert message.content[1].type == "tool_use"
    assert message.content[1].input == {"city": "Rome"}
    assert message.stop_reason == "tool_use"


# -- errors ---------------------------------------------------------------------------------

SDK_ERRORS = [
    (400, "invalid_request_error", anthropic.BadRequestError),
    (401, "authentication_error", anthropic.AuthenticationError),
    (402, "billing_error", anthropic.PaymentRequiredError),
    (403, "permission_error", anthropic.PermissionDeniedError),
    (404, "not_found_error", anthropic.NotFoundError),
    (413, "request_too_large", anthropic.ContentTooLargeError),
    (429, "rate_limit_error", anthropic.RateLimitError),
    (500, "api_error", anthropic.InternalServerError),
    (504, "timeout_error", anthropic.GatewayTimeoutError),
    (529, "overloaded_error", anthropic.OverloadedError),
]


@pytest.mark.parametrize(("status", "kind", "raised"), SDK_ERRORS)
async def test_the_sdk_raises_the_error_of_each_status(status: int, kind: str, raised: type[Exception]) -> None:
    assert error_type_for(status) == kind
    assert status_for(kind) == status
    assert ERROR_TYPES[status] == kind
    error = anthropic_error_body(kind, "what went wrong")
    async with answering(status, json.dumps(error).encode(), "application/json") as client:
        with pytest.raises(raised) as failed:
            await client.messages.create(**ASK)
    assert failed.value.body == error
    assert "what went wrong" in str(failed.value)


def test_other_statuses_and_types() -> None:
    assert error_type_for(422) == "invalid_request_error"
    assert error_type_for(409) == "invalid_request_error"
    assert error_type_for(503) == "overloaded_error"
    assert error_type_for(502) == "api_error"
    assert status_for("some_new_error") == 500


def test_a_shape_error_is_a_400_body() -> None:
    with pytest.raises(ShapeError) as refused:
        chat_from_messages(_with(temperature=3))
    assert anthropic_error_body(error_type_for(400), refused.value.message) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "temperature: must be a number from 0 to 1, got 3"},
    }
