"""Reading a request's body within the server's body timeout, for every handler that reads one.

A client that sends its headers and then trickles (or stalls) its body would otherwise hold
a connection and a handler for as long as it likes: ``read_body`` bounds a JSON body by
``body_timeout_s`` in all; ``within_body_timeout`` bounds a streamed upload (up to 200 MB,
which may honestly take longer than that) by its *progress* instead: each
``body_timeout_s`` must bring at least :data:`MIN_PROGRESS` bytes, or the upload is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

from .. import _json
from ._context import BadBody
from ._errors import openai_error

__all__ = [
    "BODY_TIMEOUT",
    "MIN_PROGRESS",
    "BodyTimeout",
    "body_timeout",
    "read_body",
    "read_json",
    "timed_out",
    "within_body_timeout",
]

T = TypeVar("T")

#: Seconds a request's body may take to arrive once its headers are in (``read_body``).
BODY_TIMEOUT: web.AppKey[float] = web.AppKey("sluice.serve.body_timeout", float)
#: When the app has no ``BODY_TIMEOUT`` (the Batch API mounted on an app of its own): ``[serve]``'s default.
DEFAULT_BODY_TIMEOUT = 30.0
#: Bytes a streamed upload must bring in each body timeout (a trickle slower than this is cut).
MIN_PROGRESS = 64 * 1024


class BodyTimeout(Exception):
    """The body did not arrive in time: a 408 (:func:`timed_out`), and the connection is closed."""


def body_timeout(request: web.Request) -> float:
    return request.app.get(BODY_TIMEOUT, DEFAULT_BODY_TIMEOUT)


def timed_out(request: web.Request) -> web.Response:
    """The 408 for a body that did not arrive in time. The connection closes after it once
    aiohttp's lingering time (``make_runner``: 2 s) has read what more the client sends:
    closing at once with its bytes unread would reset the connection, and the client could
    lose the 408 itself."""
    return openai_error(408, f"the request body did not arrive within {body_timeout(request):g} s", code="timeout")


async def read_body(request: web.Request, *, limit: int | None = None) -> bytes:
    """The request's body, within the app's body timeout and size cap (raises
    :class:`BodyTimeout` or aiohttp's 413). ``limit``: read no more than ``limit + 1``
    bytes (a longer body is cut there: the caller answers 413)."""
    try:
        async with asyncio.timeout(body_timeout(request)):
            if limit is None:
                return await request.read()
            chunks: list[bytes] = []
            size = 0
            while size <= limit:
                chunk = await request.content.read(limit + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise BodyTimeout() from None


async def read_json(request: web.Request) -> Any:
    """The body parsed as JSON (orjson: a nesting bomb is a 400, not a RecursionError)."""
    raw = await read_body(request)
    if not raw:
        raise BadBody("the request body is empty; send a JSON object")
    try:
        return _json.loads(raw)
    except ValueError:
        raise BadBody(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
            "HTTP library correctly. The OpenAI API expects a JSON payload.)"
        ) from None


async def within_body_timeout(request: web.Request, work: Awaitable[T]) -> T:
    """Await ``work`` (which reads the body as a stream) while the body keeps arriving:
    :class:`BodyTimeout` once a whole body timeout brings less than :data:`MIN_PROGRESS` bytes."""
    seconds = body_timeout(request)
    content = request.content
    loop = asyncio.get_running_loop()

    async def watch(deadline: asyncio.Timeout) -> None:
        mark = content.total_bytes
        while True:
            await asyncio.sleep(seconds / 2)
            if content.total_bytes - mark >= MIN_PROGRESS:
                mark = content.total_bytes
                deadline.reschedule(loop.time() + seconds)

    try:
        async with asyncio.timeout(seconds) as deadline:
            watcher = asyncio.create_task(watch(deadline))
            try:
                return await work
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
    except TimeoutError:
        raise BodyTimeout() from None
