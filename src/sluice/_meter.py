"""One rate limit of a :class:`~sluice.LocalLimiter`: its window, its pacer, what it learnt.

A limiter counts four things per window: requests, tokens (``tpm``), input tokens
(``itpm``) and output tokens (``otpm``). Each is a :class:`Meter` over the limiter's one
ledger, whose entries carry an amount for every meter. A meter answers for its own
limit: how much the ledger holds of it (``used``), when the sliding window has room for
more, the pacer's schedule over grants (``tat``) and over sends (``send_tat``), outside
traffic learnt from headers (``ext`` until ``ext_until``) and, for the token meters,
the most one request may ever take (``hard``). The limiter takes the latest of its
meters' answers; the arithmetic is the same for all four.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._errors import CapacityError
from ._ratelimit import Reading, per_window

__all__ = [
    "ANSWER_BOUND",
    "ANSWER_BOUND_MAX",
    "CATCH_UP",
    "INPUT",
    "KINDS",
    "OUTPUT",
    "PACED_SPAN",
    "PACE_MARGIN",
    "REQUESTS",
    "TOKENS",
    "WINDOW_MARGIN",
    "Entry",
    "Meter",
    "answer_bound",
    "capacity_error",
    "next_slot",
    "pace_factor",
]

#: The meters, in the order of a ledger entry's amounts.
REQUESTS, TOKENS, INPUT, OUTPUT = range(4)
#: What each counts, in words (for messages).
KINDS = ("requests", "tokens", "input tokens", "output tokens")

#: A grant leaves the ledger this long after its window, not at the exact instant: the
#: server counts arrivals, and network jitter can bring a request to it a little early.
WINDOW_MARGIN = 0.025  # measured grant-to-arrival on loopback under load: p99 5 ms, worst 13.5 ms

#: A grant also leaves the ledger no sooner than a window after its answer came, up to
#: this share of the window (at most ``ANSWER_BOUND_MAX`` s) after it left: the server
#: counted it by the time it answered, so a request that reached it late (a server that
#: stalled, a busy network, a loop slow to write the body) is still counted as the server
#: counts it, and the next window's request does not arrive while the server holds it.
#: Where the window binds (a burst, a token limit whose unused output came back) it costs
#: at most that share of a window; where the pacer binds, nothing.
ANSWER_BOUND = 0.02
ANSWER_BOUND_MAX = 0.2


def answer_bound(window: float) -> float:
    """How long after it left a grant's answer may still date it (see ``ANSWER_BOUND``)."""
    return min(ANSWER_BOUND_MAX, ANSWER_BOUND * window)


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


def next_slot(tat: float, now: float) -> float:
    """Where the pacer's schedule continues from after a grant at ``now``."""
    return tat if tat >= now - CATCH_UP else now


class Entry:
    """Grants in the ledger (one, or several in the same millisecond: see ``LEDGER_TICK``)
    with their amounts per meter; mutable so reconciliation can correct it in place."""

    __slots__ = ("amounts", "gone", "left", "t")

    def __init__(self, t: float, amounts: list[int]) -> None:
        #: From when it counts: when it left, or later, when its answer came (``ANSWER_BOUND``).
        self.t = t
        #: When it left (the latest of its grants): it lingers while ``t`` is later.
        self.left = t
        #: Requests, tokens, input tokens, output tokens (indexed by the meters).
        self.amounts = amounts
        #: It has left the ledger (its amounts no longer in the meters' ``used``).
        self.gone = False


