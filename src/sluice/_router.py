"""The router: several deployments per model, placement by headroom, cooldowns, fallbacks.

Deployments that share a ``model`` (each with its own ``name``) form a *group*; a request
for that model may go to any of them. Each deployment keeps its own limiter, so the
router places an attempt on the deployment that can take it soonest: it first takes a
slot at once from the one with the most headroom (fewest in flight for its ``weight``),
and when none has room it waits on all of them at once and goes with the first that
grants, so no request waits on a full deployment while another in its group has room.

A deployment that keeps failing (consecutive 5xx, 529s, connection errors, timeouts, a
storm of 429s) is taken out for a cooldown that grows while it keeps failing; when the
cooldown ends one probe is let through (half-open) and only a success brings it back.
Cooldowns apply only where there is somewhere else to go (another deployment of the
group, or a fallback model): a lone deployment is paced by its limiter and the retries.

A group is *exhausted* for one request when every deployment is cooling down or has
already failed that request; the engine then moves the request to the next model of its
``fallbacks`` list (see :class:`GroupExhausted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._adaptive import Adaptive
from ._errors import (
    AttemptTimeoutError,
    AuthenticationError,
    BadRequestError,
    CapacityError,
    ConfigError,
    ConnectError,
    GroupExhausted,
    InvalidRequestError,
    MalformedResponseError,
    MovedToSyncError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    SluiceError,
)
from ._limits import Claim, Limiter, LocalLimiter, Reservation
from ._model_names import configured_model
from ._models import BATCH_SUFFIX, BUILTIN_PROVIDERS, Deployment

if TYPE_CHECKING:
    from .providers import Provider

__all__ = [
    "Cooldown",
    "Group",
    "GroupExhausted",
    "Health",
    "Route",
    "RouteStatus",
    "Router",
    "deployment_fault",
    "model_cannot_take",
]

#: Failures that say the deployment (not the request) is in trouble.
_TROUBLE = (ServerError, OverloadedError, ConnectError, AttemptTimeoutError, MalformedResponseError, RateLimitError)


@dataclass(frozen=True, slots=True)
class Cooldown:
    """When a failing deployment is taken out, and for how long.

    After ``after_failures`` consecutive failures (5xx, 529, connection errors, timeouts,
    429s) the deployment cools down for ``seconds``, doubling each time it fails again
    (its probe included) up to ``max_seconds``; a ``Retry-After`` within ``max_seconds``
    sets a longer one.
    """

    after_failures: int = 3
    seconds: float = 5.0
    max_seconds: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.after_failures, bool) or not isinstance(self.after_failures, int) or self.after_failures < 1:
            raise ConfigError(f"Cooldown.after_failures must be an integer >= 1, got {self.after_failures!r}")
        for name in ("seconds", "max_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"Cooldown.{name} must be a positive number of seconds, got {value!r}")


class Health:
    """A deployment's circuit breaker: closed (in use), open (cooling down until
    ``until``), half-open (one probe in flight decides)."""

    __slots__ = (
        "cooldown",
        "epoch",
        "failures",
        "last_error",
        "last_message",
        "max_cooldown",
        "opens",
        "probing",
        "threshold",
        "until",
    )

    def __init__(self, policy: Cooldown | None = None) -> None:
        policy = policy or Cooldown()
        self.threshold = policy.after_failures
        self.cooldown = policy.seconds
        self.max_cooldown = policy.max_seconds
        self.failures = 0  # consecutive
        self.opens = 0  # consecutive cooldowns without a success between them
        #: Counts cooldowns ever begun: an attempt placed before the latest one began cannot
        #: end it by succeeding (it says nothing of the deployment since).
        self.epoch = 0
        self.until = -math.inf
        self.probing = False
        self.last_error: str | None = None
        self.last_message: str | None = None

    def usable(self, now: float) -> bool:
        """May an attempt go there now? (Closed, or cooled down with no probe in flight.)"""
        if self.opens == 0:
            return True
        return now >= self.until and not self.probing

    def cooling(self, now: float) -> float:
        """Seconds left of the cooldown (0 when not cooling)."""
        return max(0.0, self.until - now) if self.opens else 0.0

    def taken(self) -> int:
        """An attempt was placed here (after a cooldown, it is the probe); the epoch to give
        back with its answer."""
        if self.opens:
            self.probing = True
        return self.epoch

    def released(self) -> None:
        """The placed attempt was never sent: the probe slot is free again."""
        self.probing = False

    def succeeded(self, placed_at: int | None = None) -> None:
        """An answer. ``placed_at``: the epoch when the attempt was placed; one placed before
        the latest cooldown began does not end it."""
        if self.opens and placed_at is not None and placed_at < self.epoch:
            return
        self.failures = 0
        self.opens = 0
        self.probing = False
        self.until = -math.inf

    def failed(self, error: SluiceError, now: float, retry_after: float | None, placed_at: int | None = None) -> bool:
        """Count a failure; True when the deployment goes (back) into a cooldown.

        ``placed_at``: the epoch when the attempt was placed. One placed before the latest
        cooldown began says nothing new (the burst in flight when a deployment went down
        ends in failures after its cooldown began): it neither lengthens the cooldown nor
        ends its probe."""
        self.last_error = error.kind
        self.last_message = error.message
        if self.opens and placed_at is not None and placed_at < self.epoch:
            return False
        if not isinstance(error, _TROUBLE):
            self.probing = False
            return False
        self.failures += 1
        if not self.probing and self.failures < self.threshold:
            return False
        self.probing = False
        self.opens += 1
        self.epoch += 1
        length = min(self.max_cooldown, self.cooldown * 2.0 ** (self.opens - 1))
        if retry_after is not None and 0 <= retry_after <= self.max_cooldown:
            length = max(length, retry_after)  # the server said when it will have room
        self.until = now + length
        return True


@dataclass(eq=False, slots=True)
class Route:
    """One deployment as the engine uses it: where to send, with which limiter."""

    deployment: Deployment
    limiter: Limiter
    provider: Provider
    health: Health = field(default_factory=Health)
    #: AIMD on the in-flight cap, for a server that does not say its limits.
    adaptive: Adaptive | None = None
    answered: int = 0
    failed: int = 0

    @property
    def label(self) -> str:
        return self.deployment.label

    def fits(self, tokens: int, output: int = 0) -> bool:
        """Could this deployment ever take a request of ``tokens`` (``output`` of them its
        output cap), as its limits stand?"""
        try:
            self.limiter.check(tokens, output=output)
        except SluiceError:
            return False
        return True

    def load(self) -> float:
        """In flight for its weight: the lower, the more headroom."""
        in_flight = getattr(self.limiter, "in_flight", 0)
        return float(in_flight) / self.deployment.weight


@dataclass(frozen=True, slots=True)
class RouteStatus:
    """One deployment's state, for stats, progress and ``sluice report``."""

    deployment: str
    model: str
    state: str  # "ok", "cooling down", "probing"
    seconds_left: float
    in_flight: int
    answered: int
    failed: int
    last_error: str | None
    #: What the last failure said (provider messages carry no keys: they are redacted).
    last_message: str | None = None

    def describe(self) -> str:
        if self.state == "cooling down":
            return f"{self.deployment} cooling down, {self.seconds_left:.0f} s left"
        return f"{self.deployment} {self.state}"


