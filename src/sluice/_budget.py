"""Budgets that cannot be overshot: reserve the worst case before spending.

At admission a request reserves what it could cost at most (the most prompt tokens the
provider can bill for it, a bound that holds for any byte-level tokenizer, plus every
output token it may produce: see ``_spending.worst_case_tokens``); when the answer
lands the actual cost is committed and the rest of the reservation returns; a failure
releases it, and one that may have been billed unseen commits its worst case. So
however many requests run at once, ``spent + reserved <= limit`` holds at every
instant, and what the provider bills stays within the limit.

A request that does not fit waits while money is still reserved by requests in flight
(they usually cost less than their worst case); when nothing is in flight and it still
does not fit, or what is spent already leaves less than it needs (no hold given back
could make room), it is refused with :class:`BudgetExhaustedError`. No affordable
request is refused while money remains.

Budgets nest: a session's budget (one agent task) counts against the engine's too.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from ._errors import BudgetExhaustedError, ConfigError, UnknownPriceError
from ._format import usd

__all__ = [
    "Budget",
    "BudgetExhaustedError",
    "BudgetHold",
    "BudgetLedger",
    "SharedBudget",
    "SharedHold",
    "UnknownPriceError",
]


class SharedHold(Protocol):
    """A hold on a budget other processes share; ``commit`` must not block (it may settle
    in the background)."""

    def commit(self, actual: float) -> None: ...


class SharedBudget(Protocol):
    """A budget shared with other processes (``sluice.redis.RedisBudget``): reserve the
    worst case before sending, commit the actual cost after (see ``Spending.reserve``)."""

    name: str
    limit: float

    async def reserve(self, amount: float) -> SharedHold: ...

    async def flush(self) -> None:
        """Wait until every commit made so far has reached the shared store."""


class Budget:
    """A spending cap in US dollars; ``parent`` is the budget it also counts against.

    ``shared``: a budget other processes use too (``sluice.redis.RedisBudget``); every
    request under this budget also holds its worst case there (``Spending.reserve``), so
    the cap holds across processes and restarts, not only here."""

    __slots__ = ("_holds", "_reserved", "_spent", "limit", "name", "parent", "shared")

    def __init__(
        self,
        limit_usd: float,
        *,
        parent: Budget | None = None,
        name: str = "budget",
        shared: SharedBudget | None = None,
    ) -> None:
        if isinstance(limit_usd, bool) or not isinstance(limit_usd, (int, float)) or not limit_usd >= 0:
            raise ConfigError(f"{name} must be a number of US dollars >= 0, got {limit_usd!r}")
        self.limit = float(limit_usd)
        self.parent = parent
        self.name = name
        self.shared = shared
        self._spent = 0.0
        self._reserved = 0.0
        #: Open reservations, counted exactly: float sums drift, "is anything in flight?" must not.
        self._holds = 0

    def spent(self) -> float:
        """Dollars committed by finished requests."""
        return self._spent

    def reserved(self) -> float:
        """Dollars held by requests in flight (their worst case)."""
        return self._reserved

    def remaining(self) -> float:
        """What is left to start new work with, here and in every enclosing budget."""
        own = self.limit - self._spent - self._reserved
        return own if self.parent is None else min(own, self.parent.remaining())

    def chain(self) -> list[Budget]:
        budgets: list[Budget] = []
        budget: Budget | None = self
        while budget is not None:
            budgets.append(budget)
            budget = budget.parent
        return budgets

    def add_spent(self, dollars: float) -> None:
        """Count money spent before this process (an earlier run of the same job)."""
        self._spent += dollars

    def __repr__(self) -> str:
        return f"<Budget {self.name} ${self._spent:.4f} spent + ${self._reserved:.4f} reserved of ${self.limit:.4f}>"


class BudgetHold:
    """One request's reservation, settled exactly once.

    ``paid``: what was already counted for the request before this hold (a parked batch
    line whose batch's bill was counted when its results came, see ``Spending.settle_parked``):
    a commit counts only what it costs beyond that."""

    __slots__ = ("_ledger", "_open", "amount", "chain", "paid", "shared")

    def __init__(self, ledger: BudgetLedger, chain: list[Budget], amount: float, paid: float = 0.0) -> None:
        self._ledger = ledger
        self.chain = chain
        self.amount = amount
        self.paid = paid
        self._open = True
        #: The same request's holds on the shared budgets of its chain, settled with this one.
        self.shared: tuple[SharedHold, ...] = ()

    def commit(self, actual: float) -> None:
        """The request cost ``actual``: count it, return the rest of the reservation."""
        if self._open:
            self._open = False
            actual = max(0.0, actual - self.paid) if self.paid else actual
            self._ledger._settle(self, actual)
            for shared in self.shared:
                shared.commit(actual)

    def release(self) -> None:
        """The request cost nothing (failed, or never sent)."""
        self.commit(0.0)

    def absorb(self, other: BudgetHold) -> None:
        """Take ``other``'s reservation into this one (same chain, no shared holds): one
        hold stands for many parked requests (see ``Spending.park``)."""
        assert other._open
        assert self._open
        assert other.chain == self.chain
        assert not other.shared
        other._open = False
        self.amount += other.amount
        for budget in self.chain:
            budget._holds -= 1

    def split(self, amount: float) -> BudgetHold:
        """``amount`` of this reservation as a hold of its own (a parked request asked again)."""
        assert self._open
        assert not self.shared
        amount = min(amount, self.amount)
        self.amount -= amount
        for budget in self.chain:
            budget._holds += 1
        return BudgetHold(self._ledger, self.chain, amount)


class _Waiter:
    __slots__ = ("amount", "chain", "future")

    def __init__(self, chain: list[Budget], amount: float, future: asyncio.Future[BudgetHold]) -> None:
        self.chain = chain
        self.amount = amount
        self.future = future


class BudgetLedger:
    """Reservations against nested budgets, with one queue of waiters for all of them."""

    __slots__ = ("_waiters", "exhausted")

    def __init__(self) -> None:
        self._waiters: deque[_Waiter] = deque()
        #: Set once any request has been refused: the progress display says so.
        self.exhausted = False

    async def reserve(self, budget: Budget, amount: float) -> BudgetHold:
        chain = budget.chain()
        if _fits(chain, amount):
            return self._grant(chain, amount)
        if not _may_free(chain, amount):
            raise self._refuse(chain, amount)
        future: asyncio.Future[BudgetHold] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(chain, amount, future)
        self._waiters.append(waiter)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().release()
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _grant(self, chain: list[Budget], amount: float, paid: float = 0.0) -> BudgetHold:
        for budget in chain:
            budget._reserved += amount
            budget._holds += 1
        return BudgetHold(self, chain, amount, paid)

    def paid_hold(self, budget: Budget, paid: float) -> BudgetHold:
        """A hold of nothing for a request whose cost, ``paid``, was counted already: its
        commit counts only what it costs beyond that."""
        return self._grant(budget.chain(), 0.0, paid)

    def _refuse(self, chain: list[Budget], amount: float) -> BudgetExhaustedError:
        self.exhausted = True
        tight = min(chain, key=lambda b: b.limit - b._spent - b._reserved)
        left = tight.limit - tight._spent - tight._reserved
        return BudgetExhaustedError(
            f"not run: its worst case {usd(amount)} exceeds the {usd(left)} left of {tight.name} "
            f"({usd(tight.limit)}); rerun with a larger budget to resume"
        )

    def _settle(self, hold: BudgetHold, actual: float) -> None:
        for budget in hold.chain:
            budget._holds -= 1
            budget._reserved = budget._reserved - hold.amount if budget._holds else 0.0
            budget._spent += actual
        self._wake()

    def _wake(self) -> None:
        for waiter in list(self._waiters):
            if waiter.future.done():
                continue
            if _fits(waiter.chain, waiter.amount):
                waiter.future.set_result(self._grant(waiter.chain, waiter.amount))
            elif not _may_free(waiter.chain, waiter.amount):
                waiter.future.set_exception(self._refuse(waiter.chain, waiter.amount))


def _fits(chain: list[Budget], amount: float) -> bool:
    return all(b._spent + b._reserved + amount <= b.limit + 1e-12 for b in chain)


def _may_free(chain: list[Budget], amount: float) -> bool:
    """Could a request in flight still return money to every budget that blocks this one,
    enough to make room? (Spent money never comes back.)"""
    return all(
        b._holds > 0 and b._spent + amount <= b.limit + 1e-12
        for b in chain
        if b._spent + b._reserved + amount > b.limit + 1e-12
    )
