"""``Engine.map``'s fan-out: a source read as capacity frees up, results as they finish.

A front end on the attempt core: one producer task reads the source only while fewer
than ``room`` results wait to be taken, turns each item into a job (or a Result saying
why it cannot be one) and starts a task per job once the runtime's gate has a slot; the
consumer hands results out as they finish, or in input order.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING, Generic, TypeVar

from ._budget import Budget
from ._coerce import RequestLike, aiterate
from ._errors import CancelledError
from ._inorder import InOrder
from ._models import Result

if TYPE_CHECKING:
    from ._attempts import Attempts
    from ._job import Job

__all__ = ["fan_out"]

T = TypeVar("T")

_NEVER_STARTED = "cancelled before it started; it was never sent"


async def fan_out(
    attempts: Attempts,
    requests: Iterable[RequestLike] | AsyncIterable[RequestLike],
    *,
    model: str | None,
    ordered: bool,
    priority: int,
    budget: Budget | None,
    room: int,
) -> AsyncIterator[Result]:
    """See :meth:`Engine.map`."""
    runtime = attempts.runtime
    runtime.check_open()
    loop = asyncio.get_running_loop()
    finished: _Finished[tuple[int, Result] | BaseException | None] = _Finished()
    space = _Room(room)
    tasks: set[asyncio.Task[Result]] = set()
    taken = 0
    producer_done = False

    def on_done(task: asyncio.Task[Result], *, index: int, job: Job) -> None:
        tasks.discard(task)
        runtime.gate.release()  # the slot the producer took for it, however it ended
        if task.cancelled():  # its result was reported as it was cancelled; hand it out
            result = job.cancelled
            if result is None:  # cancelled before it ever ran
                result = Result(job.request, error=CancelledError(_NEVER_STARTED), index=index)
                runtime.emit(result)
            finished.put((index, result))
        else:
            error = task.exception()
            finished.put(error if error is not None else (index, task.result()))
        runtime.untrack(task)

    async def produce() -> None:
        nonlocal taken
        try:
            async for item in aiterate(requests):
                if not space.try_take():
                    await space.take()
                index = taken
                taken += 1
                prepared = attempts.prepare_item(item, index, model, priority, budget)
                if isinstance(prepared, Result):
                    finished.put((index, prepared))
                    continue
                try:
                    if not runtime.gate.try_acquire():
                        await runtime.gate.acquire(prepared.priority, prepared.seq)
                except asyncio.CancelledError:  # closed while it waited: it still gets its result
                    finished.put((index, attempts.not_started(prepared)))
                    raise
                if runtime.stopping:
                    runtime.gate.release()
                    finished.put((index, attempts.not_started(prepared)))
                    break
                # nothing to share or serve from a store: one coroutine less
                task = loop.create_task(attempts.run(prepared) if prepared.key is None else attempts.execute(prepared))
                tasks.add(task)
                runtime.track(task)
                task.add_done_callback(functools.partial(on_done, index=index, job=prepared))
                if runtime.stopping:
                    break
        finally:
            finished.put(None)

    producer = loop.create_task(produce())
    runtime.producers.add(producer)
    received = 0
    in_order: InOrder[Result] = InOrder()
    try:
        while not producer_done or received < taken:
            item = await finished.get()
            if item is None:
                producer_done = True
                continue
            if isinstance(item, BaseException):
                raise item
            received += 1
            index, result = item
            if not ordered:
                space.give()
                yield result
                continue
            for ready in in_order.arrived(index, result):
                space.give()
                yield ready
        await runtime.producer_finished(producer, "map() was still reading its source")
    finally:
        await runtime.end_fanout(producer, tasks)


class _Finished(Generic[T]):
    """What the tasks hand the consumer: a deque and, while it waits, one future (an
    ``asyncio.Queue`` keeps waiter lists and a task counter the one consumer never needs)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> T:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class _Room:
    """Results the consumer may still be handed before the source is read further: a
    semaphore for one waiter (the producer). ``asyncio.Semaphore.acquire`` builds a
    generator over its waiters on every call; this is a counter and, when full, a future."""

    __slots__ = ("_free", "_waiter")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiter: asyncio.Future[None] | None = None

    def try_take(self) -> bool:
        """Room at once (no coroutine on the common path)."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        while self._free <= 0:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._free -= 1

    def give(self) -> None:
        self._free += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
