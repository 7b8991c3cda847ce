"""Waiting for state that announces nothing (an HTTP API, Redis): ask again until it holds.

A FakeServer in the test's own loop is awaited with ``await server.until(...)``, which
wakes on each of its changes; one in a thread with ``clitools.wait_until(...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:  # noqa: ASYNC109
    """Until ``await check()`` is true; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 - nothing tells us: ask, as a client would
            await asyncio.sleep(0.02)
