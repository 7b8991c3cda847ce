"""What ``sluice serve`` answers is a chat completion whatever the provider behind it: the
simulated provider (the README's no-key demo) and a callable have no OpenAI body of their
own, so the server builds one from the Result."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from servetools import serving

from sluice import Deployment
from sluice.testing import FakeServer


async def test_a_provider_without_an_openai_body_still_answers_a_chat_completion(tmp_path: Path) -> None:
    async with serving([Deployment("simulate/demo")], tmp_path) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="anything", max_retries=0)
        reply = await client.chat.completions.create(
            model="simulate/demo", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        await client.close()
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert "hi" in (reply.choices[0].message.content or "")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0


async def test_an_upstream_that_refuses_the_servers_key_is_a_502_not_the_clients_401(tmp_path: Path) -> None:
    """The client's own key was fine: a 401 would make the SDK blame it (AuthenticationError)."""
    async with (
        FakeServer(api_key="sk-the-right-one") as upstream,
        serving([Deployment("openai/gpt-test", base_url=upstream.url, api_key="sk-a-wrong-one")], tmp_path) as url,
    ):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="anything", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="openai/gpt-test", messages=[{"role": "user", "content": "hi"}])
        await client.close()
    assert caught.value.status_code == 502
    assert not isinstance(caught.value, openai.AuthenticationError)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["code"] == "upstream_auth_failed"
    assert "sk-a-wrong" not in str(body)
    assert upstream.url not in str(body)
