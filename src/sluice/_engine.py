"""The engine: many requests at once, inside each deployment's limits, with honest retries.

One request's way (see ``DESIGN.md``)::

    source -> gate (priority lanes, bounded: back-pressure on the source)
           -> limiter.acquire(tokens)      # waits FIFO within its lane, woken by timer
           -> provider.send()              # one pooled HTTP session
           -> ok: reconcile usage, emit    | retryable: 429 pauses the deployment,
                                             others back off with jitter, then again
                                           | final: emit the typed error

The engine owns the loop; the limiter, the providers and the clock (the event loop's)
are objects handed to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from ._adaptive import Adaptive
from ._budget import Budget, BudgetHold, SharedBudget
from ._coerce import RequestLike, coerce, make_request
from ._errors import (
    AttemptTimeoutError,
    CancelledError,
    ConfigError,
    DeadlineExceededError,
    EngineClosedError,
    FatalProviderError,
    InvalidRequestError,
    ProviderError,
    RateLimitError,
    SluiceError,
    StoreError,
)
from ._fanout import fan_out
from ._gate import PriorityGate
from ._limits import Limiter, LocalLimiter, RateLimitSnapshot
from ._models import Deployment, Priority, Request, Result, Timings, Usage, store_key
from ._records import result_from_record
from ._retry import RetryPolicy
from ._router import (
    Cooldown,
    Group,
    GroupExhausted,
    Health,
    Route,
    Router,
    RouteStatus,
    deployment_fault,
    model_cannot_take,
)
from ._session import Session
from ._slot import AttemptTimer, Slot, Tally, WaitingScope, settle_unsettled, stopped_note
from ._spending import CheaperModel, Spending
from ._stats import Stats
from ._streaming import Stream
from .providers import HttpProvider, ProviderSet, Reply

if TYPE_CHECKING:
    from array import array

    from ._embeddings import EmbeddingResult
    from .store import SettlingStore, Store

__all__ = ["Engine", "RequestLike", "RetryEvent"]

_log = logging.getLogger("sluice")


class _Answer(Protocol):
    """What an attempt's reply carries for the engine: usage, and what the headers said."""

    @property
    def usage(self) -> Usage: ...

    @property
    def ratelimit(self) -> RateLimitSnapshot | None: ...


_A = TypeVar("_A", bound=_Answer)


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """Told to ``on_retry`` before the engine waits and tries again."""

    request: Request
    error: SluiceError
    attempt: int
    delay: float
    deployment: str


@dataclass(slots=True)
class _Job:
    request: Request
    #: Where the latest attempt went (before the first: the first deployment it may use).
    route: Route
    tokens: int
    priority: int
    seq: int
    submitted: float
    index: int | None = None
    key: str | None = None
    budget: Budget | None = None
    worst_cost: float = 0.0
    #: What was reported when the job's task was cancelled (``map`` hands it out).
    cancelled: Result | None = None
    #: The groups of deployments it may use: its model's, then its fallbacks'.
    groups: tuple[Group, ...] = ()
    #: Which of ``groups`` it is on now.
    step: int = 0
    #: Deployments that failed this request (a retry goes elsewhere when it can); a shared
    #: empty frozenset until the first one (no set per request on the hot path).
    tried: set[Route] | frozenset[Route] = frozenset()
    #: Cooldowns apply: the request has somewhere else to go.
    guarded: bool = False
    #: Its task began to run (a task cancelled before that still holds a gate slot).
    started: bool = False
    #: ``worst_cost`` is an attempt's worst case with or without a budget (an embeddings
    #: request, priced from its inputs: see ``_embeddings``).
    own_worst: bool = False
    #: The health epoch of the deployment when its latest attempt was placed: a failure
    #: of an attempt placed before a cooldown began does not lengthen that cooldown.
    placed_at: int | None = None

    @property
    def idempotency_key(self) -> str | None:
        """A header-safe form of the store key (ids may hold any character)."""
        if self.key is None:
            return None
        return "sluice-" + hashlib.sha256(self.key.encode()).hexdigest()[:32]


def _default_limiter(deployment: Deployment) -> Limiter:
    return LocalLimiter.for_deployment(deployment)


