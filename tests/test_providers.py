"""Providers: request bodies, header parsing and key handling, as pure functions where possible."""

from __future__ import annotations

import pytest

from sluice import ConfigError, Deployment, Request
from sluice.providers import AnthropicProvider, AzureOpenAIProvider, HttpTransport, OpenAIProvider
from sluice.providers._anthropic import parse_rfc3339_reset
from sluice.providers._openai import parse_openai_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1m30.5s", 90.5),
        ("1h2m3s", 3723.0),
        ("0s", 0.0),
        ("2.5", 2.5),  # some compatible servers send bare seconds
        ("", None),
        (None, None),
        ("soon", None),
        ("5x", None),
    ],
)
def test_openai_reset_durations(text: str | None, seconds: float | None) -> None:
    assert parse_openai_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2023-11-14T22:13:50Z", 30.0),
        ("2023-11-14T22:13:50.500+00:00", 30.5),
        ("2023-11-14T22:12:00Z", 0.0),
        ("2023-11-14T22:13:50", None),  # no timezone: unreadable, not guessed
        ("tomorrow", None),
    ],
)
def test_anthropic_reset_timestamps(value: str, seconds: float | None) -> None:
    assert parse_rfc3339_reset(value, now=1_700_000_000.0) == seconds


REQUEST = Request(
    "openai/gpt-4o-mini",
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    max_tokens=50,
    temperature=0.2,
    params={"top_p": 0.9, "response_format": {"type": "json_object"}},
)


def test_openai_body_passes_parameters_through_and_names_the_cap_per_server() -> None:
    provider = OpenAIProvider(HttpTransport())
    official = provider.build_body(REQUEST, Deployment("openai/gpt-4o-mini", base_url="https://api.openai.com/v1"))
    assert official["model"] == "gpt-4o-mini"
    assert official["max_completion_tokens"] == 50  # reasoning models refuse max_tokens
    assert official["top_p"] == 0.9
    assert official["response_format"] == {"type": "json_object"}
    vllm = provider.build_body(REQUEST, Deployment("meta-llama/Llama-3-8B", base_url="http://localhost:8000/v1"))
    assert vllm["model"] == "meta-llama/Llama-3-8B"
    assert vllm["max_tokens"] == 50


def test_openai_endpoint_honours_the_sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    url, headers = OpenAIProvider(HttpTransport()).endpoint(Deployment("openai/gpt-4o-mini"))
    assert url == "http://127.0.0.1:9/v1/chat/completions"
    assert headers["authorization"] == "Bearer sk-from-env"


def test_a_missing_key_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="no API key; set \\$OPENAI_API_KEY"):
        OpenAIProvider(HttpTransport()).endpoint(Deployment("openai/gpt-4o-mini"))
    with pytest.raises(ConfigError, match="MY_KEY \\(its api_key_env\\) is not set"):
        OpenAIProvider(HttpTransport()).endpoint(Deployment("openai/gpt-4o-mini", api_key_env="MY_KEY"))
    # a local server that needs no key still takes one, as with the official SDK, and the error says so
    with pytest.raises(ConfigError, match="OPENAI_API_KEY=EMPTY"):
        OpenAIProvider(HttpTransport()).endpoint(Deployment("llama3", base_url="http://localhost:11434/v1"))
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    _, headers = OpenAIProvider(HttpTransport()).endpoint(Deployment("llama3", base_url="http://localhost:11434/v1"))
    assert headers["authorization"] == "Bearer EMPTY"


def test_anthropic_body_moves_system_messages_and_requires_max_tokens() -> None:
    provider = AnthropicProvider(HttpTransport())
    body = provider.build_body(REQUEST, Deployment("anthropic/claude-sonnet-4", default_max_tokens=777))
    assert body["system"] == "be brief"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 50
    no_cap = provider.build_body(
        Request.from_prompt("anthropic/x", "hi"), Deployment("anthropic/x", default_max_tokens=777)
    )
    assert no_cap["max_tokens"] == 777
    url, headers = provider.endpoint(Deployment("anthropic/x", api_key="sk-ant"))
    assert url == "https://api.anthropic.com/v1/messages"
    assert headers == {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}


def test_azure_endpoint() -> None:
    deployment = Deployment(
        "azure/my-gpt4o", base_url="https://acme.openai.azure.com", api_key="k", options={"api_version": "2024-06-01"}
    )
    url, headers = AzureOpenAIProvider(HttpTransport()).endpoint(deployment)
    assert url == "https://acme.openai.azure.com/openai/deployments/my-gpt4o/chat/completions?api-version=2024-06-01"
    assert headers == {"api-key": "k"}


def test_openai_usage_and_ratelimit_parsing() -> None:
    provider = OpenAIProvider(HttpTransport())
    reply = provider.parse_reply(
        {
            "choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 40,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        }
    )
    assert reply.text == "hello"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (100, 40)
    assert (reply.usage.cached_input_tokens, reply.usage.reasoning_tokens) == (64, 12)
    snapshot = provider.parse_ratelimit(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-remaining-tokens": "oops",
        }
    )
    assert snapshot is not None
    assert (snapshot.limit_requests, snapshot.remaining_requests, snapshot.reset_requests) == (500, 499, 0.12)
    assert snapshot.remaining_tokens is None
    assert (snapshot.requests_window, snapshot.tokens_window) == (60.0, 60.0)  # OpenAI counts per minute
    assert provider.parse_ratelimit({}) is None


def test_anthropic_ratelimit_parsing_counts_per_minute() -> None:
    snapshot = AnthropicProvider(HttpTransport()).parse_ratelimit(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2999-01-01T00:00:00Z",
            "anthropic-ratelimit-tokens-limit": "40000",
            "anthropic-ratelimit-tokens-remaining": "39000",
        }
    )
    assert snapshot is not None
    assert (snapshot.limit_requests, snapshot.remaining_requests) == (50, 49)
    assert (snapshot.limit_tokens, snapshot.remaining_tokens, snapshot.reset_tokens) == (40000, 39000, None)
    assert snapshot.reset_requests is not None
    assert snapshot.reset_requests > 0
    assert (snapshot.requests_window, snapshot.tokens_window) == (60.0, 60.0)
    assert AnthropicProvider(HttpTransport()).parse_ratelimit({"x-ratelimit-remaining-requests": "1"}) is None
