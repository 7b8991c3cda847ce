"""The prompt-cache plan of a server (``sluice serve``, ``[serve] prompt_cache = "auto"``).

A server sees requests one at a time, from many clients, for weeks; it cannot read ahead
as a job does. So its index counts prefixes as requests come, and a prefix is marked
from the second request that carries it: the first cannot know it will recur, and
marking it would pay Anthropic's write premium (1.25x) on every prompt that never comes
again. Anthropic: the second request writes (breakpoints at the boundaries it shares,
beside the client's own, at most 4, none below the model's minimum), the next ones read;
a request sent while another is writing the same prefix is not held (a client must not
wait on another's answer): it reads what already lives and writes nothing more. OpenAI:
a ``prompt_cache_key`` per client and prefix (the widest shared one), sharded so that no key passes ~15 requests
a minute (a client's own key is kept). A request that shares nothing goes as it came.

Memory stays bounded however long the server runs: the index forgets rare prefixes
(:class:`PrefixIndex`), and the groups are at most ``most_groups``, those not asked for
in twice an entry's lifetime forgotten.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._models import Native, Request
from .._tokens import estimate_message_tokens
from ._fingerprint import Boundary, fingerprint, marked_positions
from ._groups import Group, Groups
from ._index import PrefixIndex
from ._marks import anthropic_view, legal_ttls, native_marked, with_breakpoints, with_key
from ._plan import MINIMUM_MARGIN, CacheRates, cache_rates, shared_chain
from ._rules import LOWEST_MINIMUM, MAX_BREAKPOINTS, TTL_5M, CacheRules, rules_for

if TYPE_CHECKING:
    from .._models import Deployment, Result
    from .._pricing import Pricing

__all__ = ["ServedCache", "Ticket"]

#: Seconds a group goes unasked before it is forgotten: twice the entry's lifetime.
_IDLE = 2 * TTL_5M
#: Groups are swept of the idle every this many requests.
_SWEEP_EVERY = 256
#: Seconds after which a primer that never said it ended no longer keeps others from writing.
_LONGEST_PRIME = 120.0


class Ticket:
    """What one request was sent with: the groups it writes and the one it reads."""

    __slots__ = ("primes", "reads")

    def __init__(self, primes: tuple[Group, ...], reads: Group | None) -> None:
        self.primes = primes
        self.reads = reads


class ServedCache:
    """A server's prompt-cache planner (see the module docstring)."""

    def __init__(self, pricing: Pricing, *, most_prefixes: int = 100_000, most_groups: int = 20_000) -> None:
        self.pricing = pricing
        self.index = PrefixIndex(most_prefixes)
        self.groups = Groups(most_groups)
        self._rates: dict[int, tuple[Deployment, CacheRates]] = {}
        self._marks = 0

    def mark(
        self, request: Request, deployments: Sequence[Deployment], client: str, now: float
    ) -> tuple[Request, Ticket | None]:
        """``request`` as it is to be sent to one of ``deployments`` (a model's: they share
        its rules, else nothing is marked) for ``client``, and its ticket (None: sent as it came)."""
        rules = _common_rules(deployments)
        if rules is None:
            return request, None
        view = anthropic_view(request, rules)
        if estimate_message_tokens(view.messages, view.params) < LOWEST_MINIMUM:
            return request, None  # the common case of short prompts: no fingerprint
        boundaries = fingerprint(view)
        self.index.add(boundaries)
        self._marks += 1
        if self._marks % _SWEEP_EVERY == 0:
            self.groups.expire(now, _IDLE)
        rates = self._rates_of(deployments[0], rules)
        if rules.breakpoints:
            room = MAX_BREAKPOINTS - len(marked_positions(view))
            return self._breakpoints(request, view, shared_chain(boundaries, self.index, rules, rates, room), now)
        if _own_key(request):
            return request, None
        widest = _widest(boundaries, self.index, rules, rates)
        if widest is None:
            return request, None
        group = self.groups.get(_per_client(widest.digest, client), widest.tokens, now)
        return _keyed(request, group.key(now)), Ticket((), group)

    def _breakpoints(
        self, request: Request, view: Request, shared: list[tuple[Boundary, int]], now: float
    ) -> tuple[Request, Ticket | None]:
        chain = []
        for boundary, lines in shared:
            group = self.groups.get(boundary.digest, boundary.tokens, now)
            group.lines = lines
            chain.append((boundary, group))
        deepest = max((n for n, (_, group) in enumerate(chain) if group.live(now)), default=-1)
        rest = chain[deepest + 1 :]
        if rest and rest[0][1].priming and now - rest[0][1].asked < _LONGEST_PRIME:
            rest = []  # another request is writing it: read what lives, write nothing more
        primes = tuple(group for _, group in rest)
        for group in primes:
            group.priming = True
        marked = chain[: deepest + 1] + rest
        if not marked:
            return request, None
        ttls = legal_ttls([(b.order, "5m") for b, _ in marked], marked_positions(view))
        sent = with_breakpoints(view, [(b.cut, ttl) for (b, _), ttl in zip(marked, ttls, strict=True)])
        reads = chain[deepest][1] if deepest >= 0 else None
        return (sent if view is request else native_marked(request, sent)), Ticket(primes, reads)

    def done(self, ticket: Ticket, result: Result | None, deployment: Deployment | None, now: float) -> None:
        """The request's answer is in (None: it was never sent): its groups learn."""
        answered = result is not None and result.ok and result.attempts > 0 and not result.cached
        for group in ticket.primes:
            group.priming = False
            if answered:
                group.used(now)
        if answered and ticket.reads is not None:
            ticket.reads.used(now)

    def _rates_of(self, deployment: Deployment, rules: CacheRules) -> CacheRates:
        entry = self._rates.get(id(deployment))
        if entry is None or entry[0] is not deployment:
            entry = self._rates[id(deployment)] = (deployment, cache_rates(self.pricing, deployment, rules))
        return entry[1]


