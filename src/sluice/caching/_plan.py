"""The plan for one request: which groups it belongs to, whether it writes their entries or
reads them (or waits for the request that writes them), and how it is marked.

:class:`PromptCache` is an engine's planner (``Engine(prompt_cache=...)``): the prefix
index, the groups, what each answer read and wrote, and the share of a predicted read
that answers bear out. A request of at least the fewest tokens its model caches is
fingerprinted and counted; its *chain* is the boundaries it shares with other lines,
past its model's minimum, where sharing pays at the cache's prices, one per level of
sharing (the instructions every line has, then the document eight lines ask about),
outer first. Walking the chain: a group whose entry lives is read; one being written by
another request makes this one wait (held in that group); otherwise this request writes every
group from there in (it *primes* them). A request whose chain is empty is sent as it
came: nothing marked, nothing held.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .._models import Usage
from ._fingerprint import Boundary, Cut, fingerprint, marked_positions
from ._groups import CacheTally, Group, Groups, cache_count
from ._index import PrefixIndex
from ._marks import anthropic_view, legal_ttls, native_marked, with_breakpoints, with_key
from ._rules import LOWEST_MINIMUM, MAX_BREAKPOINTS, TTL_1H, TTL_5M, CacheRules, rules_for

if TYPE_CHECKING:
    from .._job import Job
    from .._models import Deployment, Request, Result
    from .._pricing import Pricing

__all__ = ["CacheRates", "Planned", "PromptCache", "cache_rates", "shared_chain"]

#: A boundary counts only this far past its model's minimum (sluice's estimate of tokens
#: is not the provider's count).
MINIMUM_MARGIN = 1.05
#: How far a prediction of what a request reads moves with each answer.
_LEARNING = 0.3
#: Seconds: the shortest entry lifetime learnt from misses (a read sent right after its
#: primer's answer that misses says the entry was never there, not that it lives no time).
_SHORTEST_LIFETIME = 1.0


class Planned:
    """What the plan says of one job (``Job.cache``): the groups it writes (``primes``) and
    the deepest one it reads (``reads``), its breakpoints, and the read it expects."""

    __slots__ = ("_marked", "age", "cuts", "expect_read", "plain", "primes", "reads")

    def __init__(self, cuts: tuple[tuple[Cut, str], ...], primes: tuple[Group, ...], reads: Group | None) -> None:
        self.cuts = cuts
        self.primes = primes
        self.reads = reads
        self.expect_read = 0
        #: Seconds the entry it reads had gone unused when it was last sent (None: it reads none).
        self.age: float | None = None
        #: It was last sent unmarked: the entry it was to read had likely gone by then.
        self.plain = False
        self._marked: tuple[Request, Request] | None = None

    @property
    def hour(self) -> bool:
        """A breakpoint asks for an hour-long entry (billed at twice the input price)."""
        return any(ttl == "1h" for _, ttl in self.cuts)

    #: Seconds a reader waits for a deployment that holds its entry before it takes one
    #: that does not (and writes the entry there, at the write premium): a reader of a
    #: group whose deployment is full goes elsewhere this long after it found no room.
    patience = 10.0

    @property
    def routes(self) -> list[Any]:
        """The deployments (router Routes) whose caches hold what it reads: tried first."""
        return self.reads.routes if self.reads is not None else []

    def request_for(self, request: Request, deployment: Deployment, now: float) -> Request:
        """``request`` marked for the cache of ``deployment`` (as it is sent; sent as it is
        to a provider that caches nothing the planner knows)."""
        rules = rules_for(deployment)
        if rules is None:
            return request
        if self.reads is not None:
            self.age = now - self.reads.last_used
        if rules.kind == "anthropic":
            # a reader kept past its entry's lifetime (by the limiter, a retry's backoff)
            # would write it again at the write premium: it goes unmarked, at the plain price
            self.plain = not self.primes and self.reads is not None and not self.reads.live(now)
            if not self.cuts or self.plain:
                return request
            marked = self._marked
            if marked is None or marked[0] is not request:
                view = anthropic_view(request, rules)  # an Anthropic body as written: marked in it
                sent = with_breakpoints(view, self.cuts)
                marked = self._marked = (request, sent if view is request else native_marked(request, sent))
            return marked[1]
        group = self.primes[-1] if self.primes else self.reads
        return with_key(request, group.key(now)) if group is not None else request


@dataclasses.dataclass(frozen=True, slots=True)
class CacheRates:
    """A model's cache prices as multiples of its input price."""

    read: float
    write: float
    hour: float

    def pays(self, lines: int, hour: bool = False) -> bool:
        """Whether writing a prefix once and reading it ``lines - 1`` times costs less than
        sending it ``lines`` times."""
        return (self.hour if hour else self.write) + (lines - 1) * self.read < lines


