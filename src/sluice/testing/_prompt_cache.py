"""The fake's prompt caches, OpenAI's and Anthropic's, as their documentation describes them.

Written from the providers' documents, not from sluice's planner, so a test of the planner
checks it against the providers' rules rather than against its own assumptions.

**OpenAI** (Chat Completions, Responses and their batch lines). A request is routed to a
machine by a hash of its first 256 tokens combined with its ``prompt_cache_key`` (and
its organization: here its API key, and its model). One machine takes at most
``overflow_rpm`` requests a minute for a (prefix, key); the rest spill over to other
machines, cold ones as far as that prefix goes (drawn from ``spill_machines``). A
machine's cache holds the prompts it served in 128-token blocks; a prompt of at least
1,024 tokens reads the longest run of its leading blocks the machine holds (so
``cached_tokens`` is 0 or a multiple of 128 from 1,024) and writes all of them. An entry
lives ``ttl`` seconds from its last use (the documents say 5 to 10 minutes idle; 300 s
here), a day with ``prompt_cache_retention: "24h"`` on models that take it, 30 minutes
on GPT-5.6 (or ``prompt_cache_options.ttl`` ``"30m"``/``"12h"``), whose writes are billed.

**Anthropic** (Messages and Message Batches, which share the cache). Only a prefix that
ends at a ``cache_control`` breakpoint is written: one entry per breakpoint, at most four
breakpoints (a top-level ``cache_control`` puts one on the last block), none below the
model's minimum. A read walks back at most 20 blocks from each breakpoint (the
breakpoint counted) for an entry an earlier request wrote and uses the longest found.
Entries live 5 minutes, or an hour with ``"ttl": "1h"``, refreshed by each read. Tokens
read do not count against the input-tokens limit (ITPM) on current models; writes do.

**Both**: an entry is readable only once the answer that writes it has begun (its first
streamed piece, or the whole answer when not streamed): requests sent together before
then all miss and all write (``duplicate_writes``). Caches are per API key and model.
Time is the fake's clock (the event loop's; virtual under ``run_in_virtual_time``).

``mode``: ``"auto"`` (the default) caches what a request asks to be cached: Anthropic
requests with breakpoints, OpenAI requests with a ``prompt_cache_key`` (or retention
setting); other requests are answered exactly as without a cache, so existing tests and
bills are unchanged. ``"on"`` caches every OpenAI prompt as OpenAI does, automatically;
``"off"`` caches nothing (breakpoints are still checked, as the API checks them).
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._cache_blocks import anthropic_blocks, marked, openai_pieces, token_blocks
from ._cache_models import CacheModel, anthropic_model, openai_model
from ._cache_stats import CacheStats
from ._cache_usage import CacheUse
from ._formats import Call
from ._tokenizer import PromptCounter

__all__ = ["CachePlan", "PromptCache", "PromptCacheMode", "PromptCacheSettings", "owner_of"]

PromptCacheMode = Literal["auto", "on", "off"]
_OPENAI_TTLS = {"30m": 1800.0, "12h": 43_200.0}
#: What makes an OpenAI request ask for caching (in ``"auto"`` mode).
_ASKING = ("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options")
#: Entries are swept of the expired after this many commits.
_SWEEP_EVERY = 4096


@dataclass(frozen=True, slots=True)
class PromptCacheSettings:
    """The fake's prompt caches (see the module); every figure is the documented one."""

    mode: PromptCacheMode = "auto"
    #: OpenAI: the fewest tokens cached, the block size of a hit, the routed prefix.
    min_tokens: int = 1024
    block_tokens: int = 128
    routing_tokens: int = 256
    #: OpenAI: requests a minute one machine takes for a (prefix, key), over this many seconds.
    overflow_rpm: float = 15.0
    overflow_window: float = 60.0
    #: OpenAI: the machines an overflowing request may land on (any of them, at random).
    spill_machines: int = 64
    #: OpenAI: seconds an entry lives unused (in memory), and with ``"24h"`` retention.
    ttl: float = 300.0
    extended_ttl: float = 86_400.0
    #: Anthropic: the lifetimes of ``"5m"`` and ``"1h"`` entries, and the lookback in blocks.
    ttl_5m: float = 300.0
    ttl_1h: float = 3600.0
    lookback: int = 20
    #: The fewest tokens a cached prefix may have, by model (or prefix of one, or ``"*"``),
    #: over the documented ones.
    minimums: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "on", "off"):
            raise ValueError(f"prompt_cache mode must be auto, on or off, got {self.mode!r}")
        for name in ("min_tokens", "block_tokens", "routing_tokens", "spill_machines", "lookback"):
            if getattr(self, name) < 1:
                raise ValueError(f"prompt cache: {name} must be at least 1")
        for name in ("overflow_rpm", "overflow_window", "ttl", "extended_ttl", "ttl_5m", "ttl_1h"):
            if not getattr(self, name) > 0:
                raise ValueError(f"prompt cache: {name} must be positive")


