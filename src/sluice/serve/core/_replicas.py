"""``sluice serve --redis``: any replica answers for any file, batch or stored response.

A file or batch lives where it was made (its replica's state dir). Each replica records in
Redis which replica holds each object it makes (``owner:<id>``: the replica's id, address
and the client's name; no expiry, removed when a file is deleted) and keeps a heartbeat
(``replica:<id>`` -> its address, with a TTL). A request for ``/v1/files/{id}...``,
``/v1/batches/{id}...``, ``/v1/messages/batches/{id}...`` (Anthropic's Message Batches:
batches too) or ``/v1/responses/{id}...`` (and a batch create naming another replica's
file, a response continuing another replica's: its ``previous_response_id``) that this
replica does not hold is forwarded to the holder: same method, path, query, body and the
client's ``Authorization`` (the holder authenticates again), the answer streamed back.
An unreachable holder is a 503 that says so, never a silent 404. A forwarded request
carries ``x-sluice-forwarded: 1`` and is never forwarded again (no loops). Lists merge
this replica's objects with those of every live replica.

The replica's id is kept in its state dir, so a replica restarted on another address
still answers for what it holds. Forwarding is written here (a few lines of aiohttp's
client): no library proxies one aiohttp request to another while keeping OpenAI's errors.
Which requests are forwarded is the app's middleware (``serve/_forward.py``): it knows
every API's objects, this module none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from ._errors import openai_error

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["FORWARDED", "LIST_CAP", "REPLICAS", "Owner", "Replicas", "is_forwarded", "merged_page"]

_log = logging.getLogger("sluice.serve.replicas")

#: The header a forwarded request carries: its receiver answers from its own state only.
FORWARDED = "x-sluice-forwarded"
#: Seconds a replica stays listed without a heartbeat; it beats every third of that.
HEARTBEAT_TTL = 15.0
#: Seconds a list waits for each other replica.
LIST_TIMEOUT = 3.0
#: Per-replica cap of objects a merged list considers.
LIST_CAP = 10_000
_CHUNK = 1 << 16
#: An Anthropic client gives its key as ``x-api-key``, and its version (errors go in its shape).
_PASSED_HEADERS = ("authorization", "x-api-key", "anthropic-version", "content-type", "accept")
_RETURNED_HEADERS = ("content-type", "retry-after", "content-disposition", "x-request-id")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds an object: a replica (by id, and its address while it beats; "" when it
    does not) and the client."""

    replica: str
    address: str
    client: str


def _replica_id(state_dir: Path) -> str:
    """The replica's id, kept in its state dir: a restart (on any address) is the same replica."""
    path = state_dir / "replica-id"
    with contextlib.suppress(FileNotFoundError):
        found = path.read_text().strip()
        if found:
            return found
    state_dir.mkdir(parents=True, exist_ok=True)
    made = "r-" + secrets.token_hex(8)
    path.write_text(made + "\n")
    return made


