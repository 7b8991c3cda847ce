"""Where finished results live: resume after a crash, a cache across runs, and the money.

A store maps a request's idempotency key (:func:`sluice.store_key`) to its finished
result. The engine consults it before sending, records an *intent* (durably) before each
attempt goes out and settles it with what the attempt cost, and writes every finished
result as it lands, before anyone is told of it. So a request with a stored answer is
never sent again, and the requests in flight when a process died are known by the rerun.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._errors import StoreError
from .._models import Result
from ._sqlite import Recovered, Spend, SqliteStore, StoredResult
from ._vectors import StoredVector, VectorStore

__all__ = [
    "Recovered",
    "SettlingStore",
    "Spend",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoredResult",
    "StoredVector",
    "VectorStore",
]


class Store(Protocol):
    def get(self, key: str) -> StoredResult | None:
        """The stored outcome of ``key``, or None."""
        ...

    async def begin(self, key: str, worst_usd: float) -> int:
        """Durably record an attempt about to be sent (at its worst-case cost); an id for
        :meth:`settle`. Raises :class:`StoreError` when that cannot be recorded."""
        ...

    def settle(self, intent: int, charged_usd: float, *, answered: bool) -> None:
        """The attempt is over: it cost ``charged_usd`` (an answer's cost, or the worst case
        of a failure that may have been billed, or 0)."""
        ...

    async def put(self, key: str, result: Result) -> None:
        """Record a finished result durably before returning."""
        ...

    @property
    def error(self) -> StoreError | None:
        """Why writes fail, once they have."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class SettlingStore(Store, Protocol):
    """A store that can also record a result and settle the intent of the attempt that
    produced it in one write (the engine uses it when a store offers it: one op and one
    commit per answer instead of two)."""

    async def put_settled(self, key: str, result: Result, intent: int, charged_usd: float, *, answered: bool) -> None:
        """:meth:`Store.put` and :meth:`Store.settle` together; durable before returning."""
        ...
