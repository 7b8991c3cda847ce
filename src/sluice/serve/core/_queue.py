"""The bounded wait: many clients queue in sluice instead of hitting the provider as 429s,
but not without end.

A request *waits* from the moment the server takes it until a deployment's limiter
grants it capacity (the engine's concurrency gate, a budget wait and the limiter's queue
all count). The server counts such requests; past ``max_queue`` a new one is refused at
once, and one whose wait would pass its ``max_wait`` is refused (at once when the
limiter's schedule already says so, else when the time is up). Either way the 429 carries
a ``Retry-After`` worked out from what the limiter knows: its pacing interval, its pause
after a provider's 429, the requests queued ahead.

How the server learns the moment of the grant without changing the engine: the engine is
built with :class:`ServeLimiter` (``Engine(limiter_factory=...)``), a LocalLimiter that
marks the :class:`Ticket` of the request it grants. The ticket travels in a context
variable, which asyncio copies into every task the engine starts for the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from ..._limits import Claim, Grant, LocalLimiter
from ..._models import Deployment

__all__ = ["Admission", "QueueFull", "ServeLimiter", "Ticket", "WaitTooLong", "mark_granted", "serve_limiter"]

T = TypeVar("T")

#: The ticket of the request the current task works for (None: not a served request).
_TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("sluice_serve_ticket", default=None)

#: When nothing better is known: how long an answer takes (seconds), for a deployment
#: limited only by requests in flight.
_DEFAULT_LATENCY = 1.0


class Ticket:
    """One served request's wait: granted once a limiter gave it capacity."""

    __slots__ = ("granted",)

    def __init__(self) -> None:
        self.granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def grant(self) -> None:
        if not self.granted.done():
            self.granted.set_result(None)


def mark_granted() -> None:
    """The current request's capacity was granted: tell the server, which stops timing its wait."""
    ticket = _TICKET.get()
    if ticket is not None:
        ticket.grant()


class ServeLimiter(LocalLimiter):
    """A :class:`LocalLimiter` that tells the server when its requests are granted, counts
    the provider's 429s, and estimates how long a request would wait."""

    __slots__ = ("on_grant", "penalties")

    def __init__(self, **limits: Any) -> None:
        super().__init__(**limits)
        #: Pauses the engine ordered after a provider's 429 (each one is a 429 seen).
        self.penalties = 0
        #: Called as each request is granted, just before it is sent (its budget hold is
        #: already taken): the server writes client spend there, so a kill -9 loses none.
        self.on_grant: Callable[[], None] | None = None

    def try_acquire(self, tokens: int, *, output: int = 0) -> Grant | None:
        grant = super().try_acquire(tokens, output=output)
        if grant is not None:
            self._granted()
        return grant

    async def acquire(
        self, tokens: int, priority: int = 0, seq: int | None = None, *, claim: Claim | None = None, output: int = 0
    ) -> Grant:
        grant = await super().acquire(tokens, priority, seq, claim=claim, output=output)
        self._granted()
        return grant

    def _granted(self) -> None:
        mark_granted()
        if self.on_grant is not None:
            self.on_grant()

    def penalize(self, seconds: float) -> None:
        self.penalties += 1
        super().penalize(seconds)

    def paused_for(self) -> float:
        """Seconds left of the pause a provider's 429 ordered (0: none)."""
        return max(0.0, self._paused_until - asyncio.get_running_loop().time())

    def eta(self, tokens: int, ahead: float, latency: float | None) -> float:
        """Seconds until a request of ``tokens`` behind ``ahead`` others could go (an estimate
        from the schedule: the head's ready time, then one pacing interval per request)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        ready = self._ready_at(tokens, now)  # exact for the head of the queue; inf while slots are full
        typical = latency if latency is not None and latency > 0 else _DEFAULT_LATENCY
        interval = pacing_interval(
            self.requests_limit, self.tokens_limit, self.window, self.max_in_flight, tokens, latency
        )
        head = ready - now if math.isfinite(ready) else max(typical, self._paused_until - now)
        return max(0.0, head) + max(0.0, ahead) * interval


def pacing_interval(
    requests: float | None,
    tokens_limit: float | None,
    window: float,
    max_in_flight: int | None,
    tokens: int,
    latency: float | None,
) -> float:
    """Seconds between two grants at the limits' pace (the slowest of requests, tokens
    and slots in flight, the last from a typical answer's latency)."""
    per: list[float] = []
    if requests is not None:
        per.append(window / requests)
    if tokens_limit is not None and tokens:
        per.append(window * tokens / tokens_limit)
    if max_in_flight is not None:
        typical = latency if latency is not None and latency > 0 else _DEFAULT_LATENCY
        per.append(typical / max_in_flight)
    return max(per) if per else 0.0


