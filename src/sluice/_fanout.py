"""``Engine.map``'s fan-out: a source read as capacity frees up, results as they finish.

A front end on the attempt core: one producer task reads the source only while fewer
than ``room`` results wait to be taken, turns each item into a job (or a Result saying
why it cannot be one) and starts a task per job once the runtime's gate has a slot; the
consumer hands results out as they finish, or in input order.
"""

from __future__ import annotations

import asyncio
import collections
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
    from .caching import Priming

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
    priming = None
    if attempts.caching is not None:  # the prompt-cache plan: groups primed, then read
        from .caching import Priming

        priming = Priming(attempts.caching, loop, ahead=not isinstance(requests, AsyncIterable))
    workers = _Workers(attempts, finished, priming)
    taken = 0
    producer_done = False

    async def dispatch(job: Job) -> bool:
        """Hand ``job`` to a worker once the gate has a slot; False: the engine is stopping."""
        try:
            if not runtime.gate.try_acquire():
                await runtime.gate.acquire(job.priority, job.seq)
        except asyncio.CancelledError:  # closed while it waited: it still gets its result
            workers.done(job, attempts.not_started(job))
            raise
        if runtime.stopping:
            runtime.gate.release()
            workers.done(job, attempts.not_started(job))
            return False
        workers.hand(job, loop)
        return not runtime.stopping

    async def send_ready() -> bool:
        """Send the jobs the plan has ready; False: the engine is stopping."""
        assert priming is not None
        while (ready := priming.take()) is not None:
            job, planned = ready
            if planned is not None:
                attempts.planned(job, planned)
            if not await dispatch(job):
                return False
        return True

    async def make_room() -> bool:
        """Wait for room for the next item, sending what the plan makes ready meanwhile
        (held jobs may be what the consumer waits for); False: the engine is stopping."""
        if priming is None:
            await space.take()
            return True
        priming.flush()
        while True:
            if not await send_ready():
                return False
            if await space.take_or(priming.changed()):
                return True

    async def produce() -> None:
        nonlocal taken
        try:
            async for item in aiterate(requests):
                if not space.try_take() and not await make_room():
                    break
                index = taken
                taken += 1
                prepared = attempts.prepare_item(item, index, model, priority, budget)
                if isinstance(prepared, Result):
                    finished.put((index, prepared))
                    continue
                if priming is not None and priming.may_share(prepared):
                    priming.offer(prepared)
                    if not await send_ready():
                        break
                    continue
                try:  # as dispatch() does, inline: the common path costs no coroutine
                    if not runtime.gate.try_acquire():
                        await runtime.gate.acquire(prepared.priority, prepared.seq)
                except asyncio.CancelledError:  # closed while it waited: it still gets its result
                    finished.put((index, attempts.not_started(prepared)))
                    raise
                if runtime.stopping:
                    runtime.gate.release()
                    finished.put((index, attempts.not_started(prepared)))
                    break
                workers.hand(prepared, loop)
                if runtime.stopping:
                    break
            else:
                if priming is not None:  # the source is done: what the plan holds goes as it is released
                    priming.flush()
                    while await send_ready() and priming.waiting:
                        await priming.changed()
        finally:
            if priming is not None:
                for job in priming.drain():  # the engine is stopping, or the fan-out ends early
                    workers.done(job, attempts.not_started(job))
            workers.close()
            finished.put(None)

    producer = loop.create_task(produce())
    runtime.producers.add(producer)
    received = 0
    in_order: InOrder[Result] = InOrder()
    try:
        while not producer_done or received < taken:
            item = finished.take() if finished.ready else await finished.get()  # no coroutine while results wait
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
        await runtime.end_fanout(producer, workers.tasks)


