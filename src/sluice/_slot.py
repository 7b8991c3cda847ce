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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._budget import BudgetHold
from ._errors import StoreError
from ._limits import Reservation
from ._stats import Stats

if TYPE_CHECKING:
    from .store import Store

__all__ = ["Slot", "Tally", "WaitingScope", "stopped_note"]


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
        "_sent_at",
        "_stats",
        "_store",
        "_worst",
        "placed_at",
        "reservation",
        "route",
        "tally",
    )

    def __init__(
        self,
        route: Any,
        reservation: Reservation,
        hold: BudgetHold | None,
        tally: Tally,
        stats: Stats,
        worst: Callable[[], float],
        store: Store | None = None,
        on_store_error: Callable[[StoreError], None] | None = None,
    ) -> None:
        #: Where this attempt goes (the engine's route: deployment, limiter, provider).
        self.route = route
        #: The deployment's health epoch when it was placed (see ``Health.succeeded``).
        self.placed_at: int | None = getattr(getattr(route, "health", None), "epoch", None)
        self.reservation = reservation
        self.tally = tally
        self._hold = hold
        self._stats = stats
        self._worst = worst
        self._store = store
        self._on_store_error = on_store_error
        self._intent: int | None = None
        self._sent_at = 0.0

    async def note(self, key: str) -> StoreError | None:
        """Durably record the attempt before it is sent; the error if that cannot be done
        (the attempt is then released, unsent)."""
        if self._store is None:
            return None
        try:
            self._intent = await self._store.begin(key, self._worst())
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

    def sending(self) -> None:
        """It goes to the provider now."""
        tally = self.tally
        tally.attempts += 1
        tally.sent = tally.sent_this_time = tally.at_provider = True
        self._stats.attempts += 1
        self._sent_at = asyncio.get_running_loop().time()

    @property
    def sent_at(self) -> float:
        return self._sent_at

    def settle(self, charge: float | None, *, answered: bool, cut_off: bool) -> None:
        """The attempt is over. ``charge`` is what it cost (None: it may have been billed
        unseen, so its worst case); ``cut_off``: cancelled while still at the provider, so
        its intent stays open for the rerun to count."""
        tally = self.tally
        tally.at_provider = cut_off
        tally.latency = asyncio.get_running_loop().time() - self._sent_at
        self.reservation.done()
        charge = self._worst() if charge is None else max(0.0, charge)  # a cost is never a refund
        if self._hold is not None:
            self._hold.commit(charge)
        tally.charged += charge
        self._stats.charge(charge, answered=answered)
        if self._intent is not None and not cut_off:
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