def _widest(boundaries: list[Boundary], index: PrefixIndex, rules: CacheRules, rates: CacheRates) -> Boundary | None:
    """The shortest prefix past the model's minimum that other requests share (and where
    caching pays): OpenAI routes by the key and the first tokens, and the machine it
    picks serves every longer prefix it holds, so the widest group is the best key."""
    least = rules.minimum * MINIMUM_MARGIN
    for boundary in boundaries:
        if boundary.tokens >= least:
            lines = index.count(boundary.digest)
            if lines >= 2 and rates.pays(lines):
                return boundary
    return None


def _common_rules(deployments: Sequence[Deployment]) -> CacheRules | None:
    """The rules every deployment of the model keeps (the highest minimum); None when they
    differ in kind (a mark one would refuse) or one caches nothing the planner knows."""
    found = [rules_for(d) for d in deployments]
    if not found or any(r is None or r.kind != found[0].kind for r in found):  # type: ignore[union-attr]
        return None
    first = found[0]
    assert first is not None
    highest = max(r.minimum for r in found if r is not None)
    return first if highest == first.minimum else dataclasses.replace(first, minimum=highest)


def _own_key(request: Request) -> bool:
    if request.params.get("prompt_cache_key") is not None:
        return True
    native = request.native
    return native is not None and native.body.get("prompt_cache_key") is not None


def _keyed(request: Request, key: str) -> Request:
    """``request`` with ``key`` in its common fields and in a Responses body it carries."""
    keyed = with_key(request, key)
    native = request.native
    if native is not None and native.api == "responses":
        keyed = dataclasses.replace(
            keyed, native=Native(native.api, {**native.body, "prompt_cache_key": key}, native.lost)
        )
    return keyed


def _per_client(digest: int, client: str) -> int:
    """A prefix's group for one client: clients never share a key (nor its shards' rate)."""
    mixed = hashlib.blake2b(client.encode() + digest.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(mixed, "little")
