"""A concurrency cap whose waiters are served by priority, then by arrival, and whose
holders lend their slots while they wait.

``asyncio.Semaphore`` wakes waiters first come, first served; an interactive call must
overtake a queued batch, so the engine's gate orders its waiters by (priority, seq).

A holder that must wait for something outside the gate (a deployment's limiter, money,
an identical request in flight) marks its slot *idle* (:meth:`PriorityGate.idle`). While
someone waits at the gate, an idle slot is lent to them: a burst waiting on one
deployment's limiter then cannot fill the gate and starve another deployment that has
room. The lender takes a slot back (:meth:`PriorityGate.back`) before it goes on, ahead
of every newcomer, so the cap still bounds the requests at work. Nothing waits on an idle
holder, so lending cannot deadlock (a returning request holding a limiter's grant and a
budget hold never waits for a slot whose holder waits for those).
"""

from __future__ import annotations

import asyncio
import heapq

__all__ = ["Lease", "PriorityGate"]

#: A lease's states: its holder waits and may be lent out; its slot was lent; it holds one.
_IDLE, _LENT, _HELD = range(3)


class Lease:
    """One holder's slot while it waits outside the gate (see :meth:`PriorityGate.idle`)."""

    __slots__ = ("state",)

    def __init__(self, state: int) -> None:
        self.state = state

    @property
    def lent(self) -> bool:
        """Its slot went to someone else: the holder must take one back before going on."""
        return self.state == _LENT


class PriorityGate:
    __slots__ = ("_back", "_handing", "_heap", "_held", "_idle", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held = 0
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        #: Lenders taking a slot back: served before the newcomers in ``_heap``.
        self._back: list[tuple[int, int, asyncio.Future[None]]] = []
        #: Slots whose holders wait outside the gate, the latest last (lent first: its wait
        #: is likely the longest).
        self._idle: dict[Lease, None] = {}
        self._handing = False

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        return sum(1 for *_, f in self._heap if not f.done()) + sum(1 for *_, f in self._back if not f.done())

    @property
    def idle_slots(self) -> int:
        """Slots held by requests waiting outside the gate (and not lent out)."""
        return len(self._idle)

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
        await self._wait(self._heap, priority, seq)

    async def _wait(self, heap: list[tuple[int, int, asyncio.Future[None]]], priority: int, seq: int) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(heap, (priority, seq, future))
        if self._idle:
            self._lend_soon()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed a slot in the same tick we were cancelled
            raise

    def release(self) -> None:
        """Hand the slot to the best waiter (a returning lender first), or give it back."""
        if self._held > self.capacity:  # one taken back over the cap (see ``busy``): not handed on
            self._held -= 1
            return
        if self._hand():
            return
        self._held -= 1

    def _hand(self) -> bool:
        """Give one slot to the best live waiter; False if none waits."""
        for heap in (self._back, self._heap):
            while heap:
                future = heapq.heappop(heap)[2]
                if not future.done():
                    future.set_result(None)
                    return True
        return False

    # -- lending the slots of holders that wait ---------------------------------------------

    def idle(self) -> Lease:
        """The caller holds a slot and is about to wait outside the gate: while it waits,
        its slot may go to a request waiting at the gate. Settle the lease with
        :meth:`back` (to go on) or :meth:`busy` (to end soon) however the wait ends.

        Nothing is lent at once: a wait that turns out not to wait (a limiter with room)
        is over before the loop runs again, and keeps its slot."""
        lease = Lease(_IDLE)
        self._idle[lease] = None
        if self._heap or self._back:
            self._lend_soon()
        return lease

    async def back(self, lease: Lease, priority: int, seq: int) -> None:
        """The wait is over and the caller goes on: its slot again, ahead of newcomers
        (at once unless it was lent and the gate is full)."""
        if lease.state != _LENT:
            self.busy(lease)
            return
        if self._held < self.capacity and not self._back and not self._heap:
            self._held += 1
        else:
            try:
                await self._wait(self._back, priority, seq)
            except asyncio.CancelledError:
                self._held += 1  # the caller's release balances it (released past the cap)
                lease.state = _HELD
                raise
        lease.state = _HELD

    def busy(self, lease: Lease) -> None:
        """Settle ``lease`` without waiting: the caller holds a slot again (one taken over
        the cap, for a request about to end, if its own was lent)."""
        state = lease.state
        if state == _IDLE:
            del self._idle[lease]
        elif state == _LENT:
            self._held += 1
        lease.state = _HELD

    def _lend_soon(self) -> None:
        if not self._handing:
            self._handing = True
            asyncio.get_running_loop().call_soon(self._lend)

    def _lend(self) -> None:
        """Lend idle slots to waiters, the latest idle first, the best waiter first."""
        self._handing = False
        idle = self._idle
        while idle:
            lease = next(reversed(idle))
            if not self._hand():
                return
            del idle[lease]
            lease.state = _LENT

    def __repr__(self) -> str:
        return f"<PriorityGate {self._held}/{self.capacity} idle={len(self._idle)} waiting={self.waiting}>"