@dataclass(eq=False, slots=True)
class Group:
    """The deployments that serve one model."""

    model: str
    routes: list[Route] = field(default_factory=list)
    #: Futures waiting for a deployment of the group to come back from a cooldown.
    watchers: list[asyncio.Future[None]] = field(default_factory=list)

    def changed(self) -> None:
        watchers, self.watchers = self.watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)


class Router:
    """Groups of deployments per model, placement, health and fallbacks."""

    def __init__(
        self,
        *,
        make_route: Callable[[Deployment], Route],
        defaults: Mapping[str, Any] | None = None,
        fallbacks: Mapping[str, Sequence[str]] | None = None,
        on_new_deployment: Callable[[Deployment], object] = lambda d: None,
        adapt: Callable[[Deployment], Deployment] | None = None,
    ) -> None:
        self._make_route = make_route
        self._defaults = dict(defaults or {})
        self._adapt = adapt
        self._on_new = on_new_deployment
        self._groups: dict[str, Group] = {}
        #: ``chain()``'s answer per model, until a deployment is added.
        self._chains: dict[str, tuple[Group, ...]] = {}
        self._labels: dict[str, Route] = {}
        self.routes: list[Route] = []
        #: Deployments made here for a model nobody configured (a bare name never means one).
        self._made: set[str] = set()
        self.fallbacks: dict[str, tuple[str, ...]] = {}
        for model, chain in (fallbacks or {}).items():
            self._check_fallbacks(model, chain)
            self.fallbacks[model] = tuple(chain)

    # -- configuration -------------------------------------------------------------------

    def add(self, deployment: Deployment) -> Route:
        """Serve ``deployment.model`` from this deployment too (its ``name`` must be unique)."""
        if deployment.label in self._labels:
            raise ConfigError(f"two deployments are named {deployment.label!r}; give each a distinct name=")
        route = self._make_route(deployment)
        self._chains.clear()
        self.routes.append(route)
        self._labels[deployment.label] = route
        for key in _model_keys(deployment):
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = Group(key)
            if route not in group.routes:
                group.routes.append(route)
        if deployment.name is not None and deployment.label not in self._groups:
            self._groups[deployment.label] = Group(deployment.label, [route])  # a request may name one deployment
        return route

    def group(self, model: str) -> Group:
        """The group serving ``model`` (a model nobody configured gets a deployment of its own)."""
        group = self._groups.get(model)
        if group is None and "/" not in model:  # a bare name: the configured model of that name, else OpenAI's
            configured = [r.deployment for r in self.routes if r.deployment.label not in self._made]
            group = self._groups.get(configured_model(model, configured) or f"openai/{model}")
        if group is not None:
            return group
        prefix, sep, _ = model.partition("/")
        if sep and prefix not in BUILTIN_PROVIDERS:
            raise InvalidRequestError(
                f"model {model!r}: unknown provider {prefix!r}; use one of "
                f"{', '.join(sorted(BUILTIN_PROVIDERS))}, or add a Deployment for it"
            )
        # A model nobody configured: served with the defaults' limits (none by default);
        # its limiter still learns the provider's limits from its headers and 429s.
        deployment = Deployment(model, **self._defaults)
        if self._adapt is not None:
            deployment = self._adapt(deployment)
        self.add(deployment)
        self._made.add(deployment.label)
        self._on_new(deployment)
        return self._groups[model]

    def chain(self, model: str) -> tuple[Group, ...]:
        """The groups a request for ``model`` may use, in order: its own, then its fallbacks."""
        known = self._chains.get(model)
        if known is not None:
            return known
        groups = [self.group(model)]
        for fallback in self._fallbacks_of(model) or self._fallbacks_of(groups[0].model):  # a bare name's too
            group = self.group(fallback)
            if group not in groups:
                groups.append(group)
        chain = self._chains[model] = tuple(groups)
        return chain

    def _fallbacks_of(self, model: str) -> tuple[str, ...]:
        """The fallback list of ``model`` under any name it goes by: ``big`` and
        ``openai/big`` are one model (as for groups), whichever the list was keyed by."""
        chain = self.fallbacks.get(model)
        if chain is None:
            if "/" not in model:
                chain = self.fallbacks.get(f"openai/{model}")
            elif model.startswith("openai/"):
                chain = self.fallbacks.get(model.removeprefix("openai/"))
        if model.endswith(BATCH_SUFFIX):  # a model's batch tier (--tier auto) falls back to the model
            real = model.removesuffix(BATCH_SUFFIX)
            return (real, *(chain or self._fallbacks_of(real)))
        return chain or ()

    def _check_fallbacks(self, model: str, chain: Sequence[str]) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"fallbacks: a model name must be a non-empty string, got {model!r}")
        if isinstance(chain, str) or not all(isinstance(m, str) and m for m in chain):
            raise ConfigError(f"fallbacks[{model!r}] must be a list of model names, got {chain!r}")
        if model in chain:
            raise ConfigError(f"fallbacks[{model!r}] names the model itself")

    # -- placement ---------------------------------------------------------------------

    def try_acquire(
        self,
        group: Group,
        tokens: int,
        avoid: Iterable[Route],
        *,
        guarded: bool,
        can_fall_back: bool = False,
        output: int = 0,
        prefer: Collection[Route] = (),
    ) -> tuple[Route, Reservation] | None:
        """A slot at once on the deployment with the most headroom, or None (no waiting).

        ``guarded``: cooldowns apply (the request has somewhere else to go). ``output``:
        of ``tokens``, the output cap (for a deployment's output and input limits).
        ``prefer``: where any of these may take it, only they are tried (the deployments
        whose prompt caches hold what the request reads: elsewhere it would be written
        again, at the write premium); :meth:`acquire` says how long they are waited for."""
        routes = group.routes
        if len(routes) == 1 and not guarded:  # the common case costs nothing extra
            route = routes[0]
            granted = route.limiter.try_acquire(tokens, output=output)
            return None if granted is None else (route, granted)
        try:
            candidates = self._candidates(group, avoid, guarded, can_fall_back, tokens, output)
        except GroupExhausted:
            return None  # the waiting path says so
        holders = [r for r in candidates if r in prefer] if prefer else None
        if holders:  # none of them with room: the waiting path gives them a while first
            candidates = holders
        for route in sorted(candidates, key=Route.load) if len(candidates) > 1 else candidates:
            granted = route.limiter.try_acquire(tokens, output=output)
            if granted is not None:
                route.health.taken()
                return route, granted
        return None

    async def acquire(
        self,
        group: Group,
        tokens: int,
        priority: int,
        seq: int,
        avoid: Iterable[Route],
        *,
        guarded: bool,
        can_fall_back: bool,
        output: int = 0,
        prefer: Collection[Route] = (),
        patience: float = 0.0,
    ) -> tuple[Route, Reservation]:
        """Wait for the first deployment of the group that can take the attempt.

        ``prefer``: for ``patience`` seconds, only those of them that may take it are
        waited on (the deployments whose prompt caches hold what it reads); then any.
        Raises :class:`GroupExhausted` when ``can_fall_back`` and every deployment is
        cooling down or has failed this request."""
        routes = group.routes
        if len(routes) == 1 and not guarded:
            route = routes[0]
            return route, await route.limiter.acquire(tokens, priority, seq, output=output)
        loop = asyncio.get_running_loop()
        stick_until = loop.time() + patience if prefer else -math.inf
        while True:
            candidates = self._candidates(group, avoid, guarded, can_fall_back, tokens, output)
            watcher: asyncio.Future[None] = loop.create_future()
            group.watchers.append(watcher)
            timer = None
            next_back = self._next_back(group, loop.time()) if guarded else math.inf
            holders = [r for r in candidates if r in prefer] if loop.time() < stick_until else []
            alone = None  # wakes this wait only (not the group's every waiter) at stick_until
            if holders and len(holders) < len(candidates):
                candidates = holders  # until stick_until: then the race is run again on every one
                alone = loop.call_at(stick_until, _wake, watcher)
            if next_back < math.inf:
                timer = loop.call_at(next_back, group.changed)
            won = None
            try:
                if candidates:
                    won = await self._race(candidates, tokens, priority, seq, watcher, output)
                else:  # every deployment is cooling down: wait for the first probe
                    await watcher
            finally:
                if timer is not None:
                    timer.cancel()
                if alone is not None:
                    alone.cancel()
                if not watcher.done() or alone is not None:  # not left behind in the group's list
                    with contextlib.suppress(ValueError):
                        group.watchers.remove(watcher)
            if won is not None:
                won[0].health.taken()
                return won

    def _candidates(
        self,
        group: Group,
        avoid: Iterable[Route],
        guarded: bool,
        can_fall_back: bool,
        tokens: int = 0,
        output: int = 0,
    ) -> list[Route]:
        """Where the attempt may go: deployments not cooling down that have not failed this
        request; failing that, those that have (a retry), or none (wait for a probe).
        Raises :class:`GroupExhausted` when none is left and the request can fall back."""
        if not guarded:
            return list(group.routes)
        now = asyncio.get_running_loop().time()
        fitting = [r for r in group.routes if r.fits(tokens, output)]
        if not fitting:  # no deployment of the model can ever take it
            if can_fall_back:
                raise GroupExhausted(f"no deployment of {group.model!r} can take a request of {tokens} tokens")
            group.routes[0].limiter.check(tokens, output=output)  # raises its CapacityError
        usable = [r for r in fitting if r.health.usable(now)]
        tried = set(avoid)
        fresh = [r for r in usable if r not in tried]
        if fresh:
            return fresh
        if can_fall_back:
            raise GroupExhausted(f"every deployment of {group.model!r} is cooling down or failed this request")
        return usable

    @staticmethod
    def _next_back(group: Group, now: float) -> float:
        """When the next cooling deployment of the group may be probed."""
        times = [r.health.until for r in group.routes if r.health.opens and r.health.until > now]
        return min(times, default=math.inf)

    @staticmethod
    async def _race(
        candidates: Sequence[Route],
        tokens: int,
        priority: int,
        seq: int,
        watcher: asyncio.Future[None],
        output: int = 0,
    ) -> tuple[Route, Reservation] | None:
        """Wait on every candidate's limiter at once; the first grant wins, the rest are
        withdrawn (a grant that came in the same tick is refunded). None: the group changed."""
        claim = Claim()  # the first grant takes it: the others then skip this request

        def wait_on(route: Route) -> Awaitable[Reservation]:
            limiter = route.limiter
            if isinstance(limiter, LocalLimiter):
                return limiter.acquire(tokens, priority, seq, claim=claim, output=output)
            return limiter.acquire(tokens, priority, seq, output=output)

        waits: dict[asyncio.Future[Any], Route] = {asyncio.ensure_future(wait_on(r)): r for r in candidates}
        try:
            done, _ = await asyncio.wait([*waits, watcher], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await _withdraw(waits, keep=None)
            raise
        winner = next((f for f in waits if f in done and not f.cancelled() and f.exception() is None), None)
        if winner is None:
            failed = next((f for f in waits if f in done and not f.cancelled()), None)
            await _withdraw(waits, keep=None)
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]  # e.g. CapacityError
            return None
        try:
            await _withdraw(waits, keep=winner)
        except BaseException:  # cancelled while the losers were withdrawn: the winner's grant too
            winner.result().refund()
            raise
        return waits[winner], winner.result()

    # -- learning ----------------------------------------------------------------------

    def succeeded(
        self, route: Route, latency: float | None = None, output_tokens: int = 0, placed_at: int | None = None
    ) -> None:
        """An answer from ``route``: ``latency`` (None: not known) teaches AIMD; ``placed_at``
        (the health epoch when the attempt was placed) decides whether it may end a cooldown."""
        route.answered += 1
        if route.adaptive is not None and latency is not None:
            route.adaptive.answered(latency, output_tokens)
        health = route.health
        if health.opens or health.failures or health.probing:  # a healthy one has nothing to reset
            was_cooling = health.opens > 0
            health.succeeded(placed_at)
            if was_cooling:
                self._group_changed(route)

    def failed(self, route: Route, error: SluiceError, *, guarded: bool, placed_at: int | None = None) -> bool:
        """Count a failed attempt; True when the deployment went into a cooldown
        (``placed_at``: see :meth:`Health.failed`)."""
        route.failed += 1
        if route.adaptive is not None and isinstance(error, _TROUBLE):
            route.adaptive.failed()
        if not guarded:
            route.health.last_error = error.kind
            route.health.last_message = error.message
            return False
        retry_after = getattr(error, "retry_after", None)
        cooling = route.health.failed(error, asyncio.get_running_loop().time(), retry_after, placed_at)
        self._group_changed(route)
        return cooling

    def released(self, route: Route) -> None:
        """A placed attempt was never sent."""
        if route.health.probing:
            route.health.released()
            self._group_changed(route)

    def _group_changed(self, route: Route) -> None:
        for group in self._groups.values():
            if route in group.routes:
                group.changed()

    def has_alternative(self, groups: Sequence[Group]) -> bool:
        """Whether a request over ``groups`` has somewhere else to go (cooldowns apply)."""
        return len(groups) > 1 or len(groups[0].routes) > 1

    def status(self) -> list[RouteStatus]:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # asked after the loop ended: nothing is cooling any more
            now = math.inf
        rows = []
        for route in self.routes:
            health = route.health
            left = health.cooling(now)
            state = "cooling down" if left > 0 else "probing" if health.probing else "ok"
            rows.append(
                RouteStatus(
                    deployment=route.label,
                    model=route.deployment.model,
                    state=state,
                    seconds_left=left,
                    in_flight=int(getattr(route.limiter, "in_flight", 0)),
                    answered=route.answered,
                    failed=route.failed,
                    last_error=health.last_error,
                    last_message=health.last_message,
                )
            )
        return rows

    def route_named(self, label: str) -> Route | None:
        return self._labels.get(label)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _withdraw(waits: Mapping[asyncio.Future[Any], Route], keep: asyncio.Future[Any] | None) -> None:
    """Cancel the losing waits; refund any that were granted in the same tick.

    ``asyncio.wait`` (not awaiting each) so that a cancellation of the caller's own task is
    not swallowed here: it propagates, and the refunds still happen."""
    losers = [f for f in waits if f is not keep]
    for future in losers:
        if not future.done():
            future.cancel()
    try:
        if losers:
            await asyncio.wait(losers)
    finally:
        for future in losers:
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().refund()


