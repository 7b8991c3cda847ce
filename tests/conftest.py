"""Shared fixtures: the fake provider (``server``) and a real redis-server (``redis_server``).

Helpers are plain modules beside this one: ``fake_provider`` (deployments pointed at a
fake), ``clitools`` (the ``sluice`` command as a subprocess), ``servetools`` (``sluice
serve`` in-process), ``polling`` (waiting for state nothing announces) and
``redis_server``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from clitools import reap_started
from redis_server import redis_server

from sluice.testing import FakeServer

__all__ = [
    "api_key",
    "fake_prices",
    "private_price_cache",
    "reap_commands",
    "redis_server",
    "server",
    "shared_bytecode_cache",
]


@pytest.fixture
def api_key() -> str:
    """The key ``server`` requires; a module that needs another overrides this fixture."""
    return "sk-test"


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]] | None:
    """What ``server`` bills (model -> USD per Mtok in, out); a module overrides it."""
    return None


@pytest.fixture
async def server(
    request: pytest.FixtureRequest, api_key: str, fake_prices: dict[str, tuple[float, float]] | None
) -> AsyncIterator[FakeServer]:
    """The fake provider, requiring ``api_key`` and billing ``fake_prices``.

    An async test gets it in the test's own event loop, so ``await server.until(...)``
    and ``server.on_arrival`` run beside the test. A sync test blocks (it runs the
    ``sluice`` command, it waits), so it gets the server answering from a thread.
    """
    fake = FakeServer(api_key=api_key, prices=fake_prices)
    if inspect.iscoroutinefunction(request.function):
        async with fake:
            yield fake
    else:
        with fake.running_in_thread():
            yield fake


@pytest.fixture(autouse=True)
def reap_commands() -> Iterator[None]:
    """After each test, the ``sluice`` commands it started are ended and their pipes closed."""
    yield
    reap_started()


@pytest.fixture(scope="session", autouse=True)
def shared_bytecode_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where bytecode may not be written beside the sources (PYTHONDONTWRITEBYTECODE),
    every ``python -m sluice`` a test starts compiles sluice and its dependencies from
    source again, a third of its start-up. The session's subprocesses share one cache
    instead, in its temporary directory (nothing is written under ``src/``).

    A child whose file size is capped (RLIMIT_FSIZE) must write no bytecode (``python -B``
    or PYTHONDONTWRITEBYTECODE=1): CPython writes a .pyc in one write(2), which the cap
    cuts short, and every process after it would fail to load that module."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONDONTWRITEBYTECODE")
        patch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path_factory.mktemp("pycache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def private_price_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The price cache (``sluice._price_cache``) of the session and every command it starts
    lives in its temporary directory, never in the user's own cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLUICE_CACHE_DIR", str(tmp_path_factory.mktemp("sluice-cache")))
        yield
