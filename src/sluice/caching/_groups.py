"""Groups of requests that share a prefix, and what the planner knows of each.

A group is named by the hash of its shared prefix. It is *priming* while the one request
sent to write its cache entry has not been answered (the others wait: an entry is
readable only once the answer that writes it has begun), and *live* until its entry is
likely gone (its lifetime after its last use). Each group keeps the deployment that wrote
its entry (deployments have separate caches) and, for OpenAI, its cache keys: one shard
per ~15 requests a minute, the rate past which OpenAI spreads one (prefix, key) over
other machines, cold ones.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from ._rules import KEY_RPM

__all__ = ["CacheTally", "Group", "Groups"]

#: Seconds before an entry's lifetime ends that the planner stops counting on it (a tenth
#: of a lifetime learnt to be short).
_MARGIN = 30.0
_KEY_WINDOW = 60.0


@dataclass(slots=True)
class CacheTally:
    """Tokens a set of requests sent uncached, wrote to the cache and read from it, with
    what that saved against sending them uncached."""

    requests: int = 0
    hits: int = 0
    uncached_tokens: int = 0
    written_tokens: int = 0
    read_tokens: int = 0
    #: Writes of a prefix the plan expected to read (another request wrote it too, or it had gone).
    duplicate_writes: int = 0
    saved_usd: float = 0.0

    def add(self, uncached: int, written: int, read: int, saved: float, *, duplicate: bool) -> None:
        self.requests += 1
        self.hits += read > 0
        self.uncached_tokens += uncached
        self.written_tokens += written
        self.read_tokens += read
        self.duplicate_writes += duplicate
        self.saved_usd += saved

    @property
    def hit_rate(self) -> float:
        """Of the prompt tokens, the share read from the cache."""
        total = self.uncached_tokens + self.written_tokens + self.read_tokens
        return self.read_tokens / total if total else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "hits": self.hits,
            "uncached_tokens": self.uncached_tokens,
            "written_tokens": self.written_tokens,
            "read_tokens": self.read_tokens,
            "hit_rate": round(self.hit_rate, 4),
            "duplicate_writes": self.duplicate_writes,
            "saved_usd": round(self.saved_usd, 9),
        }


@dataclass(slots=True, eq=False)
class Group:
    """One shared prefix (see the module docstring)."""

    digest: int
    tokens: int
    #: Lines of the group seen so far (an estimate: the index is lossy).
    lines: int = 0
    priming: bool = False
    #: When its entry was last written or read (the loop's clock); 0: never written.
    last_used: float = 0.0
    #: Its entry's lifetime, refreshed by each use (the one asked for, or shorter where the
    #: planner learnt the provider's entries go sooner).
    ttl: float = 300.0
    #: Jobs waiting for its primer's answer.
    held: deque[Any] = field(default_factory=deque)
    #: The deployments (router Routes) that hold its entry: wrote or read it in its
    #: lifetime. Several deployments of a model have separate caches.
    routes: list[Any] = field(default_factory=list)
    #: OpenAI: each key shard's sends in the last minute.
    shards: list[deque[float]] = field(default_factory=list)
    tally: CacheTally = field(default_factory=CacheTally)

    def live(self, now: float) -> bool:
        """Its entry is counted on: used within its lifetime (less a margin)."""
        return self.last_used > 0 and now < self.last_used + self.ttl - min(_MARGIN, self.ttl / 10)

    def used(self, now: float, route: Any = None) -> None:
        """Its entry was written or read now (on ``route``): it lives its lifetime from now."""
        if not self.live(now):  # gone everywhere it was: only where it was written now holds it
            self.routes.clear()
        self.last_used = max(self.last_used, now)
        if route is not None and route not in self.routes:
            self.routes.append(route)

    def key(self, now: float) -> str:
        """The ``prompt_cache_key`` of the next request: the first shard not yet at ~15
        requests in the last minute (a new one when all are), its send counted."""
        for number, sends in enumerate(self.shards):
            while sends and sends[0] <= now - _KEY_WINDOW:
                sends.popleft()
            if len(sends) < KEY_RPM:
                sends.append(now)
                return f"sluice-{self.digest:016x}-{number}"
        self.shards.append(deque([now]))
        return f"sluice-{self.digest:016x}-{len(self.shards) - 1}"

    @property
    def label(self) -> str:
        return f"{self.digest:016x}"[:12]


class Groups:
    """The groups known, at most ``most`` (the least recently used idle ones are forgotten)."""

    __slots__ = ("_groups", "most")

    def __init__(self, most: int = 50_000) -> None:
        self.most = most
        self._groups: OrderedDict[int, Group] = OrderedDict()

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Any:
        return iter(self._groups.values())

    def get(self, digest: int, tokens: int) -> Group:
        group = self._groups.get(digest)
        if group is None:
            group = self._groups[digest] = Group(digest, tokens)
            if len(self._groups) > self.most:
                self._forget()
        else:
            self._groups.move_to_end(digest)
        return group

    def find(self, digest: int) -> Group | None:
        return self._groups.get(digest)

    def _forget(self) -> None:
        for digest in list(self._groups)[: len(self._groups) - self.most * 3 // 4]:
            group = self._groups[digest]
            if not group.held and not group.priming:
                del self._groups[digest]
