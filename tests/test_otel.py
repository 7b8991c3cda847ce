"""OpenTelemetry: a span per request and per attempt, in the GenAI semantic conventions.

The library's spans go to the SDK's in-memory exporter; the commands' (``sluice run
--otel``, ``sluice serve --otel``) through the standard OTLP/HTTP exporter, configured by
the standard variables, to a real receiver on loopback (:mod:`otlp_receiver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fake_provider import deployment_at
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from otlp_receiver import OtlpReceiver

import sluice
from sluice import Price, RetryPolicy
from sluice._tracing import FAILURES
from sluice.testing import FakeServer

PROMPT = "What is a sluice? (secret prompt)"


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _engine(server: FakeServer, provider: TracerProvider, **kwargs: Any) -> sluice.Engine:
    capture = kwargs.pop("capture_content", False)
    return sluice.Engine(
        [deployment_at(server, price=Price(2.0, 8.0))],
        retry=RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.02),
        tracing=sluice.Tracing(provider, capture_content=capture),
        **kwargs,
    )


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        found.setdefault(span.name, []).append(span)
    return found


def _no_content(span: ReadableSpan) -> None:
    attributes = dict(span.attributes or {})
    assert "gen_ai.input.messages" not in attributes
    assert "gen_ai.output.messages" not in attributes
    assert all(PROMPT not in str(value) for value in attributes.values())


async def test_a_request_with_a_retry_is_one_genai_span_with_an_attempt_span_each(
    server: FakeServer, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    server.inject("503")
    async with _engine(server, provider) as engine:
        result = await engine.complete("openai/gpt-test", PROMPT, max_tokens=12, temperature=0.5)
    assert result.ok
    assert result.attempts == 2
    found = _by_name(exporter.get_finished_spans())
    (request,) = found["chat gpt-test"]
    attempts = sorted(found["attempt openai/gpt-test"], key=lambda s: s.start_time or 0)
    assert len(attempts) == 2
    assert request.kind is SpanKind.CLIENT
    attributes = dict(request.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "openai"
    assert attributes["gen_ai.request.model"] == "gpt-test"
    assert attributes["gen_ai.request.max_tokens"] == 12
    assert attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.response.model"] == "gpt-test"
    assert attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens > 0
    assert attributes["gen_ai.usage.output_tokens"] == result.usage.output_tokens > 0
    assert attributes["gen_ai.response.finish_reasons"] == (result.finish_reason,)
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["sluice.cost_usd"] == pytest.approx(result.cost_usd)
    assert attributes["sluice.attempts"] == 2
    assert attributes["sluice.retries"] == 1
    assert attributes["sluice.deployment"] == "openai/gpt-test"
    assert attributes["sluice.tier"] == "sync"
    assert request.status.status_code is StatusCode.UNSET
    _no_content(request)
    # each attempt is a child of the request, the first a 503 that was retried
    for span in attempts:
        assert span.parent is not None
        assert span.parent.span_id == request.context.span_id
        assert span.context.trace_id == request.context.trace_id
        assert "gen_ai.operation.name" not in (span.attributes or {})  # a backend counts the request once
        assert "gen_ai.usage.input_tokens" not in (span.attributes or {})
        _no_content(span)
    first, second = (dict(s.attributes or {}) for s in attempts)
    assert first["sluice.attempt"] == 1
    assert second["sluice.attempt"] == 2
    assert first["error.type"] == "server_error"
    assert first["http.response.status_code"] == 503
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert second["sluice.outcome"] == "ok"
    assert request.start_time is not None
    assert request.end_time is not None
    assert attempts[0].start_time is not None
    assert request.start_time <= attempts[0].start_time
    assert attempts[1].end_time is not None
    assert attempts[1].end_time <= request.end_time


async def test_a_failed_request_says_its_error_type_and_the_spans_join_the_callers_trace(
    server: FakeServer, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    server.inject("400")
    tracer = provider.get_tracer("the-app")
    async with _engine(server, provider) as engine:
        with tracer.start_as_current_span("handle a user request") as outer:
            result = await engine.complete("openai/gpt-test", PROMPT, max_tokens=12)
    assert not result.ok
    found = _by_name(exporter.get_finished_spans())
    (request,) = found["chat gpt-test"]
    assert request.parent is not None
    assert request.parent.span_id == outer.get_span_context().span_id
    attributes = dict(request.attributes or {})
    assert attributes["error.type"] == "bad_request"
    assert attributes["sluice.attempts"] == 1
    assert request.status.status_code is StatusCode.ERROR
    assert "gen_ai.usage.input_tokens" not in attributes


async def test_content_is_recorded_only_when_asked(
    server: FakeServer, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    async with _engine(server, provider, capture_content=True) as engine:
        result = await engine.complete("openai/gpt-test", PROMPT, max_tokens=12)
    (request,) = _by_name(exporter.get_finished_spans())["chat gpt-test"]
    attributes = dict(request.attributes or {})
    assert json.loads(str(attributes["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
    ]
    assert json.loads(str(attributes["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": result.text}],
            "finish_reason": result.finish_reason,
        }
    ]


async def test_map_streams_embeddings_and_stored_answers_each_get_their_span(
    server: FakeServer, spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Any
) -> None:
    from sluice.store import SqliteStore

    provider, exporter = spans
    embedder = deployment_at(server, "openai/text-embedding-3-small", price=Price(0.02, 0.0))
    store = SqliteStore(tmp_path / "state.db")
    engine = sluice.Engine(
        [deployment_at(server, price=Price(2.0, 8.0)), embedder], store=store, tracing=sluice.Tracing(provider)
    )
    try:
        async with engine:
            results = [r async for r in engine.map([f"question {i}" for i in range(3)], model="openai/gpt-test")]
            again = await engine.complete("openai/gpt-test", "question 0")  # answered from the state
            async with engine.stream("openai/gpt-test", "tell me a story", max_tokens=8) as stream:
                text = "".join([delta async for delta in stream])
            vectors = await engine.embed(["a", "b"], model="openai/text-embedding-3-small")
    finally:
        store.close()  # the engine does not close a store it was given
    assert all(r.ok for r in results)
    assert again.cached
    assert text
    assert len(vectors) == 2
    found = _by_name(exporter.get_finished_spans())
    chats = found["chat gpt-test"]
    assert len(chats) == 5  # three from map, one cached, one stream
    cached = [s for s in chats if (s.attributes or {}).get("sluice.cached")]
    assert len(cached) == 1
    assert "server.address" not in (cached[0].attributes or {})
    attempts = found["attempt openai/gpt-test"]
    assert len(attempts) == 4  # the cached one sent nothing
    assert all(a.parent is not None and a.parent.span_id != cached[0].context.span_id for a in attempts)
    (embeddings,) = found["embeddings text-embedding-3-small"]
    attributes = dict(embeddings.attributes or {})
    assert attributes["gen_ai.operation.name"] == "embeddings"
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["sluice.embeddings.inputs"] == 2
    (embed_attempt,) = found["attempt openai/text-embedding-3-small"]
    assert embed_attempt.parent is not None
    assert embed_attempt.parent.span_id == embeddings.context.span_id


def test_import_sluice_and_an_untraced_engine_import_no_opentelemetry() -> None:
    code = (
        "import sys, asyncio, sluice\n"
        "async def main():\n"
        "    async with sluice.Engine([sluice.Deployment('simulate/demo')]) as engine:\n"
        "        assert (await engine.complete('simulate/demo', 'hi')).ok\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_tracing_must_be_a_flag_or_a_tracing() -> None:
    with pytest.raises(sluice.ConfigError, match=r"tracing must be True, False or a sluice\.Tracing"):
        sluice.Engine([sluice.Deployment("simulate/demo")], tracing="yes")  # type: ignore[arg-type]


def test_the_global_provider_is_used_with_tracing_true() -> None:
    assert trace.get_tracer_provider() is not None  # the API's proxy: spans go nowhere until one is set
    engine = sluice.Engine([sluice.Deployment("simulate/demo")], tracing=True)
    assert engine.attempts.tracer is not None


# -- the commands: the standard OTLP exporter, configured by the standard variables --------------


def _otel_env(receiver: OtlpReceiver, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "OTEL_"))}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_SERVICE_NAME="sluice-under-test",
        NO_COLOR="1",
        **extra,
    )
    return env


async def _run(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sluice", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        _, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_sluice_run_otel_sends_a_span_per_request_to_the_collector(server: FakeServer, tmp_path: Path) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"{PROMPT} {i}"}], "max_tokens": 8}) + "\n"
            for i in range(5)
        )
    )
    server.inject("429", retry_after=0.01)
    async with OtlpReceiver() as receiver:
        env = _otel_env(receiver, OPENAI_BASE_URL=server.url, OPENAI_API_KEY="sk-test")
        code, stderr = await _run(
            "run", str(inputs), "-o", str(tmp_path / "out.jsonl"), "--model", "openai/gpt-test", "--otel", env=env
        )
        assert code == 0, stderr
        requests = await receiver.until(5, "chat gpt-test")
        attempts = await receiver.until(6, "attempt openai/gpt-test")
    assert {s.kind for s in requests} == {"client"}
    for span in requests:
        assert span.resource["service.name"] == "sluice-under-test"
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.provider.name"] == "openai"
        assert span.attributes["gen_ai.request.model"] == "gpt-test"
        assert span.attributes["gen_ai.response.model"] == "gpt-test"
        assert span.attributes["gen_ai.usage.input_tokens"] > 0
        assert span.attributes["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.input.messages" not in span.attributes
        assert all(PROMPT not in str(v) for v in span.attributes.values())
    assert sorted(s.attributes["sluice.attempts"] for s in requests) == [1, 1, 1, 1, 2]
    rate_limited = [s for s in attempts if s.attributes.get("error.type") == "rate_limited"]
    assert len(rate_limited) == 1
    assert rate_limited[0].attributes["http.response.status_code"] == 429
    by_id = {s.span_id: s for s in requests}
    assert all(a.parent_span_id in by_id and by_id[a.parent_span_id].trace_id == a.trace_id for a in attempts)


async def test_sluice_serve_otel_continues_the_callers_trace(tmp_path: Path) -> None:
    upstream_key = "sk-upstream-secret-0123456789"
    alice_key = "sk-alice-0123456789abcdef"
    async with FakeServer(api_key=upstream_key) as upstream, OtlpReceiver() as receiver:
        config = tmp_path / "sluice.toml"
        config.write_text(
            f'[[deployment]]\nmodel = "openai/gpt-test"\nbase_url = "{upstream.url}"\napi_key_env = "UPSTREAM_KEY"\n'
            '[[client]]\nname = "alice"\nkey_env = "ALICE_KEY"\n'
        )
        env = _otel_env(
            receiver,
            UPSTREAM_KEY=upstream_key,
            ALICE_KEY=alice_key,
            OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sluice", "serve", "--config", str(config), "--port", "0", "--otel",
            "--state", str(tmp_path / "state"),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        try:
            assert process.stdout is not None
            async with asyncio.timeout(30):
                line = (await process.stdout.readline()).decode()
            url = line.split("listening on ")[1].split()[0]
            headers = {"authorization": f"Bearer {alice_key}", "traceparent": f"00-{trace_id}-{parent_id}-01"}
            async with aiohttp.ClientSession(headers=headers) as http:
                body = {"model": "gpt-test", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
                async with http.post(f"{url}/v1/chat/completions", json=body) as response:
                    assert response.status == 200
                    answer = (await response.json())["choices"][0]["message"]["content"]
                async with http.get(f"{url}/health") as response:
                    assert response.status == 200
            (server_span,) = await receiver.until(1, "POST /v1/chat/completions")
            (request,) = await receiver.until(1, "chat gpt-test")
            (attempt,) = await receiver.until(1, "attempt openai/gpt-test")
        finally:
            process.terminate()
            async with asyncio.timeout(30):
                _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    assert server_span.kind == "server"
    assert server_span.trace_id == trace_id
    assert server_span.parent_span_id == parent_id
    assert server_span.attributes["http.response.status_code"] == 200
    assert server_span.attributes["sluice.client"] == "alice"
    assert request.trace_id == attempt.trace_id == trace_id
    assert request.parent_span_id == server_span.span_id
    assert attempt.parent_span_id == request.span_id
    # content was asked for (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT), and only the prompt's and answer's
    assert PROMPT in request.attributes["gen_ai.input.messages"]
    assert answer in request.attributes["gen_ai.output.messages"]
    assert not [s for s in receiver.spans if "health" in s.name]
    for span in receiver.spans:
        for value in span.attributes.values():
            assert upstream_key not in str(value)
            assert alice_key not in str(value)


def test_otel_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    from sluice.otel import tracing_from_env

    with pytest.raises(sluice.ConfigError, match="http/protobuf or grpc"):
        tracing_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(sluice.ConfigError, match="otlp, console or none"):
        tracing_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert tracing_from_env({"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    env = {**os.environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}
    out = subprocess.run(
        [sys.executable, "-m", "sluice", "run", str(inputs), "-o", str(tmp_path / "o.jsonl"), "--model", "simulate/demo", "--otel"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf or grpc, got 'thrift'" in out.stderr
    assert not (tmp_path / "o.jsonl").exists()
    config = tmp_path / "sluice.toml"
    config.write_text('[[deployment]]\nmodel = "simulate/demo"\n')
    for command in (
        ["serve", "--config", str(config), "--port", "0"],
        ["worker", "--redis", "redis://127.0.0.1:9/0", "--config", str(config)],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "sluice", *command, "--otel"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert "got 'thrift'" in out.stderr


def test_messages_are_described_in_the_conventions_schema_whatever_they_hold() -> None:
    from sluice.otel._spans import input_messages

    messages: list[Any] = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"at": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a sluice gate"},
        {"role": "assistant", "content": "odd", "tool_calls": "not a list"},
        "not a message",
    ]
    assert input_messages(messages) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {
            "role": "user",
            "parts": [{"type": "text", "content": "what is this?"}, {"type": "image_url"}],
        },  # never the bytes
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "look", "arguments": '{"at": 1}'}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "a sluice gate"}]},
        {"role": "assistant", "parts": [{"type": "text", "content": "odd"}]},
    ]


# -- what tracing must never do: break a request, keep a slot, leak content --------------------------


class _Raising(SpanProcessor):
    """A span processor with a bug: it raises when a span whose name starts with ``prefix``
    starts (``where="start"``) or ends."""

    def __init__(self, where: str, prefix: str) -> None:
        self.where, self.prefix = where, prefix

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start" and span.name.startswith(self.prefix):
            raise RuntimeError("a span processor's bug")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "end" and span.name.startswith(self.prefix):
            raise RuntimeError("a span processor's bug")


@pytest.mark.parametrize("where", ["start", "end"])
@pytest.mark.parametrize("prefix", ["chat", "attempt", "embeddings"])
async def test_a_span_processor_that_raises_breaks_no_request_and_keeps_no_slot(
    server: FakeServer, where: str, prefix: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FAILURES, "count", 0)  # as in a fresh process: the first failure is logged
    provider = TracerProvider()
    provider.add_span_processor(_Raising(where, prefix))
    deployments = [
        deployment_at(server, price=Price(2.0, 8.0), max_in_flight=1),
        deployment_at(server, "openai/text-embedding-3-small", price=Price(0.02, 0.0), max_in_flight=1),
    ]
    retry = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02)
    async with sluice.Engine(deployments, retry=retry, tracing=sluice.Tracing(provider)) as engine:
        for i in range(3):  # one slot each: a slot kept by the first would wedge the second
            result = await asyncio.wait_for(engine.complete("openai/gpt-test", f"q {i}", max_tokens=8), 10)
            assert result.ok, result.error
            async with asyncio.timeout(10):
                vectors = await engine.embed([f"a {i}", f"b {i}"], model="openai/text-embedding-3-small")
            assert len(vectors) == 2
        assert all(route.limiter.in_flight == 0 for route in engine.router.routes)  # type: ignore[attr-defined]
    assert server.stats.received == 6
    assert FAILURES.count >= 3
    logged = [r for r in caplog.records if "tracing failed" in r.getMessage()]
    assert len(logged) == 1  # once per process, not once per span
    assert logged[0].exc_info is not None
    provider.shutdown()


async def test_a_cancelled_embeddings_request_ends_its_span(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    async with FakeServer(latency=5.0) as slow:
        embedder = deployment_at(slow, "openai/text-embedding-3-small", price=Price(0.02, 0.0))
        async with sluice.Engine([embedder], tracing=sluice.Tracing(provider)) as engine:
            task = asyncio.create_task(engine.embed(["slow a", "slow b"], model="openai/text-embedding-3-small"))
            await slow.until(lambda: slow.stats.received == 1, timeout=10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    found = _by_name(exporter.get_finished_spans())
    (request,) = found["embeddings text-embedding-3-small"]  # ended, so exported
    (attempt,) = found["attempt openai/text-embedding-3-small"]
    assert attempt.parent is not None
    assert attempt.parent.span_id == request.context.span_id
    assert (request.attributes or {})["error.type"] == "cancelled"
    assert request.status.status_code is StatusCode.ERROR


class _TraceThatRaises:
    """A RequestTrace whose attempt() raises (no tracer of sluice's does: the seam must
    still settle the attempt's slot whatever a tracer does)."""

    def attempt(self, route: Any, number: int) -> None:
        raise RuntimeError("a tracer's bug")

    def enter(self) -> object:
        return None

    def leave(self, token: object) -> None:
        pass

    def attempt_done(self, outcome: object) -> None:
        pass

    def ended(self, outcome: object, tally: Any) -> None:
        pass


class _TracerThatRaises:
    def request(self, job: Any, operation: str = "chat") -> _TraceThatRaises:
        return _TraceThatRaises()

    def finished(self, job: Any, result: Any) -> None:
        pass


async def test_a_tracer_raising_as_an_attempt_starts_still_frees_its_slot(server: FakeServer) -> None:
    engine = sluice.Engine([deployment_at(server, max_in_flight=1)], retry=RetryPolicy(max_attempts=1))
    engine.attempts.tracer = _TracerThatRaises()
    async with engine:
        for i in range(2):  # the second waits forever for the slot if the first kept it
            result = await asyncio.wait_for(engine.complete("openai/gpt-test", f"q {i}", max_tokens=8), 10)
            assert not result.ok
        (route,) = engine.router.routes
        assert route.limiter.in_flight == 0  # type: ignore[attr-defined]


def test_tracing_takes_a_tracer_provider() -> None:
    with pytest.raises(sluice.ConfigError, match="must be an OpenTelemetry TracerProvider"):
        sluice.Tracing(provider="oops")
    with pytest.raises(sluice.ConfigError, match="capture_content"):
        sluice.Tracing(capture_content="yes")  # type: ignore[arg-type]
    assert sluice.Tracing(TracerProvider()).capture_content is False


SECRET_ANSWER = "PATIENT John Doe, diagnosis: secret"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


async def _quoting_answer(request: sluice.Request) -> str:
    if "upstream" in str(request.messages):
        raise sluice.ServerError(f"upstream echoes {SECRET_ANSWER}", status=503)
    return '{"a": "' + SECRET_ANSWER + '"}'  # valid JSON, wrong type: the validator's message quotes it


@pytest.mark.parametrize("capture", [False, True])
async def test_without_content_capture_no_error_message_reaches_a_span(
    spans: tuple[TracerProvider, InMemorySpanExporter], capture: bool
) -> None:
    provider, exporter = spans
    deployment = sluice.Deployment("openai/m", provider=sluice.CallableProvider(_quoting_answer))
    tracing = sluice.Tracing(provider, capture_content=capture)
    async with sluice.Engine([deployment], retry=RetryPolicy(max_attempts=1), tracing=tracing, max_reasks=0) as engine:
        invalid = await engine.complete("openai/m", "x", schema=SCHEMA)
        failed = await engine.complete("openai/m", "the upstream fails")
    assert invalid.error is not None
    assert invalid.error.kind == "invalid_output"
    assert SECRET_ANSWER in str(invalid.error)
    assert isinstance(failed.error, sluice.ServerError)
    finished = exporter.get_finished_spans()
    requests = [s for s in finished if s.name.startswith("chat ")]
    assert sorted(str((s.attributes or {})["error.type"]) for s in requests) == ["invalid_output", "server_error"]
    for span in requests:  # with capture_content, the messages say what happened
        assert (SECRET_ANSWER in (span.status.description or "")) is capture
    for span in finished:
        shown = (span.status.description or "") + str(dict(span.attributes or {}))
        assert capture or SECRET_ANSWER not in shown, span.name
        if span.status.status_code is StatusCode.ERROR and not capture:
            kind = (span.attributes or {})["error.type"]
            assert span.status.description == f"{kind} (the message is recorded only with capture_content)"


async def test_an_answer_from_the_state_or_a_twin_is_a_span_that_cost_and_used_nothing(
    server: FakeServer, spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    from sluice.store import SqliteStore

    provider, exporter = spans
    server.latency = 0.1
    store = SqliteStore(tmp_path / "state.db")
    engine = _engine(server, provider, store=store)
    try:
        async with engine:
            first, twin = await asyncio.gather(
                engine.complete("openai/gpt-test", "twin"), engine.complete("openai/gpt-test", "twin")
            )
            stored = await engine.complete("openai/gpt-test", "twin")
    finally:
        store.close()  # the engine does not close a store it was given
    assert [r.cached for r in (first, twin, stored)] == [False, True, True]
    assert server.stats.received == 1
    chats = exporter.get_finished_spans()
    requests = [dict(s.attributes or {}) for s in chats if s.name == "chat gpt-test"]
    sent = [a for a in requests if not a["sluice.cached"]]
    cached = [a for a in requests if a["sluice.cached"]]
    assert len(sent) == 1
    assert len(cached) == 2
    assert sent[0]["gen_ai.usage.input_tokens"] == first.usage.input_tokens > 0
    assert sent[0]["sluice.cost_usd"] == pytest.approx(first.cost_usd)
    for attributes in cached:  # the twin's and the stored answer's alike
        assert attributes["sluice.cost_usd"] == 0.0
        assert attributes["sluice.attempts"] == 0
        assert attributes["sluice.retries"] == 0
        assert "gen_ai.usage.input_tokens" not in attributes
        assert "gen_ai.usage.output_tokens" not in attributes
        assert attributes["sluice.cached.input_tokens"] == first.usage.input_tokens
        assert attributes["sluice.cached.output_tokens"] == first.usage.output_tokens
    total = sum(int(a.get("gen_ai.usage.input_tokens", 0)) for a in requests)  # a backend adding up usage
    assert total == first.usage.input_tokens


async def test_a_reask_is_not_a_retry_on_the_span(
    server: FakeServer, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    server.structured.configure(first=1, kinds=["missing"])
    server.inject("503")
    async with _engine(server, provider) as engine:
        result = await engine.complete("openai/gpt-test", "json please", schema=SCHEMA, max_tokens=50)
        plain = await engine.complete("openai/gpt-test", "no schema", max_tokens=8)
    assert result.ok, result.error
    assert result.reasks == 1
    assert result.attempts == 3  # a 503 retried, an invalid answer re-asked, a valid one
    assert result.reask_cost_usd is not None
    assert result.reask_cost_usd > 0
    by_question = {str(s.attributes and s.attributes.get("sluice.reasks")): s for s in exporter.get_finished_spans()}
    span = by_question["1"]
    attributes = dict(span.attributes or {})
    assert attributes["sluice.attempts"] == 3
    assert attributes["sluice.retries"] == 1
    assert attributes["sluice.reasks"] == 1
    assert attributes["sluice.reask_cost_usd"] == pytest.approx(result.reask_cost_usd)
    assert attributes["sluice.cost_usd"] == pytest.approx(result.cost_usd)
    assert attributes["gen_ai.output.type"] == "json"
    assert plain.ok
    (other,) = [s for s in _by_name(exporter.get_finished_spans())["chat gpt-test"] if s is not span]
    assert "gen_ai.output.type" not in (other.attributes or {})
    assert "sluice.reasks" not in (other.attributes or {})


async def test_only_integers_an_exporter_can_encode_go_on_a_span(
    server: FakeServer, spans: tuple[TracerProvider, InMemorySpanExporter], caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    provider, exporter = spans
    params: dict[str, Any] = {"seed": 2**63, "top_k": 2**64 - 1, "n": True, "max_completion_tokens": True}
    async with _engine(server, provider) as engine:
        odd = await engine.complete("openai/gpt-test", "odd", params=params)
        fine = await engine.complete("openai/gpt-test", "fine", params={"seed": 2**63 - 1, "top_k": -(2**63)})
    assert fine.ok  # the odd one may be refused by the provider: its span is made all the same
    assert odd.attempts == 1
    requests = {str(s.attributes and s.attributes.get("gen_ai.request.seed")): s for s in exporter.get_finished_spans()}
    odd_attributes = dict(requests["None"].attributes or {})
    for key in ("gen_ai.request.seed", "gen_ai.request.top_k", "gen_ai.request.choice.count"):
        assert key not in odd_attributes
    assert "gen_ai.request.max_tokens" not in odd_attributes  # True is no number of tokens
    fine_attributes = dict(requests[str(2**63 - 1)].attributes or {})
    assert fine_attributes["gen_ai.request.top_k"] == -(2**63)
    caplog.clear()
    encode_spans(exporter.get_finished_spans()).SerializeToString()
    assert not [r for r in caplog.records if "Failed to encode" in r.getMessage()]


@contextlib.asynccontextmanager
async def _traced_serve(provider: TracerProvider, state: Path) -> AsyncIterator[str]:
    """``sluice serve`` in-process, tracing into ``provider``, with alice's key."""
    from servetools import ENV, deployment, fake, listening

    from sluice.cli._config import JobConfig
    from sluice.serve._app import build_app
    from sluice.serve.core._settings import ClientSpec, ServeSettings

    async with fake() as upstream:
        config = JobConfig((deployment(upstream, max_in_flight=1),), tracing=sluice.Tracing(provider))
        app = build_app(config, ServeSettings(), (ClientSpec("alice", "ALICE_KEY"),), state, environ=ENV)
        async with listening(app) as url:
            yield url


async def test_serve_continues_no_trace_and_makes_no_span_for_an_unauthenticated_caller(
    spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    from servetools import ALICE_KEY

    provider, exporter = spans
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    traceparent = f"00-{trace_id}-{parent_id}-01"
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with _traced_serve(provider, tmp_path / "state") as url, aiohttp.ClientSession() as http:
        for headers in ({"authorization": "Bearer sk-not-a-key-0123456789"}, {}):
            for path in ("/v1/chat/completions", "/v1/models"):
                method = http.post if path.endswith("completions") else http.get
                async with method(url + path, json=body, headers={**headers, "traceparent": traceparent}) as r:
                    assert r.status == 401
        assert exporter.get_finished_spans() == ()  # neither a span nor a continued trace
        headers = {"authorization": f"Bearer {ALICE_KEY}", "traceparent": traceparent}
        async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
        async with http.post(url + "/v1/chat/completions", json={"model": "nope"}, headers=headers) as r:
            assert r.status == 404  # an unknown model: a span all the same, with its status
    found = _by_name(exporter.get_finished_spans())
    served = found["POST /v1/chat/completions"]
    assert sorted(dict(s.attributes or {})["http.response.status_code"] for s in served) == [200, 404]
    for span in served:
        assert span.kind is SpanKind.SERVER
        assert f"{span.context.trace_id:032x}" == trace_id
        assert span.parent is not None
        assert f"{span.parent.span_id:016x}" == parent_id
        assert (span.attributes or {})["sluice.client"] == "alice"
    (request,) = found["chat gpt-test"]
    assert request.parent is not None
    assert request.parent.span_id in {s.context.span_id for s in served}


@pytest.mark.parametrize("where", ["start", "end"])
async def test_serve_answers_whatever_a_span_processor_raises(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servetools import ALICE_KEY

    monkeypatch.setattr(FAILURES, "count", 0)
    provider = TracerProvider()
    provider.add_span_processor(_Raising(where, ""))  # every span: the server's and the engine's
    headers = {"authorization": f"Bearer {ALICE_KEY}"}
    async with _traced_serve(provider, tmp_path / "state") as url, aiohttp.ClientSession(headers=headers) as http:
        for i in range(3):  # max_in_flight=1: a slot kept would wedge the next
            body = {"model": "gpt-test", "messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": 8}
            async with asyncio.timeout(10), http.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
        async with http.get(url + "/v1/models") as r:
            assert r.status == 200
    assert FAILURES.count >= 4
    provider.shutdown()