@dataclass(slots=True)
class _Entry:
    """A cached prefix: until when it lives, from when it can be read, its lifetime."""

    expires: float
    readable: float
    ttl: float


@dataclass(frozen=True, slots=True)
class CachePlan:
    """What a request will get from the cache if it is admitted (nothing is stored until
    :meth:`PromptCache.commit`): its usage, and the input tokens its ITPM counts."""

    use: CacheUse
    counted_input: int
    label: str
    api: str
    #: The entries to write or refresh: their store, their keys, their lifetime.
    store: dict[bytes, _Entry]
    keys: tuple[bytes, ...]
    ttl: float
    refresh: bytes | None = None
    #: OpenAI: the home machine's arrivals, when the request goes there; a spill otherwise.
    home: deque[float] | None = None
    spilled: bool = False
    #: Anthropic: the lifetime of each written key (one per breakpoint).
    ttls: tuple[float, ...] = ()


def owner_of(headers: Mapping[str, str]) -> str:
    """Whose cache a request uses: its API key (caches are per organization)."""
    return headers.get("x-api-key") or headers.get("Authorization", "").removeprefix("Bearer ")


class PromptCache:
    """The prompt caches of one fake server (``server.prompt_cache``): consult, then commit."""

    def __init__(self, settings: PromptCacheSettings, counter: PromptCounter, seed: int | None = None) -> None:
        self.settings = settings
        self.stats = CacheStats()
        self._counter = counter
        self._rng = random.Random(seed)
        #: OpenAI: (route, machine) -> block hash -> entry; the home machines' arrivals by route.
        self._machines: dict[tuple[bytes, int], dict[bytes, _Entry]] = {}
        self._homes: dict[bytes, deque[float]] = {}
        #: Anthropic: (owner, model) -> prefix hash -> entry.
        self._entries: dict[tuple[str, str], dict[bytes, _Entry]] = {}
        self._commits = 0

    @property
    def mode(self) -> PromptCacheMode:
        return self.settings.mode

    def consult(self, api: str, body: Any, call: Call, owner: str, now: float) -> CachePlan | None:
        """What ``call`` would read and write at ``now`` (None: the cache is not involved)."""
        if self.settings.mode == "off" or not isinstance(body, Mapping):
            return None
        if api == "anthropic":
            return self._anthropic(body, call, owner, now) if marked(body) else None
        if api not in ("chat", "responses") or (api == "chat" and "messages" not in body):  # not embeddings
            return None
        asked = any(body.get(k) is not None for k in _ASKING)
        if self.settings.mode == "auto" and not asked:
            return None
        return self._openai(api, body, call, owner, now)

    def commit(self, plan: CachePlan, now: float, begins: float) -> CacheUse:
        """The request was admitted at ``now`` and its answer begins at ``begins``: its
        writes are stored (readable from ``begins``) and its reads refreshed."""
        store = plan.store
        if plan.use.writes and any(_writing(store.get(key), now) for key in plan.keys):
            self.stats.duplicate_writes += 1  # another request is still writing this prefix
        for index, key in enumerate(plan.keys):
            ttl = plan.ttls[index] if plan.ttls else plan.ttl
            entry = store.get(key)
            if entry is None or entry.expires <= now:
                store[key] = _Entry(now + ttl, begins, ttl)
            else:
                entry.expires = max(entry.expires, now + ttl)
                entry.readable = min(entry.readable, begins)
        if plan.refresh is not None:
            read = store[plan.refresh]
            read.expires = max(read.expires, now + read.ttl)
        if plan.home is not None:
            plan.home.append(now)
        self.stats.count(plan.label, plan.use, spilled=plan.spilled)
        self._commits += 1
        if self._commits % _SWEEP_EVERY == 0:
            self._sweep(now)
        return plan.use

    def served(self, api: str, body: Any, call: Call, owner: str, now: float) -> Call:
        """``call`` answered at once (a batch line): consulted and committed together."""
        plan = self.consult(api, body, call, owner, now)
        return call if plan is None else call._replace(cache=self.commit(plan, now, now))

    def reset(self) -> None:
        """Empty every cache (the stats stay; see :meth:`CacheStats.reset`)."""
        self._machines.clear()
        self._homes.clear()
        self._entries.clear()

    # -- OpenAI ---------------------------------------------------------------------------

    def _openai(self, api: str, body: Mapping[str, Any], call: Call, owner: str, now: float) -> CachePlan:
        settings, counter = self.settings, self._counter
        model = openai_model(call.model, settings.minimums, settings.min_tokens)
        total, size = call.prompt_tokens, settings.block_tokens
        hashes = token_blocks(counter, openai_pieces(counter, api, body, total), size, total // size)
        routed = hashes[: max(1, settings.routing_tokens // size)]
        key = body.get("prompt_cache_key")
        route = hashlib.sha256(
            "\x1f".join((owner, call.model, str(key))).encode() + (routed[-1] if routed else b"")
        ).digest()
        home = self._homes.setdefault(route, deque())
        while home and home[0] <= now - settings.overflow_window:
            home.popleft()
        spilled = len(home) >= settings.overflow_rpm
        machine = 1 + self._rng.randrange(settings.spill_machines) if spilled else 0
        store = self._machines.setdefault((route, machine), {})
        cacheable = len(hashes) * size >= model.minimum
        matched = 0
        if cacheable:
            for digest in hashes:
                entry = store.get(digest)
                if entry is None or entry.expires <= now or entry.readable > now:
                    break
                matched += 1
        read = matched * size if matched * size >= model.minimum else 0
        written = len(hashes) * size - read if cacheable else 0
        use = CacheUse(
            read=read,
            written=written,
            writes_priced=model.writes_priced,
            read_rate=model.read,
            write_rate=model.write,
            write_1h_rate=model.write_1h,
        )
        label = f"{key if isinstance(key, str) else ''}|{route.hex()[:12]}"
        return CachePlan(
            use,
            total,
            label,
            api,
            store,
            tuple(hashes) if cacheable else (),
            self._openai_ttl(body, model),
            home=None if spilled else home,
            spilled=spilled,
        )

    def _openai_ttl(self, body: Mapping[str, Any], model: CacheModel) -> float:
        options = body.get("prompt_cache_options")
        chosen = options.get("ttl") if isinstance(options, Mapping) else None
        if chosen in _OPENAI_TTLS and model.writes_priced:
            return _OPENAI_TTLS[str(chosen)]
        if body.get("prompt_cache_retention") == "24h" and model.extended:
            return self.settings.extended_ttl
        return model.ttl if model.ttl is not None else self.settings.ttl

    # -- Anthropic ------------------------------------------------------------------------

    def _anthropic(self, body: Mapping[str, Any], call: Call, owner: str, now: float) -> CachePlan | None:
        settings = self.settings
        found = anthropic_blocks(self._counter, body)
        if not found.breakpoints:
            return None
        blocks = found.blocks
        model = anthropic_model(call.model, settings.minimums)
        store = self._entries.setdefault((owner, call.model), {})
        hit = -1
        for point in found.breakpoints:
            for index in range(point, max(-1, point - settings.lookback), -1):
                entry = store.get(blocks[index].hash)
                if entry is not None and entry.expires > now and entry.readable <= now:
                    hit = max(hit, index)
                    break
        read = blocks[hit].end if hit >= 0 else 0
        written = [p for p in found.breakpoints if p > hit and blocks[p].end >= model.minimum]
        short = long = 0
        last = read
        for point in written:
            if blocks[point].ttl == "1h":
                long += blocks[point].end - last
            else:
                short += blocks[point].end - last
            last = blocks[point].end
        use = CacheUse(read, short, long, True, model.read, model.write, model.write_1h)
        counted = call.prompt_tokens - (0 if model.reads_count_itpm else read)
        shown = blocks[hit if hit >= 0 else (written or found.breakpoints)[-1]].hash
        ttls = tuple(settings.ttl_1h if blocks[p].ttl == "1h" else settings.ttl_5m for p in written)
        refresh = blocks[hit].hash if hit >= 0 else None
        keys = tuple(blocks[p].hash for p in written)
        return CachePlan(use, counted, shown.hex()[:12], "anthropic", store, keys, 0.0, refresh, ttls=ttls)

    def _sweep(self, now: float) -> None:
        """Forget expired entries (and machines and homes left empty)."""
        for machine in [m for m, store in self._machines.items() if not _pruned(store, now)]:
            del self._machines[machine]
        for owner in [o for o, store in self._entries.items() if not _pruned(store, now)]:
            del self._entries[owner]
        for route in [r for r, arrivals in self._homes.items() if not arrivals or arrivals[-1] <= now - 3600]:
            del self._homes[route]


def _pruned(store: dict[bytes, _Entry], now: float) -> dict[bytes, _Entry]:
    """``store`` without its expired entries (in place)."""
    for key in [k for k, entry in store.items() if entry.expires <= now]:
        del store[key]
    return store


def _writing(entry: _Entry | None, now: float) -> bool:
    """Whether ``entry`` is being written: it lives, but its answer has not begun."""
    return entry is not None and entry.expires > now and entry.readable > now
