"""Answers that break on the way: a connection held open, dropped, or cut mid-body.

Kept apart from the request flow of :mod:`._server`, which calls these for the ``hang``,
``reset`` and ``truncated`` faults (and for a stream fault asked of an answer that is
not streamed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter

from aiohttp import web

from ._faults import Fault, FaultSpec

__all__ = ["drop", "gone", "hang", "truncate", "unstreamed"]


def gone(request: web.BaseRequest) -> bool:
    """The client closed the connection (or it was closed under it)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def unstreamed(fault: FaultSpec) -> FaultSpec:
    """A stream fault drawn for an answer that is not streamed: its plain counterpart."""
    kind = Fault.TRUNCATED if fault.kind is Fault.STREAM_CUT else Fault.SERVER_ERROR
    return dataclasses.replace(fault, kind=kind)


async def hang(request: web.BaseRequest, closing: asyncio.Event) -> None:
    """Wait until the client goes away or the server stops (``closing``)."""
    while not closing.is_set():
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), 0.05)


def drop(request: web.BaseRequest, by_status: Counter[int]) -> web.Response:
    """Close the connection without an answer (aiohttp then fails quietly to write)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    by_status[0] += 1
    return web.Response(status=204)


async def truncate(
    request: web.BaseRequest, headers: dict[str, str], body: bytes, by_status: Counter[int]
) -> web.StreamResponse:
    """Promise ``len(body)`` bytes, send half of them, then close the connection."""
    response = web.StreamResponse(status=200, headers=headers)
    response.content_length = len(body)
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    transport = request.transport
    if transport is not None:
        transport.close()
    by_status[0] += 1
    return response
