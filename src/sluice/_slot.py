"""One admitted attempt and what it holds, settled exactly once whatever happens.

An attempt is admitted when it holds a rate-limit reservation, a budget hold (under a
budget) and, with a store, a durable *intent* (the note that it is about to be sent).
However the attempt ends — an answer, an error, never sent, cut off — each of the three
is settled once: the reservation reconciled or refunded, the hold committed with what
the attempt cost, the intent settled with that charge (or, for an attempt cut off at the
provider, left open for the rerun to count). Kept apart from the engine so that a plain
send and a stream share one set of rules.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._budget import BudgetHold
from ._errors import CancelledError, StoreError
from ._limits import Reservation, usage_counts
from ._stats import Stats
from .caching._rules import reads_counted

if TYPE_CHECKING:
    from ._errors import SluiceError
    from ._models import Usage
    from .store import AttemptLog, Store

#: What the timeline is told of an attempt that ended with neither an answer nor an error
#: (cut off at the provider, or a stream its reader left).
_UNANSWERED = CancelledError("cut off before it was answered")

__all__ = ["AttemptTimer", "Slot", "Tally", "TimerWatch", "WaitingScope", "settle_unsettled", "stopped_note"]


@dataclass(slots=True)
class Tally:
    """What a job's attempts have added up to so far."""

    started: float
    attempts: int = 0
    waited: float = 0.0
    latency: float = 0.0
    charged: float = 0.0
    sent: bool = False
    sent_this_time: bool = False
    at_provider: bool = False
    #: The last attempt's intent, settled with the job's result rather than on its own:
    #: (intent, charge, answered) (see ``Slot.settle(hand_over=True)``).
    unsettled: tuple[int, float, bool] | None = None


def stopped_note(tally: Tally) -> str:
    """Why a job stopped by ``Engine.stop()`` did not finish, in words."""
    if tally.at_provider:
        return "stopped: still at the provider when the grace period ended; it was sent and may have been billed"
    return "stopped before retrying" if tally.sent else "stopped before it was sent"