class Engine:
    """Runs requests against deployments. Use ``async with Engine(...) as engine``.

    ``concurrency`` caps requests admitted at once across all deployments (each
    deployment's own ``max_in_flight`` and rate limits apply inside it); ``buffer``
    caps results admitted but not yet taken by the consumer of :meth:`map`, which is
    what keeps memory flat however long the input. Hooks are plain functions, called
    for every result (``on_result``) and before every retry (``on_retry``); a hook that
    raises is logged and counted (``stats.hook_errors``), never allowed to lose a result.

    A model with no configured deployment is served by ``Deployment(model, **defaults)``:
    no local limits unless ``defaults`` gives some; it learns from the provider's headers.

    With a ``store``, every attempt is recorded (durably) before it is sent and settled
    with what it cost, every finished result is written as it lands, and a request whose
    key (:func:`~sluice.store_key`) has a stored answer is served from the store instead
    of being sent; so is a stored rejection of the request itself (400/422), unless
    ``retry_failed``. Identical requests in flight at once are sent once. When the store
    cannot be written the engine stops admitting (see :attr:`store_error`).

    Every result carries its cost when its model's price is known. With ``budget_usd``,
    each request reserves its worst-case cost before it is sent, so concurrency cannot
    push spending past the cap; one that no longer fits is refused as
    ``budget_exhausted``. ``session(budget_usd=...)`` gives one task a budget of its own,
    counted against the engine's too; ``cheaper`` switches to a cheaper model as money
    runs low. Under a budget, a model with no known price is refused unless
    ``allow_unpriced``.
    """

    def __init__(
        self,
        deployments: Deployment | Iterable[Deployment] = (),
        *,
        retry: RetryPolicy | None = None,
        concurrency: int = 256,
        buffer: int | None = None,
        on_result: Callable[[Result], object] | None = None,
        on_retry: Callable[[RetryEvent], object] | None = None,
        limiter_factory: Callable[[Deployment], Limiter] = _default_limiter,
        store: Store | None = None,
        retry_failed: bool = False,
        budget_usd: float | None = None,
        shared_budget: SharedBudget | None = None,
        allow_unpriced: bool = False,
        cheaper: CheaperModel | None = None,
        defaults: Mapping[str, Any] | None = None,
        fallbacks: Mapping[str, Sequence[str]] | None = None,
        cooldown: Cooldown | None = None,
        grace: float | None = None,
    ) -> None:
        if isinstance(deployments, Deployment):
            deployments = [deployments]
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be a positive integer, got {concurrency!r}")
        if buffer is not None and (not isinstance(buffer, int) or buffer < 1):
            raise ConfigError(f"buffer must be a positive integer, got {buffer!r}")
        self.retry = retry or RetryPolicy()
        self.concurrency = concurrency
        self.buffer = buffer or max(concurrency * 4, 64)
        self.on_result = on_result
        self.on_retry = on_retry
        self.store = store
        self.retry_failed = retry_failed
        self.spending = Spending(budget_usd, allow_unpriced=allow_unpriced, cheaper=cheaper, shared=shared_budget)
        self.stats = Stats()
        #: Why the store stopped taking writes, once it has; the engine stopped admitting then.
        self.store_error: StoreError | None = None
        #: Seconds attempts at the provider get when the engine stops on its own (the store
        #: failed); None waits for them.
        self.grace = grace
        self._inflight: dict[str, asyncio.Future[Result]] = {}
        self._limiter_factory = limiter_factory
        self._cooldown = cooldown or Cooldown()
        self._providers = ProviderSet(idle_timeout=self.retry.idle_timeout)
        self.router = Router(
            make_route=self._make_route,
            defaults=defaults,
            fallbacks=fallbacks,
            on_new_deployment=self.spending.pricing.known,  # now, not between an answer and its commit
        )
        for deployment in deployments:
            self.add_deployment(deployment)
        self._gate = PriorityGate(concurrency)
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()  # map()'s jobs, embeddings' packs
        self._producers: set[asyncio.Task[None]] = set()
        self._active_calls = 0
        self._idle: asyncio.Event | None = None
        self._stopping = False
        self._closed = False
        #: Batch tasks not at the provider right now (waiting for money, capacity or a
        #: retry's backoff): stop() cancels them, so a stop sends nothing new.
        self._waiting: set[asyncio.Task[Any]] = set()
        self._stop_cancelled: set[asyncio.Task[Any]] = set()
        self._grace_timer: asyncio.TimerHandle | None = None
        self._timer = AttemptTimer()
        self._worst_of = self._worst  # bound once: every Slot calls it with its job
        #: The store writes a result and settles its last attempt's intent in one op.
        self._settling = callable(getattr(store, "put_settled", None))  # not isinstance: no sqlite3 import here

    # -- configuration -------------------------------------------------------------------

    def add_deployment(self, deployment: Deployment) -> None:
        """Serve ``deployment.model`` (and its ``name``) from this deployment too: deployments
        that share a model form a group, each with its own ``name``."""
        if not isinstance(deployment, Deployment):
            raise ConfigError(f"expected a Deployment, got {type(deployment).__name__}")
        self.router.add(deployment)

    def _make_route(self, deployment: Deployment) -> Route:
        limiter = self._limiter_factory(deployment)
        route = Route(deployment, limiter, self._providers.for_deployment(deployment), Health(self._cooldown))
        unlimited = deployment.rpm is None and deployment.tpm is None and deployment.max_in_flight is None
        if unlimited and isinstance(limiter, LocalLimiter):  # it may be a server that never says its limits
            route.adaptive = Adaptive(limiter)
        return route

    def session(self, budget_usd: float, *, name: str | None = None, shared: SharedBudget | None = None) -> Session:
        """A spending scope for one task, counted against this engine's budget too.

        ``shared``: a budget other processes use too (``RedisBudget``) that this task's
        requests also hold in, so its cap holds across them."""
        return Session(self, self.spending.session(budget_usd, name or "the session budget", shared))

    def remaining(self) -> float:
        """Dollars left to start work with (``inf`` without a budget)."""
        return self.spending.remaining()

    def spent(self) -> float:
        """Dollars spent so far: answers, and failed attempts that may have been billed."""
        budget = self.spending.budget
        return budget.spent() if budget is not None else self.stats.cost_usd + self.stats.maybe_billed_usd

    @property
    def deployments(self) -> Sequence[Deployment]:
        return tuple(route.deployment for route in self.router.routes)

    def limiter(self, model: str) -> Limiter:
        """The limiter of the (first) deployment serving ``model`` (for introspection)."""
        return self.router.group(model).routes[0].limiter

    def deployment_status(self) -> list[RouteStatus]:
        """Each deployment's state: ok, cooling down (and for how long), probing."""
        return self.router.status()

    # -- running -----------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def start(self) -> None:
        """Check and do the slow one-time work now, not on the first request.

        A configured deployment that needs an API key and has none is a
        :class:`ConfigError` here, before anything is sent; so is one with no known price
        under a budget (unless ``allow_unpriced``). The HTTP pool is opened
        (importing aiohttp) and every deployment's price looked up (importing
        genai-prices); otherwise the event loop stalls ~0.5 s mid-run and rate-limit
        slots go unused.
        """
        for route in self.router.routes:
            self.spending.check_priced(route.deployment)
            if isinstance(route.provider, HttpProvider):
                route.provider.check(route.deployment)
                self._providers.transport.session()

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.close(drain=exc_type is None)

    async def complete(
        self,
        model: str | Request,
        messages: Sequence[Mapping[str, Any]] | str | None = None,
        *,
        priority: int = Priority.INTERACTIVE,
        budget: Budget | None = None,
        **fields: Any,
    ) -> Result:
        """Run one request now, ahead of queued batch work. Returns its Result.

        ``engine.complete("openai/gpt-4o-mini", "hi")`` or ``engine.complete(request)``.
        An invalid request raises :class:`InvalidRequestError` before anything is sent;
        provider failures come back as ``result.error`` (``result.unwrap()`` raises them).
        """
        if self._closed:
            raise EngineClosedError("the engine is closed")
        request = make_request(model, messages, fields)
        job = self._job(request, priority if request.priority is None else request.priority, budget=budget)
        self._active_calls += 1
        try:
            await self._gate.acquire(job.priority, job.seq)
            try:
                return await self._execute(job)
            finally:
                self._gate.release()
        finally:
            self._active_calls -= 1
            self._maybe_idle()

    def stream(
        self,
        model: str | Request,
        messages: Sequence[Mapping[str, Any]] | str | None = None,
        *,
        priority: int = Priority.INTERACTIVE,
        budget: Budget | None = None,
        **fields: Any,
    ) -> Stream:
        """One request, its text handed on as it arrives (see :mod:`sluice._streaming`)::

            async with engine.stream("openai/gpt-4o-mini", "hi") as stream:
                async for delta in stream:
                    print(delta, end="")
            result = stream.result

        Arguments as for :meth:`complete`; limits, budget, retries (before the first delta
        only) and the store apply as to any request.
        """
        if self._closed:
            raise EngineClosedError("the engine is closed")
        request = make_request(model, messages, fields)
        job = self._job(request, priority if request.priority is None else request.priority, budget=budget)
        return Stream(self, job)

    async def run(
        self,
        requests: Iterable[RequestLike] | AsyncIterable[RequestLike],
        *,
        model: str | None = None,
        priority: int = Priority.BATCH,
        budget: Budget | None = None,
    ) -> list[Result]:
        """Every result, in input order."""
        return [r async for r in self.map(requests, model=model, ordered=True, priority=priority, budget=budget)]

    def map(
        self,
        requests: Iterable[RequestLike] | AsyncIterable[RequestLike],
        *,
        model: str | None = None,
        ordered: bool = False,
        priority: int = Priority.BATCH,
        budget: Budget | None = None,
    ) -> AsyncIterator[Result]:
        """Results as they complete (or in input order with ``ordered=True``).

        The source is read only as capacity frees up, so a generator of ten million
        prompts never sits in memory. Every item taken from the source yields exactly
        one Result; a bad item yields one whose ``error`` names it, and one cancelled
        (``close(drain=False)``, ``stop()``) yields a cancelled one. Leaving the loop
        early (break, cancellation) cancels the in-flight requests and waits for them:
        no task outlives the iteration. If the engine is closed without draining while
        the source is still being read, the iteration ends with :class:`EngineClosedError`.
        """
        return fan_out(self, requests, model=model, ordered=ordered, priority=priority, budget=budget)

    async def embed(
        self,
        texts: Iterable[str] | AsyncIterable[str],
        *,
        model: str,
        dimensions: int | None = None,
        params: Mapping[str, Any] | None = None,
        priority: int = Priority.NORMAL,
        budget: Budget | None = None,
        batch_size: int | None = None,
        batch_tokens: int | None = None,
    ) -> list[array[float]]:
        """A vector per text, in input order: ``await engine.embed(texts, model="openai/text-embedding-3-small")``.

        Texts are packed many to a request (see :mod:`sluice._embeddings`) within the
        provider's per-request limits and the deployment's limits, budget and retries; each
        vector is a float32 ``array('f')`` (``numpy.frombuffer(v, dtype=numpy.float32)``
        reads it without a copy). With a store, every text's vector is stored as it lands
        and served from there on a rerun. A text the provider refuses fails alone.

        Raises :class:`~sluice.EmbeddingError` when any text could not be embedded: its
        ``results`` holds every text's :class:`~sluice.EmbeddingResult`, vectors included
        (use :meth:`embed_map` to handle failures text by text instead). A single string
        is one text (a list of one vector comes back).
        """
        from ._embeddings import embed

        if self._closed:
            raise EngineClosedError("the engine is closed")
        return await embed(
            self,
            texts,
            model=model,
            dimensions=dimensions,
            params=params,
            priority=priority,
            budget=budget,
            batch_size=batch_size,
            batch_tokens=batch_tokens,
        )

    def embed_map(
        self,
        texts: Iterable[str] | AsyncIterable[str],
        *,
        model: str,
        dimensions: int | None = None,
        params: Mapping[str, Any] | None = None,
        ordered: bool = False,
        priority: int = Priority.NORMAL,
        budget: Budget | None = None,
        batch_size: int | None = None,
        batch_tokens: int | None = None,
    ) -> AsyncIterator[EmbeddingResult]:
        """One :class:`~sluice.EmbeddingResult` per text (``.vector`` or ``.error``,
        ``.index`` its position), as requests finish (in input order with ``ordered``).

        The source is read only as room frees up, so memory stays flat however many texts
        it holds; leaving the loop early cancels what is in flight. Arguments as for
        :meth:`embed`.
        """
        from ._embeddings import embed_map

        if self._closed:
            raise EngineClosedError("the engine is closed")
        return embed_map(
            self,
            texts,
            model=model,
            dimensions=dimensions,
            params=params,
            ordered=ordered,
            priority=priority,
            budget=budget,
            batch_size=batch_size,
            batch_tokens=batch_tokens,
        )

    def stop(self, *, grace: float | None = None) -> None:
        """Stop admitting new work and send nothing new.

        Batch items not at the provider right now (waiting for money or rate-limit
        capacity, or in a retry's backoff) are not sent: they come back at once as
        cancelled ("stopped before it was sent" / "stopped before retrying"), for a rerun
        to do. Attempts at the provider finish and are delivered; with ``grace``, those
        still there after ``grace`` seconds are cancelled and come back as cancelled (they
        were sent, so they may have been billed).
        """
        self._stopping = True
        for task in list(self._waiting):
            self._cancel_for_stop(task)
        if grace is not None and self._grace_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._grace_timer = loop.call_later(max(0.0, grace), self._end_grace)

    def _end_grace(self) -> None:
        for task in list(self._tasks):
            self._cancel_for_stop(task)

    def _cancel_for_stop(self, task: asyncio.Task[Any]) -> None:
        if task not in self._stop_cancelled and not task.done():
            self._stop_cancelled.add(task)
            task.cancel()

    async def close(self, *, drain: bool = True) -> None:
        """Stop admitting; let in-flight requests finish (or cancel them); release connections."""
        self._stopping = True
        self._closed = True
        if not drain:
            for task in list(self._tasks):
                task.cancel()
            for producer in list(self._producers):
                producer.cancel()
        while self._tasks or self._active_calls:
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
            await self._idle.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        await self.spending.flush()  # a shared budget's settles reach it before we say we are done
        await self._providers.aclose()

    def _maybe_idle(self) -> None:
        if self._idle is not None and not self._tasks and not self._active_calls:
            self._idle.set()

    # -- one job ---------------------------------------------------------------------------

    def _job(self, request: Request, priority: int, index: int | None = None, budget: Budget | None = None) -> _Job:
        budget = budget or self.spending.budget
        try:
            key = store_key(request) if self.store is not None else None  # as asked: before a switch or a cap
        except (TypeError, ValueError) as exc:  # text that is not valid Unicode, or not JSON at all
            raise InvalidRequestError(f"the request cannot be stored: {exc}") from None
        request = self.spending.choose_model(request, budget)
        groups = self.router.chain(request.model)
        route = groups[0].routes[0]
        request, worst = self.spending.prepare(request, route.deployment, budget)
        tokens = route.provider.estimate_tokens(request, route.deployment)
        fits = route.fits(tokens) or any(r.fits(tokens) for group in groups for r in group.routes)
        if not fits:
            route.limiter.check(tokens)  # no deployment it may use can ever take it: its CapacityError
        self.stats.submitted += 1
        loop = asyncio.get_running_loop()
        job = _Job(request, route, tokens, priority, next(self._seq), loop.time(), index, key, budget, worst)
        job.groups = groups
        job.guarded = self.router.has_alternative(groups)
        if budget is not None and job.guarded:
            job.worst_cost = self._worst_of_candidates(job)
        return job

    def _worst_of_candidates(self, job: _Job) -> float:
        """Under a budget: the worst case of the dearest deployment that may still run it."""
        worst = 0.0
        for group in job.groups[job.step :]:
            for route in group.routes:
                worst = max(worst, self.spending.prepare(job.request, route.deployment, job.budget)[1])
        return worst

    def _fall_back(self, job: _Job) -> bool:
        """Move the job to the next model of its fallback list; False when there is none."""
        if job.step + 1 >= len(job.groups):
            return False
        job.step += 1
        job.tried = frozenset()
        route = job.groups[job.step].routes[0]
        job.tokens = route.provider.estimate_tokens(job.request, route.deployment)
        if job.budget is not None:
            job.worst_cost = self._worst_of_candidates(job)
        self.stats.fallbacks += 1
        return True

    def _prepare_item(
        self, item: object, index: int, model: str | None, priority: int, budget: Budget | None
    ) -> _Job | Result:
        """A job for an input item, or a failed Result saying why it cannot be one."""
        try:
            request = coerce(item, model)
            return self._job(request, priority if request.priority is None else request.priority, index, budget)
        except Exception as exc:  # one odd item must never stop the rest
            error = exc if isinstance(exc, SluiceError) else InvalidRequestError(f"{type(exc).__name__}: {exc}")
            self.stats.submitted += 1
            key = item.get("id") if isinstance(item, Mapping) else None
            result = Result(
                request=item if isinstance(item, Request) else None,
                error=error,
                index=index,
                key=key if isinstance(key, str) else None,
            )
            self._emit(result)
            return result

    def _not_started(self, job: _Job) -> Result:
        result = Result(job.request, error=CancelledError("not started: the engine was stopping"), index=job.index)
        self._emit(result)
        return result

    async def _admitted(self, job: _Job) -> Result:
        job.started = True  # from here the finally below gives the gate's slot back
        try:
            if job.key is None:  # nothing to share or serve from a store: one coroutine less
                return await self._attempts(job)
            return await self._execute(job)
        finally:
            self._gate.release()

    def _from_store(self, job: _Job) -> Result | None:
        """The stored result for this job, emitted, if the store has one worth reusing:
        an answer, or (unless ``retry_failed``) the provider's rejection of the request."""
        if self.store is None or job.key is None:
            return None
        stored = self.store.get(job.key)
        if stored is None or not (stored.ok or (stored.kept and not self.retry_failed)):
            return None
        result = result_from_record(job.request, stored.record, index=job.index)
        self._emit(result)
        return result

    async def _execute(self, job: _Job) -> Result:
        """Run a job, or share the result of an identical one in flight or already stored."""
        if job.key is None:
            return await self._attempts(job)
        try:
            while (leader := self._inflight.get(job.key)) is not None:
                shared = await asyncio.shield(leader)
                if not isinstance(shared.error, CancelledError):
                    free = 0.0 if shared.cost_usd is not None else None  # paid for once, by the leader
                    result = dataclasses.replace(
                        shared, request=job.request, index=job.index, cached=True, cost_usd=free
                    )
                    self._emit(result)
                    return result
        except asyncio.CancelledError:
            job.cancelled = self._finish(
                job, Tally(asyncio.get_running_loop().time()), error=CancelledError(_NEVER_SENT)
            )
            raise
        stored = self._from_store(job)  # checked here, after the gate: an identical one may have landed
        if stored is not None:
            return stored
        future = self._inflight[job.key] = asyncio.get_running_loop().create_future()
        try:
            result = await self._attempts(job)
        except BaseException:
            future.set_result(Result(job.request, error=CancelledError("cancelled")))
            raise
        finally:
            if self._inflight.get(job.key) is future:
                del self._inflight[job.key]
        future.set_result(result)
        return result

    async def _attempts(self, job: _Job) -> Result:
        """Attempt until an outcome, then record it (durably, with a store) and report it."""
        loop = asyncio.get_running_loop()
        tally = Tally(loop.time())
        deadline = tally.started + self.retry.deadline if self.retry.deadline is not None else None
        batch = job.index is not None
        outcome: Reply | SluiceError
        try:
            # Attempt until success, a final error, the attempt budget, the deadline or a stop
            # (inline, not a coroutine of its own: one object and one frame less per request).
            while True:
                if self._stopping and batch:  # not sent (again): the rerun does it
                    outcome = CancelledError(stopped_note(tally))
                    break
                outcome = await self._attempt(job, tally, deadline, hand_over=self._settling)
                if not isinstance(outcome, SluiceError):
                    break
                if not tally.sent_this_time:  # budget, capacity, deadline, store or stop: final
                    break
                delay = self._after_failure(job, outcome, tally.attempts, deadline)
                if delay is None:
                    break
                settle_unsettled(tally, self.store, self._store_failed)  # it goes again: no result to ride with
                if delay > 0 and not isinstance(outcome, RateLimitError):  # a 429's pause is the limiter's
                    with self._waiting_while(batch):
                        await asyncio.sleep(delay)
        except asyncio.CancelledError:
            settle_unsettled(tally, self.store, self._store_failed)
            task = asyncio.current_task()
            if task is None or task not in self._stop_cancelled:
                note = "it was sent and may have been answered" if tally.sent else "it was never sent"
                job.cancelled = self._finish(job, tally, error=CancelledError(f"cancelled; {note}"))
                raise
            self._stop_cancelled.discard(task)  # stop() wants a result, not a cancelled task
            task.uncancel()
            outcome = CancelledError(stopped_note(tally))
        result = self._result(job, tally, outcome)
        store = self.store
        if job.key is not None and store is not None and tally.attempts and not isinstance(outcome, CancelledError):
            unsettled, tally.unsettled = tally.unsettled, None
            try:
                # durable before anyone is told; with the last attempt's intent settled in the same write
                if unsettled is not None and self._settling:
                    intent, charge, answered = unsettled
                    settling = cast("SettlingStore", store)
                    await settling.put_settled(job.key, result, intent, charge, answered=answered)
                else:
                    if unsettled is not None:
                        store.settle(*unsettled[:2], answered=unsettled[2])
                    await store.put(job.key, result)
            except StoreError as exc:
                self._store_failed(exc)  # the answer still goes out: the output may keep it
        else:
            settle_unsettled(tally, store, self._store_failed)
        self._emit(result)
        return result

    async def _attempt(
        self,
        job: _Job,
        tally: Tally,
        deadline: float | None,
        send: Callable[[Route], Awaitable[_A]] | None = None,
        *,
        hand_over: bool = False,
    ) -> _A | Reply | SluiceError:
        """One attempt: admission (money, capacity, the intent), then the provider. What
        the slot holds is settled before it returns, whatever happens.

        ``send`` sends the attempt to the deployment chosen for it (an embeddings pack
        sends itself this way); by default the job's chat request. ``hand_over``: the
        intent's settlement is left in ``tally.unsettled``, for the caller to write with
        the result (one store write per answer)."""
        slot = await self._admit(job, tally, deadline)
        if isinstance(slot, SluiceError):
            return slot
        route: Route = slot.route
        timeout = self.retry.attempt_timeout
        loop = asyncio.get_running_loop()
        slot.sending(loop)
        if deadline is not None:
            timeout = min(timeout or deadline - slot.sent_at, deadline - slot.sent_at)
        charge: float | None = None  # None: it may have been billed, at its worst case
        answered = cut_off = timed_out = False
        # one shared timer for every attempt's timeout, not an asyncio.timeout() each
        watch = self._timer.arm(loop, slot.sent_at + timeout) if timeout is not None else None
        try:
            try:
                if send is None:
                    reply: _A | Reply = await route.provider.send(
                        job.request, route.deployment, idempotency_key=job.idempotency_key
                    )
                else:
                    reply = await send(route)
            finally:
                timed_out = self._timer.disarm(watch)
        except asyncio.CancelledError:
            if timed_out:  # the timer's own cancellation: a timeout
                return AttemptTimeoutError(f"no answer from {route.deployment.label} within {timeout:g} s")
            cut_off = True
            raise
        except TimeoutError:
            return AttemptTimeoutError(f"no answer from {route.deployment.label} within {timeout:g} s")
        except ProviderError as exc:
            if not exc.maybe_billed:
                charge = 0.0
            return exc
        except SluiceError as exc:  # raised before anything went out (a missing key, say)
            charge = 0.0
            return exc
        except Exception as exc:  # a provider's own bug must not take the whole job down
            return FatalProviderError(f"{type(exc).__name__} in provider {route.provider.name!r}: {exc}")
        else:
            if reply.ratelimit is not None:  # learn before the slot frees and wakes the next
                route.limiter.observe(reply.ratelimit)
            slot.reservation.reconcile(reply.usage.total_tokens or job.tokens)
            charge = self.spending.cost(route.deployment, reply.usage) or 0.0
            answered = True
            latency = asyncio.get_running_loop().time() - slot.sent_at
            self.router.succeeded(route, latency, reply.usage.output_tokens, slot.placed_at)
            return reply
        finally:
            slot.settle(charge, answered=answered, cut_off=cut_off, hand_over=hand_over)
            if cut_off:  # cancelled at the provider: no verdict on the deployment (a probe is freed)
                self.router.released(route)

    async def _admit(self, job: _Job, tally: Tally, deadline: float | None) -> Slot | SluiceError:
        """Money, then capacity, then (with a store) the durable intent: a Slot ready to
        send, or why the attempt cannot be made (final: it was not sent)."""
        loop = asyncio.get_running_loop()
        router = self.router
        batch = job.index is not None
        tally.sent_this_time = False
        waited_from = loop.time()
        hold: BudgetHold | None = None
        try:
            # The common case, no budget and room at once, takes no timer and no await.
            group = job.groups[job.step]
            granted = None
            if job.budget is None:
                granted = router.try_acquire(
                    group, job.tokens, job.tried, guarded=job.guarded, can_fall_back=job.step + 1 < len(job.groups)
                )
            while granted is None:
                with self._waiting_while(batch):
                    async with asyncio.timeout_at(deadline):
                        hold = await self.spending.reserve(job.budget, job.worst_cost)
                        try:
                            granted = await router.acquire(
                                job.groups[job.step],
                                job.tokens,
                                job.priority,
                                job.seq,
                                job.tried,
                                guarded=job.guarded,
                                can_fall_back=job.step + 1 < len(job.groups),
                            )
                        except GroupExhausted:
                            _settle(hold, 0.0)
                            hold = None
                            self._fall_back(job)
            route, reservation = granted
            job.route = route
            job.placed_at = route.health.epoch
        except TimeoutError:
            _settle(hold, 0.0)
            return DeadlineExceededError(f"its deadline ({self.retry.deadline:g} s) passed while it waited")
        except SluiceError as exc:  # no money left, or a limit learnt since that it can never fit
            _settle(hold, 0.0)
            return exc
        except BaseException:
            _settle(hold, 0.0)
            raise
        finally:
            tally.waited += loop.time() - waited_from
        store = self.store if job.key is not None else None
        slot = Slot(route, reservation, hold, tally, self.stats, self._worst_of, job, store, self._store_failed)
        if store is not None:
            assert job.key is not None
            try:
                failed = await slot.note(job.key)
            except BaseException:
                router.released(route)
                raise
            if failed is not None:
                router.released(route)
                self._store_failed(failed)
                return CancelledError(f"not sent: {failed.message}")
        delay = slot.send_delay(loop.time())  # 0 unless what came before it left late
        if delay > 0:
            try:
                with self._waiting_while(batch):
                    await asyncio.sleep(delay)
            except BaseException:
                slot.unsent()
                router.released(route)
                raise
        if self._stopping and batch:
            slot.unsent()
            router.released(route)
            return CancelledError(stopped_note(tally))
        return slot

    def _worst(self, job: _Job) -> float:
        """What an attempt counts for when it may have been billed unseen: its worst case."""
        if job.budget is not None or job.own_worst:
            return job.worst_cost
        deployment = job.route.deployment
        if not self.spending.pricing.has_price(deployment):
            return 0.0  # what worst_cost says for an unknown price, without counting the prompt's bytes
        return self.spending.worst_cost(job.request, deployment)

    def _store_failed(self, error: StoreError) -> None:
        """The state cannot be written: stop admitting; what is in flight still finishes."""
        if self.store_error is None:
            self.store_error = error
            _log.error("%s; stopping", error.message)
            self.stop(grace=self.grace)

    def _waiting_while(self, batch: bool) -> WaitingScope:
        return WaitingScope(self._waiting if batch else None)

    def _after_failure(self, job: _Job, error: SluiceError, attempt: int, deadline: float | None) -> float | None:
        """Learn from a failed attempt; the delay before the next, or None to give up.

        The next attempt may go elsewhere: to another deployment of the group (at once,
        when one has not failed this request yet), or to the next model of the request's
        fallbacks when the error says this model cannot take it (its context window, its
        content policy) or every deployment of the model has failed it.
        """
        route = job.route
        if isinstance(error, ProviderError) and error.ratelimit is not None:
            route.limiter.observe(error.ratelimit)
        if isinstance(error, RateLimitError):
            self.stats.rate_limited += 1
            # the server's hint within RetryPolicy.max_retry_after, else the un-jittered backoff:
            # one 429 saying "retry-after: 86400" must not pause a deployment for a day
            route.limiter.penalize(self.retry.pause(error, attempt))
        self.router.failed(route, error, guarded=job.guarded, placed_at=job.placed_at)
        if job.guarded:
            job.tried = {*job.tried, route}
        if attempt >= self.retry.max_attempts:
            return None
        elsewhere = job.guarded and any(r not in job.tried for r in job.groups[job.step].routes)
        can_fall_back = job.step + 1 < len(job.groups)
        if can_fall_back and (model_cannot_take(error) or (deployment_fault(error) and not elsewhere)):
            self._fall_back(job)  # this model cannot take it, or none of its deployments can be used
            delay = 0.0
        elif elsewhere and deployment_fault(error):  # this deployment's key, model or setup
            delay = 0.0
        elif not self.retry.should_retry(error, attempt):
            return None
        else:
            delay = 0.0 if elsewhere else self.retry.delay(error, attempt)
        now = asyncio.get_running_loop().time()
        if deadline is not None and now + delay >= deadline:
            return None
        self.stats.retries += 1
        if self.on_retry is not None:
            try:
                self.on_retry(RetryEvent(job.request, error, attempt, delay, route.deployment.label))
            except Exception:
                self.stats.hook_errors += 1
                _log.exception("the on_retry hook raised; carrying on")
        return delay

    def _result(self, job: _Job, tally: Tally, outcome: Reply | SluiceError) -> Result:
        if isinstance(outcome, SluiceError):
            return self._finish(job, tally, error=outcome, emit=False)
        return self._finish(job, tally, reply=outcome, emit=False)

    def _finish(
        self,
        job: _Job,
        tally: Tally,
        *,
        error: SluiceError | None = None,
        reply: Reply | None = None,
        emit: bool = True,
    ) -> Result:
        now = asyncio.get_running_loop().time()
        priced = self.spending.pricing.has_price(job.route.deployment)
        result = Result(
            job.request,
            text=reply.text if reply is not None else None,
            error=error,
            usage=reply.usage if reply is not None else Usage(),
            raw=reply.raw if reply is not None else None,
            attempts=tally.attempts,
            timings=Timings(
                queued=tally.started - job.submitted,
                limiter_wait=tally.waited,
                latency=tally.latency,
                total=now - job.submitted,
            ),
            deployment=job.route.deployment.label,
            model=job.route.deployment.model if tally.attempts else None,
            finish_reason=reply.finish_reason if reply is not None else None,
            request_id=reply.request_id if reply is not None else None,
            index=job.index,
            cost_usd=tally.charged if priced and tally.attempts else None,
        )
        if emit:
            self._emit(result)
        return result

    def _emit(self, result: Result) -> None:
        self.stats.record(result)
        if self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:  # a hook's bug must not abort map() or lose a paid answer
                self.stats.hook_errors += 1
                _log.exception("the on_result hook raised; the result is kept")

    def __repr__(self) -> str:
        names = ", ".join(d.label for d in self.deployments)
        state = "closed" if self._closed else "stopping" if self._stopping else "open"
        return f"<Engine [{names}] {state} in_flight={self._gate.held}>"


_NEVER_SENT = "cancelled while an identical request was in flight; it was never sent"


def _settle(hold: BudgetHold | None, charge: float) -> None:
    if hold is not None:
        hold.commit(charge)
