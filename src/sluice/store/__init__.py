"""Where finished results live: resume after a crash, and a cache across runs.

A store maps a request's idempotency key (:func:`sluice.store_key`) to its finished
result. The engine consults it before sending and writes every finished result to it
as it lands, so a request with a stored success is never sent again.
"""

from __future__ import annotations

from typing import Protocol

from .._models import Result
from ._sqlite import SqliteStore, StoredResult

__all__ = ["SqliteStore", "Store", "StoredResult"]


class Store(Protocol):
    def get(self, key: str) -> StoredResult | None:
        """The stored outcome of ``key``, or None."""
        ...

    def put(self, key: str, result: Result) -> None:
        """Record a finished result durably before returning."""
        ...

    def close(self) -> None: ...
