"""A Redis connection lost under a command is Redis being unreachable, on either event loop.

Redis going away while a client (re)connects closes the socket between the connect and the
first write. The default loop then fails the write with redis-py's ConnectionError; uvloop
(the commands' loop) raised a RuntimeError no caller expects, which escaped as a traceback
from a worker stopping while Redis was down. Both clients sluice makes must say it the
same way (a ConnectionError: retried once, then "Redis cannot be reached").

redis-py 8.2 checks for a closed transport before it writes and says so itself; on the
older releases sluice accepts (redis>=5) the uvloop case needs sluice's translation
(without it, both uvloop cases here fail on redis 6.2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis_server import RedisServer

from sluice.redis._connection import UNREACHABLE, Connection
from sluice.redis._jobs import connect

pytestmark = pytest.mark.timeout(60)


def _loops() -> list[Any]:
    loops: list[Any] = [pytest.param(None, id="asyncio")]
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency of the commands where the platform has it
        return loops
    return [*loops, pytest.param(uvloop.new_event_loop, id="uvloop")]


CLIENTS: dict[str, Callable[[str], aioredis.Redis]] = {
    "limits and budgets": lambda url: Connection(url).client,
    "job queues": connect,
}


@pytest.mark.parametrize("client_of", CLIENTS.values(), ids=CLIENTS.keys())
@pytest.mark.parametrize("loop_factory", _loops())
def test_a_command_written_to_a_socket_redis_closed_is_a_connection_error(
    redis_server: RedisServer, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None, client_of: Any
) -> None:
    async def scenario() -> None:
        client = client_of(redis_server.url)
        try:
            assert await client.ping()
            pool = client.connection_pool
            conn = await pool.get_connection()
            # The socket closed under the connection, as a dying Redis closes it; redis-py
            # still holds it as connected, so the next command is written to it.
            conn._writer.transport.abort()
            await asyncio.sleep(0)
            with pytest.raises(RedisConnectionError) as caught:
                await conn.send_command("PING")
            assert isinstance(caught.value, UNREACHABLE)
            await pool.release(conn)
            assert await client.ping()  # a new connection once Redis answers
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(scenario())
