"""Results that finish in any order, handed out in input order (``map(ordered=True)``,
``embed``/``embed_map(ordered=True)``): each waits until every earlier one is out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["InOrder"]

T = TypeVar("T")


class InOrder(Generic[T]):
    __slots__ = ("_next", "_waiting")

    def __init__(self) -> None:
        self._waiting: dict[int, T] = {}
        self._next = 0

    def arrived(self, index: int, item: T) -> Iterator[T]:
        """``item`` is the ``index``-th (from 0): what may be handed out now, in order."""
        waiting = self._waiting
        waiting[index] = item
        while self._next in waiting:
            ready = waiting.pop(self._next)
            self._next += 1
            yield ready
