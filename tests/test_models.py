"""Values: validation with clear messages, content keys, secrets that stay secret."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import sluice
from sluice import ConfigError, Deployment, InvalidRequestError, Request, Result, Secret, request_key
from sluice._tokens import estimate_message_tokens, estimate_text_tokens

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "", "messages": MESSAGES}, "model must be a non-empty string"),
        ({"model": "m", "messages": []}, "messages is empty"),
        ({"model": "m", "messages": "hello"}, "messages must be a list"),
        ({"model": "m", "messages": [42]}, r"messages\[0\] must be an object"),
        ({"model": "m", "messages": [{"content": "x"}]}, r"messages\[0\] needs a 'role'"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, r"content must be a string"),
        ({"model": "m", "messages": [{"role": "user"}]}, r"messages\[0\] has no 'content'"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": True}, "max_tokens must be a positive integer"),
        ({"model": "m", "messages": MESSAGES, "temperature": -1}, "temperature must be a number"),
        ({"model": "m", "messages": MESSAGES, "params": []}, "params must be a mapping"),
        ({"model": "m", "messages": MESSAGES, "id": 5}, "id must be a string"),
    ],
)
def test_invalid_requests_are_refused_with_a_reason(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        Request(**kwargs)


def test_a_request_id_that_is_not_valid_unicode_is_refused_clearly() -> None:
    with pytest.raises(InvalidRequestError, match="not valid Unicode"):
        Request.from_prompt("openai/gpt-x", "hi", id="file-\udcff.txt")


def test_request_key_is_content_and_ignores_metadata() -> None:
    a = Request("openai/gpt-4o-mini", MESSAGES, max_tokens=5, metadata={"row": 1})
    b = Request("openai/gpt-4o-mini", [{"role": "user", "content": "hi"}], max_tokens=5, metadata={"row": 2})
    c = Request("openai/gpt-4o-mini", MESSAGES, max_tokens=6)
    assert request_key(a) == request_key(b)
    assert request_key(a) != request_key(c)
    assert Result(a).id == request_key(a)
    assert Result(Request("m", MESSAGES, id="row-7")).id == "row-7"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rpm": 0}, "rpm must be a positive number"),
        ({"tpm": -5}, "tpm must be a positive number"),
        ({"max_in_flight": 0}, "max_in_flight must be a positive integer"),
        ({"window": 0}, "window must be a positive"),
        ({"burst_requests": -1}, "burst_requests must be a number >= 0"),
        ({"base_url": "localhost:8000"}, "base_url must start with http"),
    ],
)
def test_invalid_deployments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Deployment("openai/gpt-4o-mini", **kwargs)


def test_less_than_one_request_per_window_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 1 per window"):
        Deployment("openai/x", rpm=0.5)


@pytest.mark.parametrize(
    ("model", "kwargs", "provider", "name"),
    [
        ("openai/gpt-4o-mini", {}, "openai", "gpt-4o-mini"),
        ("gpt-4o-mini", {}, "openai", "gpt-4o-mini"),
        ("anthropic/claude-sonnet-4", {}, "anthropic", "claude-sonnet-4"),
        ("simulate/fast", {}, "simulate", "fast"),
        (
            "meta-llama/Llama-3-8B",
            {"base_url": "http://localhost:8000/v1"},
            "openai",
            "meta-llama/Llama-3-8B",
        ),
        ("azure/my-deployment", {}, "azure", "my-deployment"),
    ],
)
def test_provider_and_model_names(model: str, kwargs: dict[str, Any], provider: str, name: str) -> None:
    d = Deployment(model, **kwargs)
    assert (d.provider_name, d.model_name) == (provider, name)


def test_secrets_never_show() -> None:
    d = Deployment("openai/gpt-4o-mini", api_key="sk-very-secret")
    assert "sk-very-secret" not in repr(d)
    assert "sk-very-secret" not in repr(d.api_key)
    assert "sk-very-secret" not in str(d.api_key)
    assert isinstance(d.api_key, Secret)
    assert d.api_key.get() == "sk-very-secret"
    with pytest.raises(TypeError):
        pickle.dumps(d.api_key)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("abcd", 1), ("abcde", 2), ("a" * 400, 100), ("日本語", 3), ("héllo", 2)],
)
def test_text_token_estimate(text: str, tokens: int) -> None:
    assert estimate_text_tokens(text) == tokens


def test_message_token_estimate_counts_overheads_parts_and_tools() -> None:
    assert estimate_message_tokens([{"role": "user", "content": "abcd"}]) == 3 + 4 + 1
    parts = [{"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]}]
    assert estimate_message_tokens(parts) == 3 + 4 + 1 + 765
    with_tools = estimate_message_tokens(MESSAGES, {"tools": [{"name": "x" * 40}]})
    assert with_tools > estimate_message_tokens(MESSAGES)


def test_public_surface_is_curated() -> None:
    assert sorted(sluice.__all__) == sorted(set(sluice.__all__))
    for name in sluice.__all__:
        assert getattr(sluice, name) is not None
    assert {"Engine", "Request", "Result", "Deployment", "RetryPolicy", "SluiceError", "run"} <= set(sluice.__all__)
    for name in sluice.__all__:
        obj = getattr(sluice, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, sluice.SluiceError)


def test_import_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, sluice; print('aiohttp' in sys.modules, 'asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