def cache_rates(pricing: Pricing, deployment: Deployment, rules: CacheRules) -> CacheRates:
    """The model's read and write prices as multiples of its input price: genai-prices'
    (or the deployment's own), else the providers' documented ones."""
    read, write = (0.1, 1.25) if rules.kind == "anthropic" else (0.5, 1.0)
    known = pricing.known(deployment)
    price = known.price if known is not None else None
    if price is not None and price.input_per_mtok > 0:
        if price.cached_input_per_mtok is not None:
            read = price.cached_input_per_mtok / price.input_per_mtok
        if price.cache_write_per_mtok is not None:
            write = price.cache_write_per_mtok / price.input_per_mtok
    return CacheRates(read, write, 2.0 if rules.kind == "anthropic" else write)


def shared_chain(
    boundaries: list[Boundary], index: PrefixIndex, rules: CacheRules, rates: CacheRates, room: int
) -> list[tuple[Boundary, int]]:
    """The boundaries of a prompt that other lines share (with how many lines), past the
    model's minimum and where caching pays, the deepest of each level of sharing, outer
    first; at most ``room`` of them, the deepest (Anthropic: the breakpoints left; OpenAI:
    one, a key per group, since an outer group's entry is on another machine)."""
    least = rules.minimum * MINIMUM_MARGIN
    shared: list[tuple[Boundary, int]] = []
    for boundary in boundaries:
        if boundary.tokens < least:
            continue
        lines = index.count(boundary.digest)
        if lines < 2 or not rates.pays(lines):
            continue
        if shared and lines >= shared[-1][1]:
            shared.pop()  # as widely shared as this one, and shorter: this one covers it
        shared.append((boundary, lines))
    return shared[-room:] if room > 0 else []


