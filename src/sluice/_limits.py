"""Rate limits as reservations: requests and tokens per window, and requests in flight.

Each deployment gets one :class:`LocalLimiter`. Two mechanisms work together:

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from ._errors import CapacityError

if TYPE_CHECKING:
    from ._models import Deployment

_L = TypeVar("_L", bound="LocalLimiter")

__all__ = ["Claim", "Grant", "Limiter", "LocalLimiter", "RateLimitSnapshot", "Reservation", "sane_snapshot"]


@dataclass(frozen=True, slots=True)
class RateLimitSnapshot:
    """What a response's rate-limit headers said (None where a header was absent).

    Limits and remaining counts are per ``requests_window`` / ``tokens_window`` seconds:
    the provider's unit, not the deployment's (OpenAI and Anthropic count per minute;
    some OpenAI-compatible servers count requests per day). Resets are seconds from now.
    """

    limit_requests: float | None = None
    remaining_requests: float | None = None
    reset_requests: float | None = None
    limit_tokens: float | None = None
    remaining_tokens: float | None = None
    reset_tokens: float | None = None
    requests_window: float = 60.0
    tokens_window: float = 60.0


class Reservation(Protocol):
    """Capacity granted to one attempt; settle it exactly once it is known what happened.

    A reservation may also have ``send_delay(now) -> float`` (seconds to hold the attempt
    before it leaves) and ``sent(at)``, called with the loop's time as it leaves: a limiter
    that counts from the send rather than the grant covers whatever came between (a stall
    of the loop, the commit of the attempt's intent). Both are optional.
    """

    tokens: int

    def reconcile(self, actual_tokens: int) -> None:
        """Replace the estimated token cost with the cost the provider reported."""

    def done(self) -> None:
        """The attempt is over (answer or error): free its in-flight slot."""

    def refund(self) -> None:
        """The attempt was never sent: give back everything it took."""


class Limiter(Protocol):
    """Admission control for one deployment."""

    def check(self, tokens: int) -> None:
        """Raise :class:`CapacityError` if ``tokens`` can never be granted."""

    async def acquire(self, tokens: int, priority: int = 0, seq: int | None = None) -> Reservation:
        """Wait (FIFO within ``priority``) until one request of ``tokens`` may be sent."""

    def try_acquire(self, tokens: int) -> Reservation | None:
        """Grant at once if nobody waits and there is room; None otherwise (no waiting)."""

    def penalize(self, seconds: float) -> None:
        """Pause the whole deployment for ``seconds`` (the server said 429)."""

    def observe(self, snapshot: RateLimitSnapshot) -> None:
        """Learn from the server's rate-limit headers (counted per the snapshot's windows)."""


#: A grant leaves the ledger this long after its window, not at the exact instant: the
#: server counts arrivals, and network jitter can bring a request to it a little early.
WINDOW_MARGIN = 0.025  # measured grant-to-arrival on loopback under load: p99 5 ms, worst 13.5 ms

#: Grants within this many seconds share one ledger entry, dated by the latest of them:
#: each then leaves the window at most this much late (never early), and a fast server
#: at 10,000 requests/s leaves ~60,000 entries in a minute's ledger instead of 600,000
#: objects for every garbage collection to walk.
LEDGER_TICK = 0.001

#: How late a timer may fire and still keep the pacer's schedule (seconds). Event loops
#: wake timers a millisecond or so late; restarting the schedule from "now" each time
#: would lose that much per request (~5 % at 50/s). Idle longer than this, and the
#: schedule restarts: unused capacity is not saved up into a burst.
CATCH_UP = 0.020

#: The pacer spaces grants ``1 + PACE_MARGIN / min(window, PACED_SPAN)`` times wider than
#: ``window / limit``, so that a server counting over a window shorter than ours (down to
#: ``PACED_SPAN``: 100 per 10 s for our 600 per minute) is not sent one request too many
#: when requests reach it unevenly. What can bring two requests closer than their slots:
#: the pacers' ``CATCH_UP`` tolerance (a timer that fired late is caught up), and network
#: jitter; grants held back longer (a loop stall, a slow commit of the attempt's intent)
#: are spaced again as they leave (see ``LocalLimiter._send_delay``). Costs 0.3 % of a
#: 60 s window's rate.
PACE_MARGIN = CATCH_UP + 0.010
PACED_SPAN = 10.0


def pace_factor(window: float) -> float:
    """How much wider than ``window / limit`` the pacer spaces grants (see ``PACE_MARGIN``)."""
    return 1.0 + PACE_MARGIN / min(window, PACED_SPAN)


def _next_slot(tat: float, now: float) -> float:
    """Where the pacer's schedule continues from after a grant at ``now``."""
    return tat if tat >= now - CATCH_UP else now


