"""``Engine.map``'s fan-out: a source read as capacity frees up, results as they finish.

Split from the engine for size; it is the engine's own machinery and uses its internals
(the gate, the task registry, the stop flag). One producer task reads the source only
while fewer than ``engine.buffer`` results wait to be taken, turns each item into a job
(or a Result saying why it cannot be one) and starts a task per job once the gate has a
slot; the consumer hands results out as they finish, or in input order.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING

from ._budget import Budget
from ._coerce import RequestLike, aiterate
from ._errors import CancelledError, EngineClosedError
from ._models import Result

if TYPE_CHECKING:
    from ._engine import Engine, _Job

__all__ = ["fan_out"]

_NEVER_STARTED = "cancelled before it started; it was never sent"


async def fan_out(
    engine: Engine,
    requests: Iterable[RequestLike] | AsyncIterable[RequestLike],
    *,
    model: str | None,
    ordered: bool,
    priority: int,
    budget: Budget | None,
) -> AsyncIterator[Result]:
    """See :meth:`Engine.map`."""
    if engine._closed:
        raise EngineClosedError("the engine is closed")
    loop = asyncio.get_running_loop()
    finished: asyncio.Queue[tuple[int, Result] | BaseException | None] = asyncio.Queue()
    room = _Room(engine.buffer)
    tasks: set[asyncio.Task[Result]] = set()
    taken = 0
    producer_done = False

    def on_done(task: asyncio.Task[Result], *, index: int, job: _Job) -> None:
        tasks.discard(task)
        engine._tasks.discard(task)
        engine._stop_cancelled.discard(task)
        if task.cancelled():  # its result was reported as it was cancelled; hand it out
            if not job.started:  # cancelled before its first step: its gate slot is still taken
                engine._gate.release()
            result = job.cancelled
            if result is None:  # cancelled before it ever ran
                result = Result(job.request, error=CancelledError(_NEVER_STARTED), index=index)
                engine._emit(result)
            finished.put_nowait((index, result))
        else:
            error = task.exception()
            finished.put_nowait(error if error is not None else (index, task.result()))
        engine._maybe_idle()

    async def produce() -> None:
        nonlocal taken
        try:
            async for item in aiterate(requests):
                await room.take()
                index = taken
                taken += 1
                prepared = engine._prepare_item(item, index, model, priority, budget)
                if isinstance(prepared, Result):
                    finished.put_nowait((index, prepared))
                    continue
                try:
                    await engine._gate.acquire(prepared.priority, prepared.seq)
                except asyncio.CancelledError:  # closed while it waited: it still gets its result
                    finished.put_nowait((index, engine._not_started(prepared)))
                    raise
                if engine._stopping:
                    engine._gate.release()
                    finished.put_nowait((index, engine._not_started(prepared)))
                    break
                task = loop.create_task(engine._admitted(prepared))
                tasks.add(task)
                engine._tasks.add(task)
                task.add_done_callback(functools.partial(on_done, index=index, job=prepared))
                if engine._stopping:
                    break
        finally:
            finished.put_nowait(None)

    producer = loop.create_task(produce())
    engine._producers.add(producer)
    received = 0
    waiting: dict[int, Result] = {}
    next_index = 0
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
                room.give()
                yield result
                continue
            waiting[index] = result
            while next_index in waiting:
                ready = waiting.pop(next_index)
                next_index += 1
                room.give()
                yield ready
        if producer.cancelled():
            raise EngineClosedError("the engine was closed while map() was still reading its source")
        await producer  # surfaces an error raised by the source itself
    finally:
        engine._producers.discard(producer)
        if not producer.done():
            producer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(producer, *tasks, return_exceptions=True)


class _Room:
    """Results the consumer may still be handed before the source is read further: a
    semaphore for one waiter (the producer). ``asyncio.Semaphore.acquire`` builds a
    generator over its waiters on every call; this is a counter and, when full, a future."""

    __slots__ = ("_free", "_waiter")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiter: asyncio.Future[None] | None = None

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
