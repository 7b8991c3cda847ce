"""Reading a request's body within the server's body timeout, for every handler that reads one.

A client that sends its headers and then trickles (or stalls) its body would otherwise hold
a connection and a handler for as long as it likes: ``read_body`` bounds a JSON body by
``body_timeout_s`` in all; ``within_body_timeout`` bounds a streamed upload (up to 200 MB,
which may honestly take longer than that) by its *progress* instead: each
``body_timeout_s`` must bring at least :data:`MIN_PROGRESS` bytes, or the upload is cut.

A JSON body is parsed whole, so what it may cost is bounded before and as it arrives
(:class:`BodyLimits`, ``[serve]``'s): its size (``max_body_mb``, a 413); the values it
holds, counted per chunk as it arrives (``max_json_values``, a 413 before anything is
parsed: 16 MB of ``{},`` would be ~400 MB of objects); and the bytes of bodies read and
parsed at once, in all and per client (``_body_budget``; a body of at most
:data:`SMALL_BODY` bytes, no more than aiohttp buffers per connection anyway, skips it).
The parse runs on the event loop: orjson holds the GIL throughout, so a thread would stall
the loop just the same; the value cap is what bounds how long one parse takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from ... import _json
from ._body_budget import BodyBudget, BudgetWait
from ._context import BadBody, Refused
from ._errors import openai_error
from ._keys import CLIENT

__all__ = [
    "BODY_LIMITS",
    "BODY_TIMEOUT",
    "MIN_PROGRESS",
    "BodyLimits",
    "BodyTimeout",
    "body_timeout",
    "read_body",
    "read_json",
    "timed_out",
    "timeout_message",
    "within_body_timeout",
]

T = TypeVar("T")

#: Seconds a request's body may take to arrive once its headers are in (``read_body``).
BODY_TIMEOUT: web.AppKey[float] = web.AppKey("sluice.serve.body_timeout", float)
#: When the app has no ``BODY_TIMEOUT`` (the Batch API mounted on an app of its own): ``[serve]``'s default.
DEFAULT_BODY_TIMEOUT = 30.0
#: Bytes a streamed upload must bring in each body timeout (a trickle slower than this is cut).
MIN_PROGRESS = 64 * 1024
#: A JSON body this small is read without waiting for the body budget: aiohttp buffers as
#: much of every connection's body whether or not it is read.
SMALL_BODY = 64 * 1024
_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """What one JSON request body may be, and the budget such bodies are read within
    (``[serve]``'s ``max_body_mb``, ``max_json_values``, ``parse_budget_mb``,
    ``client_parse_budget_mb``; a body waits at most ``wait_s`` for the budget)."""

    max_bytes: int = 32 * 1024 * 1024
    max_values: int = 1_000_000
    budget: BodyBudget | None = None
    wait_s: float = 30.0


#: The app's :class:`BodyLimits` (without one: the defaults, with no budget).
BODY_LIMITS: web.AppKey[BodyLimits] = web.AppKey("sluice.serve.body_limits", BodyLimits)
_NO_BUDGET = BodyLimits()
#: ``request[_READ]``: what :func:`read_json` made of the body: (True, the value) or (False, the error).
_READ: web.RequestKey[tuple[bool, Any]] = web.RequestKey("sluice.serve.read_json")


class BodyTimeout(Exception):
    """The body did not arrive in time: a 408 (:func:`timed_out`), and the connection is closed.
    ``total``: the upload's whole deadline passed (rather than its progress stalling)."""

    def __init__(self, total: float | None = None) -> None:
        super().__init__(total)
        self.total = total


def body_timeout(request: web.Request) -> float:
    return request.app.get(BODY_TIMEOUT, DEFAULT_BODY_TIMEOUT)


def timed_out(request: web.Request, exc: BodyTimeout | None = None) -> web.Response:
    """The 408 for a body that did not arrive in time. The connection closes after it once
    aiohttp's lingering time (``make_runner``: 2 s) has read what more the client sends:
    closing at once with its bytes unread would reset the connection, and the client could
    lose the 408 itself."""
    return openai_error(408, timeout_message(request, exc), code="timeout")


