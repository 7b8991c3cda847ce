"""A concurrency cap whose waiters are served by priority, then by arrival.

``asyncio.Semaphore`` wakes waiters first come, first served; an interactive call must
overtake a queued batch, so the engine's gate orders its waiters by (priority, seq).
"""

from __future__ import annotations

import asyncio
import heapq

__all__ = ["PriorityGate"]


class PriorityGate:
    __slots__ = ("_heap", "_held", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held = 0
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        return sum(1 for *_, f in self._heap if not f.done())

    def try_acquire(self) -> bool:
        """A slot at once if one is free and nobody waits (no coroutine on the common path)."""
        if self._held < self.capacity and not self._heap:
            self._held += 1
            return True
        return False

    async def acquire(self, priority: int, seq: int) -> None:
        if self._held < self.capacity and not self._heap:
            self._held += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (priority, seq, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed a slot in the same tick we were cancelled
            raise

    def release(self) -> None:
        """Hand the slot to the best waiter, or give it back."""
        heap = self._heap
        while heap:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)
                return
        self._held -= 1

    def __repr__(self) -> str:
        return f"<PriorityGate {self._held}/{self.capacity} waiting={self.waiting}>"
