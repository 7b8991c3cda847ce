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
from typing import TYPE_CHECKING, Any, NamedTuple

from .._models import Usage
from ._rules import KEY_RPM

if TYPE_CHECKING:
    from .._models import Deployment
    from .._pricing import Pricing

__all__ = ["CacheCount", "CacheTally", "Group", "Groups", "cache_count"]

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


class CacheCount(NamedTuple):
    """One answer's prompt tokens split as the provider billed them, and what that saved
    against sending them uncached."""

    uncached: int
    written: int
    read: int
    saved_usd: float
    #: A write of a prefix the plan expected to read (its entry had gone, or was being written).
    duplicate: bool


def cache_count(pricing: Pricing, deployment: Deployment, usage: Usage, *, expected_read: bool) -> CacheCount:
    """``usage``'s prompt tokens read, written and uncached, and the dollars saved."""
    read = min(usage.cached_input_tokens, usage.input_tokens)
    written = min(usage.cache_write_tokens, usage.input_tokens - read)
    saved = 0.0
    cost = pricing.cost(deployment, usage)
    if cost is not None and (read or written):
        plain = Usage(usage.input_tokens, usage.output_tokens, reasoning_tokens=usage.reasoning_tokens)
        saved = (pricing.cost(deployment, plain) or 0.0) - cost
    return CacheCount(usage.input_tokens - read - written, written, read, saved, written > 0 and expected_read)


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
    #: When it was last asked for (:meth:`Groups.get`; the loop's clock, 0: not said).
    asked: float = 0.0

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

    def get(self, digest: int, tokens: int, now: float = 0.0) -> Group:
        """The group of ``digest`` (made when new), as asked for at ``now``."""
        group = self._groups.get(digest)
        if group is None:
            group = self._groups[digest] = Group(digest, tokens)
            if len(self._groups) > self.most:
                self._forget()
        else:
            self._groups.move_to_end(digest)
        group.asked = max(group.asked, now)
        return group

    def find(self, digest: int) -> Group | None:
        return self._groups.get(digest)

    def expire(self, now: float, idle: float) -> int:
        """Forget the groups not asked for (:meth:`get`) in ``idle`` seconds and not
        priming nor holding anyone (a server's: it runs for weeks, and a group whose entry
        is long gone knows nothing worth keeping); returns how many went. The groups are in
        the order last asked for, so it stops at the first one still in use."""
        groups = self._groups
        old = []
        for digest, group in groups.items():  # lazily: it stops at the first one in use
            if now - max(group.asked, group.last_used) < idle:
                break  # this one and all after it were asked for since
            if not group.held and not group.priming:
                old.append(digest)
        for digest in old:
            del groups[digest]
        return len(old)

    def _forget(self) -> None:
        for digest in list(self._groups)[: len(self._groups) - self.most * 3 // 4]:
            group = self._groups[digest]
            if not group.held and not group.priming:
                del self._groups[digest]
