"""What every front end of one engine shares while it runs.

``complete()``, ``stream()``, ``map()`` and the embeddings pipeline all pass the same
concurrency gate, register their tasks in one place (so that ``close()`` can wait for
them and ``stop()`` can cut them short), hand their Results out through one emission
(stats and the ``on_result`` hook), and stop the same way when the store fails.

:meth:`Runtime.absorb_stop` is the one place that tells a task cancelled by ``stop()``
(which wants a Result: "stopped before it was sent") from any other cancellation (which
must propagate).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ._errors import EngineClosedError, StoreError
from ._gate import PriorityGate
from ._models import Result
from ._slot import WaitingScope
from ._stats import Stats

__all__ = ["Runtime"]

_log = logging.getLogger("sluice")


class Runtime:
    """The gate, the task registry, stop/close state, emission and the store's failure."""

    __slots__ = (
        "_grace_timer",
        "_idle",
        "_seq",
        "_stop_cancelled",
        "active_calls",
        "closed",
        "gate",
        "grace",
        "learnt_embedding_limits",
        "on_result",
        "producers",
        "stats",
        "stopping",
        "store_error",
        "tasks",
        "waiting",
    )

    def __init__(
        self,
        concurrency: int,
        stats: Stats,
        *,
        on_result: Callable[[Result], object] | None = None,
        grace: float | None = None,
    ) -> None:
        self.gate = PriorityGate(concurrency)
        self.stats = stats
        self.on_result = on_result
        #: Seconds attempts at the provider get when the engine stops on its own (the store
        #: failed); None waits for them.
        self.grace = grace
        #: Why the store stopped taking writes, once it has; admission stopped then.
        self.store_error: StoreError | None = None
        self.stopping = False
        self.closed = False
        #: ``map()``'s jobs and embeddings' packs: what ``close()`` waits for.
        self.tasks: set[asyncio.Task[Any]] = set()
        #: Tasks reading a source (``map()``, embeddings): ``close(drain=False)`` cancels them.
        self.producers: set[asyncio.Task[Any]] = set()
        #: ``complete()`` and ``stream()`` calls under way.
        self.active_calls = 0
        #: Batch tasks not at the provider right now (waiting for money, capacity or a
        #: retry's backoff): ``stop()`` cancels them, so a stop sends nothing new.
        self.waiting: set[asyncio.Task[Any]] = set()
        #: Per-request limits the embeddings pipeline learnt from refusals, per model: a
        #: later ``embed()`` on the same engine starts from them (inputs, tokens).
        self.learnt_embedding_limits: dict[str, tuple[int, int]] = {}
        self._seq = itertools.count()
        self._idle: asyncio.Event | None = None
        self._stop_cancelled: set[asyncio.Task[Any]] = set()
        self._grace_timer: asyncio.TimerHandle | None = None

    def next_seq(self) -> int:
        """Arrival order, for first come first served within a priority lane."""
        return next(self._seq)

    def check_open(self) -> None:
        if self.closed:
            raise EngineClosedError("the engine is closed")

    # -- tasks ----------------------------------------------------------------------------

    def track(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)

    def untrack(self, task: asyncio.Task[Any]) -> None:
        """A tracked task is done (however it ended)."""
        self.tasks.discard(task)
        self._stop_cancelled.discard(task)
        self.maybe_idle()

    def call_began(self) -> None:
        self.active_calls += 1

    def call_ended(self) -> None:
        self.active_calls -= 1
        self.maybe_idle()

    def maybe_idle(self) -> None:
        if self._idle is not None and not self.tasks and not self.active_calls:
            self._idle.set()

    def waiting_while(self, batch: bool) -> WaitingScope:
        """Marks the current task as one ``stop()`` may cancel (batch work only)."""
        return WaitingScope(self.waiting if batch else None)

    # -- stop and close ----------------------------------------------------------------------

    def stop(self, *, grace: float | None = None) -> None:
        """See :meth:`Engine.stop`."""
        self.stopping = True
        for task in list(self.waiting):
            self._cancel_for_stop(task)
        if grace is not None and self._grace_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._grace_timer = loop.call_later(max(0.0, grace), self._end_grace)

    def _end_grace(self) -> None:
        for task in list(self.tasks):
            self._cancel_for_stop(task)

    def _cancel_for_stop(self, task: asyncio.Task[Any]) -> None:
        if task not in self._stop_cancelled and not task.done():
            self._stop_cancelled.add(task)
            task.cancel()

    def absorb_stop(self) -> bool:
        """Called where a ``CancelledError`` was caught: True when it was ``stop()``'s (the
        current task is un-cancelled and should give its "stopped" Result), False when it
        is any other cancellation (re-raise it)."""
        task = asyncio.current_task()
        if task is None or task not in self._stop_cancelled:
            return False
        self._stop_cancelled.discard(task)
        task.uncancel()
        return True

    async def close(self, *, drain: bool) -> None:
        """Stop admitting; wait for every tracked task and call (cancelled first unless ``drain``)."""
        self.stopping = True
        self.closed = True
        if not drain:
            for task in list(self.tasks):
                task.cancel()
            for producer in list(self.producers):
                producer.cancel()
        while self.tasks or self.active_calls:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
            await self._idle.wait()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._grace_timer is not None:
            self._grace_timer.cancel()

    # -- a fan-out's source reader ----------------------------------------------------------

    async def producer_finished(self, producer: asyncio.Task[Any], what: str) -> None:
        """After a fan-out handed out its last result: the reader's own error surfaces; a
        reader cancelled by :meth:`close` means the engine closed under ``what``."""
        if producer.cancelled():
            raise EngineClosedError(f"the engine was closed while {what}")
        await producer

    async def end_fanout(self, producer: asyncio.Task[Any], tasks: Iterable[asyncio.Task[Any]]) -> None:
        """However a fan-out ends (done, an error, its caller gone): the reader and the
        requests still running are cancelled and awaited, so nothing outlives the call."""
        self.producers.discard(producer)
        if not producer.done():
            producer.cancel()
        running = list(tasks)
        for task in running:
            task.cancel()
        await asyncio.gather(producer, *running, return_exceptions=True)

    # -- results and failures ---------------------------------------------------------------

    def emit(self, result: Result) -> None:
        """Count a Result and tell the ``on_result`` hook (whose bug never loses a result)."""
        self.stats.record(result)
        if self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:  # a hook's bug must not abort map() or lose a paid answer
                self.stats.hook_errors += 1
                _log.exception("the on_result hook raised; the result is kept")

    def store_failed(self, error: StoreError) -> None:
        """The state cannot be written: stop admitting; what is in flight still finishes."""
        if self.store_error is None:
            self.store_error = error
            _log.error("%s; stopping", error.message)
            self.stop(grace=self.grace)
