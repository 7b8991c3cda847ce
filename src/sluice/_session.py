"""A spending scope for one task: ``async with engine.session(budget_usd=0.50) as task:``.

An agent that plans, reviews and searches in parallel gives each task its own budget;
every request of the task counts against it and against the engine's budget, and
``remaining()`` lets the task scale its effort to what is left.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._budget import Budget
from ._models import Priority, Request, Result

if TYPE_CHECKING:
    from ._engine import Engine, RequestLike

__all__ = ["Session"]


class Session:
    __slots__ = ("budget", "engine")

    def __init__(self, engine: Engine, budget: Budget) -> None:
        self.engine = engine
        self.budget = budget

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Nothing to release: the engine owns the connections."""

    async def complete(
        self,
        model: str | Request,
        messages: Sequence[Mapping[str, Any]] | str | None = None,
        *,
        priority: int = Priority.INTERACTIVE,
        **fields: Any,
    ) -> Result:
        return await self.engine.complete(model, messages, priority=priority, budget=self.budget, **fields)

    def map(
        self,
        requests: Iterable[RequestLike] | AsyncIterable[RequestLike],
        *,
        model: str | None = None,
        ordered: bool = False,
        priority: int = Priority.BATCH,
    ) -> AsyncIterator[Result]:
        return self.engine.map(requests, model=model, ordered=ordered, priority=priority, budget=self.budget)

    async def run(
        self,
        requests: Iterable[RequestLike] | AsyncIterable[RequestLike],
        *,
        model: str | None = None,
        priority: int = Priority.BATCH,
    ) -> list[Result]:
        return await self.engine.run(requests, model=model, priority=priority, budget=self.budget)

    def remaining(self) -> float:
        """Dollars this task may still start work with (its own cap and the engine's)."""
        return self.budget.remaining()

    def spent(self) -> float:
        return self.budget.spent()

    def __repr__(self) -> str:
        return f"<Session {self.budget!r}>"
