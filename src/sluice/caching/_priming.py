"""Order and priming inside one fan-out (``Engine.map``): a bounded look-ahead.

The fan-out offers each job as it reads it. A job that shares nothing goes at once. A
job that may share a prefix waits in a short window (``PromptCache.lookahead`` jobs, and
only while the source has more at once: the caller's stream is never held back) so that
the lines after it are counted before it is decided; then it is placed
(``PromptCache.place``): sent as its groups' primer, sent as a reader, or held until its
primer's answer (an entry is readable only once its writer's answer has begun, so
requests sent together would all write). When a primer's answer is in, the jobs it held
are placed again: they read, or prime the next group in. Many groups prime at once, so
the job never idles on one. A held job is sent anyway after ``PromptCache.max_hold`` s.

The fan-out takes the jobs that are ready (:meth:`Priming.take`) and waits on
:meth:`Priming.changed` when it has nothing else to do; nothing here sends or awaits.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from ._groups import Group
from ._plan import Planned, PromptCache
from ._rules import LOWEST_MINIMUM

if TYPE_CHECKING:
    import asyncio

    from .._job import Job
    from .._models import Result
    from ._fingerprint import Boundary

__all__ = ["Priming"]


class _Held:
    __slots__ = ("boundaries", "group", "job", "since")

    def __init__(self, job: Job, boundaries: list[Boundary], group: Group, since: float) -> None:
        self.job = job
        self.boundaries = boundaries
        self.group = group
        self.since = since


class Priming:
    """One fan-out's window, held jobs and ready jobs (see the module docstring)."""

    __slots__ = ("_ahead", "_cache", "_changed", "_held", "_loop", "_timer", "_window", "ready")

    def __init__(self, cache: PromptCache, loop: asyncio.AbstractEventLoop, *, ahead: bool = True) -> None:
        self._cache = cache
        self._loop = loop
        #: Jobs read ahead before the first is decided (0 for a source that may wait, or
        #: when the whole input was counted beforehand: the jobs go in the order given,
        #: which ``sluice run``'s plan made, e.g. a batch tier's chunks holding whole groups).
        self._ahead = cache.lookahead if ahead and cache.counting else 0
        #: Jobs read ahead, undecided, with their boundaries.
        self._window: collections.deque[tuple[Job, list[Boundary]]] = collections.deque()
        #: Jobs decided: the fan-out sends them, in order, with their plans.
        self.ready: collections.deque[tuple[Job, Planned | None]] = collections.deque()
        #: Jobs waiting for a primer, by id.
        self._held: dict[int, _Held] = {}
        self._changed: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def waiting(self) -> bool:
        """Jobs are undecided, held or ready: the fan-out must not end yet."""
        return bool(self._window or self._held or self.ready)

    def may_share(self, job: Job) -> bool:
        """Whether ``job``'s prompt is long enough for any cache (one test on the common
        path; the rest goes straight to its worker)."""
        return job.tokens - job.output >= LOWEST_MINIMUM

    def offer(self, job: Job) -> None:
        """A job just read: to :attr:`ready` at once when it can share nothing."""
        boundaries = self._cache.boundaries(job)
        if boundaries is None:
            self.ready.append((job, None))
            return
        self._window.append((job, boundaries))
        if len(self._window) > self._ahead:
            self._decide(*self._window.popleft())

    def flush(self) -> None:
        """Decide every job read ahead (the source has nothing more at once)."""
        while self._window:
            self._decide(*self._window.popleft())

    def _decide(self, job: Job, boundaries: list[Boundary]) -> None:
        now = self._loop.time()
        cache = self._cache
        placed = cache.place(job, cache.chain(job, boundaries), now)
        if isinstance(placed, Group):
            self._held[id(job)] = _Held(job, boundaries, placed, now)
            if self._timer is None:
                self._timer = self._loop.call_at(now + cache.max_hold, self._expire)
            return
        self.ready.append((job, placed))

    def finished(self, job: Job, result: Result) -> None:
        """A job's result is in: the jobs its answer held are placed again."""
        planned = job.cache
        if not isinstance(planned, Planned):
            return
        released = self._cache.finished(job, planned, result, self._loop.time())
        for each in released:
            held = self._held.pop(id(each), None)
            if held is not None:
                self._decide(held.job, held.boundaries)
        if released:
            self._wake()

    def take(self) -> tuple[Job, Planned | None] | None:
        """The next job to send, and its plan; None when none is ready."""
        return self.ready.popleft() if self.ready else None

    def changed(self) -> asyncio.Future[None]:
        """Done when a job becomes ready (a primer answered, a hold ran out)."""
        if self._changed is None or self._changed.done():
            self._changed = self._loop.create_future()
            if self.ready:
                self._changed.set_result(None)
        return self._changed

    def drain(self) -> list[Job]:
        """Every job not sent yet (the fan-out is ending early: they end as never started);
        the groups they were to prime are free for others."""
        jobs = [job for job, _ in self._window]
        for job, planned in self.ready:
            jobs.append(job)
            for group in planned.primes if planned is not None else ():
                group.priming = False
        for held in self._held.values():
            jobs.append(held.job)
            _forget(held)
        self.ready.clear()
        self._window.clear()
        self._held.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return jobs

    def _wake(self) -> None:
        waiter = self._changed
        if waiter is not None and not waiter.done() and self.ready:
            waiter.set_result(None)

    def _expire(self) -> None:
        """Held jobs past ``max_hold`` go as they came (their primer is slow: they write)."""
        self._timer = None
        now = self._loop.time()
        limit = self._cache.max_hold
        for key, held in list(self._held.items()):
            if now - held.since >= limit:
                del self._held[key]
                _forget(held)
                self.ready.append((held.job, None))
        if self._held:
            soonest = min(held.since for held in self._held.values()) + limit
            self._timer = self._loop.call_at(soonest, self._expire)
        self._wake()


def _forget(held: _Held) -> None:
    """Take a held job out of its group's queue (by identity: jobs are not compared)."""
    queue = held.group.held
    for index, job in enumerate(queue):
        if job is held.job:
            del queue[index]
            return
