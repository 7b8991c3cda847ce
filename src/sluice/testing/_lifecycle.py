"""Starting and stopping a loopback aiohttp server: in a task, a thread or a process.

Kept apart from what the fake answers, so the request flow reads on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aiohttp import web

__all__ = ["LoopbackServer"]

#: How long a stopping server waits for requests still sleeping out their latency.
SHUTDOWN_TIMEOUT = 1.0


@dataclass(slots=True)
class _ThreadState:
    loop: asyncio.AbstractEventLoop | None = None
    stop: asyncio.Event | None = None
    error: BaseException | None = None


class LoopbackServer:
    """A low-level aiohttp server; subclasses answer requests in :meth:`_handle`."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._runner: web.ServerRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Set when the server stops, to end requests that would otherwise never answer.
        self._closing: asyncio.Event | None = None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raise NotImplementedError

    async def start(self) -> Self:
        """Start listening (on an ephemeral port unless one was given)."""
        if self._runner is not None:
            raise RuntimeError("the server is already running")
        self._loop = asyncio.get_running_loop()
        self._closing = asyncio.Event()
        # No access log: logging every request would dominate the zero-latency path.
        server = web.Server(self._handle, access_log=None, request_factory=_request_factory(self._loop))
        runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Stop listening, end hanging requests and close every connection."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._closing is not None:
            self._closing.set()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @contextlib.contextmanager
    def running_in_thread(self, timeout: float = 10.0) -> Iterator[Self]:
        """Serve from a daemon thread with its own event loop, for sync code and scripts."""
        state = _ThreadState()
        started = threading.Event()
        thread = threading.Thread(
            target=asyncio.run,
            args=(self._serve_in_thread(state, started),),
            name="sluice-fake-server",
            daemon=True,
        )
        thread.start()
        if not started.wait(timeout):
            raise RuntimeError("the server did not start in time")
        if state.error is not None:
            thread.join(timeout)
            raise state.error
        try:
            yield self
        finally:
            if state.loop is not None and state.stop is not None:
                state.loop.call_soon_threadsafe(state.stop.set)
            thread.join(timeout)

    async def _serve_in_thread(self, state: _ThreadState, started: threading.Event) -> None:
        try:
            await self.start()
        except BaseException as exc:  # handed over to the caller's thread
            state.error = exc
            started.set()
            return
        state.loop = asyncio.get_running_loop()
        state.stop = asyncio.Event()
        started.set()
        try:
            await state.stop.wait()
        finally:
            await self.stop()

    @property
    def port(self) -> int:
        """The port it listens on (known once started)."""
        if self._port is None:
            raise RuntimeError("the server is not started")
        return self._port

    @property
    def url(self) -> str:
        """OpenAI-style base URL, ending in ``/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        """Anthropic-style base URL; the client posts to ``{anthropic_url}/v1/messages``."""
        return f"http://{self.host}:{self.port}"


#: The largest request body taken: a Batch API upload may be 200 MB (aiohttp's default is 1 MB).
MAX_BODY = 256 * 1024 * 1024


def _request_factory(loop: asyncio.AbstractEventLoop) -> Any:
    def make(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY)

    return make