class PromptCache:
    """An engine's prompt-cache planner (see the module docstring)."""

    def __init__(self, pricing: Pricing, *, lookahead: int = 64, max_hold: float = 120.0) -> None:
        self.pricing = pricing
        self.index = PrefixIndex()
        self.groups = Groups()
        #: Jobs a fan-out reads ahead before it decides the first; seconds a job may wait
        #: for its group's primer before it is sent anyway.
        self.lookahead = lookahead
        self.max_hold = max_hold
        #: Of a predicted read, the share answers bore out (learnt; 1.0 to begin with).
        self.borne_out = 1.0
        #: Each job's boundaries are counted as it comes (off once a whole input was
        #: counted beforehand: :meth:`adopt`).
        self.counting = True
        self.total = CacheTally()
        self.by_deployment: dict[str, CacheTally] = {}
        #: Per deployment (label): the longest an entry is counted on, learnt from reads
        #: that missed (an entry that had gone unused that long was gone).
        self.lifetimes: dict[str, float] = {}
        self._rates: dict[int, tuple[Deployment, CacheRates]] = {}

    # -- what a job shares ----------------------------------------------------------------

    def boundaries(self, job: Job) -> list[Boundary] | None:
        """The job's boundaries, counted in the index; None when its model caches nothing
        the planner knows, or its prompt is shorter than any cache takes (no fingerprint:
        the common case of short prompts costs one test)."""
        if job.tokens - job.output < LOWEST_MINIMUM:
            return None
        rules = rules_for(job.route.deployment)
        if rules is None:
            return None
        native = job.request.native  # a body sent as written: only an Anthropic one is read (and marked)
        if native is not None and (native.api != "anthropic" or rules.kind != "anthropic"):
            return None
        found = fingerprint(anthropic_view(job.request, rules))
        if self.counting:
            self.index.add(found)
        return found

    def adopt(self, index: PrefixIndex) -> None:
        """Plan on ``index``: every line of the job counted beforehand (``sluice run``'s
        first pass over its input), so a line knows the lines far ahead that share it."""
        self.index = index
        self.counting = False

    def chain(self, job: Job, boundaries: list[Boundary]) -> list[tuple[Boundary, Group]]:
        """The groups ``job`` shares, outer first (see the module docstring)."""
        deployment = job.route.deployment
        rules = rules_for(deployment)
        assert rules is not None
        rates = self.rates(deployment, rules)
        hour = deployment.tier == "batch"
        room = MAX_BREAKPOINTS - len(marked_positions(anthropic_view(job.request, rules))) if rules.breakpoints else 1
        shared = shared_chain(boundaries, self.index, rules, rates, room)
        chain = []
        for boundary, lines in shared:
            group = self.groups.get(boundary.digest, boundary.tokens)
            group.lines = lines
            asked = TTL_1H if hour and rates.pays(lines, hour=True) else TTL_5M
            group.ttl = min(asked, self.lifetimes.get(deployment.label, asked))
            chain.append((boundary, group))
        return chain

    def place(self, job: Job, chain: list[tuple[Boundary, Group]], now: float) -> Planned | Group | None:
        """``job``'s plan: a :class:`Planned` to send it with, the Group it waits in (for its
        primer's answer), or None (nothing shared: sent as it came)."""
        if not chain:
            return None
        deepest = -1
        for number, (_, group) in enumerate(chain):
            if group.live(now):
                deepest = number
        if deepest + 1 < len(chain) and job.route.deployment.tier != "batch":  # a batch is not waited on
            group = chain[deepest + 1][1]
            if group.priming:
                group.held.append(job)
                return group
        primes = tuple(group for _, group in chain[deepest + 1 :])
        for group in primes:
            group.priming = True
        reads = chain[deepest][1] if deepest >= 0 else None
        planned = Planned(self._cuts(job, chain), primes, reads)
        if reads is not None:
            planned.expect_read = int(chain[deepest][0].tokens * self.borne_out)
        return planned

    def _cuts(self, job: Job, chain: list[tuple[Boundary, Group]]) -> tuple[tuple[Cut, str], ...]:
        rules = rules_for(job.route.deployment)
        if rules is None or not rules.breakpoints:
            return ()
        wanted = [(boundary.order, "1h" if group.ttl == TTL_1H else "5m") for boundary, group in chain]
        ttls = legal_ttls(wanted, marked_positions(anthropic_view(job.request, rules)))
        return tuple((boundary.cut, ttl) for (boundary, _), ttl in zip(chain, ttls, strict=True))

    def rates(self, deployment: Deployment, rules: CacheRules) -> CacheRates:
        """The model's cache prices (see :func:`cache_rates`), looked up once per deployment."""
        entry = self._rates.get(id(deployment))
        if entry is not None and entry[0] is deployment:
            return entry[1]
        rates = cache_rates(self.pricing, deployment, rules)
        self._rates[id(deployment)] = (deployment, rates)
        return rates

    # -- what it got ----------------------------------------------------------------------

    def finished(self, job: Job, planned: Planned, result: Result, now: float) -> list[Job]:
        """``job``'s answer (or failure) is in: its groups learn, and the jobs that waited
        for it as their primer are handed back (to be placed again)."""
        answered = result.ok and result.attempts > 0 and not result.cached
        # its group written before its answer: by another line sent beside it (a batch's lines
        # all prime, a batch being answered in turn), so a write of its own was a duplicate
        rewrote = bool(planned.primes) and planned.primes[-1].live(now)
        # sent where its entry was not (its deployments had no room): a write there says
        # nothing of how long entries live
        elsewhere = planned.reads is not None and job.route not in planned.reads.routes
        for group in planned.primes:
            group.priming = False
            if answered:
                group.used(now, job.route)
        if answered and planned.reads is not None and not planned.plain:
            planned.reads.used(now, job.route)  # read there, or written there anew
        if answered:
            self._count(job, planned, result.usage, rewrote)
            if not elsewhere:
                self._learn_lifetime(job, planned, result.usage)
        released: list[Job] = []
        for group in planned.primes:
            while group.held:
                released.append(group.held.popleft())
        return released

    def _learn_lifetime(self, job: Job, planned: Planned, usage: Usage) -> None:
        """A planned read that came back a write of the prefix (Anthropic: its entry had
        gone; an entry lives only where a breakpoint asked, so a miss is its lifetime, not
        routing): the deployment's entries are counted on for less than the entry's age
        then, so the next lines of a group whose entry may be gone prime it again, one
        line first, rather than each writing it in parallel."""
        reads, age = planned.reads, planned.age
        if reads is None or age is None or not planned.cuts or planned.plain:
            return
        label = job.route.deployment.label
        known = self.lifetimes.get(label, reads.ttl)
        if usage.cached_input_tokens >= reads.tokens // 2:  # read: entries live at least that long
            if label in self.lifetimes and age > known:
                self.lifetimes[label] = age
        elif usage.cache_write_tokens >= reads.tokens // 2:  # written again: it had gone
            # halved at most per miss: one odd miss (a provider's restart) does not teach a
            # lifetime of seconds; misses that keep coming do, in a few steps
            self.lifetimes[label] = max(_SHORTEST_LIFETIME, min(known, max(age, known / 2)))
            reads.ttl = min(reads.ttl, self.lifetimes[label])

    def _count(self, job: Job, planned: Planned, usage: Usage, rewrote: bool) -> None:
        deployment = job.route.deployment
        uncached, written, read, saved, _ = cache_count(self.pricing, deployment, usage, expected_read=False)
        if planned.expect_read:
            self.borne_out = min(1.0, (1 - _LEARNING) * self.borne_out + _LEARNING * read / planned.expect_read)
        duplicate = written > 0 and (rewrote or not planned.primes)
        tallies = [self.total, self.by_deployment.setdefault(deployment.label, CacheTally())]
        group = planned.primes[-1] if planned.primes else planned.reads
        if group is not None:
            tallies.append(group.tally)
        for tally in tallies:
            tally.add(uncached, written, read, saved, duplicate=duplicate)

    def summary(self, groups: int = 10) -> dict[str, Any]:
        """What the planner did, as JSON-ready data: totals, per deployment, the largest groups."""
        largest = sorted((g for g in self.groups if g.tally.requests), key=lambda g: -g.tally.requests)[:groups]
        return {
            **self.total.summary(),
            "groups": sum(1 for g in self.groups if g.tally.requests),
            "by_deployment": {label: tally.summary() for label, tally in sorted(self.by_deployment.items())},
            "by_group": {g.label: {"tokens": g.tokens, **g.tally.summary()} for g in largest},
        }
