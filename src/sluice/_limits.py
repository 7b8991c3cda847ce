"""Rate limits as reservations: requests, tokens, input and output tokens per window, and
requests in flight.

Each deployment gets one :class:`LocalLimiter`. Two mechanisms work together, for each
limit (a :class:`~sluice._meter.Meter`: ``rpm``, ``tpm``, ``itpm``, ``otpm``):

* a **sliding-window ledger** of what was granted in the last ``window`` seconds
  guarantees the stated limit exactly: never more than ``rpm`` requests or ``tpm``
  tokens in *any* window, not just in calendar minutes;
* a **pacer** (GCRA, the "virtual scheduling" form of a token bucket) spreads the
  limit evenly, because providers enforce a per-minute limit over shorter slices
  (60,000/min may be enforced as 1,000/s). ``burst_*`` lets that much go at once,
  explicitly; the default is none. A timer that fires late does not cost throughput:
  the schedule keeps its slots (see ``CATCH_UP``).

Both count from when a request *leaves* for the provider, not from its grant: a ledger
entry is dated by its send (:meth:`Grant.sent`), and a second pacer over the sends holds
a request that would leave closer to the ones before it than the pace allows
(:meth:`Grant.send_delay`). A stall of the loop or a slow commit between grant and send
then delays requests instead of bunching them up at the server.

A request's tokens are its prompt estimate plus its output cap (``max_tokens``):
``acquire(tokens, output=...)`` says how many of them are output, so ``itpm`` is charged
the rest and ``otpm`` the cap, each reconciled apart with the usage reported (input as
Anthropic counts it: prompt and cache writes, not cache reads; see :func:`usage_counts`).

Waiters are served in (priority, arrival) order — never by size, so a large request
is not starved by small ones — and are woken by a single timer set for the moment the
head of the queue can go, or by a release. Nothing polls, and no lock is held across
a sleep. A 429 pauses the whole deployment; ``x-ratelimit-*`` headers tighten the
local view when the server has seen traffic we have not (another process, another
tool on the same key).

Header figures are per the provider's window (a minute, for OpenAI and Anthropic), which
need not be the deployment's: :meth:`LocalLimiter.observe` converts them into its own
window before it compares or adopts anything. A learnt limit can then fall below one
request per window, or below one large request's tokens; such a request goes alone in
its window and the pacer spaces it out, so the rate still holds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from typing import TYPE_CHECKING, Protocol, TypeVar

from ._errors import CapacityError
from ._meter import (
    CATCH_UP,
    INPUT,
    KINDS,
    OUTPUT,
    PACE_MARGIN,
    PACED_SPAN,
    REQUESTS,
    TOKENS,
    WINDOW_MARGIN,
    Entry,
    Meter,
    answer_bound,
    capacity_error,
    pace_factor,
)
from ._ratelimit import RateLimitSnapshot, readings, sane_snapshot

if TYPE_CHECKING:
    from ._models import Deployment, Usage

_L = TypeVar("_L", bound="LocalLimiter")

__all__ = [
    "CATCH_UP",
    "PACED_SPAN",
    "PACE_MARGIN",
    "WINDOW_MARGIN",
    "Claim",
    "Grant",
    "Limiter",
    "LocalLimiter",
    "RateLimitSnapshot",
    "Reservation",
    "pace_factor",
    "sane_snapshot",
    "usage_counts",
]


class Reservation(Protocol):
    """Capacity granted to one attempt; settle it exactly once it is known what happened.

    A reservation may also have ``send_delay(now) -> float`` (seconds to hold the attempt
    before it leaves) and ``sent(at)``, called with the loop's time as it leaves: a limiter
    that counts from the send rather than the grant covers whatever came between (a stall
    of the loop, the commit of the attempt's intent). Both are optional.
    """

    tokens: int

    def reconcile(
        self, actual_tokens: int, *, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        """Replace the estimated token cost with the cost the provider reported: ``actual_tokens``
        for the token limit, ``input_tokens`` and ``output_tokens`` for the input and output
        limits (without them, the output stays as reserved and the input is the rest)."""

    def done(self) -> None:
        """The attempt is over (answer or error): free its in-flight slot."""

    def refund(self) -> None:
        """The attempt was never sent: give back everything it took."""


class Limiter(Protocol):
    """Admission control for one deployment. ``tokens`` is a request's whole estimate
    (prompt + output cap); ``output``, how many of them are the output cap."""

    def check(self, tokens: int, *, output: int = 0) -> None:
        """Raise :class:`CapacityError` if ``tokens`` can never be granted."""

    async def acquire(self, tokens: int, priority: int = 0, seq: int | None = None, *, output: int = 0) -> Reservation:
        """Wait (FIFO within ``priority``) until one request of ``tokens`` may be sent."""

    def try_acquire(self, tokens: int, *, output: int = 0) -> Reservation | None:
        """Grant at once if nobody waits and there is room; None otherwise (no waiting)."""

    def penalize(self, seconds: float) -> None:
        """Pause the whole deployment for ``seconds`` (the server said 429)."""

    def observe(self, snapshot: RateLimitSnapshot) -> None:
        """Learn from the server's rate-limit headers (counted per the snapshot's windows)."""


def usage_counts(usage: Usage, *, reads_counted: bool = False) -> tuple[int, int, int]:
    """What an answer counts for (tokens, input tokens, output tokens) as providers count
    their limits: every token for a token limit; for an input limit the prompt and the
    cache writes but not the cache reads (Anthropic's ITPM rule; sluice's
    ``Usage.input_tokens`` includes both kinds of cached tokens), unless ``reads_counted``
    (Anthropic's older models count them: ``caching.reads_counted``)."""
    read = 0 if reads_counted else usage.cached_input_tokens
    return usage.total_tokens, max(0, usage.input_tokens - read), usage.output_tokens


#: Grants within this many seconds share one ledger entry, dated by the latest of them:
#: each then leaves the window at most this much late (never early), and a fast server
#: at 10,000 requests/s leaves ~60,000 entries in a minute's ledger instead of 600,000
#: objects for every garbage collection to walk.
LEDGER_TICK = 0.001


class Grant:
    """A :class:`LocalLimiter`'s reservation (see :class:`Reservation`)."""

    __slots__ = ("_counted", "_entry", "_limiter", "_open", "_paced", "_sent", "output", "tokens")

    def __init__(self, limiter: LocalLimiter, entry: Entry, tokens: int, output: int = 0) -> None:
        self._limiter = limiter
        self._entry = entry
        self._open = True
        self.tokens = tokens
        #: Of ``tokens``, the output cap (reserved against the output limit).
        self.output = output
        #: What this grant adds to its ledger entry per meter (the entry may hold other
        #: grants too); None once refunded.
        self._counted: list[int] | None = [1, tokens, tokens - output, output]
        self._sent = False
        #: It has its place in the send pacer (``send_delay`` was asked).
        self._paced = False

    def send_delay(self, now: float) -> float:
        """Seconds to hold it before it leaves (0 almost always): requests leave no closer
        together than the pace allows, however the grants before them straggled. Ask once,
        just before sending: it takes the request's place in the send pacer."""
        if self._paced or self._counted is None:
            return 0.0
        if not self._limiter._active:  # nothing paces it: its place is taken, at once
            self._paced = True
            return 0.0
        return self._limiter._send_delay(self, now)

    def sent(self, at: float) -> None:
        """It was handed to the provider at ``at`` (the loop's clock): the window and the
        send pacer count from when it left, not from when it was granted."""
        if self._counted is not None and not self._sent:
            self._sent = True
            self._limiter._left(self, at)

    def reconcile(
        self, actual_tokens: int, *, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        counted = self._counted
        if counted is None:
            return
        output = counted[OUTPUT] if output_tokens is None else output_tokens
        given = actual_tokens - output if input_tokens is None else input_tokens
        if given < 0:
            given = 0
        delta = (0, actual_tokens - counted[TOKENS], given - counted[INPUT], output - counted[OUTPUT])
        if delta[TOKENS] or delta[INPUT] or delta[OUTPUT]:
            counted[TOKENS], counted[INPUT], counted[OUTPUT] = actual_tokens, given, output
            self._limiter._adjust(self._entry, delta, sent=self._paced)

    def done(self) -> None:
        if self._open:
            self._open = False
            limiter = self._limiter
            if self._counted is not None and limiter._active:
                limiter._answered(self._entry)
            limiter._release_slot()

    def refund(self) -> None:
        if self._counted is not None:
            counted, self._counted = self._counted, None
            self._limiter._adjust(self._entry, tuple(-amount for amount in counted), sent=self._paced)
        self.done()

    def __repr__(self) -> str:
        return f"Reservation(tokens={self.tokens}, open={self._open})"


class Claim:
    """Shared by one request's waits on several limiters (the router waits on every
    deployment of a group at once): the first limiter to grant takes it, and the others
    drop that waiter instead of granting it too (a grant they would then hand back)."""

    __slots__ = ("taken",)

    def __init__(self) -> None:
        self.taken = False


class _Waiter:
    __slots__ = ("claim", "future", "output", "tokens")

    def __init__(self, future: asyncio.Future[Grant], tokens: int, output: int, claim: Claim | None = None) -> None:
        self.future = future
        self.tokens = tokens
        self.output = output
        self.claim = claim


class LocalLimiter:
    """In-process limits for one deployment (see the module docstring)."""

    __slots__ = (
        "_active",
        "_answer_bound",
        "_heap",
        "_in_flight",
        "_ledger",
        "_loop",
        "_meters",
        "_paused_until",
        "_seq",
        "_tie",
        "_timer",
        "_timer_at",
        "max_in_flight",
        "name",
        "window",
    )

    def __init__(
        self,
        *,
        requests: float | None = None,
        tokens: float | None = None,
        window: float = 60.0,
        max_in_flight: int | None = None,
        burst_requests: float = 0.0,
        burst_tokens: float = 0.0,
        name: str = "deployment",
        input_tokens: float | None = None,
        output_tokens: float | None = None,
    ) -> None:
        self.name = name
        self.window = window
        self._answer_bound = answer_bound(window)
        self.max_in_flight = max_in_flight
        #: Requests, tokens, input tokens, output tokens (see :mod:`._meter`).
        self._meters = (
            Meter(REQUESTS, requests, window, burst_requests),
            Meter(TOKENS, tokens, window, burst_tokens),
            Meter(INPUT, input_tokens, window),
            Meter(OUTPUT, output_tokens, window),
        )
        #: The meters with a limit: the only ones that count (one learns its limit from
        #: headers, and then its count, from the ledger: see ``_activate``).
        self._active = tuple(meter for meter in self._meters if meter.limit is not None)
        self._ledger: deque[Entry] = deque()
        self._paused_until = -math.inf
        self._in_flight = 0
        self._heap: list[tuple[int, int, int, _Waiter]] = []
        self._tie = itertools.count()  # two engines may share a limiter and a seq number
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def for_deployment(cls: type[_L], deployment: Deployment) -> _L:
        """The limiter of ``deployment``'s own figures (the engine's default ``limiter_factory``)."""
        return cls(
            requests=deployment.rpm,
            tokens=deployment.tpm,
            window=deployment.window,
            max_in_flight=deployment.max_in_flight,
            burst_requests=deployment.burst_requests,
            burst_tokens=deployment.burst_tokens,
            name=deployment.label,
            input_tokens=deployment.itpm,
            output_tokens=deployment.otpm,
        )

    # -- the public protocol -------------------------------------------------------

    def check(self, tokens: int, *, output: int = 0) -> None:
        if not self._active:  # no limit known: anything fits
            return
        error = self._too_large(tokens, output)
        if error is not None:
            raise error

    def try_acquire(self, tokens: int, *, output: int = 0) -> Grant | None:
        if self._active:
            self.check(tokens, output=output)
        if self._heap:
            return None  # first come, first served: never jump the queue
        now = (self._loop or self._bind()).time()
        if not self._active:  # no limit known: only the in-flight cap and a pause hold it back
            full = self.max_in_flight is not None and self._in_flight >= self.max_in_flight
            return None if full or self._paused_until > now else self._grant(tokens, now, output)
        return self._grant(tokens, now, output) if self._ready_at(tokens, now, output) <= now else None

    async def acquire(
        self,
        tokens: int,
        priority: int = 0,
        seq: int | None = None,
        *,
        claim: Claim | None = None,
        output: int = 0,
    ) -> Grant:
        granted = self.try_acquire(tokens, output=output) if claim is None or not claim.taken else None
        if granted is not None:
            if claim is not None:
                claim.taken = True
            return granted
        loop = self._loop or self._bind()
        future: asyncio.Future[Grant] = loop.create_future()
        order = next(self._seq) if seq is None else seq
        heapq.heappush(self._heap, (priority, order, next(self._tie), _Waiter(future, tokens, output, claim)))
        self._wake()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                future.result().refund()  # granted in the same tick we were cancelled
            self._wake()
            raise

    def penalize(self, seconds: float) -> None:
        loop = self._loop or self._bind()
        until = loop.time() + max(0.0, seconds)
        if until > self._paused_until:
            self._paused_until = until
            self._wake()

    def observe(self, snapshot: RateLimitSnapshot) -> None:
        now = self._now()
        self._expire(now)
        changed = False
        lingering = self._lingering(now)
        for meter, reading in zip(self._meters, readings(sane_snapshot(snapshot)), strict=True):
            if meter.limit is None and reading.limit is not None:
                self._activate(meter)
            changed = meter.learn(reading, self.window, now, lingering[meter.index]) or changed
        if changed:
            self._wake()

    # -- introspection ---------------------------------------------------------------

    @property
    def requests_limit(self) -> float | None:
        """Requests per window now in force (configured, or lower from the headers)."""
        return self._meters[REQUESTS].limit

    @property
    def tokens_limit(self) -> float | None:
        """Tokens per window now in force."""
        return self._meters[TOKENS].limit

    @property
    def input_limit(self) -> float | None:
        """Input tokens per window now in force."""
        return self._meters[INPUT].limit

    @property
    def output_limit(self) -> float | None:
        """Output tokens per window now in force."""
        return self._meters[OUTPUT].limit

    @property
    def burst_requests(self) -> float:
        return self._meters[REQUESTS].burst

    @property
    def burst_tokens(self) -> float:
        return self._meters[TOKENS].burst

    @property
    def used(self) -> tuple[int, int, int, int]:
        """What the window holds now: requests, tokens, input tokens, output tokens."""
        self._expire(self._now())
        totals = [0, 0, 0, 0]
        for entry in self._ledger:
            for index, amount in enumerate(entry.amounts):
                totals[index] += amount
        return totals[0], totals[1], totals[2], totals[3]

    @property
    def waiting(self) -> int:
        return sum(1 for *_, w in self._heap if not w.future.done())

    def waiting_before(self, priority: int) -> int:
        """Waiters a new request of ``priority`` would queue behind (its lane and those before it)."""
        return sum(1 for p, *_, w in self._heap if p <= priority and not w.future.done())

    def forecast(self, tokens: int, ahead: int = 0, *, output: int = 0) -> float:
        """When (the loop's clock) a request of ``tokens`` behind ``ahead`` others of its size
        would be granted, by this limiter's own schedule: its pause, its window and its
        pacer (a burst allowance included), not an even pace alone. Slots in flight are
        not in it (they free when answers come: the caller knows how long those take)."""
        now = self._now()
        self._expire(now)
        start = self._paused_until if self._paused_until > now else now
        at = start
        span = self.window + WINDOW_MARGIN
        amounts = 1, tokens, tokens - output, output
        nth = max(0, ahead) + 1
        for meter in self._active:
            amount = amounts[meter.index]
            if amount:
                ready = meter.forecast(amount, nth, start, self._ledger, span)
                if ready > at:
                    at = ready
        return at

    def set_max_in_flight(self, cap: int | None) -> None:
        """Change the in-flight cap (adaptive concurrency); a higher one lets waiters go."""
        raised = cap is None or (self.max_in_flight is not None and cap > self.max_in_flight)
        self.max_in_flight = cap
        if raised and self._heap:
            self._wake()

    @property
    def learnt_limits(self) -> bool:
        """Whether request or token limits are known (configured, or from the server's headers)."""
        return bool(self._active)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def __repr__(self) -> str:
        limits = [f"{KINDS[m.index].replace(' ', '_')}={m.used}/{m.limit:g}" for m in self._active if m.limit]
        if self.max_in_flight is not None:
            limits.append(f"in_flight={self._in_flight}/{self.max_in_flight}")
        return (
            f"<LocalLimiter {self.name} per {self.window:g}s {' '.join(limits) or 'unlimited'} waiting={self.waiting}>"
        )

    # -- internals ---------------------------------------------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _expire(self, now: float) -> None:
        # An entry leaves at ``t + window + WINDOW_MARGIN``, computed exactly as
        # ``Meter.ready_at`` computes it: ``t <= now - window - margin`` can round the
        # other way, and then an entry lingers in the counts at the instant a waiter was
        # granted because it had left (and an ``observe`` then misjudges outside traffic).
        span = self.window + WINDOW_MARGIN
        ledger = self._ledger
        while ledger and ledger[0].t + span <= now:
            entry = ledger.popleft()
            entry.gone = True
            amounts = entry.amounts
            for meter in self._active:
                meter.used -= amounts[meter.index]

    def _lingering(self, now: float) -> list[int]:
        """What the ledger holds, per meter, only because answers came late (the entries
        whose window from when they left is over): the oldest entries, at its head."""
        span = self.window + WINDOW_MARGIN
        totals = [0, 0, 0, 0]
        for entry in self._ledger:
            if entry.left + span > now:
                break
            for index, amount in enumerate(entry.amounts):
                totals[index] += amount
        return totals

    def _activate(self, meter: Meter) -> None:
        """``meter`` is about to learn a limit: from now on it counts, starting from what
        the ledger holds of it (nothing counted it while it had no limit)."""
        index = meter.index
        meter.used = sum(entry.amounts[index] for entry in self._ledger)
        self._active = tuple(m for m in self._meters if m is meter or m.limit is not None)

    def _ready_at(self, tokens: int, now: float, output: int = 0) -> float:
        """The earliest time a request of ``tokens`` (``output`` of them its output cap)
        could go; inf while slots are full."""
        if self.max_in_flight is not None and self._in_flight >= self.max_in_flight:
            return math.inf
        self._expire(now)
        at = self._paused_until
        span = self.window + WINDOW_MARGIN
        amounts = 1, tokens, tokens - output, output
        for meter in self._active:
            amount = amounts[meter.index]
            if amount:
                ready = meter.ready_at(amount, now, self._ledger, span)
                if ready > at:
                    at = ready
        return at

    def _too_large(self, tokens: int, output: int = 0) -> CapacityError | None:
        """The error for a request that can never be granted, or None."""
        amounts = 1, tokens, tokens - output, output
        for meter in self._active:
            if meter.too_large(amounts[meter.index]):
                assert meter.hard is not None
                return capacity_error(self.name, meter.index, amounts[meter.index], meter.hard, meter.hard_per)
        return None

    def _grant(self, tokens: int, now: float, output: int = 0) -> Grant:
        ledger = self._ledger
        given = tokens - output
        if ledger and now - ledger[-1].t <= LEDGER_TICK:
            entry = ledger[-1]  # one entry per millisecond, its time the latest grant's
            entry.t = entry.left = now
            held = entry.amounts
            held[REQUESTS] += 1
            held[TOKENS] += tokens
            held[INPUT] += given
            held[OUTPUT] += output
        else:
            if not self._active:  # nothing expired it on the way here (see try_acquire): as it grows
                self._expire(now)
            entry = Entry(now, [1, tokens, given, output])
            ledger.append(entry)
        amounts = 1, tokens, given, output
        for meter in self._active:
            meter.granted(amounts[meter.index], now)
        self._in_flight += 1
        return Grant(self, entry, tokens, output)

    def _send_delay(self, grant: Grant, now: float) -> float:
        """How long ``grant`` waits before it leaves, and its place in the send pacer: the
        grant pacer's schedule kept over the moments requests actually leave (with the same
        ``CATCH_UP`` tolerance, and the same ``burst_*`` allowance). Grants that a stall of
        the loop or a slow commit held back leave spaced as they were granted, not in a
        bunch the server would count in one slice; requests that are all a little late keep
        their spacing and wait for nothing. Called once per grant, as it is about to leave:
        its slot is taken here, so two requests that wait at once do not leave at once."""
        at = now
        tokens, output = grant.tokens, grant.output
        amounts = 1, tokens, tokens - output, output
        active = self._active
        for meter in active:
            if amounts[meter.index] > 0:
                at = max(at, meter.leaves_from())
        for meter in active:
            amount = amounts[meter.index]
            if amount > 0:
                meter.leaves(amount, at)
        grant._paced = True
        return at - now

    def _left(self, grant: Grant, at: float) -> None:
        """``grant`` left for the provider at ``at``: its ledger entry counts from then (it
        cannot reach the server sooner). One that skipped ``send_delay`` (a caller that does
        not ask) takes its send pacer slot now."""
        entry = grant._entry
        if not entry.gone:
            if at > entry.left:
                entry.left = at
            if at > entry.t:
                entry.t = at
        if not grant._paced:
            self._send_delay(grant, at)

    def _adjust(self, entry: Entry, delta: tuple[int, ...], *, sent: bool = False) -> None:
        """Correct a grant after the fact (reconcile or refund) by ``delta`` per meter, in
        ledger and pacers (``sent``: it has its place in the send pacer, which counts it too)."""
        active = self._active  # none while no limit is known: only the ledger keeps count then
        if active:
            self._expire(self._now())
        held = entry.amounts
        held[REQUESTS] += delta[REQUESTS]
        held[TOKENS] += delta[TOKENS]
        held[INPUT] += delta[INPUT]
        held[OUTPUT] += delta[OUTPUT]
        if active:
            counted = not entry.gone  # still in the ledger (a later send may keep it past its time)
            for meter in active:
                change = delta[meter.index]
                if change:
                    meter.adjust(change, counted=counted, sent=sent)
        if (self._heap or self._timer is not None) and min(delta) < 0:
            self._wake()

    def _answered(self, entry: Entry) -> None:
        """A grant of ``entry`` was answered now: the server counted it by then, so the
        entry counts from now at the latest, up to ``answer_bound`` after it left."""
        if entry.gone:
            return
        latest = entry.t + self._answer_bound
        now = self._now()
        if now < latest:
            latest = now
        if latest > entry.t:
            entry.t = latest

    def _release_slot(self) -> None:
        self._in_flight -= 1
        if self._heap:
            self._wake()

    def _now(self) -> float:
        return (self._loop or self._bind()).time()

    def _wake(self) -> None:
        """Grant every waiter that fits now, in order; set one timer for the next."""
        heap = self._heap
        now = self._now()
        while heap:
            waiter = heap[0][3]
            if waiter.future.done():
                heapq.heappop(heap)
                continue
            if waiter.claim is not None and waiter.claim.taken:  # granted elsewhere meanwhile
                heapq.heappop(heap)
                waiter.future.cancel()
                continue
            too_large = self._too_large(waiter.tokens, waiter.output)
            if too_large is not None:  # the server told us its limit is lower than configured
                heapq.heappop(heap)
                waiter.future.set_exception(too_large)
                continue
            at = self._ready_at(waiter.tokens, now, waiter.output)
            if at <= now:
                heapq.heappop(heap)
                if waiter.claim is not None:
                    waiter.claim.taken = True
                waiter.future.set_result(self._grant(waiter.tokens, now, waiter.output))
                continue
            self._arm(at)
            return
        self._arm(math.inf)

    def _arm(self, at: float) -> None:
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at != math.inf:
            self._timer = (self._loop or self._bind()).call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._wake()
