"""One Redis connection shared by a process's limiters and budgets, and what to do when
Redis cannot be reached.

Redis trouble is explicit: a call that cannot reach Redis raises :class:`RedisDown`;
callers then stop admitting (nothing is granted while Redis is down) and retry with
:meth:`Connection.backoff`. The first failure is logged once, as a warning naming
host:port (never the password in the URL); recovery is logged once too. ``problem``
says what is wrong for the CLI to show.

Wake-ups between processes (a lease freed, a budget hold settled) go over pub/sub: one
pattern subscription per connection, read by one task, dispatched to local callbacks.
Nothing polls; a lost subscription (Redis restarted) is re-made by the same task, and
every callback then fires once so that waiters look again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import SluiceError

__all__ = ["UNREACHABLE", "Connection", "RedisDown", "RedisFailed", "closed_socket_aware", "redis_target"]

log = logging.getLogger("sluice.redis")

#: Errors that mean "Redis cannot be reached right now" (retry), as opposed to a bug.
UNREACHABLE: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


class _ClosedSocketIsUnreachable:
    """A command written to a socket Redis has closed under it: the default event loop
    drops the bytes and the read fails with a ConnectionError; uvloop (the CLI's loop)
    raises ``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>;
    the handler is closed`` from the write (MagicStack/uvloop#506). That is Redis going
    away, not a bug: it is raised as redis-py's ConnectionError (retried once, then down)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except RuntimeError as exc:
            if "handler is closed" not in str(exc):
                raise
            raise RedisConnectionError("Redis closed the connection while a command was being written") from exc


class _Tcp(_ClosedSocketIsUnreachable, aioredis.Connection):
    pass


class _Tls(_ClosedSocketIsUnreachable, aioredis.SSLConnection):
    pass


class _Unix(_ClosedSocketIsUnreachable, aioredis.UnixDomainSocketConnection):
    pass


_CLOSED_SOCKET_AWARE: dict[type[Any], type[Any]] = {
    aioredis.Connection: _Tcp,
    aioredis.SSLConnection: _Tls,
    aioredis.UnixDomainSocketConnection: _Unix,
}


def closed_socket_aware(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """``pool``, its connections (of the class its URL chose) made with the translation above;
    before the pool makes its first connection."""
    pool.connection_class = _CLOSED_SOCKET_AWARE.get(pool.connection_class, pool.connection_class)
    return pool


class RedisDown(SluiceError):
    """Redis cannot be reached: nothing is admitted until it is back."""


class RedisFailed(SluiceError):
    """Redis answered with an error (not an outage): a bug or a misconfigured server,
    reported to the request that needed it rather than retried."""


def redis_target(url: str) -> str:
    """``host:port/db`` of a Redis URL, without user or password (safe to log)."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    db = parts.path.lstrip("/") or "0"
    return f"{host}:{port}/{db}"


class Connection:
    """A redis-py asyncio client with explicit down/up handling (see the module docstring)."""

    def __init__(self, url: str, *, namespace: str = "sluice", timeout: float = 5.0) -> None:
        self.url = url
        self.namespace = namespace
        self.target = redis_target(url)
        # One immediate retry, for a pooled connection that went stale when Redis restarted;
        # more would hide an outage inside one call. We retry ourselves, explicitly, so that
        # "down" is seen at once and admission pauses.
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 1),
            health_check_interval=0,
        )
        closed_socket_aware(self.client.connection_pool)
        #: Whether the owner grants from local limits while Redis is down (said in ``problem``).
        self.fail_open = False
        #: What is wrong with Redis right now, in words; None while it answers.
        self.problem: str | None = None
        self._failures = 0
        self._scripts: dict[str, AsyncScript] = {}
        self._listeners: dict[str, set[Callable[[], None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @property
    def healthy(self) -> bool:
        return self.problem is None

    # -- calls -------------------------------------------------------------------------

    async def run(self, name: str, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a Lua script by its SHA (loaded once; re-loaded on NOSCRIPT after a restart)."""
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.client.register_script(source)
        return await self.call(script(keys=list(keys), args=list(args)))

    async def call(self, awaitable: Awaitable[Any]) -> Any:
        """Await one Redis call; :class:`RedisDown` if Redis cannot be reached."""
        try:
            result = await awaitable
        except UNREACHABLE as exc:
            self._down(exc)
            raise RedisDown(f"Redis at {self.target} cannot be reached: {type(exc).__name__}") from None
        except ResponseError as exc:
            if "LOADING" in str(exc) or "MASTERDOWN" in str(exc) or "BUSY" in str(exc):
                self._down(exc)
                raise RedisDown(f"Redis at {self.target} is not ready: {exc}") from None
            raise RedisFailed(f"Redis at {self.target} refused a sluice script: {exc}") from None
        except RedisError as exc:
            raise RedisFailed(f"Redis at {self.target}: {type(exc).__name__}: {exc}") from None
        self._up()
        return result

    def backoff(self) -> float:
        """Seconds to wait before trying a down Redis again (0.05 s doubling to 2 s)."""
        return float(min(2.0, 0.05 * 2 ** min(self._failures, 6)))

    def _down(self, exc: BaseException) -> None:
        self._failures += 1
        if self.problem is None:
            then = "local limits grant meanwhile (fail_open)" if self.fail_open else "admission paused until it is back"
            self.problem = f"Redis at {self.target} cannot be reached ({type(exc).__name__}); {then}"
            log.warning("%s", self.problem)

    def _up(self) -> None:
        if self.problem is not None:
            log.warning("Redis at %s is back; admission resumes", self.target)
            self.problem = None
            self._failures = 0

    # -- background settles ------------------------------------------------------------

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run a settle in the background (the engine's settles are synchronous); tracked,
        so that :meth:`flush` and :meth:`close` wait for it."""

        async def guarded() -> None:
            try:
                await coro
            except RedisDown:
                pass  # a lease or hold then expires on its own; logged by _down
            except (RedisFailed, RedisError) as exc:
                log.warning("a settle on Redis at %s failed: %s", self.target, exc)

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Wait for every background settle started so far."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- wake-ups over pub/sub --------------------------------------------------------

    def channel(self, *parts: str) -> str:
        return ":".join((self.namespace, "wake", *parts))

    def listen(self, channel: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a message arrives on ``channel`` (and after a reconnect)."""
        self._listeners.setdefault(channel, set()).add(callback)
        if self._reader is None and not self._closed:
            self._reader = asyncio.get_running_loop().create_task(self._read())

    def unlisten(self, channel: str, callback: Callable[[], None]) -> None:
        callbacks = self._listeners.get(channel)
        if callbacks is not None:
            callbacks.discard(callback)

    async def _read(self) -> None:
        pattern = self.channel("*")
        while not self._closed:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(pattern)
                self._up()
                self._fire_all()  # whatever was published while we were not listening
                while not self._closed:
                    message = await pubsub.get_message(timeout=None)
                    if message is None:
                        continue
                    channel = message.get("channel")
                    name = channel.decode() if isinstance(channel, bytes) else str(channel)
                    for callback in list(self._listeners.get(name, ())):
                        callback()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                self._down(exc)
                await asyncio.sleep(self.backoff())
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2

    def _fire_all(self) -> None:
        for callbacks in list(self._listeners.values()):
            for callback in list(callbacks):
                callback()

    async def close(self) -> None:
        """Wait for background settles, stop listening, close the client."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), timeout=10)
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        await self.client.aclose()
