"""How many bytes of JSON request bodies the server reads and parses at once: in all, and
per client.

A body in memory is its bytes, then the objects parsed from them; aiohttp holds no more
than ~128 KiB of a body nobody reads, so the bound is taken before reading: a body's
``Content-Length`` (or the largest body, when it is sent chunked) is held from the first
byte read until it is parsed. A client waits for its own budget first, then for the
server's, so one client's many bodies queue behind each other and never ahead of another
client's. A body larger than a budget is taken alone rather than never.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

__all__ = ["BodyBudget", "BudgetWait", "ByteBudget"]


class BudgetWait(Exception):
    """No room came within the wait: ``mine`` when it was the client's own budget that was full."""

    def __init__(self, mine: bool) -> None:
        super().__init__("the client's own budget" if mine else "the server's budget")
        self.mine = mine


class ByteBudget:
    """A semaphore counted in bytes, first come first served (a large cost is not overtaken
    for ever by small ones)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def idle(self) -> bool:
        return self.used == 0 and not self._waiters

    def cost(self, size: int) -> int:
        """What ``size`` bytes take of this budget: at most all of it."""
        return min(max(size, 0), self.capacity)

    async def acquire(self, size: int) -> int:
        """Wait for room for ``size`` bytes; what was taken (give it back to :meth:`release`)."""
        cost = self.cost(size)
        if not self._waiters and self.used + cost <= self.capacity:
            self.used += cost
            return cost
        waiter = asyncio.get_running_loop().create_future()
        entry = (cost, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # granted as it was cancelled: give it back
                self.release(cost)
            else:
                with contextlib.suppress(ValueError):  # not already dropped by _wake
                    self._waiters.remove(entry)
                self._wake()  # those behind it may fit now
            raise
        return cost

    def release(self, cost: int) -> None:
        self.used -= cost
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            cost, waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self.used += cost
            waiter.set_result(None)


class BodyBudget:
    """The server's budget and one per client (made on first use, dropped when idle)."""

    def __init__(self, total_bytes: int, client_bytes: int) -> None:
        self.total = ByteBudget(total_bytes)
        self.client_bytes = client_bytes
        self._clients: dict[str, ByteBudget] = {}

    @contextlib.asynccontextmanager
    async def hold(self, client: str, size: int, *, wait_s: float) -> AsyncIterator[None]:
        """Hold ``size`` bytes of ``client``'s budget and the server's while the body is read
        and parsed; :class:`BudgetWait` when no room came within ``wait_s``."""
        own = self._clients.get(client)
        if own is None:
            own = self._clients[client] = ByteBudget(self.client_bytes)
        taken_own = taken_total = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    taken_own = await own.acquire(size)
            except TimeoutError:
                raise BudgetWait(mine=True) from None
            try:
                async with asyncio.timeout_at(deadline):
                    taken_total = await self.total.acquire(size)
            except TimeoutError:
                raise BudgetWait(mine=False) from None
            yield
        finally:
            if taken_total:
                self.total.release(taken_total)
            if taken_own:
                own.release(taken_own)
            if own.idle:
                self._clients.pop(client, None)