class _Workers:
    """The tasks that run a fan-out's jobs: one per job in flight at most (the gate bounds
    them), each taking the next job when it is done with one, so a job costs a deque
    append and, when a worker sleeps, one wake-up, not a Task of its own with a done
    callback (2.4 % of sluice's own instructions a request, ``bench/instructions.py``).
    Each job yields exactly one Result however its worker ends: cancelled mid-job, its
    ``job.cancelled``; cancelled before it started, "never started"; a ``stop()``
    absorbed, the worker goes on to the next."""

    __slots__ = ("_attempts", "_closed", "_finished", "_jobs", "_priming", "_sleeping", "tasks")

    def __init__(
        self,
        attempts: Attempts,
        finished: _Finished[tuple[int, Result] | BaseException | None],
        priming: Priming | None = None,
    ) -> None:
        self._attempts = attempts
        self._finished = finished
        #: The prompt-cache plan's fan-out part (told of every planned job's result).
        self._priming = priming
        self._jobs: collections.deque[Job] = collections.deque()
        #: Idle workers: the future each sleeps on, and its task.
        self._sleeping: collections.deque[tuple[asyncio.Future[None], asyncio.Task[None]]] = collections.deque()
        self._closed = False
        self.tasks: set[asyncio.Task[None]] = set()

    def hand(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        """Run ``job`` (its gate slot taken): on a sleeping worker, else on a new one. The
        worker is in the runtime's registry from now until it sleeps again, so a
        ``close(drain=False)`` or a stop's grace running out cancels a job handed but not
        yet started, as it would a job's own task."""
        self._jobs.append(job)
        runtime = self._attempts.runtime
        sleeping = self._sleeping
        while sleeping:
            waiter, task = sleeping.popleft()
            if not waiter.done():
                waiter.set_result(None)
                runtime.track(task)
                return
        task = loop.create_task(self._work())
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        runtime.track(task)

    def done(self, job: Job, result: Result) -> None:
        """``job``'s one Result, to the consumer (and to the plan, when it has one)."""
        self._finished.put((_index(job), result))
        if job.cache is not None and self._priming is not None:
            self._priming.finished(job, result)

    def close(self) -> None:
        """No more jobs: sleeping workers end, busy ones after their job."""
        self._closed = True
        while self._sleeping:
            waiter, _ = self._sleeping.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def _work(self) -> None:
        attempts, jobs, finished = self._attempts, self._jobs, self._finished
        runtime = attempts.runtime
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        assert me is not None
        while True:
            if not jobs:
                runtime.untrack(me)  # a sleeping worker holds nothing close() waits for
                if self._closed:
                    return
                waiter = loop.create_future()
                self._sleeping.append((waiter, me))
                try:
                    await waiter
                except asyncio.CancelledError:  # woken for a job, then cancelled before it began
                    self._abandon()
                    absorbed = runtime.absorb_stop()
                    runtime.untrack(me)
                    if not absorbed:
                        raise
                continue
            job = jobs.popleft()
            try:
                # nothing to share or serve from a store: one coroutine less
                result = await (attempts.run(job) if job.key is None else attempts.execute(job))
            except asyncio.CancelledError:
                self.done(job, job.cancelled or self._never_started(job))
                if not runtime.absorb_stop():
                    self._abandon()
                    runtime.untrack(me)
                    raise
                # stop()'s, absorbed: on to the next job (which ends "stopped" at once)
            except Exception as exc:  # a bug: the consumer raises it
                finished.put(exc)
            else:
                self.done(job, result)
            finally:
                runtime.gate.release()  # the slot the producer took for it, however it ended

    def _abandon(self) -> None:
        """A worker cancelled before its next job: the jobs waiting for a worker end as
        never started (a cancellation that reaches one reaches all: the fan-out is
        ending, the engine closing, or a stop's grace is over)."""
        while self._jobs:
            job = self._jobs.popleft()
            self._attempts.runtime.gate.release()
            self.done(job, self._never_started(job))

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if task.cancelled():  # perhaps before it ever ran: its job still gets its result
            self._abandon()
        self._attempts.runtime.untrack(task)

    def _never_started(self, job: Job) -> Result:
        result = Result(job.request, error=CancelledError(_NEVER_STARTED), index=job.index)
        self._attempts.runtime.emit(result)
        return result


def _index(job: Job) -> int:
    assert job.index is not None  # every map() job has its place in the input
    return job.index


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

    @property
    def ready(self) -> bool:
        """Something is waiting to be taken."""
        return bool(self._items)

    def take(self) -> T:
        """The next item, when :attr:`ready`."""
        return self._items.popleft()

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

    async def take_or(self, other: asyncio.Future[None]) -> bool:
        """Room (taken: True), or ``other`` done first (False: nothing taken)."""
        while self._free <= 0:
            if other.done():
                return False
            waiter = self._waiter = asyncio.get_running_loop().create_future()

            def wake(_: object, waiter: asyncio.Future[None] = waiter) -> None:
                if not waiter.done():
                    waiter.set_result(None)

            other.add_done_callback(wake)
            try:
                await waiter
            finally:
                self._waiter = None
                other.remove_done_callback(wake)
        self._free -= 1
        return True

    def give(self) -> None:
        self._free += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