class Slot:
    """An admitted attempt: its reservation, budget hold and intent (see the module docstring)."""

    __slots__ = (
        "_hold",
        "_intent",
        "_on_store_error",
        "_stats",
        "_store",
        "_subject",
        "_timeline",
        "_worst",
        "first_at",
        "held_back",
        "placed_at",
        "ready_at",
        "reservation",
        "route",
        "sent_at",
        "tally",
    )

    def __init__(
        self,
        route: Any,
        reservation: Reservation,
        hold: BudgetHold | None,
        tally: Tally,
        stats: Stats,
        worst: Callable[[Any], float],
        subject: Any,
        store: Store | None = None,
        on_store_error: Callable[[StoreError], None] | None = None,
        placed_at: int | None = None,
        timeline: AttemptLog | None = None,
    ) -> None:
        #: Where this attempt goes (the engine's route: deployment, limiter, provider).
        self.route = route
        #: The deployment's health epoch when it was placed (see ``Health.succeeded``).
        self.placed_at = placed_at
        self.reservation = reservation
        self.tally = tally
        self._hold = hold
        self._stats = stats
        #: ``worst(subject)``: what the attempt counts for when it may have been billed unseen
        #: (a function and its argument, not a closure: no object per attempt).
        self._worst = worst
        self._subject = subject
        self._store = store
        self._on_store_error = on_store_error
        self._intent: int | None = None
        #: When it went to the provider (the loop's time; see :meth:`sending`).
        self.sent_at = 0.0
        #: When admission finished (the loop's time): the moment it is sent, unless it waits.
        self.ready_at: float | None = None
        #: Told of the attempt when it settles (the store's timeline, for ``sluice report``).
        self._timeline = timeline
        #: When a stream's first delta came (the loop's time), set by the stream.
        self.first_at: float | None = None
        #: Seconds the send pacer holds it back before it may leave (admission waits them).
        self.held_back = 0.0

    async def note(self, key: str) -> StoreError | None:
        """Durably record the attempt before it is sent; the error if that cannot be done
        (the attempt is then released, unsent)."""
        if self._store is None:
            return None
        try:
            self._intent = await self._store.begin(key, self._worst(self._subject))
        except StoreError as exc:
            self.unsent()
            return exc
        except BaseException:
            self.unsent()
            raise
        return None

    def unsent(self) -> None:
        """It was never sent: give everything back."""
        self.reservation.refund()
        if self._hold is not None:
            self._hold.commit(0.0)
        if self._intent is not None:
            self._settle_intent(0.0, answered=False)

    def keep_hold(self) -> BudgetHold | None:
        """The budget hold, taken out of the slot (a parked request keeps its worst case
        reserved after its attempt is settled: ``Spending.park``)."""
        hold, self._hold = self._hold, None
        return hold

    def send_delay(self, now: float) -> float:
        """Seconds to hold the attempt before it leaves, as its limiter asks (0 almost always)."""
        delay = getattr(self.reservation, "send_delay", None)  # optional in the Reservation protocol
        return float(delay(now)) if delay is not None else 0.0

    def sending(self, now: float | None = None) -> None:
        """It goes to the provider now (``now``: the loop's time, if the caller has it)."""
        tally = self.tally
        tally.attempts += 1
        tally.sent = tally.sent_this_time = tally.at_provider = True
        self._stats.attempts += 1
        if now is None:
            now = asyncio.get_running_loop().time()
        self.sent_at = now
        sent = getattr(self.reservation, "sent", None)  # optional in the Reservation protocol
        if sent is not None:
            sent(now)

    def reconcile(self, usage: Usage, estimate: int) -> None:
        """Settle the reservation to what the answer used: its tokens, and its input and
        output as their limits count them (see ``usage_counts``); an answer without usage
        keeps the ``estimate`` it reserved."""
        counted = usage.cached_input_tokens > 0 and reads_counted(self.route.deployment)
        tokens, given, output = usage_counts(usage, reads_counted=counted)
        if not tokens:
            self.reservation.reconcile(estimate)
            return
        self.reservation.reconcile(tokens, input_tokens=given, output_tokens=output)

    def settle(
        self,
        charge: float | None,
        *,
        answered: bool,
        cut_off: bool,
        hand_over: bool = False,
        now: float | None = None,
        error: SluiceError | None = None,
        usage: Usage | None = None,
    ) -> None:
        """The attempt is over. ``charge`` is what it cost (None: it may have been billed
        unseen, so its worst case); ``cut_off``: cancelled while still at the provider, so
        its intent stays open for the rerun to count. ``hand_over``: leave the intent's
        settlement in ``tally.unsettled`` for the caller to write with the result (or
        with :func:`settle_unsettled`). ``error`` (why it failed) and ``usage`` (what it
        answered with) are for the timeline."""
        tally = self.tally
        tally.at_provider = cut_off
        ended = asyncio.get_running_loop().time() if now is None else now
        tally.latency = ended - self.sent_at
        self.reservation.done()
        charge = self._worst(self._subject) if charge is None else max(0.0, charge)  # a cost is never a refund
        if self._hold is not None:
            self._hold.commit(charge)
        tally.charged += charge
        self._stats.charge(charge, answered=answered)
        if self._timeline is not None:
            if error is None and not answered:
                error = _UNANSWERED
            self._timeline.attempt(
                self.route.deployment, self.sent_at, ended, tally.attempts, error, usage, charge, self.first_at
            )
        if self._intent is not None and not cut_off:
            if hand_over:
                tally.unsettled = (self._intent, charge, answered)
                self._intent = None
            else:
                self._settle_intent(charge, answered=answered)

    def _settle_intent(self, charge: float, *, answered: bool) -> None:
        assert self._store is not None
        assert self._intent is not None
        intent, self._intent = self._intent, None
        try:
            self._store.settle(intent, charge, answered=answered)
        except StoreError as exc:
            if self._on_store_error is not None:
                self._on_store_error(exc)


def settle_unsettled(tally: Tally, store: Store | None, on_error: Callable[[StoreError], None]) -> None:
    """Settle an intent handed over by ``Slot.settle(hand_over=True)`` on its own (no
    result is written with it: the job retries, or ends without a stored result)."""
    pending, tally.unsettled = tally.unsettled, None
    if pending is None or store is None:
        return
    try:
        store.settle(pending[0], pending[1], answered=pending[2])
    except StoreError as exc:
        on_error(exc)


class WaitingScope:
    """Marks the current task as waiting (``stop()`` may cancel it) for the ``with`` body."""

    __slots__ = ("_task", "_tasks")

    def __init__(self, tasks: set[asyncio.Task[Any]] | None) -> None:
        self._tasks = tasks
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> None:
        if self._tasks is not None:
            task = asyncio.current_task()
            if task is not None:
                self._task = task
                self._tasks.add(task)

    def __exit__(self, *exc: object) -> None:
        if self._task is not None and self._tasks is not None:
            self._tasks.discard(self._task)


