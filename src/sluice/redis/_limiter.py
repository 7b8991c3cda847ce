"""Rate limits shared by every process that uses the same deployment, kept in Redis.

One round trip per reservation: a Lua script (``_scripts.ACQUIRE``) reads Redis's clock
and, all or nothing, checks and reserves the request and its tokens (and their input and
output parts, for ``itpm`` and ``otpm``) against the same sliding-window ledger and
even-spacing pacer as :class:`~sluice.LocalLimiter`, plus the in-flight leases.
Refused, it says how long until the next slot opens; the process sleeps exactly that
long (a timer) and asks again. Within a process only the head of a
local FIFO (priority, arrival) talks to Redis, so local waiters never hammer it.

Round trips per request: one to reserve; one to settle (``reconcile`` and ``done``
called in the same tick go as one script) when there is an in-flight cap or a token
limit, none otherwise. Besides, per process and deployment: one lease refresh every
``lease_seconds / 3`` while requests are in flight, and the provider's rate-limit
headers at most once a second (at once when they show a lower limit).

In-flight slots are leases (a sorted set scored by expiry) that a live process keeps
refreshing; a process that dies stops refreshing and its slots come back when its
leases expire. A freed lease wakes waiters in other processes over pub/sub.

What a lease cannot promise: a process paused longer than ``lease_seconds`` (SIGSTOP, a
VM frozen, an event loop blocked) stops refreshing while its requests may still be at the
provider; its slots are given to others meanwhile, so ``max_in_flight`` can be exceeded by
what the paused process had in flight until those requests end. And a Redis that loses
its data (restarted without persistence, flushed, keys evicted) forgets the window: for
one window, up to twice the limit may be sent (the provider's 429s then pause everyone
through ``penalize``). Run Redis with persistence (AOF) and ``maxmemory-policy noeviction``.

When Redis cannot be reached nothing is granted: the head waiter retries with backoff
and admission resumes when Redis answers (``fail_open=True``: a local limiter with the
same limits grants meanwhile). A settle that cannot reach Redis is dropped, not raised:
its lease and window entry expire on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import logging
import os
import uuid
from typing import Any

from .._limits import CATCH_UP, WINDOW_MARGIN, LocalLimiter, RateLimitSnapshot, sane_snapshot
from .._meter import INPUT, OUTPUT, TOKENS, capacity_error
from .._models import Deployment, Secret
from ..providers._anthropic import DEFAULT_BASE_URL as ANTHROPIC_BASE
from ..providers._openai import DEFAULT_BASE_URL as OPENAI_BASE
from . import _scripts
from ._connection import Connection, RedisDown, RedisFailed

__all__ = ["RedisLimiter", "RedisLimits", "SharedGrant", "deployment_fingerprint"]

log = logging.getLogger("sluice.redis")

#: The usual environment variable of each built-in provider's key (as its provider reads it).
_KEY_ENV = {"openai": "OPENAI_API_KEY", "azure": "AZURE_OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
_BASE_ENV = {"openai": "OPENAI_BASE_URL", "azure": "AZURE_OPENAI_ENDPOINT", "anthropic": "ANTHROPIC_BASE_URL"}
#: Where a built-in provider sends without a base URL: the same endpoint as one that names it.
_DEFAULT_BASE = {"openai": OPENAI_BASE, "anthropic": ANTHROPIC_BASE}


def _api_key(deployment: Deployment) -> str:
    if isinstance(deployment.api_key, Secret) and deployment.api_key:
        return deployment.api_key.get()
    env = deployment.api_key_env or _KEY_ENV.get(deployment.provider_name)
    return os.environ.get(env, "") if env else ""


def deployment_fingerprint(deployment: Deployment) -> str:
    """Who shares a limit: provider, base URL, model and API key, hashed (the key is never
    written anywhere; only 16 hex digits of a SHA-256 over all four)."""
    provider = deployment.provider_name
    base_env = _BASE_ENV.get(provider)
    base = deployment.base_url or (os.environ.get(base_env, "") if base_env else "") or _DEFAULT_BASE.get(provider, "")
    material = "\0".join((provider, base.rstrip("/"), deployment.model_name, _api_key(deployment)))
    return hashlib.sha256(material.encode()).hexdigest()[:16]


#: A grant leaves the shared window this long after it (seconds). Wider than the local
#: ``WINDOW_MARGIN``: between a grant at Redis and the request's arrival at the provider
#: lie a reply from Redis and, for each process, its own scheduling delays.
SHARED_WINDOW_MARGIN = max(WINDOW_MARGIN, 0.05)

#: How often (seconds) one process sends the provider's remaining counts to Redis.
OBSERVE_EVERY = 1.0


def _num(value: float | None) -> str:
    return "-1" if value is None else repr(float(value))


class RedisLimits:
    """Shared limits on one Redis: ``Engine(limiter_factory=limits.limiter_factory)``.

    ``healthy`` / ``problem`` say whether Redis answers (for the CLI to show).
    ``close()`` waits for background settles and closes the connection.
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "sluice",
        fail_open: bool = False,
        lease_seconds: float = 30.0,
        window_margin: float = SHARED_WINDOW_MARGIN,
    ) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds!r}")
        self.connection = Connection(url, namespace=namespace)
        self.connection.fail_open = fail_open
        self.namespace = namespace
        self.fail_open = fail_open
        self.lease_seconds = lease_seconds
        #: A grant leaves the shared window this long after it: covers the spread between
        #: a grant at Redis and the request's arrival at the provider.
        self.window_margin = window_margin
        self._limiters: dict[str, RedisLimiter] = {}
        self._ids = itertools.count()
        self._process = uuid.uuid4().hex[:12]

    @property
    def healthy(self) -> bool:
        return self.connection.healthy

    @property
    def problem(self) -> str | None:
        """What is wrong with Redis, in words (None while it answers)."""
        return self.connection.problem

    def limiter_factory(self, deployment: Deployment) -> RedisLimiter:
        """The shared limiter of ``deployment`` (one per deployment and process)."""
        return self.limiter_for(deployment, deployment_fingerprint(deployment))

    def limiter_for(self, deployment: Deployment, key: str, *, cls: type[RedisLimiter] | None = None) -> RedisLimiter:
        """The shared limiter named ``key`` (one per key and process) with ``deployment``'s
        limits: ``limiter_factory`` names it by the deployment's fingerprint; a caller may
        share a limit by another name (``sluice serve``: a client's own rpm/tpm). ``cls``:
        a subclass to make it with (the server's adds its bookkeeping)."""
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = (cls or RedisLimiter)(self, deployment, key)
        return limiter

    def _new_id(self) -> str:
        return f"{self._process}:{next(self._ids)}"

    async def close(self) -> None:
        for limiter in self._limiters.values():
            limiter._stop()
        await self.connection.close()

    async def __aenter__(self) -> RedisLimits:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "ok" if self.problem is None else "down"
        return f"<RedisLimits {self.connection.target} {state} deployments={len(self._limiters)}>"


