"""Embeddings end to end: real HTTP over loopback to the fake's ``/v1/embeddings``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import signal
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from clitools import read_output, run_cli, start_cli, wait_until, write_jsonl
from fake_provider import deployment_at

import sluice
from sluice import (
    BadRequestError,
    BudgetExhaustedError,
    Deployment,
    EmbeddingError,
    EmbeddingResult,
    Engine,
    InvalidRequestError,
    Price,
    RetryPolicy,
)
from sluice.providers import AzureOpenAIProvider, HttpTransport, OpenAIProvider
from sluice.store import SqliteStore
from sluice.testing import FakeServer
from sluice.testing._embeddings import REJECT_MARKER, fake_vector

MODEL = "openai/text-embedding-3-small"
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=10.0)


def texts(n: int, start: int = 0) -> list[str]:
    return [f"text number {i}" for i in range(start, start + n)]


def expected(text: str, dimensions: int) -> list[float]:
    return array("f", fake_vector(text, dimensions)).tolist()


# -- the library -----------------------------------------------------------------------------


async def test_vectors_come_back_in_input_order(server: FakeServer) -> None:
    server.latency_jitter = 0.02  # packs finish out of order
    inputs = texts(3000)
    async with Engine(deployment_at(server, MODEL), retry=FAST_RETRY) as engine:
        vectors = await engine.embed(inputs, model=MODEL, dimensions=8, batch_size=100)
        unordered = [r async for r in engine.embed_map(inputs, model=MODEL, dimensions=8, batch_size=100)]
        ordered = [r.index async for r in engine.embed_map(inputs, model=MODEL, dimensions=8, ordered=True)]
    assert len(vectors) == 3000
    assert all(isinstance(v, array) and v.typecode == "f" for v in vectors)
    assert [v.tolist() for v in vectors] == [expected(t, 8) for t in inputs]
    assert sorted(r.index for r in unordered) == list(range(3000))
    assert ordered == list(range(3000))


async def test_5000_texts_go_in_a_few_requests_each_within_the_limits(server: FakeServer) -> None:
    async with Engine(deployment_at(server, MODEL)) as engine:
        vectors = await engine.embed(texts(5000), model=MODEL, dimensions=4)
    assert len(vectors) == 5000
    assert server.stats.received == 3  # 2048 + 2048 + 904
    assert sorted(server.embeddings.batch_sizes) == [904, 2048, 2048]
    assert set(server.stats.by_status) == {200}  # the fake refuses anything over OpenAI's limits
    assert engine.stats.succeeded == 5000
    assert engine.stats.attempts == 3


async def test_packs_stay_within_the_request_token_limit_and_tpm(server: FakeServer) -> None:
    long_texts = [f"{i} " + "word " * 400 for i in range(200)]  # ~500 tokens each
    server.embeddings.max_tokens = 20_000  # as the deployment says below
    async with Engine(deployment_at(server, MODEL, options={"embed_batch_tokens": 20_000})) as engine:
        await engine.embed(long_texts, model=MODEL, dimensions=4)
    assert set(server.stats.by_status) == {200}
    assert max(server.embeddings.batch_tokens) <= 20_000
    assert server.stats.received == math.ceil(sum(server.embeddings.batch_tokens) / 20_000)


async def test_a_tpm_limit_caps_each_request_and_is_never_broken() -> None:
    # The server allows twice what the deployment says: its clock sees a window's edge a few
    # ms later than the client's (the first request also opens the connection), so two
    # full packs may share one of its windows, never three. A client that ignored its TPM
    # would send all 9,000 tokens at once: 429s.
    async with FakeServer(api_key="sk-test", tpm=6000, window=1.0) as server:
        engine = Engine(deployment_at(server, MODEL, tpm=3000, window=1.0))
        async with engine:
            vectors = await engine.embed(texts(2250), model=MODEL, dimensions=4)  # 9,000 tokens
    assert len(vectors) == 2250
    assert server.stats.rate_limited == 0
    assert max(server.embeddings.batch_tokens) <= 3000
    assert server.stats.received == 3


async def test_a_text_the_server_rejects_fails_alone(server: FakeServer) -> None:
    inputs = texts(5000)
    inputs[3333] = f"this one is {REJECT_MARKER}"
    async with Engine(deployment_at(server, MODEL)) as engine:
        with pytest.raises(EmbeddingError) as caught:
            await engine.embed(inputs, model=MODEL, dimensions=4)
    results = caught.value.results
    assert [r.index for r in caught.value.failed] == [3333]
    assert isinstance(results[3333].error, BadRequestError)
    assert "text 3333" in caught.value.message
    assert all(r.ok for i, r in enumerate(results) if i != 3333)
    assert results[3334].unwrap().tolist() == expected(inputs[3334], 4)
    # one bad text costs about two requests per halving of its pack, never a request per text
    assert server.stats.by_status[400] <= 12
    assert server.stats.received <= 3 + 2 * 11


async def test_embed_map_reports_each_failure_without_raising(server: FakeServer) -> None:
    inputs = ["fine", "", f"bad {REJECT_MARKER}", "also fine"]
    async with Engine(deployment_at(server, MODEL)) as engine:
        results = [r async for r in engine.embed_map(inputs, model=MODEL, dimensions=4, ordered=True)]
    assert [r.ok for r in results] == [True, False, False, True]
    assert isinstance(results[1].error, InvalidRequestError)  # refused before sending
    assert "empty" in results[1].error.message
    assert isinstance(results[2].error, BadRequestError)
    assert results[3].vector is not None


async def test_a_refusal_of_the_request_itself_is_not_split_text_by_text(server: FakeServer) -> None:
    async with Engine(deployment_at(server, MODEL)) as engine:
        with pytest.raises(EmbeddingError) as caught:
            await engine.embed(texts(5000), model=MODEL, dimensions=5000)  # too many for the model
    assert len(caught.value.failed) == 5000
    assert "dimensions" in caught.value.message
    assert server.stats.received == 3  # the 400 names a parameter: no halves


async def test_every_request_refused_stops_splitting_early(server: FakeServer) -> None:
    server.embeddings.reject_marker = ""  # every text "holds" it: every request is refused, unnamed
    async with Engine(deployment_at(server, MODEL)) as engine:
        with pytest.raises(EmbeddingError) as caught:
            await engine.embed(texts(5000), model=MODEL, dimensions=4)
    assert len(caught.value.failed) == 5000
    assert server.stats.received < 50  # not the ~10,000 a blind bisection would send


async def test_a_rerun_is_served_from_the_store(server: FakeServer, tmp_path: Path) -> None:
    inputs = texts(3000)
    inputs[7] = f"refused {REJECT_MARKER}"
    store = SqliteStore(tmp_path / "state.db")
    async with Engine(deployment_at(server, MODEL), store=store) as engine:
        with pytest.raises(EmbeddingError):
            await engine.embed(inputs, model=MODEL, dimensions=16)
    store.close()
    sent_first = server.stats.received
    server.reset_stats()
    store = SqliteStore(tmp_path / "state.db")
    async with Engine(deployment_at(server, MODEL), store=store) as engine:
        with pytest.raises(EmbeddingError) as caught:
            await engine.embed(inputs, model=MODEL, dimensions=16)
        # another dimension count is another vector: it is sent
        await engine.embed(inputs[:5], model=MODEL, dimensions=8)
    assert sent_first > 0
    assert server.stats.received == 1  # only the dimensions=8 request
    results = caught.value.results
    assert all(r.cached for r in results)
    assert [r.index for r in caught.value.failed] == [7]  # the rejection is kept, not resent
    assert results[100].unwrap().tolist() == expected(inputs[100], 16)
    store.close()
    server.reset_stats()
    store = SqliteStore(tmp_path / "state.db")
    async with Engine(deployment_at(server, MODEL), store=store, retry_failed=True) as engine:
        with pytest.raises(EmbeddingError):
            await engine.embed(inputs, model=MODEL, dimensions=16)
    store.close()
    assert server.stats.received == 1  # --retry-failed sends the rejected text again, alone


async def test_identical_texts_are_sent_once(server: FakeServer) -> None:
    async with Engine(deployment_at(server, MODEL)) as engine:
        vectors = await engine.embed(["same"] * 50 + ["other"], model=MODEL, dimensions=4)
    assert server.embeddings.batch_sizes == [2]
    assert vectors[0].tolist() == vectors[49].tolist() == expected("same", 4)
    assert engine.stats.cached == 49


async def test_the_budget_is_never_exceeded() -> None:
    price = (1000.0, 0.0)  # dollars per million input tokens: a few texts cost real money here
    async with FakeServer(api_key="sk-test", tokenizer="bytes", prices={"*": price}) as server:
        dep = deployment_at(server, MODEL, price=Price(*price))
        inputs = [f"{i}: " + "é" * 40 for i in range(1000)]  # 2 bytes a character: the hostile case
        async with Engine(dep, budget_usd=0.5) as engine:
            results = [r async for r in engine.embed_map(inputs, model=MODEL, dimensions=4)]
    billed = server.total_billed_usd
    assert billed <= 0.5
    ok = [r for r in results if r.ok]
    refused = [r for r in results if isinstance(r.error, BudgetExhaustedError)]
    assert ok
    assert refused
    assert len(ok) + len(refused) == 1000
    assert sum(r.cost_usd or 0.0 for r in ok) == pytest.approx(billed)
    assert engine.spent() <= 0.5


async def test_429s_and_5xx_are_retried(server: FakeServer) -> None:
    server.inject("429", times=2, retry_after=0.01)
    server.inject("503")
    async with Engine(deployment_at(server, MODEL), retry=FAST_RETRY) as engine:
        vectors = await engine.embed(texts(100), model=MODEL, dimensions=4)
    assert len(vectors) == 100
    assert engine.stats.rate_limited == 2
    assert engine.stats.retries == 3
    assert server.stats.received == 4


async def test_a_body_too_large_is_split_and_the_limit_learnt(server: FakeServer) -> None:
    big = [f"{i} " + "x" * 3000 for i in range(400)]  # one 300k-token pack is ~1.2 MB: a 413
    async with Engine(deployment_at(server, MODEL)) as engine:
        first = await engine.embed(big, model=MODEL, dimensions=4)
        server.reset_stats()
        second = await engine.embed([t + "!" for t in big], model=MODEL, dimensions=4)
    assert len(first) == len(second) == 400
    assert server.stats.by_status == {200: server.stats.received}  # learnt: no refusal the second time


async def test_a_count_limit_is_learnt_from_refusals(server: FakeServer) -> None:
    server.embeddings.max_inputs = 100  # a server that takes fewer inputs than OpenAI
    async with Engine(deployment_at(server, MODEL)) as engine:
        await engine.embed(texts(1000), model=MODEL, dimensions=4)
        refused_first = server.stats.by_status[400]
        server.reset_stats()
        await engine.embed(texts(1000, start=1000), model=MODEL, dimensions=4)
    assert refused_first > 0
    assert server.stats.by_status[400] == 0
    assert max(server.embeddings.batch_sizes) <= 100


async def test_base64_on_the_wire_gives_the_same_vectors(server: FakeServer) -> None:
    dep = deployment_at(server, MODEL, options={"embedding_encoding": "base64"})
    async with Engine(dep) as engine:
        vectors = await engine.embed(texts(10), model=MODEL, dimensions=32)
    assert [v.tolist() for v in vectors] == [expected(t, 32) for t in texts(10)]


async def test_cost_comes_from_genai_prices_with_input_tokens_only(server: FakeServer) -> None:
    async with Engine(deployment_at(server, MODEL)) as engine:
        results = [r async for r in engine.embed_map(texts(10), model=MODEL, dimensions=4)]
    tokens = sum(r.usage.input_tokens for r in results)
    assert tokens == server.stats.prompt_tokens  # the shares add up to what the server counted
    assert sum(r.cost_usd or 0.0 for r in results) == pytest.approx(tokens * 0.02 / 1e6)
    assert engine.stats.cost_usd == pytest.approx(tokens * 0.02 / 1e6)


async def test_memory_stays_flat_over_a_long_source(server: FakeServer) -> None:
    pulled = 0

    def source() -> Iterator[str]:
        nonlocal pulled
        for i in range(40_000):
            pulled += 1
            yield f"text {i}"

    most_ahead = 0
    handed = 0
    async with Engine(deployment_at(server, MODEL)) as engine:
        async for result in engine.embed_map(source(), model=MODEL, dimensions=4):
            assert result.ok
            handed += 1
            most_ahead = max(most_ahead, pulled - handed)
            if handed % 500 == 0:
                await asyncio.sleep(0.01)  # a slow consumer
    assert handed == 40_000
    assert most_ahead <= 8 * 2048 + 3 * 256  # read only as room frees up: 8 packs and a chunk, not 40,000


async def test_leaving_embed_map_early_cancels_what_is_in_flight(server: FakeServer) -> None:
    server.latency = 0.5
    async with Engine(deployment_at(server, MODEL)) as engine:
        async with contextlib.aclosing(engine.embed_map(texts(20_000), model=MODEL, dimensions=4)) as stream:
            async for _ in stream:
                break
        assert not engine.runtime.tasks  # no pack outlives the iteration
    assert server.stats.accepted < 10


async def test_a_stop_gives_the_texts_of_a_half_full_pack_their_results(server: FakeServer) -> None:
    async with Engine(deployment_at(server, MODEL)) as engine:

        def source() -> Iterator[str]:
            for i in range(1000):
                if i == 300:  # the first 256 texts wait in a pack not yet full
                    engine.stop()
                yield f"text {i}"

        async with asyncio.timeout(10):
            results = [r async for r in engine.embed_map(source(), model=MODEL, dimensions=4)]
    assert len(results) == 256
    assert all(isinstance(r.error, sluice.CancelledError) for r in results)
    assert server.stats.received == 0


async def test_a_provider_without_embeddings_says_so(server: FakeServer) -> None:
    dep = Deployment("anthropic/claude-test", base_url=server.anthropic_url, api_key="sk-test")
    async with Engine(dep) as engine:
        with pytest.raises(EmbeddingError, match="no embeddings endpoint"):
            await engine.embed(["hi"], model="anthropic/claude-test")
    assert server.stats.received == 0


async def test_the_simulated_provider_embeds_deterministically() -> None:
    dep = Deployment("simulate/embed", options={"latency": 0.0, "dimensions": 12})
    async with Engine(dep) as engine:
        first = await engine.embed(["a", "b"], model="simulate/embed")
        again = await engine.embed("a", model="simulate/embed")
    assert len(first[0]) == 12
    assert first[0].tolist() == again[0].tolist()
    assert first[0].tolist() != first[1].tolist()


def test_embedding_key_depends_on_model_text_and_dimensions_only() -> None:
    key = sluice.embedding_key
    assert key(MODEL, "a", {"dimensions": 4}) == key("text-embedding-3-small", "a", {"dimensions": 4, "user": "u"})
    assert key(MODEL, "a", {"dimensions": 4}) != key(MODEL, "a", {"dimensions": 8})
    assert key(MODEL, "a") != key(MODEL, "b")
    assert key(MODEL, "a") != key(MODEL, "a", scope="line-1")
    result = EmbeddingResult(0, error=BadRequestError("no"))
    with pytest.raises(BadRequestError):
        result.unwrap()


def test_embeddings_urls_and_encodings() -> None:
    transport = HttpTransport()
    azure = AzureOpenAIProvider(transport)
    dep = Deployment("azure/emb", base_url="https://x.openai.azure.com", api_key="k" * 10)
    assert azure.embeddings_url(dep) == (
        "https://x.openai.azure.com/openai/deployments/emb/embeddings?api-version=2024-10-21"
    )
    assert azure.embedding_encoding(dep) == "base64"
    openai = OpenAIProvider(transport)
    assert openai.embedding_encoding(Deployment(MODEL, api_key="k" * 10)) == "base64"  # api.openai.com
    local = Deployment(MODEL, base_url="http://127.0.0.1:1/v1")
    assert openai.embeddings_url(local) == "http://127.0.0.1:1/v1/embeddings"
    assert openai.embedding_encoding(local) == "float"  # not every compatible server knows base64


async def test_the_fake_refuses_what_openai_refuses(server: FakeServer) -> None:
    url = f"{server.url}/embeddings"
    headers = {"Authorization": "Bearer sk-test"}
    server.embeddings.max_tokens = 100
    async with aiohttp.ClientSession() as session:

        async def post(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            async with session.post(url, json=body, headers=headers) as response:
                return response.status, await response.json()

        status, body = await post({"model": "m", "input": ["a", ""]})
        assert status == 400
        assert "'$.input' is invalid" in body["error"]["message"]
        status, body = await post({"model": "m", "input": ["a" * 500]})
        assert (status, body["error"]["code"]) == (400, "max_tokens_per_request")
        status, body = await post({"model": "m", "input": ["a"] * 2049})
        assert status == 400
        status, body = await post({"model": "m", "input": "a b", "encoding_format": "base64", "dimensions": 3})
        assert status == 200
        vector = array("f", base64.b64decode(body["data"][0]["embedding"]))
        assert vector.tolist() == expected("a b", 3)
        assert body["usage"]["prompt_tokens"] == 1


# -- the batch command -----------------------------------------------------------------------


def batch_line(i: int, text: Any, **body: Any) -> dict[str, Any]:
    body = {"model": "text-embedding-3-small", "input": text, "dimensions": 4, **body}
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": body}


def test_cli_runs_batch_api_embedding_lines_and_a_rerun_sends_nothing(server: FakeServer, tmp_path: Path) -> None:
    lines = [batch_line(i, f"text {i}") for i in range(600)]
    lines.append(batch_line(600, ["first", "second"], encoding_format="base64"))
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", output)
    assert done.returncode == 0, done.stderr
    records = {r["line"]: r for r in read_output(output)}
    assert sorted(records) == list(range(1, 602))
    assert records[8]["id"] == records[8]["custom_id"] == "r7"
    assert records[8]["embedding"] == expected("text 7", 4)
    assert records[8]["usage"]["input_tokens"] > 0
    assert records[8]["cost_usd"] > 0  # text-embedding-3-small's price, from genai-prices
    both = records[601]["embedding"]
    assert [array("f", base64.b64decode(v)).tolist() for v in both] == [expected(t, 4) for t in ("first", "second")]
    assert server.stats.received == 1  # 602 texts, one request
    before = output.read_bytes()
    again = run_cli(server, "run", source, "-o", output)
    assert again.returncode == 0, again.stderr
    assert server.stats.received == 1
    assert output.read_bytes() == before


def test_cli_embeds_a_field_of_csv_rows_and_resumes_from_the_state(server: FakeServer, tmp_path: Path) -> None:
    source = tmp_path / "rows.csv"
    source.write_text("name,description\n" + "".join(f"n{i},about thing {i}\n" for i in range(300)))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--embed", "description", "--id-field", "name"]
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    records = read_output(output)
    assert len(records) == 300
    by_id = {r["id"]: r for r in records}
    assert by_id["n42"]["embedding"] == expected("about thing 42", 1536)
    assert by_id["n42"]["metadata"] == {"name": "n42", "description": "about thing 42"}
    sent = server.stats.received
    # the last records never reached the output (a crash): the rerun writes them from the state
    output.write_text("".join(line + "\n" for line in output.read_text().splitlines()[:-25]))
    again = run_cli(server, *args)
    assert again.returncode == 0, again.stderr
    assert server.stats.received == sent
    assert len(read_output(output)) == 300
    assert "served from the state  25" in again.stdout


def test_cli_records_a_rejected_text_and_lines_of_the_other_kind(server: FakeServer, tmp_path: Path) -> None:
    lines = [batch_line(i, f"text {i}") for i in range(100)]
    lines[50] = batch_line(50, f"bad {REJECT_MARKER}")
    lines.append({"custom_id": "chat", "body": {"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}})
    lines.append(batch_line(101, [1, 2, 3]))  # token arrays
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", output)
    assert done.returncode == 1, done.stderr
    records = {r["line"]: r for r in read_output(output)}
    assert len(records) == 102
    assert records[51]["error"]["type"] == "bad_request"
    assert records[101]["error"]["type"] == "invalid_input"
    assert "chat request in a job of embeddings" in records[101]["error"]["message"]
    assert "token arrays" in records[102]["error"]["message"]
    assert sum(r["ok"] for r in records.values()) == 99
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}, batch_line(1, "x")])
    mixed = run_cli(server, "run", chat, "-o", tmp_path / "chat-out.jsonl", "--model", "openai/gpt-test")
    assert mixed.returncode == 1, mixed.stderr
    chat_records = {r["line"]: r for r in read_output(tmp_path / "chat-out.jsonl")}
    assert chat_records[1]["ok"]
    assert "embeddings request in a job of chat requests" in chat_records[2]["error"]["message"]


def test_cli_refuses_chat_flags_with_embed(server: FakeServer, tmp_path: Path) -> None:
    source = tmp_path / "rows.csv"
    source.write_text("a\nx\n")
    done = run_cli(server, "run", source, "-o", tmp_path / "o.jsonl", "--embed", "a", "--template", "{a}")
    assert done.returncode == 2
    assert "--template" in done.stderr


def test_cli_ctrl_c_then_rerun_embeds_every_text_once(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.3
    source = write_jsonl(tmp_path / "in.jsonl", [batch_line(i, f"text {i}") for i in range(20_000)])
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--ordered"]
    process = start_cli(server, *args)
    try:
        wait_until(lambda: len(server.embeddings.batch_sizes) >= 2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    written = len(read_output(output))
    assert 0 < written < 20_000
    server.latency = 0.0
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    records = read_output(output)
    assert [r["line"] for r in records] == list(range(1, 20_001))
    assert records[-1]["embedding"] == expected("text 19999", 4)
    assert sum(server.embeddings.batch_sizes) == 20_000  # every text embedded once, over both runs
    assert server.stats.duplicate_successes == 0


async def test_the_vector_type_the_docs_name_is_the_one_embed_returns(server: FakeServer) -> None:
    """Issue 34 point 29: ``engine.embed`` gives float32 ``array('f')`` vectors, not lists
    (an eighth of the memory); the docs and the docstring say so, and how to get a list."""
    import json

    section = _docs_page("guides/streaming-embeddings.md")
    assert "float32 `array('f')`, not a list" in section
    assert "v.tolist()" in section
    assert "not a list" in (Engine.embed.__doc__ or "")
    async with Engine(deployment_at(server, MODEL), retry=FAST_RETRY) as engine:
        (vector,) = await engine.embed(["a text"], model=MODEL, dimensions=8)
    assert isinstance(vector, array)
    assert vector.typecode == "f"
    assert json.loads(json.dumps(vector.tolist())) == expected("a text", 8)


def _docs_page(name: str) -> str:
    return (Path(__file__).resolve().parent.parent / "docs" / name).read_text()