def _model_keys(deployment: Deployment) -> set[str]:
    keys = {deployment.model}
    if deployment.provider_name == "openai" and "/" not in deployment.model:
        keys.add(f"openai/{deployment.model}")  # "gpt-4o-mini" and "openai/gpt-4o-mini" are one model
    return keys


#: Provider error codes (and words) that say the model cannot take this request at all.
_CANNOT_TAKE = ("context_length_exceeded", "content_filter", "content_policy", "context window", "context length")
_CANNOT_TAKE_WORDS = ("maximum context length", "prompt is too long", "context window", "content management policy")


def model_cannot_take(error: SluiceError) -> bool:
    """A rejection of the request by this model (too long, against its content policy), or a
    request its provider cannot express (raised before sending): another model may take it."""
    if isinstance(error, InvalidRequestError) and not isinstance(error, CapacityError):
        return True
    if isinstance(error, MovedToSyncError):
        return True
    if not isinstance(error, BadRequestError):
        return False
    code = (error.provider_type or "").lower()
    message = error.message.lower()
    return any(c in code for c in _CANNOT_TAKE) or any(w in message for w in _CANNOT_TAKE_WORDS)


def deployment_fault(error: SluiceError) -> bool:
    """A failure of this deployment's setup (key, permission, model name, config), which
    another deployment of the same model may not share."""
    return isinstance(error, (AuthenticationError, PermissionDeniedError, NotFoundError, ConfigError))
