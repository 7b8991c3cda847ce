"""Embeddings of token arrays (``input`` as token ids, as OpenAI's API takes them, and as
LangChain's ``OpenAIEmbeddings()`` sends by default): passed on as they are, counted by
their length, refused clearly where a deployment takes text only."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from fake_provider import deployment_at
from servetools import ALICE_KEY, PRICE, embedder, fake, sdk, serving

from sluice import EmbeddingError, Engine
from sluice.serve.core._settings import ClientSpec
from sluice.store import SqliteStore

ARRAYS = [[1712, 374, 264], [49725, 13, 7, 99]]


async def test_token_arrays_are_embedded_through_serve_and_reach_the_upstream_as_they_are(tmp_path: Path) -> None:
    async with fake() as upstream, serving([embedder(upstream)], tmp_path) as url:
        client = sdk(url)
        many = await client.embeddings.create(model="text-embedding-3-small", input=ARRAYS)
        one = await client.embeddings.create(model="text-embedding-3-small", input=[5, 6, 7, 8, 9])
        await client.close()
        assert [d.index for d in many.data] == [0, 1]
        assert all(len(d.embedding) == 1536 for d in [*many.data, *one.data])
        assert many.data[0].embedding != many.data[1].embedding
        assert many.usage.prompt_tokens == 7  # a token array is as many tokens as it is long
        assert one.usage.prompt_tokens == 5
        assert upstream.embeddings.token_arrays == [*ARRAYS, [5, 6, 7, 8, 9]]  # passed on as they are


async def test_a_token_arrays_length_is_what_the_clients_tpm_counts(tmp_path: Path) -> None:
    limited = ClientSpec("alice", "ALICE_KEY", tpm=100)
    async with fake() as upstream, serving([embedder(upstream)], tmp_path, clients=(limited,)) as url:
        client = sdk(url, key=ALICE_KEY)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model="text-embedding-3-small", input=list(range(150)))
        assert "exceed client 'alice''s tpm" in caught.value.message  # 150 tokens, not ~4 of characters
        answer = await client.embeddings.create(model="text-embedding-3-small", input=list(range(60)))
        assert answer.usage.prompt_tokens == 60
        with pytest.raises(openai.RateLimitError) as limited_error:  # 60 + 60 > 100 a minute
            await client.embeddings.create(
                model="text-embedding-3-small", input=list(range(60)), extra_headers={"x-sluice-max-wait": "0"}
            )
        assert "client 'alice'" in limited_error.value.message
        await client.close()
        assert upstream.embeddings.texts_embedded == 1


async def test_a_deployment_that_takes_text_only_refuses_token_arrays_with_a_clear_400(tmp_path: Path) -> None:
    async with fake() as upstream:
        text_only = deployment_at(
            upstream, "openai/text-embedding-3-small", price=PRICE, options={"embed_token_arrays": False}
        )
        async with serving([text_only], tmp_path) as url:
            client = sdk(url)
            with pytest.raises(openai.BadRequestError) as caught:
                await client.embeddings.create(model="text-embedding-3-small", input=ARRAYS)
            text = await client.embeddings.create(model="text-embedding-3-small", input=["a sluice"])
            await client.close()
        assert "is a token array" in caught.value.message
        assert "takes text only; send the text" in caught.value.message
        assert len(text.data) == 1
        assert upstream.embeddings.batch_sizes == [1]  # the arrays were never sent


@pytest.mark.parametrize(
    "given",
    [[[]], [[1, -2]], [[1, True]], [1, "a"], [["a"], [1]], [1.5]],
    ids=["empty", "negative", "bool", "mixed", "mixed-arrays", "float"],
)
async def test_what_is_not_a_token_array_is_refused_naming_input(tmp_path: Path, given: list[object]) -> None:
    async with fake() as upstream, serving([embedder(upstream)], tmp_path) as url:
        client = sdk(url)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model="text-embedding-3-small", input=given)  # type: ignore[arg-type]
        await client.close()
        assert caught.value.param is not None
        assert caught.value.param.startswith("input")
        assert upstream.stats.received == 0


async def test_the_engine_embeds_token_arrays_and_stores_them_apart_from_texts(tmp_path: Path) -> None:
    async with fake() as upstream:
        store = SqliteStore(tmp_path / "state.db")
        async with Engine(embedder(upstream), store=store) as engine:
            vectors = await engine.embed([[1, 2, 3], "1,2,3", (1, 2, 3)], model="openai/text-embedding-3-small")
            again = await engine.embed([[1, 2, 3]], model="openai/text-embedding-3-small")
            with pytest.raises(EmbeddingError) as caught:
                await engine.embed([[1, -1]], model="openai/text-embedding-3-small")
        store.close()
        assert vectors[0] != vectors[1]  # an array is not the text of its numbers
        assert vectors[0] == vectors[2] == again[0]
        assert upstream.embeddings.texts_embedded == 2  # the same array once; the rerun from the store
        assert "token array" in str(caught.value)