class SharedGrant:
    """One reservation from the shared limiter; settled exactly once (in the background)."""

    __slots__ = ("_delta", "_done", "_flush", "_limiter", "_local", "id", "input", "output", "tokens")

    def __init__(self, limiter: RedisLimiter, grant_id: str, tokens: int, local: Any = None, output: int = 0) -> None:
        self._limiter = limiter
        self.id = grant_id
        self.tokens = tokens
        #: Its input and output parts, as Redis holds them (settled with ``tokens``).
        self.input = tokens - output
        self.output = output
        #: Changes to send: tokens, input, output.
        self._delta = (0, 0, 0)
        self._done = False
        self._flush: asyncio.Handle | None = None
        #: Granted by the fail-open local limiter while Redis was down.
        self._local = local

    def reconcile(
        self, actual_tokens: int, *, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        if self._local is not None:
            self._local.reconcile(actual_tokens, input_tokens=input_tokens, output_tokens=output_tokens)
            return
        output = self.output if output_tokens is None else output_tokens
        given = max(0, actual_tokens - output if input_tokens is None else input_tokens)
        self._delta = (actual_tokens - self.tokens, given - self.input, output - self.output)
        self._schedule()

    def send_delay(self, now: float) -> float:
        """No hold: the shared window counts from Redis's clock (``SHARED_WINDOW_MARGIN``);
        a fail-open local grant is spaced as locally."""
        return self._local.send_delay(now) if self._local is not None else 0.0

    def sent(self, at: float) -> None:
        """Counted from the grant on Redis's clock (``SHARED_WINDOW_MARGIN`` covers the send);
        a grant of the fail-open local limiter counts from its send, as locally."""
        if self._local is not None:
            self._local.sent(at)

    def done(self) -> None:
        if self._local is not None:
            self._local.done()
            self._release_local()
            return
        if not self._done:
            self._done = True
            self._limiter._leases.discard(self.id)
            self._limiter._in_flight -= 1
            self._schedule()

    def refund(self) -> None:
        if self._local is not None:
            self._local.refund()
            self._release_local()
            return
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not self._done:
            self._done = True
            self._limiter._leases.discard(self.id)
            self._limiter._in_flight -= 1
        # release the lease too, even after done(): its own settle may just have been
        # cancelled above (removing a lease already gone does nothing)
        self._limiter._settle(self, delta=(0, 0, 0), refund=True, release=True)

    def _release_local(self) -> None:
        if not self._done:
            self._done = True
            self._limiter._in_flight -= 1

    def _schedule(self) -> None:
        # reconcile() then done() in the same tick (the engine's way) go as one script.
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self._flush = None
        changes, self._delta = self._delta, (0, 0, 0)
        seen = self._limiter._seen
        # a change to a count no limit is known for anywhere we have looked: not worth a round trip
        delta = tuple(0 if seen[kind] is None else change for kind, change in zip(_TOKEN_KINDS, changes, strict=True))
        self.tokens += delta[0]
        self.input += delta[1]
        self.output += delta[2]
        release = self._done and self._limiter.max_in_flight is not None
        if any(delta) or release:
            self._limiter._settle(self, delta=delta, refund=False, release=release)

    def __repr__(self) -> str:
        return f"Reservation(tokens={self.tokens}, open={not self._done}, shared)"


#: The token counts a grant settles, as the limiter's meters number them.
_TOKEN_KINDS = (TOKENS, INPUT, OUTPUT)


class _Waiter:
    __slots__ = ("future", "output", "tokens")

    def __init__(self, future: asyncio.Future[SharedGrant], tokens: int, output: int = 0) -> None:
        self.future = future
        self.tokens = tokens
        self.output = output


class RedisLimiter:
    """One deployment's shared limiter in one process (see the module docstring)."""

    def __init__(self, limits: RedisLimits, deployment: Deployment, fingerprint: str) -> None:
        self._limits = limits
        self._conn = limits.connection
        self.name = deployment.label
        self.fingerprint = fingerprint
        self.requests_limit = deployment.rpm
        self.tokens_limit = deployment.tpm
        self.input_limit = deployment.itpm
        self.output_limit = deployment.otpm
        self.window = deployment.window
        self.max_in_flight = deployment.max_in_flight
        self.burst_requests = deployment.burst_requests
        self.burst_tokens = deployment.burst_tokens
        #: The most one request may take of each token count, and per how many seconds
        #: (configured, or lower from the headers): by meter index (tokens, input, output).
        self._hard: dict[int, tuple[float | None, float]] = {
            TOKENS: (deployment.tpm, deployment.window),
            INPUT: (deployment.itpm, deployment.window),
            OUTPUT: (deployment.otpm, deployment.window),
        }
        prefix = f"{limits.namespace}:lim:{{{fingerprint}}}:"
        parts = ("state", "grants", "tokens", "leases", "wait_lease", "wait_tokens", "input", "output")
        self._keys = [prefix + part for part in parts]
        self._channel = self._conn.channel("lim", fingerprint)
        self._heap: list[tuple[int, int, int, _Waiter]] = []
        self._seq = itertools.count()
        self._tie = itertools.count()
        self._pump: asyncio.Task[None] | None = None
        self._kick: asyncio.Event | None = None
        self._leases: set[str] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._fallback: LocalLimiter | None = None
        self._listening = False
        self._next_probe = 0.0
        self._observed_at = -float("inf")
        self._seen_requests: float | None = deployment.rpm
        #: The lowest token limits known (configured or from headers), per our window.
        self._seen: dict[int, float | None] = {TOKENS: deployment.tpm, INPUT: deployment.itpm, OUTPUT: deployment.otpm}
        #: When (event-loop time) Redis last said the next slot opens; 0.0 once it granted.
        self.next_slot_at = 0.0

    # -- the Limiter protocol -----------------------------------------------------------

    def check(self, tokens: int, *, output: int = 0) -> None:
        for kind, amount in zip(_TOKEN_KINDS, (tokens, tokens - output, output), strict=True):
            cap, per = self._hard[kind]
            if cap is not None and amount > cap:
                raise capacity_error(self.name, kind, amount, cap, per)

    def try_acquire(self, tokens: int, *, output: int = 0) -> SharedGrant | None:
        """Never at once: every grant is Redis's to give (one round trip, in :meth:`acquire`)."""
        self.check(tokens, output=output)
        return None

    async def acquire(self, tokens: int, priority: int = 0, seq: int | None = None, *, output: int = 0) -> SharedGrant:
        self.check(tokens, output=output)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SharedGrant] = loop.create_future()
        order = next(self._seq) if seq is None else seq
        heapq.heappush(self._heap, (priority, order, next(self._tie), _Waiter(future, tokens, output)))
        if self._pump is None or self._pump.done():
            self._pump = loop.create_task(self._run_pump())
        elif len(self._heap) > 1 and self._heap[0][3].future is future:
            self._wake()  # it went ahead of the one being served: serve it now
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                future.result().refund()  # granted in the same tick we were cancelled
            self._wake()
            raise

    def penalize(self, seconds: float) -> None:
        ms = max(0.0, seconds) * 1000
        self._conn.spawn(self._conn.run("penalize", _scripts.PENALIZE, self._keys, [repr(ms), self._ttl_ms()]))
        if self._fallback is not None:
            self._fallback.penalize(seconds)

    def observe(self, snapshot: RateLimitSnapshot) -> None:
        """Tighten the shared limits when the provider's headers say so (for every process)."""
        snapshot = sane_snapshot(snapshot)
        own = self.window
        for kind, raw in (
            (TOKENS, snapshot.limit_tokens),
            (INPUT, snapshot.limit_input_tokens),
            (OUTPUT, snapshot.limit_output_tokens),
        ):
            cap = self._hard[kind][0]
            if raw is not None and (cap is None or raw < cap):
                self._hard[kind] = (raw, snapshot.tokens_window)

        def per(value: float | None, window: float) -> float | None:
            return None if value is None else value * own / window

        def ms(value: float | None) -> str:
            return "-1" if value is None else repr(value * 1000)

        args = [
            _num(per(snapshot.limit_requests, snapshot.requests_window)),
            _num(per(snapshot.limit_tokens, snapshot.tokens_window)),
            _num(per(snapshot.remaining_requests, snapshot.requests_window)),
            ms(snapshot.reset_requests),
            _num(per(snapshot.remaining_tokens, snapshot.tokens_window)),
            ms(snapshot.reset_tokens),
            _num(self.requests_limit),
            _num(self.tokens_limit),
            repr(self.window * 1000),
            repr(self._limits.window_margin * 1000),
            self._ttl_ms(),
            _num(per(snapshot.limit_input_tokens, snapshot.tokens_window)),
            _num(per(snapshot.remaining_input_tokens, snapshot.tokens_window)),
            ms(snapshot.reset_input_tokens),
            _num(self.input_limit),
            _num(per(snapshot.limit_output_tokens, snapshot.tokens_window)),
            _num(per(snapshot.remaining_output_tokens, snapshot.tokens_window)),
            ms(snapshot.reset_output_tokens),
            _num(self.output_limit),
        ]
        read = [*args[:6], *args[11:14], *args[15:18]]
        if any(a != "-1" for a in read) and self._worth_sending(snapshot):
            self._conn.spawn(self._conn.run("observe", _scripts.OBSERVE, self._keys, args))
        if self._fallback is not None:
            self._fallback.observe(snapshot)

    def _worth_sending(self, snapshot: RateLimitSnapshot) -> bool:
        """Every answer carries headers; sending each to Redis would double the round trips.
        A lower limit goes at once; otherwise (remaining counts, outside traffic) at most
        once per ``OBSERVE_EVERY`` seconds per process."""
        lower = False
        if snapshot.limit_requests is not None:
            value = snapshot.limit_requests * self.window / snapshot.requests_window
            if self._seen_requests is None or value < self._seen_requests:
                self._seen_requests = value
                lower = True
        for kind, limit in (
            (TOKENS, snapshot.limit_tokens),
            (INPUT, snapshot.limit_input_tokens),
            (OUTPUT, snapshot.limit_output_tokens),
        ):
            if limit is not None:
                value = limit * self.window / snapshot.tokens_window
                seen = self._seen[kind]
                if seen is None or value < seen:
                    self._seen[kind] = value
                    lower = True
        now = asyncio.get_running_loop().time()
        if lower or now - self._observed_at >= OBSERVE_EVERY:
            self._observed_at = now
            return True
        return False

    # -- introspection -------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests of this process in flight on this deployment."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        return sum(1 for *_, w in self._heap if not w.future.done())

    def estimate_wait(self) -> float:
        """Seconds until the next slot opens, as Redis last said (no round trip: 0.0 when
        its last answer was a grant; the reconnect backoff while Redis is down)."""
        if not self._conn.healthy:
            return self._conn.backoff()
        return max(0.0, self.next_slot_at - asyncio.get_running_loop().time())

    @property
    def learnt_limits(self) -> bool:
        return any(
            limit is not None for limit in (self.requests_limit, self.tokens_limit, self.input_limit, self.output_limit)
        )

    def __repr__(self) -> str:
        return (
            f"<RedisLimiter {self.name} key={self.fingerprint} in_flight={self._in_flight} "
            f"waiting={self.waiting} redis={'ok' if self._conn.healthy else 'down'}>"
        )

    # -- internals ---------------------------------------------------------------------------

    def _ttl_ms(self) -> str:
        """Keys outlive the window, the leases and a pause by a margin, then vanish."""
        return str(int((self.window + self._limits.lease_seconds) * 1000) + 60_000)

    def _wake(self) -> None:
        if self._kick is not None:
            self._kick.set()

    async def _sleep(self, seconds: float) -> None:
        """Sleep until the next slot opens, or until something frees capacity sooner."""
        kick = self._kick
        if kick is None:
            kick = self._kick = asyncio.Event()
        if kick.is_set():
            kick.clear()
            return
        try:
            async with asyncio.timeout(seconds):
                await kick.wait()
        except TimeoutError:
            pass
        kick.clear()

    def _head(self) -> _Waiter | None:
        heap = self._heap
        while heap and heap[0][3].future.done():
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    async def _run_pump(self) -> None:
        """Serve the local queue's head against Redis until the queue is empty; a bug in
        it fails the waiters instead of leaving them waiting for ever."""
        try:
            await self._serve()
        except Exception as exc:
            log.exception("%s: the shared limiter failed", self.name)
            for *_, waiter in self._heap:
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
            self._heap.clear()
        finally:
            self._pump = None

    async def _serve(self) -> None:
        if not self._listening:
            self._listening = True
            self._conn.listen(self._channel, self._wake)
        if self._kick is None:
            self._kick = asyncio.Event()
        self._kick.clear()
        while (waiter := self._head()) is not None:
            if not self._conn.healthy and self._limits.fail_open:
                await self._grant_locally(waiter)
                continue
            grant_id = self._limits._new_id()
            try:
                reply = await self._conn.run(
                    "acquire", _scripts.ACQUIRE, self._keys, self._acquire_args(waiter, grant_id)
                )
            except RedisFailed as exc:  # not an outage: the request that needed it hears why
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
                continue
            except RedisDown:
                if self._limits.fail_open:
                    self._next_probe = asyncio.get_running_loop().time() + self._conn.backoff()
                    continue
                await self._sleep(self._conn.backoff())
                continue
            granted, value = int(reply[0]), float(reply[1])
            if granted != 1:
                self.next_slot_at = asyncio.get_running_loop().time() + max(0.0, value) / 1000
                await self._sleep(max(0.0, value) / 1000)
                continue
            self.next_slot_at = 0.0
            grant = SharedGrant(self, grant_id, waiter.tokens, output=waiter.output)
            self._in_flight += 1
            if self.max_in_flight is not None:
                self._leases.add(grant_id)
                self._ensure_refresher()
            if waiter.future.done():  # cancelled while we asked: give it back
                grant.refund()
            else:
                waiter.future.set_result(grant)

    async def _grant_locally(self, waiter: _Waiter) -> None:
        """fail_open while Redis is down: the head goes through a local limiter with the
        same limits; Redis is probed again after a backoff."""
        loop = asyncio.get_running_loop()
        if loop.time() >= self._next_probe:
            await self._probe()
            self._next_probe = loop.time() + self._conn.backoff()
            if self._conn.healthy:
                return
        fallback = self._fallback
        if fallback is None:
            fallback = self._fallback = LocalLimiter(
                requests=self.requests_limit,
                tokens=self.tokens_limit,
                window=self.window,
                max_in_flight=self.max_in_flight,
                burst_requests=self.burst_requests,
                burst_tokens=self.burst_tokens,
                name=self.name,
                input_tokens=self.input_limit,
                output_tokens=self.output_limit,
            )
        try:
            async with asyncio.timeout(self._conn.backoff()):
                local = await fallback.acquire(waiter.tokens, output=waiter.output)
        except TimeoutError:
            return
        grant = SharedGrant(self, self._limits._new_id(), waiter.tokens, local, waiter.output)
        self._in_flight += 1
        if waiter.future.done():
            grant.refund()
        else:
            waiter.future.set_result(grant)

    async def _probe(self) -> None:
        with contextlib.suppress(RedisDown):
            await self._conn.call(self._conn.client.ping())

    def _acquire_args(self, waiter: _Waiter, grant_id: str) -> list[str]:
        return [
            str(waiter.tokens),
            _num(self.requests_limit),
            _num(self.tokens_limit),
            repr(self.window * 1000),
            "-1" if self.max_in_flight is None else str(self.max_in_flight),
            repr(float(self.burst_requests)),
            repr(float(self.burst_tokens)),
            repr(self._limits.lease_seconds * 1000),
            grant_id,
            repr(self._limits.window_margin * 1000),
            repr(CATCH_UP * 1000),
            self._ttl_ms(),
            str(waiter.tokens - waiter.output),
            str(waiter.output),
            _num(self.input_limit),
            _num(self.output_limit),
        ]

    def _settle(self, grant: SharedGrant, *, delta: tuple[int, ...], refund: bool, release: bool) -> None:
        args = [
            grant.id,
            str(delta[0]),
            "1" if refund else "0",
            "1" if release and self.max_in_flight is not None else "0",
            _num(self.requests_limit),
            _num(self.tokens_limit),
            repr(self.window * 1000),
            self._ttl_ms(),
            self._channel,
            str(grant.tokens),
            str(delta[1]),
            str(delta[2]),
            _num(self.input_limit),
            _num(self.output_limit),
            str(grant.input),
            str(grant.output),
        ]

        async def settle() -> None:
            try:
                await self._conn.run("settle", _scripts.SETTLE, self._keys, args)
            finally:
                if release or refund or min(delta) < 0:
                    self._wake()  # our own waiters look again once Redis has it

        self._conn.spawn(settle())

    def _ensure_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_leases())

    async def _refresh_leases(self) -> None:
        """Keep this process's leases alive while it holds them (a dead process's expire)."""
        period = self._limits.lease_seconds / 3
        while self._leases:
            await asyncio.sleep(period)
            if not self._leases:
                break
            args = [repr(self._limits.lease_seconds * 1000), self._ttl_ms(), *sorted(self._leases)]
            try:
                await self._conn.run("refresh", _scripts.REFRESH, [self._keys[3]], args)
            except (RedisDown, RedisFailed):
                continue  # said once by the connection; the lease then expires on its own
        self._refresher = None

    def _stop(self) -> None:
        for task in (self._pump, self._refresher):
            if task is not None:
                task.cancel()
        if self._listening:
            self._conn.unlisten(self._channel, self._wake)
        self._listening = False
