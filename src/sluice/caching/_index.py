"""How many lines share each prefix: a bounded count of boundary hashes.

Memory stays flat however long the input: past ``most`` entries, the prefixes seen once
are forgotten (a prefix shared by many lines is seen again soon, and so survives), as in
lossy counting. Only boundaries at or past the fewest tokens any provider caches are
counted; the rest can never be a group.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._fingerprint import Boundary
from ._rules import LOWEST_MINIMUM

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """Boundary hash -> lines seen with it (see the module docstring)."""

    __slots__ = ("_counts", "most")

    def __init__(self, most: int = 200_000) -> None:
        self.most = most
        self._counts: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, boundaries: Iterable[Boundary]) -> None:
        """One line's boundaries (each hash counted once per line)."""
        counts = self._counts
        last = None
        for boundary in boundaries:
            digest = boundary.digest
            if boundary.tokens < LOWEST_MINIMUM or digest == last:
                continue
            last = digest
            counts[digest] = counts.get(digest, 0) + 1
        if len(counts) > self.most:
            self._shrink()

    def count(self, digest: int) -> int:
        return self._counts.get(digest, 0)

    def _shrink(self) -> None:
        """Forget the rarest prefixes until a quarter of the room is free."""
        counts = self._counts
        floor = 1
        while len(counts) > self.most * 3 // 4:
            for digest in [d for d, n in counts.items() if n <= floor]:
                del counts[digest]
            floor += 1