def serve_limiter(deployment: Deployment) -> ServeLimiter:
    """``Engine(limiter_factory=serve_limiter)``: the engine's default limiter, made a ServeLimiter."""
    return ServeLimiter.for_deployment(deployment)


class QueueFull(Exception):
    """Refused: the queue is at ``max_queue``; ``retry_after`` seconds is when to come back."""

    def __init__(self, retry_after: float) -> None:
        super().__init__("queue full")
        self.retry_after = retry_after


class WaitTooLong(Exception):
    """Refused: it would wait (or has waited) past its ``max_wait``."""

    def __init__(self, retry_after: float, waited: float) -> None:
        super().__init__("wait too long")
        self.retry_after = retry_after
        self.waited = waited


def estimate(limiters: Iterable[Any], tokens: int, ahead: float, latency: float | None) -> float:
    """How long a request would wait for the first of ``limiters`` (a group shares its
    queue across its deployments, so each sees its share of those ahead)."""
    found = [limiter for limiter in limiters if callable(getattr(limiter, "eta", None))]
    if not found:
        return 1.0
    share = ahead / len(found)
    return float(min(limiter.eta(tokens, share, latency) for limiter in found))


class Admission:
    """Counts the requests waiting for capacity and enforces ``max_queue`` and ``max_wait``."""

    __slots__ = ("max_queue", "max_wait", "waiting")

    def __init__(self, max_queue: int, max_wait: float) -> None:
        self.max_queue = max_queue
        self.max_wait = max_wait
        self.waiting = 0

    def check_room(self, retry_after: Callable[[], float]) -> None:
        """Raise :class:`QueueFull` when no more requests may wait."""
        if self.waiting >= self.max_queue:
            raise QueueFull(retry_after())

    async def wait_for(
        self,
        acquire: Awaitable[T],
        *,
        max_wait: float,
        retry_after: Callable[[], float],
    ) -> T:
        """A wait outside the engine (a client's own limiter), counted and bounded the same way."""
        task = asyncio.ensure_future(acquire)
        self.waiting += 1
        try:
            done, _ = await asyncio.wait({task}, timeout=max_wait)
        except BaseException:
            task.cancel()
            raise
        finally:
            self.waiting -= 1
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise WaitTooLong(retry_after(), max_wait)

    async def run(
        self,
        make: Callable[[], Coroutine[Any, Any, T]],
        *,
        max_wait: float,
        retry_after: Callable[[], float],
    ) -> T:
        """Run ``make()`` (a request through the engine) in a task of its own, counted as
        waiting until a limiter grants it; cancelled with :class:`WaitTooLong` if that
        takes longer than ``max_wait`` (nothing was sent then). Once granted it runs to its
        end. Cancelling the caller cancels it."""
        loop = asyncio.get_running_loop()
        ticket = Ticket()
        token = _TICKET.set(ticket)
        try:
            task: asyncio.Task[T] = loop.create_task(make())  # copies the context: the ticket goes with it
        finally:
            _TICKET.reset(token)
        self.waiting += 1
        counted = True
        began = loop.time()
        try:
            waits: set[asyncio.Future[Any]] = {task, ticket.granted}
            done, _ = await asyncio.wait(waits, timeout=max_wait, return_when=asyncio.FIRST_COMPLETED)
            self.waiting -= 1
            counted = False
            if not done:  # neither granted nor finished: still waiting, so nothing was sent
                after = retry_after()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise WaitTooLong(after, loop.time() - began)
            return await task
        except BaseException:
            if counted:
                self.waiting -= 1
            task.cancel()
            raise
        finally:
            if not ticket.granted.done():
                ticket.granted.cancel()