class Meter:
    """One limit over the limiter's ledger (see the module docstring). ``limit`` is per
    the limiter's window; None: not limited (yet: headers may teach one)."""

    __slots__ = ("burst", "ext", "ext_until", "hard", "hard_per", "index", "limit", "scale", "send_tat", "tat", "used")

    def __init__(self, index: int, limit: float | None, window: float, burst: float = 0.0) -> None:
        self.index = index
        self.limit = limit
        self.burst = burst
        #: Seconds the pacer gives one whole ``limit`` (the window, a little wider).
        self.scale = window * pace_factor(window)
        self.used = 0
        self.tat = -math.inf
        #: The pacer again, over the moments requests leave (``LocalLimiter._send_delay``).
        self.send_tat = -math.inf
        self.ext = 0.0
        self.ext_until = -math.inf
        # The most one request may take, and per how many seconds that is counted: the
        # configured limit, or a lower one the server reported in its own unit. Unlike
        # ``limit`` it is never converted into our window: a request larger than our
        # window's share of a per-minute limit still fits the minute. Requests have none
        # (a request is one, however low the limit: it goes alone, paced).
        self.hard = limit if index != REQUESTS else None
        self.hard_per = window

    def ready_at(self, amount: int, now: float, ledger: Iterable[Entry], span: float) -> float:
        """When ``amount`` more may go: the pacer's slot and the window's room (set ``limit`` first).

        A limit below ``amount`` per window (learnt from headers) lets it go alone in its
        window; the pacer then spaces it out, so the rate still holds."""
        limit = self.limit
        assert limit is not None
        slot = self.tat - self.burst * self.scale / limit
        cap = limit if limit > amount else float(amount)
        if self.used + amount + (self.ext if now < self.ext_until else 0.0) <= cap:
            return slot if slot > now else now  # room now: the common case, without a walk
        room = self._room_at(amount, cap, now, ledger, span)
        return slot if slot > room else room

    def _room_at(self, amount: int, limit: float, now: float, ledger: Iterable[Entry], span: float) -> float:
        """When the sliding window will have room for ``amount`` more.

        Room grows as ledger entries age out (at ``t + span``) and when the outside traffic
        learnt from headers expires; both only grow with time, so the first moment that
        fits wins.
        """
        used, ext, ext_until = self.used, self.ext, self.ext_until
        if now >= ext_until:
            ext = 0.0
        if used + ext + amount <= limit:
            return now
        index = self.index
        at = -math.inf
        for entry in ledger:
            # never earlier than the entries before it leave: a send later than its grant
            # moves an entry's time on, and the limiter expires them in order
            at = max(at, entry.t + span)
            if ext and ext_until <= at:
                if used + amount <= limit:
                    return ext_until
                ext = 0.0
            used -= entry.amounts[index]
            if used + ext + amount <= limit:
                return at
        return ext_until if ext and amount <= limit else math.inf

    def forecast(self, amount: int, nth: int, now: float, ledger: Iterable[Entry], span: float) -> float:
        """When the ``nth`` of a run of requests of ``amount`` each would be granted, counted
        from now (set ``limit`` first): the schedule :meth:`ready_at` keeps, worked out ahead.

        Two bounds, the later wins. The pacer: one slot per ``amount * scale / limit``
        seconds from its schedule, ``burst`` of them at once. The window: at most ``per``
        of them in any span, so the nth goes no sooner than a span after the (nth - per)th,
        and the first ``per`` when what the ledger holds now has left enough room. So a
        plain window (``burst`` = the limit) takes a whole window's worth at its start, and
        the next at the start of the next window; an even pace spreads them. Closed form:
        one term per window ahead, two walks of the ledger at most."""
        limit = self.limit
        assert limit is not None
        cap = limit if limit > amount else float(amount)  # a request above the limit goes alone
        per = max(1, int(cap // amount)) if amount > 0 else nth
        interval = amount * self.scale / limit
        base = self.tat if self.tat >= now - CATCH_UP else now
        head = base - self.burst * self.scale / limit
        full = -math.inf  # when the ledger leaves room for ``per`` more (found once)
        at = -math.inf
        ahead = nth
        windows = 0
        while ahead >= 1:
            if ahead >= per:
                if full == -math.inf:
                    full = self._room_at(per * amount, cap, now, ledger, span)
                room = full
            else:
                room = self._room_at(ahead * amount, cap, now, ledger, span)
            paced = head + (ahead - 1) * interval
            at = max(at, max(paced, room) + windows * span)
            ahead -= per
            windows += 1
        return at if at > now else now

    def granted(self, amount: int, now: float) -> None:
        """A grant of ``amount`` at ``now``: counted in the window, its slot taken in the pacer."""
        self.used += amount
        if amount and self.limit is not None:
            self.tat = next_slot(self.tat, now) + amount * self.scale / self.limit

    def leaves_from(self) -> float:
        """The earliest a request may leave under this limit's send pacer (the grant
        pacer's ``CATCH_UP`` tolerance and ``burst`` allowance kept; set ``limit`` first)."""
        assert self.limit is not None
        return self.send_tat - max(CATCH_UP, self.burst * self.scale / self.limit)

    def leaves(self, amount: int, at: float) -> None:
        """A request of ``amount`` leaves at ``at``: its slot in the send pacer."""
        assert self.limit is not None
        self.send_tat = max(self.send_tat, at) + amount * self.scale / self.limit

    def adjust(self, delta: int, *, counted: bool, sent: bool) -> None:
        """A grant's amount changed by ``delta`` after the fact (reconcile, refund):
        ``counted``, it is still in the window; ``sent``, it holds a send-pacer slot,
        which moves with it."""
        if counted:
            self.used += delta
        if delta and self.limit is not None:
            shift = delta * self.scale / self.limit
            self.tat += shift
            if sent:
                self.send_tat += shift

    def learn(self, reading: Reading, own: float, now: float, lingering: int = 0) -> bool:
        """Adopt what the headers said, converted into our window of ``own`` seconds: a
        lower limit, and outside traffic (what the server counts beyond our own ledger,
        until its reset). True if anything changed.

        A limit converts exactly: N per minute is N * own / 60 per ``own`` seconds. A
        remaining count cannot: the server counts over its window, we over ours. Our
        window's share of it is taken as proportional to the lengths (as if the traffic it
        counts were spread evenly), which is exact when the windows are equal."""
        changed = False
        limit = per_window(reading.limit, reading.window, own)
        if limit is not None and (self.limit is None or limit < self.limit):
            self.limit = limit
            changed = True
        raw = reading.limit
        if self.index != REQUESTS and raw is not None and (self.hard is None or raw < self.hard):
            self.hard = raw
            self.hard_per = reading.window
            changed = True
        remaining = per_window(reading.remaining, reading.window, own)
        if self.limit is not None and remaining is not None and reading.reset is not None:
            # what lingers in the ledger past its window (``ANSWER_BOUND``) may be gone from
            # the server's count: not ours to set against it
            unseen = self.limit - (self.used - lingering) - remaining
            if unseen > 0:
                self.ext = unseen
                self.ext_until = now + reading.reset
                changed = True
        return changed

    def too_large(self, amount: int) -> bool:
        """Whether ``amount`` can never be granted (more than one request may ever take)."""
        return self.hard is not None and amount > self.hard


def capacity_error(name: str, kind: int, amount: int, cap: float, per: float) -> CapacityError:
    """Why a request needing ``amount`` of meter ``kind`` can never go to deployment ``name``,
    which allows ``cap`` of it per ``per`` seconds."""
    if kind == INPUT:
        return CapacityError(
            f"needs ~{amount} input tokens (prompt estimate) but {name} allows {cap:g} input tokens "
            f"per {per:g} s (itpm); shorten the prompt"
        )
    if kind == OUTPUT:
        return CapacityError(
            f"may write {amount} output tokens (max_tokens) but {name} allows {cap:g} output tokens "
            f"per {per:g} s (otpm); lower max_tokens"
        )
    return CapacityError(
        f"needs ~{amount} tokens (prompt estimate + max_tokens) but {name} allows "
        f"{cap:g} tokens per {per:g} s; lower max_tokens or shorten the prompt"
    )
