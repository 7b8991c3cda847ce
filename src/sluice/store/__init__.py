"""Where finished results live: resume after a crash, a cache across runs, and the money.

A store maps a request's idempotency key (:func:`sluice.store_key`) to its finished
result. The engine consults it before sending, records an *intent* (durably) before each
attempt goes out and settles it with what the attempt cost, and writes every finished
result as it lands, before anyone is told of it. So a request with a stored answer is
never sent again, and the requests in flight when a process died are known by the rerun.
A store may also keep the job's timeline (an :class:`AttemptLog` as its ``timeline``):
every attempt and cooldown, for the plots of ``sluice report --html``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._errors import SluiceError, StoreError
from .._models import Deployment, Result, Usage
from ._sqlite import Recovered, Spend, SqliteStore, StoredResult
from ._timeline import SqliteTimeline
from ._vectors import StoredVector, VectorStore

__all__ = [
    "AttemptLog",
    "Recovered",
    "SettlingStore",
    "Spend",
    "SqliteStore",
    "SqliteTimeline",
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


class AttemptLog(Protocol):
    """What an engine tells a store's ``timeline`` (when it has one that is not None): each
    attempt as it settles and each cooldown as it begins. Times are the event loop's
    clock. Called on the hot path: it must only note, never wait or raise."""

    def attempt(
        self,
        deployment: Deployment,
        sent_at: float,
        ended: float,
        number: int,
        error: SluiceError | None,
        usage: Usage | None,
        cost: float,
        first_at: float | None,
    ) -> None:
        """An attempt that was sent is over: ``number`` is the job's attempt count (2 and up:
        a retry), ``error`` None for an answer, ``cost`` what it was charged, ``first_at``
        when a stream's first delta came (None: not a stream)."""
        ...

    def cooldown(self, deployment: Deployment, seconds: float, why: str) -> None:
        """``deployment`` takes no attempts for ``seconds`` from now, because of ``why``."""
        ...
