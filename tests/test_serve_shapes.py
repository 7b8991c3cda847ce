"""What ``sluice serve`` answers is a chat completion whatever the provider behind it: the
simulated provider (the README's no-key demo) and a callable have no OpenAI body of their
own, so the server builds one from the Result."""

from __future__ import annotations

from pathlib import Path

import openai
from test_serve import serving

from sluice import Deployment


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
