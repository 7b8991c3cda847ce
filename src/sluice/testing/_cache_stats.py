"""What the fake's prompt caches did, for tests and benchmarks to check (``server.prompt_cache.stats``,
and ``prompt_cache`` in ``GET /_fake/stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._cache_usage import CacheUse

__all__ = ["CacheStats", "PrefixStats"]


@dataclass(slots=True)
class PrefixStats:
    """One prefix's requests: an OpenAI route (``key|hash of its first tokens``) or an
    Anthropic entry (the hash of the prefix read, or else written)."""

    requests: int = 0
    hits: int = 0
    read_tokens: int = 0
    written_tokens: int = 0
    spills: int = 0


@dataclass(slots=True)
class CacheStats:
    """Counters of the requests the caches served (admitted ones; a 429 touches nothing)."""

    #: Requests the cache was consulted for, and those that read from it.
    requests: int = 0
    hits: int = 0
    #: Tokens read from the cache, written to it (all lifetimes), written with ``"ttl": "1h"``.
    read_tokens: int = 0
    written_tokens: int = 0
    written_1h_tokens: int = 0
    #: Writes of a prefix another request was still writing (not yet readable): requests
    #: sent together before the first answer began, each paying for the same write.
    duplicate_writes: int = 0
    #: OpenAI requests that overflowed their (prefix, key)'s machine to another.
    spills: int = 0
    by_prefix: dict[str, PrefixStats] = field(default_factory=dict)

    def count(self, label: str, use: CacheUse, *, spilled: bool) -> None:
        """One admitted request's reads and writes."""
        prefix = self.by_prefix.get(label)
        if prefix is None:
            prefix = self.by_prefix[label] = PrefixStats()
        self.requests += 1
        prefix.requests += 1
        if use.read:
            self.hits += 1
            prefix.hits += 1
        self.read_tokens += use.read
        prefix.read_tokens += use.read
        self.written_tokens += use.writes
        prefix.written_tokens += use.writes
        self.written_1h_tokens += use.written_1h
        if spilled:
            self.spills += 1
            prefix.spills += 1

    def reset(self) -> None:
        """Back to zero (``FakeServer.reset_stats``)."""
        fresh = CacheStats()
        for name in self.__slots__:
            setattr(self, name, getattr(fresh, name))

    def summary(self) -> dict[str, Any]:
        """The counters as JSON-ready data."""
        return {
            "requests": self.requests,
            "hits": self.hits,
            "read_tokens": self.read_tokens,
            "written_tokens": self.written_tokens,
            "written_1h_tokens": self.written_1h_tokens,
            "duplicate_writes": self.duplicate_writes,
            "spills": self.spills,
            "by_prefix": {
                label: {name: getattr(prefix, name) for name in PrefixStats.__slots__}
                for label, prefix in sorted(self.by_prefix.items())
            },
        }
