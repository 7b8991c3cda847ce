"""API keys never appear anywhere a key could leak to: the output, the state file (and its
WAL), the terminal, logs, reprs and error messages, even when a server echoes the key back
in its error message (some OpenAI-compatible servers do)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from clitools import MODEL, env_for, questions, run_cli, write_jsonl

from sluice import ConfigError, Deployment, Engine, RetryPolicy
from sluice.testing import FakeServer

CANARY = "sk-canary-7f3a9c2e55d1"


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(api_key=CANARY, echo_key_in_errors=True).running_in_thread() as fake:
        yield fake


def _everything_written(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file())


@pytest.mark.parametrize("key", [CANARY, CANARY + "-but-wrong"])
def test_no_key_in_files_or_terminal(server: FakeServer, tmp_path: Path, key: str) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(12))
    output = tmp_path / "out.jsonl"
    env = env_for(server, OPENAI_API_KEY=key)
    config = tmp_path / "retry.toml"
    config.write_text("[retry]\nmax_attempts = 2\nbase_delay = 0.01\n")
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--config", config, env=env)
    assert done.returncode in (0, 3), done.stderr
    report = run_cli(server, "report", tmp_path / "out.sluice.db", env=env)
    check = run_cli(server, "config", "check", "--config", config, "--model", MODEL, env=env)
    shown = done.stdout + done.stderr + report.stdout + report.stderr + check.stdout + check.stderr
    assert CANARY not in shown
    assert CANARY.encode() not in _everything_written(tmp_path)
    if key != CANARY:  # the server said the key back; it was masked before anything kept it
        assert server.stats.by_status[401] >= 1


async def test_no_key_in_logs_reprs_or_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeServer(api_key=CANARY, echo_key_in_errors=True) as fake:
        wrong = Deployment(MODEL, base_url=fake.url, api_key=CANARY + "-wrong", name="wrong")
        right = Deployment("openai/gpt-right", base_url=fake.url, api_key=CANARY, name="right")
        async with Engine([wrong, right]) as engine:
            failed = await engine.complete(MODEL, "hi")
            answered = await engine.complete("openai/gpt-right", "hi")
            texts = [repr(engine), repr(wrong), repr(right), repr(failed), repr(answered), str(failed.error)]
            texts += [repr(engine.limiter(MODEL)), repr(engine.stats.snapshot())]
    assert failed.error is not None
    assert failed.error.kind == "authentication_error"
    assert answered.ok
    texts += [str(failed.raw), str(answered.raw), caplog.text]
    for text in texts:
        assert CANARY not in text
    with pytest.raises(ConfigError) as raised:
        Deployment(MODEL, api_key=CANARY, rpm=-1)
    assert CANARY not in str(raised.value)


async def test_keys_never_follow_a_redirect_to_another_server() -> None:
    seen: list[dict[str, str]] = []

    async def other(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"error": {"message": "no"}}, status=400)

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        raise web.HTTPTemporaryRedirect(f"{other_url}{request.path_qs}")

    runners = []
    urls = []
    for handler in (other, redirect):
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
    other_url, redirect_url = urls
    try:
        deployments = [
            Deployment("openai/gpt-x", base_url=f"{redirect_url}/v1", api_key="sk-openai-secret"),
            Deployment("anthropic/claude-x", base_url=redirect_url, api_key="sk-ant-secret"),
            Deployment("azure/gpt-x", base_url=redirect_url, api_key="azure-secret"),
        ]
        async with Engine(deployments, retry=RetryPolicy(max_attempts=1)) as engine:
            results = [await engine.complete(d.model, "hi", max_tokens=5) for d in deployments]
    finally:
        for runner in runners:
            await runner.cleanup()
    assert seen == []  # nothing reached the other origin
    for result in results:
        assert result.error is not None
        assert "redirected to" in result.error.message
        assert "base_url" in result.error.message