class TimerWatch:
    """One attempt under an :class:`AttemptTimer`: its task, when it runs out, and whether it did.

    With an ``idle`` timeout, :meth:`heard` (the provider hearing bytes of the answer, see
    ``_arrival``) moves ``due`` on to ``idle`` seconds from now, never past ``hard`` (the
    attempt timeout or the deadline)."""

    __slots__ = ("active", "cancelling", "due", "expired", "hard", "idle", "idle_ran_out", "loop", "task")

    def __init__(
        self, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop, due: float, idle: float | None, hard: float
    ) -> None:
        self.task = task
        self.loop = loop
        #: ``task.cancelling()`` when armed: a cancel from elsewhere is not a timeout.
        self.cancelling = task.cancelling()
        self.active = True
        self.expired = False
        self.due = due
        self.idle = idle
        self.hard = hard
        #: It expired through silence (``idle``), not at ``hard``.
        self.idle_ran_out = False

    def heard(self) -> None:
        """Bytes of the answer arrived: the silence starts again from now."""
        if self.idle is not None:
            self.due = min(self.loop.time() + self.idle, self.hard)


class AttemptTimer:
    """Cuts off attempts that outlive their timeout, with one loop timer for all of them.

    ``asyncio.timeout()`` around every attempt costs a ``Timeout``, a ``TimerHandle`` in
    the loop's heap and its cancellation per request (~5 % of the engine's CPU against a
    fast server). Here an attempt costs one small object and a push on this heap; one loop
    timer is kept for the earliest deadline. The semantics are ``asyncio.timeout``'s: on
    expiry the task is cancelled, and :meth:`disarm` says whether the ``CancelledError``
    the attempt got is the timer's (uncancelling it), so a cancellation from elsewhere
    still propagates. Written by hand: asyncio has no shared-deadline primitive.
    """

    __slots__ = ("_active", "_dead", "_due", "_handle", "_heap", "_loop", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerWatch]] = []
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._due = float("inf")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead = 0
        self._active = 0

    @property
    def scheduled(self) -> bool:
        """A loop timer is pending (never, while no attempt is watched)."""
        return self._handle is not None

    def arm(
        self, loop: asyncio.AbstractEventLoop, at: float, *, idle: float | None = None, hard: float | None = None
    ) -> TimerWatch | None:
        """Watch the current task until :meth:`disarm`; cancel it if that is after ``at``
        (the loop's clock), or, with ``idle``, after ``idle`` seconds without
        :meth:`TimerWatch.heard` once ``at`` has passed, and at ``hard`` at the latest.
        None outside a task (nothing to cut off)."""
        task = asyncio.current_task(loop)
        if task is None:
            return None
        watch = TimerWatch(task, loop, at, idle, at if hard is None else hard)
        heapq.heappush(self._heap, (at, next(self._seq), watch))
        self._active += 1
        if at < self._due or loop is not self._loop:
            self._schedule(loop, at)
        return watch

    def disarm(self, watch: TimerWatch | None) -> bool:
        """The attempt is over: True when its timeout fired and the task's cancellation is
        the timer's alone (the caller turns its ``CancelledError`` into a timeout)."""
        if watch is None:
            return False
        watch.active = False
        self._active -= 1
        timed_out = False
        if watch.expired:  # already off the heap
            timed_out = watch.task.uncancel() <= watch.cancelling
        else:
            self._dead += 1
        heap = self._heap
        if not self._active:  # nothing left to watch: no timer pending (a virtual clock would jump to it)
            heap.clear()
            self._dead = 0
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
                self._due = float("inf")
        elif self._dead > 256 and self._dead * 2 > len(heap):  # forget finished attempts in bulk
            self._heap = [entry for entry in heap if entry[2].active]
            heapq.heapify(self._heap)
            self._dead = 0
        return timed_out

    def _schedule(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._loop = loop
        self._due = at
        self._handle = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        loop = self._loop
        self._handle = None
        self._due = float("inf")
        assert loop is not None
        now = loop.time()
        heap = self._heap
        while heap and (heap[0][0] <= now or not heap[0][2].active):
            _, _, watch = heapq.heappop(heap)
            if not watch.active:
                self._dead -= 1
            elif watch.due > now:  # its answer was heard since: watched on, from then
                heapq.heappush(heap, (watch.due, next(self._seq), watch))
            else:
                watch.expired = True
                watch.idle_ran_out = watch.due < watch.hard
                watch.task.cancel()
        if heap:
            self._schedule(loop, heap[0][0])