def timeout_message(request: web.Request, exc: BodyTimeout | None = None) -> str:
    if exc is not None and exc.total is not None:
        return f"the upload did not arrive within {exc.total:g} s, the longest this server waits for one"
    return f"the request body did not arrive within {body_timeout(request):g} s"


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
    """The body parsed as JSON (orjson: a nesting bomb is a 400, not a RecursionError),
    within the app's :class:`BodyLimits`: aiohttp's 413 past ``max_bytes``, a
    :class:`~._context.Refused` 413 past ``max_values``, 429/503 when no budget came in time.
    Read once: a second call (the handler after the forwarding middleware) gets the same."""
    read = request.get(_READ)
    if read is None:
        try:
            read = (True, await _read_json(request))
        except (BadBody, Refused, BodyTimeout, web.HTTPException) as exc:
            read = (False, exc)
        request[_READ] = read
    ok, value = read
    if not ok:
        raise value
    return value


async def _read_json(request: web.Request) -> Any:
    limits = request.app.get(BODY_LIMITS, _NO_BUDGET)
    size = request.content_length
    if size is not None and size > limits.max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=limits.max_bytes, actual_size=size)
    if limits.budget is None or (size is not None and size <= SMALL_BODY):
        return _parse(await _read_counted(request, limits))
    client = request.get(CLIENT)
    try:
        async with limits.budget.hold(
            client.name if client is not None else "-", size or limits.max_bytes, wait_s=limits.wait_s
        ):
            return _parse(await _read_counted(request, limits))
    except BudgetWait as exc:
        raise Refused(_busy(limits, exc.mine)) from None


async def _read_counted(request: web.Request, limits: BodyLimits) -> bytearray:
    """The body, within the body timeout, its size and values checked chunk by chunk as they arrive."""
    raw = bytearray()
    values = 0
    try:
        async with asyncio.timeout(body_timeout(request)):
            while chunk := await request.content.read(_CHUNK):
                raw += chunk
                if len(raw) > limits.max_bytes:
                    raise web.HTTPRequestEntityTooLarge(max_size=limits.max_bytes, actual_size=len(raw))
                values += _json.most_values(chunk)
                if values > limits.max_values:
                    raise Refused(_too_many_values(limits.max_values))
    except TimeoutError:
        raise BodyTimeout() from None
    return raw


def _parse(raw: bytearray) -> Any:
    if not raw:
        raise BadBody("the request body is empty; send a JSON object")
    try:
        return _json.loads(raw)
    except ValueError:
        raise BadBody(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
            "HTTP library correctly. The OpenAI API expects a JSON payload.)"
        ) from None


def _too_many_values(most: int) -> web.Response:
    response = openai_error(
        413,
        f"the request body holds more than {most:,} JSON values and keys (counted by the ',' ':' '[' '{{' in it); "
        "this server parses at most that many in one request",
        code="too_many_values",
    )
    response.force_close()  # the rest of the body is not read
    return response


def _busy(limits: BodyLimits, mine: bool) -> web.Response:
    """No room in the body budget within the wait: the client's own (429), or the server's (503)."""
    if mine:
        response = openai_error(
            429,
            "too many large request bodies of yours are being read at once; retry once they are answered",
            code="rate_limit_exceeded",
            type="requests",
            headers={"Retry-After": "1"},
        )
    else:
        response = openai_error(
            503,
            "the server is reading as many large request bodies as it takes at once; retry shortly",
            type="server_error",
            headers={"Retry-After": "1"},
        )
    response.force_close()  # the body is not read
    return response


async def within_body_timeout(request: web.Request, work: Awaitable[T], *, total: float | None = None) -> T:
    """Await ``work`` (which reads the body as a stream) while the body keeps arriving:
    :class:`BodyTimeout` once a whole body timeout brings less than :data:`MIN_PROGRESS`
    bytes, or (``total``) once ``total`` seconds have passed however fast it arrives."""
    seconds = body_timeout(request)
    content = request.content
    loop = asyncio.get_running_loop()
    end = loop.time() + total if total is not None else math.inf

    async def watch(deadline: asyncio.Timeout) -> None:
        mark = content.total_bytes
        while True:
            await asyncio.sleep(seconds / 2)
            if content.total_bytes - mark >= MIN_PROGRESS:
                mark = content.total_bytes
                deadline.reschedule(min(loop.time() + seconds, end))

    try:
        async with asyncio.timeout_at(min(loop.time() + seconds, end)) as deadline:
            watcher = asyncio.create_task(watch(deadline))
            try:
                return await work
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
    except TimeoutError:
        raise BodyTimeout(total if loop.time() >= end else None) from None