class Replicas:
    """This replica's entry in Redis and its way to the others."""

    def __init__(self, url: str, state_dir: Path, address: str | None, *, namespace: str = "sluice") -> None:
        import redis.asyncio as aioredis  # the redis extra: imported only with --redis

        self.id = _replica_id(state_dir)
        self.address = address.rstrip("/") if address else None
        self._prefix = f"{namespace}:serve:"
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_connect_timeout=2.0, socket_timeout=2.0, decode_responses=True
        )
        self._http: aiohttp.ClientSession | None = None
        self._beat: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- lifetime ----------------------------------------------------------------------------

    def set_address(self, address: str) -> None:
        """Where the others reach this replica (known once it listens, when not configured)."""
        self.address = address.rstrip("/")
        self._wake.set()

    async def start(self, app: web.Application) -> None:
        self._http = aiohttp.ClientSession(auto_decompress=False)
        self._beat = asyncio.create_task(self._heartbeat())

    async def close(self, app: web.Application) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        with contextlib.suppress(Exception):
            await self._redis.delete(self._key("replica", self.id))
        if self._http is not None:
            await self._http.close()
        await self._redis.aclose()

    async def _heartbeat(self) -> None:
        while True:
            if self.address is not None:
                try:
                    await self._redis.set(self._key("replica", self.id), self.address, ex=int(HEARTBEAT_TTL))
                except Exception as exc:  # Redis down: the limiters say so; try again at the next beat
                    _log.warning("sluice serve: cannot register replica %s in Redis: %s", self.id, exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), HEARTBEAT_TTL / 3)

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}{kind}:{name}"

    # -- owners ------------------------------------------------------------------------------

    async def own(self, object_ids: Iterable[str], client: str) -> None:
        """Record that this replica holds ``object_ids`` (of ``client``)."""
        record = json.dumps({"replica": self.id, "client": client})  # no address: see owner()
        try:
            await self._redis.mset({self._key("owner", oid): record for oid in object_ids})
        except Exception as exc:
            _log.error("sluice serve: cannot record in Redis that this replica holds %s: %s", list(object_ids), exc)

    async def disown(self, object_id: str) -> None:
        try:
            await self._redis.delete(self._key("owner", object_id))
        except Exception as exc:
            _log.error("sluice serve: cannot remove %s from Redis: %s", object_id, exc)

    async def owner(self, object_id: str) -> Owner | None:
        """Who holds ``object_id``, at its live address when it beats (raises on Redis trouble)."""
        raw = await self._redis.get(self._key("owner", object_id))
        if raw is None:
            return None
        record = json.loads(raw)
        # Only a live heartbeat's address: a stopped replica's old address may now be anyone
        # (a reused pod IP), and the forward carries the client's key. None: not reachable.
        live = await self._redis.get(self._key("replica", record["replica"]))
        return Owner(record["replica"], str(live) if live else "", record["client"])

    async def peers(self) -> dict[str, str]:
        """The other live replicas: id -> address."""
        found: dict[str, str] = {}
        pattern = self._key("replica", "*")
        async for key in self._redis.scan_iter(match=pattern, count=100):
            replica = key.removeprefix(self._key("replica", ""))
            if replica != self.id:
                address = await self._redis.get(key)
                if address:
                    found[replica] = str(address)
        return found

    # -- talking to the others -----------------------------------------------------------------

    def _headers(self, request: web.Request) -> dict[str, str]:
        headers = {FORWARDED: "1"}
        for name in _PASSED_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        return headers

    async def forward(self, request: web.Request, owner: Owner, body: bytes | None, what: str) -> web.StreamResponse:
        """``request`` answered by ``owner``, its body streamed back; a 503 if it cannot be reached."""
        assert self._http is not None
        timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=120.0)
        try:
            upstream = await self._http.request(
                request.method,
                owner.address + request.path_qs,
                data=body,
                headers=self._headers(request),
                allow_redirects=False,
                timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            _log.warning(
                "sluice serve: replica %s (%s) holds %s but is not reachable: %s",
                owner.replica,
                owner.address,
                what,
                exc,
            )
            return openai_error(
                503, f"the replica that holds {what} is not reachable; retry later", type="server_error"
            )
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name in (*_RETURNED_HEADERS, "content-encoding"):
                if name in upstream.headers:
                    response.headers[name] = upstream.headers[name]
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(_CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
        except (aiohttp.ClientError, TimeoutError) as exc:
            # cut off mid-body: drop the connection, so the client sees a short read, not an end
            _log.warning("sluice serve: replica %s stopped answering mid-response for %s: %s", owner.replica, what, exc)
            if request.transport is not None:
                request.transport.abort()
            return response
        finally:
            upstream.release()

    async def peer_lists(self, request: web.Request) -> list[dict[str, Any]]:
        """The caller's objects on every other live replica (``request``'s path and query)."""
        try:
            peers = await self.peers()
        except Exception as exc:
            _log.warning("sluice serve: cannot list the replicas in Redis: %s", exc)
            return []
        http = self._http
        assert http is not None
        timeout = aiohttp.ClientTimeout(total=LIST_TIMEOUT)

        async def ask(address: str) -> list[dict[str, Any]]:
            async with http.get(address + request.path_qs, headers=self._headers(request), timeout=timeout) as got:
                got.raise_for_status()
                answer = await got.json()
                data: list[dict[str, Any]] = answer["data"]
                return data

        results = await asyncio.gather(*(ask(a) for a in peers.values()), return_exceptions=True)
        merged: list[dict[str, Any]] = []
        for (replica, address), result in zip(peers.items(), results, strict=True):
            if isinstance(result, BaseException):
                _log.warning(
                    "sluice serve: replica %s (%s) did not answer the list of %s: %s",
                    replica,
                    address,
                    request.path,
                    type(result).__name__,
                )
            else:
                merged.extend(result)
        return merged


REPLICAS: web.AppKey[Replicas] = web.AppKey("sluice.serve.replicas", Replicas)


def is_forwarded(request: web.Request) -> bool:
    return request.headers.get(FORWARDED) == "1"


def merged_page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, descending: bool
) -> tuple[list[dict[str, Any]], bool]:
    """One page of the merged list, ordered by ``created_at`` (then id), each object once:
    the page after ``after`` (an id on any replica) and whether more follow."""
    unique = {item["id"]: item for item in items}
    ordered = sorted(unique.values(), key=lambda item: (item["created_at"], item["id"]), reverse=descending)
    if after is not None:
        for index, item in enumerate(ordered):
            if item["id"] == after:
                ordered = ordered[index + 1 :]
                break
    return ordered[:limit], len(ordered) > limit