def sane_snapshot(snapshot: RateLimitSnapshot) -> RateLimitSnapshot:
    """Drop header values that cannot be limits: 0, negatives ("unlimited"), NaN, inf,
    and every count whose window is not a positive number of seconds."""

    def keep(value: float | None, minimum: float) -> float | None:
        return value if value is not None and math.isfinite(value) and value >= minimum else None

    requests_ok = math.isfinite(snapshot.requests_window) and snapshot.requests_window > 0
    tokens_ok = math.isfinite(snapshot.tokens_window) and snapshot.tokens_window > 0
    return RateLimitSnapshot(
        limit_requests=keep(snapshot.limit_requests, 1.0) if requests_ok else None,
        remaining_requests=keep(snapshot.remaining_requests, 0.0) if requests_ok else None,
        reset_requests=keep(snapshot.reset_requests, 0.0),
        limit_tokens=keep(snapshot.limit_tokens, 1.0) if tokens_ok else None,
        remaining_tokens=keep(snapshot.remaining_tokens, 0.0) if tokens_ok else None,
        reset_tokens=keep(snapshot.reset_tokens, 0.0),
        requests_window=snapshot.requests_window if requests_ok else 60.0,
        tokens_window=snapshot.tokens_window if tokens_ok else 60.0,
    )


def _per_window(value: float | None, window: float, own: float) -> float | None:
    """``value`` per ``window`` seconds, as the same rate per ``own`` seconds."""
    return None if value is None else value * own / window


class _Entry:
    """Grants in the ledger (one, or several in the same millisecond: see ``LEDGER_TICK``);
    mutable so reconciliation can correct it in place."""

    __slots__ = ("gone", "requests", "t", "tokens")

    def __init__(self, t: float, tokens: int) -> None:
        self.t = t
        self.requests = 1
        self.tokens = tokens
        #: It has left the ledger (its counts no longer in the totals).
        self.gone = False


class Grant:
    """A :class:`LocalLimiter`'s reservation (see :class:`Reservation`)."""

    __slots__ = ("_counted", "_entry", "_limiter", "_open", "_paced", "_sent", "tokens")

    def __init__(self, limiter: LocalLimiter, entry: _Entry, tokens: int) -> None:
        self._limiter = limiter
        self._entry = entry
        self._open = True
        self.tokens = tokens
        #: What this grant adds to its ledger entry (the entry may hold other grants too);
        #: None once refunded.
        self._counted: int | None = tokens
        self._sent = False
        #: It has its place in the send pacer (``send_delay`` was asked).
        self._paced = False

    def send_delay(self, now: float) -> float:
        """Seconds to hold it before it leaves (0 almost always): requests leave no closer
        together than the pace allows, however the grants before them straggled. Ask once,
        just before sending: it takes the request's place in the send pacer."""
        if self._paced or self._counted is None:
            return 0.0
        return self._limiter._send_delay(self, now)

    def sent(self, at: float) -> None:
        """It was handed to the provider at ``at`` (the loop's clock): the window and the
        send pacer count from when it left, not from when it was granted."""
        if self._counted is not None and not self._sent:
            self._sent = True
            self._limiter._left(self, at)

    def reconcile(self, actual_tokens: int) -> None:
        if self._counted is not None:
            delta, self._counted = actual_tokens - self._counted, actual_tokens
            self._limiter._adjust(self._entry, requests=0, tokens=delta, sent=self._paced)

    def done(self) -> None:
        if self._open:
            self._open = False
            self._limiter._release_slot()

    def refund(self) -> None:
        if self._counted is not None:
            counted, self._counted = self._counted, None
            self._limiter._adjust(self._entry, requests=-1, tokens=-counted, sent=self._paced)
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
    __slots__ = ("claim", "future", "tokens")

    def __init__(self, future: asyncio.Future[Grant], tokens: int, claim: Claim | None = None) -> None:
        self.future = future
        self.tokens = tokens
        self.claim = claim


