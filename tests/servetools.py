"""Helpers for tests of ``sluice serve``: the proxy in-process on a loopback port, the
official openai SDK as its client, and a fake provider upstream."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
from fake_provider import deployment_at

from sluice import Deployment, Price, RetryPolicy
from sluice.cli._config import JobConfig
from sluice.serve._app import build_app, make_runner
from sluice.serve.core._settings import ClientSpec, ServeSettings
from sluice.testing import FakeServer

UPSTREAM_KEY = "sk-upstream-secret-0123456789"
ALICE_KEY = "sk-alice-0123456789abcdef"
BOB_KEY = "sk-bob-0123456789abcdef01"
ENV = {"ALICE_KEY": ALICE_KEY, "BOB_KEY": BOB_KEY}
PRICE = Price(2.0, 8.0)
MESSAGES: list[Any] = [{"role": "user", "content": "Say hello to the proxy"}]


def ask(i: int) -> list[Any]:
    """A question of its own (identical ones are answered from the state)."""
    return [{"role": "user", "content": f"question {i}"}]


def fake(**kwargs: Any) -> FakeServer:
    """The upstream provider: it takes the server's key and bills at ``PRICE``."""
    return FakeServer(api_key=UPSTREAM_KEY, prices={"*": (2.0, 8.0)}, **kwargs)


def deployment(fake: FakeServer, **kwargs: Any) -> Deployment:
    """``openai/gpt-test`` at the upstream, priced (the proxy counts what clients spend)."""
    kwargs.setdefault("price", PRICE)
    return deployment_at(fake, **kwargs)


def embedder(fake: FakeServer) -> Deployment:
    return deployment_at(fake, "openai/text-embedding-3-small", price=PRICE)


@contextlib.asynccontextmanager
async def serving(
    deployments: list[Deployment],
    state: Path,
    *,
    clients: tuple[ClientSpec, ...] = (),
    retry: RetryPolicy | None = None,
    environ: dict[str, str] | None = None,
    **settings: Any,
) -> AsyncIterator[str]:
    """The proxy on a loopback port; yields its base URL (``http://127.0.0.1:PORT``)."""
    config = JobConfig(tuple(deployments), retry=retry or RetryPolicy(max_attempts=3, base_delay=0.01))
    app = build_app(config, ServeSettings(**settings), clients, state, environ=ENV if environ is None else environ)
    async with listening(app) as url:
        yield url


@contextlib.asynccontextmanager
async def listening(app: aiohttp.web.Application) -> AsyncIterator[str]:
    """``app`` served on a free loopback port; yields its base URL (``http://127.0.0.1:PORT``)."""
    runner = make_runner(app)
    await runner.setup()
    try:
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def plain_server(app: aiohttp.web.Application) -> AsyncIterator[str]:
    """An upstream of the test's own (a plain aiohttp app) on a free loopback port; yields its URL."""
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def sdk(url: str, key: str = "anything", **kwargs: Any) -> openai.AsyncOpenAI:
    kwargs.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, **kwargs)