class LocalLimiter:
    """In-process limits for one deployment (see the module docstring)."""

    __slots__ = (
        "_ext_requests",
        "_ext_tokens",
        "_ext_until_requests",
        "_ext_until_tokens",
        "_hard_tokens",
        "_hard_tokens_per",
        "_heap",
        "_in_flight",
        "_ledger",
        "_loop",
        "_pace",
        "_paused_until",
        "_send_tat_requests",
        "_send_tat_tokens",
        "_seq",
        "_tat_requests",
        "_tat_tokens",
        "_tie",
        "_timer",
        "_timer_at",
        "_used_requests",
        "_used_tokens",
        "burst_requests",
        "burst_tokens",
        "max_in_flight",
        "name",
        "requests_limit",
        "tokens_limit",
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
    ) -> None:
        self.name = name
        self.requests_limit = requests
        self.tokens_limit = tokens
        self.window = window
        self.max_in_flight = max_in_flight
        self.burst_requests = burst_requests
        self.burst_tokens = burst_tokens
        # The most tokens one request may ever take, and per how many seconds that limit
        # is counted: the configured limit, or a lower one the server reported in its own
        # unit. Unlike ``tokens_limit`` it is never converted into our window: a request
        # larger than our window's share of a per-minute limit still fits the minute.
        self._hard_tokens = tokens
        self._hard_tokens_per = window
        self._ledger: deque[_Entry] = deque()
        self._used_requests = 0
        self._used_tokens = 0
        self._tat_requests = -math.inf
        self._tat_tokens = -math.inf
        self._pace = pace_factor(window)
        #: The pacer again, over the moments requests leave (see ``_send_delay``).
        self._send_tat_requests = -math.inf
        self._send_tat_tokens = -math.inf
        self._ext_requests = 0.0
        self._ext_until_requests = -math.inf
        self._ext_tokens = 0.0
        self._ext_until_tokens = -math.inf
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
        )

    # -- the public protocol -------------------------------------------------------

    def check(self, tokens: int) -> None:
        error = self._too_large(tokens)
        if error is not None:
            raise error

    def try_acquire(self, tokens: int) -> Grant | None:
        self.check(tokens)
        if self._heap:
            return None  # first come, first served: never jump the queue
        now = (self._loop or self._bind()).time()
        return self._grant(tokens, now) if self._ready_at(tokens, now) <= now else None

    async def acquire(
        self, tokens: int, priority: int = 0, seq: int | None = None, *, claim: Claim | None = None
    ) -> Grant:
        granted = self.try_acquire(tokens) if claim is None or not claim.taken else None
        if granted is not None:
            if claim is not None:
                claim.taken = True
            return granted
        loop = self._loop or self._bind()
        future: asyncio.Future[Grant] = loop.create_future()
        order = next(self._seq) if seq is None else seq
        heapq.heappush(self._heap, (priority, order, next(self._tie), _Waiter(future, tokens, claim)))
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
        snapshot = sane_snapshot(snapshot)
        now = self._now()
        self._expire(now)
        own = self.window
        # A limit converts exactly: N per minute is N * own / 60 per ``own`` seconds. A
        # remaining count cannot: the server counts over its window, we over ours. We take
        # our window's share of it as proportional to the lengths (as if the traffic it
        # counts were spread evenly), which is exact when the windows are equal.
        limit_requests = _per_window(snapshot.limit_requests, snapshot.requests_window, own)
        remaining_requests = _per_window(snapshot.remaining_requests, snapshot.requests_window, own)
        limit_tokens = _per_window(snapshot.limit_tokens, snapshot.tokens_window, own)
        remaining_tokens = _per_window(snapshot.remaining_tokens, snapshot.tokens_window, own)
        changed = False
        if limit_requests is not None and (self.requests_limit is None or limit_requests < self.requests_limit):
            self.requests_limit = limit_requests
            changed = True
        if limit_tokens is not None and (self.tokens_limit is None or limit_tokens < self.tokens_limit):
            self.tokens_limit = limit_tokens
            changed = True
        if snapshot.limit_tokens is not None and (
            self._hard_tokens is None or snapshot.limit_tokens < self._hard_tokens
        ):
            self._hard_tokens = snapshot.limit_tokens
            self._hard_tokens_per = snapshot.tokens_window
            changed = True
        if self.requests_limit is not None and remaining_requests is not None and snapshot.reset_requests is not None:
            unseen = self.requests_limit - self._used_requests - remaining_requests
            if unseen > 0:
                self._ext_requests = unseen
                self._ext_until_requests = now + snapshot.reset_requests
                changed = True
        if self.tokens_limit is not None and remaining_tokens is not None and snapshot.reset_tokens is not None:
            unseen = self.tokens_limit - self._used_tokens - remaining_tokens
            if unseen > 0:
                self._ext_tokens = unseen
                self._ext_until_tokens = now + snapshot.reset_tokens
                changed = True
        if changed:
            self._wake()

    # -- introspection ---------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return sum(1 for *_, w in self._heap if not w.future.done())

    def set_max_in_flight(self, cap: int | None) -> None:
        """Change the in-flight cap (adaptive concurrency); a higher one lets waiters go."""
        raised = cap is None or (self.max_in_flight is not None and cap > self.max_in_flight)
        self.max_in_flight = cap
        if raised and self._heap:
            self._wake()

    @property
    def learnt_limits(self) -> bool:
        """Whether request or token limits are known (configured, or from the server's headers)."""
        return self.requests_limit is not None or self.tokens_limit is not None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def __repr__(self) -> str:
        limits = []
        if self.requests_limit is not None:
            limits.append(f"requests={self._used_requests}/{self.requests_limit:g}")
        if self.tokens_limit is not None:
            limits.append(f"tokens={self._used_tokens}/{self.tokens_limit:g}")
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
        # ``_window_ready`` computes it: ``t <= now - window - margin`` can round the
        # other way, and then an entry lingers in the counts at the instant a waiter was
        # granted because it had left (and an ``observe`` then misjudges outside traffic).
        span = self.window + WINDOW_MARGIN
        ledger = self._ledger
        while ledger and ledger[0].t + span <= now:
            entry = ledger.popleft()
            entry.gone = True
            self._used_requests -= entry.requests
            self._used_tokens -= entry.tokens

    def _ready_at(self, tokens: int, now: float) -> float:
        """The earliest time a request of ``tokens`` could go; inf while slots are full.

        A learnt limit below one request (or below this request's tokens) per window
        lets the request go alone in its window; the pacer then spaces it out.
        """
        if self.max_in_flight is not None and self._in_flight >= self.max_in_flight:
            return math.inf
        self._expire(now)
        at = self._paused_until
        if self.requests_limit is not None:
            interval = self.window * self._pace / self.requests_limit
            at = max(
                at,
                self._tat_requests - self.burst_requests * interval,
                self._window_ready(1, max(1.0, self.requests_limit), True, now),
            )
        if self.tokens_limit is not None and tokens:
            interval = self.window * self._pace / self.tokens_limit
            at = max(
                at,
                self._tat_tokens - self.burst_tokens * interval,
                self._window_ready(tokens, max(float(tokens), self.tokens_limit), False, now),
            )
        return at

    def _window_ready(self, amount: int, limit: float, requests: bool, now: float) -> float:
        """When the sliding window will have room for ``amount`` more (requests or tokens).

        Room grows as ledger entries age out and when the outside traffic learnt from
        headers expires; both only grow with time, so the first moment that fits wins.
        """
        if requests:
            used, ext, ext_until = self._used_requests, self._ext_requests, self._ext_until_requests
        else:
            used, ext, ext_until = self._used_tokens, self._ext_tokens, self._ext_until_tokens
        if now >= ext_until:
            ext = 0.0
        if used + ext + amount <= limit:
            return now
        span = self.window + WINDOW_MARGIN
        at = -math.inf
        for entry in self._ledger:
            # never earlier than the entries before it leave: a send later than its grant
            # moves an entry's time on (``_sent``), and ``_expire`` takes them in order
            at = max(at, entry.t + span)
            if ext and ext_until <= at:
                if used + amount <= limit:
                    return ext_until
                ext = 0.0
            used -= entry.requests if requests else entry.tokens
            if used + ext + amount <= limit:
                return at
        return ext_until if ext and amount <= limit else math.inf

    def _too_large(self, tokens: int) -> CapacityError | None:
        """The error for a request that can never be granted, or None."""
        cap = self._hard_tokens
        if cap is None or tokens <= cap:
            return None
        return CapacityError(
            f"needs ~{tokens} tokens (prompt estimate + max_tokens) but {self.name} allows "
            f"{cap:g} tokens per {self._hard_tokens_per:g} s; lower max_tokens or shorten the prompt"
        )

    def _grant(self, tokens: int, now: float) -> Grant:
        ledger = self._ledger
        if ledger and now - ledger[-1].t <= LEDGER_TICK:
            entry = ledger[-1]  # one entry per millisecond, its time the latest grant's
            entry.t = now
            entry.requests += 1
            entry.tokens += tokens
        else:
            entry = _Entry(now, tokens)
            ledger.append(entry)
        self._used_requests += 1
        self._used_tokens += tokens
        if self.requests_limit is not None:
            self._tat_requests = _next_slot(self._tat_requests, now) + self.window * self._pace / self.requests_limit
        if self.tokens_limit is not None and tokens:
            self._tat_tokens = _next_slot(self._tat_tokens, now) + tokens * self.window * self._pace / self.tokens_limit
        self._in_flight += 1
        return Grant(self, entry, tokens)

    def _send_delay(self, grant: Grant, now: float) -> float:
        """How long ``grant`` waits before it leaves, and its place in the send pacer: the
        grant pacer's schedule kept over the moments requests actually leave (with the same
        ``CATCH_UP`` tolerance, and the same ``burst_*`` allowance). Grants that a stall of
        the loop or a slow commit held back leave spaced as they were granted, not in a
        bunch the server would count in one slice; requests that are all a little late keep
        their spacing and wait for nothing. Called once per grant, as it is about to leave:
        its slot is taken here, so two requests that wait at once do not leave at once."""
        at = now
        per_request = per_token = 0.0
        if self.requests_limit is not None:
            per_request = self.window * self._pace / self.requests_limit
            at = max(at, self._send_tat_requests - max(CATCH_UP, self.burst_requests * per_request))
        tokens = grant.tokens if self.tokens_limit is not None else 0
        if tokens > 0:
            assert self.tokens_limit is not None
            per_token = self.window * self._pace / self.tokens_limit
            at = max(at, self._send_tat_tokens - max(CATCH_UP, self.burst_tokens * per_token))
        if per_request:
            self._send_tat_requests = max(self._send_tat_requests, at) + per_request
        if tokens > 0:
            self._send_tat_tokens = max(self._send_tat_tokens, at) + tokens * per_token
        grant._paced = True
        return at - now

    def _left(self, grant: Grant, at: float) -> None:
        """``grant`` left for the provider at ``at``: its ledger entry counts from then (it
        cannot reach the server sooner). One that skipped ``send_delay`` (a caller that does
        not ask) takes its send pacer slot now."""
        entry = grant._entry
        if at > entry.t and not entry.gone:
            entry.t = at
        if not grant._paced:
            self._send_delay(grant, at)

    def _adjust(self, entry: _Entry, *, requests: int, tokens: int, sent: bool = False) -> None:
        """Correct a grant after the fact (reconcile or refund) in ledger and pacers
        (``sent``: it has its place in the send pacer, which counts it too)."""
        if not requests and not tokens:
            return
        now = self._now()
        self._expire(now)
        in_window = not entry.gone  # still in the ledger (a later send may keep it past its time)
        entry.requests += requests
        entry.tokens += tokens
        if in_window:
            self._used_requests += requests
            self._used_tokens += tokens
        if requests and self.requests_limit is not None:
            self._tat_requests += requests * self.window * self._pace / self.requests_limit
            if sent:  # a refund after its send slot was taken: the slot goes back too
                self._send_tat_requests += requests * self.window * self._pace / self.requests_limit
        if tokens and self.tokens_limit is not None:
            self._tat_tokens += tokens * self.window * self._pace / self.tokens_limit
            if sent:
                self._send_tat_tokens += tokens * self.window * self._pace / self.tokens_limit
        if requests < 0 or tokens < 0:
            self._wake()

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
            too_large = self._too_large(waiter.tokens)
            if too_large is not None:  # the server told us its limit is lower than configured
                heapq.heappop(heap)
                waiter.future.set_exception(too_large)
                continue
            at = self._ready_at(waiter.tokens, now)
            if at <= now:
                heapq.heappop(heap)
                if waiter.claim is not None:
                    waiter.claim.taken = True
                waiter.future.set_result(self._grant(waiter.tokens, now))
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
