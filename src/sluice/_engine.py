"""The engine: many requests at once, inside each deployment's limits, with honest retries.

One request's way (see ``DESIGN.md``)::

    source -> gate (priority lanes, bounded: back-pressure on the source)
           -> limiter.acquire(tokens)      # waits FIFO within its lane, woken by timer
           -> provider.send()              # one pooled HTTP session
           -> ok: reconcile usage, emit    | retryable: 429 pauses the deployment,
                                             others back off with jitter, then again
                                           | final: emit the typed error

:class:`Engine` is the facade: configuration and the public calls. What runs a request
is the attempt core (:mod:`._attempts`, one retry loop for every front end) over the
shared runtime (:mod:`._runtime`: the gate, tasks, stop and close, emission); the
front ends are :mod:`._fanout` (``map``), :mod:`._streaming` and :mod:`._embeddings`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._adaptive import Adaptive
from ._attempts import Attempts, RetryEvent
from ._budget import Budget, SharedBudget
from ._coerce import RequestLike, make_request
from ._errors import ConfigError, InvalidRequestError
from ._fanout import fan_out
from ._limits import Limiter, LocalLimiter
from ._models import Deployment, Priority, Request, Result
from ._retry import RetryPolicy
from ._router import Cooldown, Health, Route, Router, RouteStatus
from ._runtime import Runtime
from ._session import Session
from ._spending import CheaperModel, Spending
from ._stats import Stats
from .caching._mode import prompt_cache_of
from .providers import HttpProvider, ProviderSet
from .structured import MAX_REASKS

if TYPE_CHECKING:
    from array import array

    from ._embeddings import EmbeddingResult
    from ._errors import StoreError
    from ._streaming import Stream
    from ._tracing import Tracing
    from .caching import PromptCache
    from .store import Store

__all__ = ["Engine", "RequestLike", "RetryEvent"]


def _default_limiter(deployment: Deployment) -> Limiter:
    return LocalLimiter.for_deployment(deployment)


class Engine:
    """Runs requests against deployments. Use ``async with Engine(...) as engine``.

    ``concurrency`` caps requests admitted at once across all deployments (each
    deployment's own ``max_in_flight`` and rate limits apply inside it); a request
    waiting for a deployment's limiter, for money, for an identical request in flight or
    out a retry's backoff lends its slot to one that waits for the gate, so a burst on
    one deployment does not hold back another with room; ``buffer``
    caps results admitted but not yet taken by the consumer of :meth:`map`, which is
    what keeps memory flat however long the input. Hooks are plain functions, called
    for every result (``on_result``) and before every retry (``on_retry``); a hook that
    raises is logged and counted (``stats.hook_errors``), never allowed to lose a result.

    A model with no configured deployment is served by ``Deployment(model, **defaults)``:
    no local limits unless ``defaults`` gives some; it learns from the provider's headers.
    ``adapt_deployment`` is applied to such a deployment first (a job's tier, see
    :mod:`sluice.tiers`). ``spending`` shares another engine's money (its budget,
    reservations and waiters) instead of the budget arguments: ``sluice serve`` runs
    batch-tier lines on an engine of their own that spends the clients' budgets.
    ``tracing=True`` (or a :class:`~sluice.Tracing`) makes an OpenTelemetry span per
    request and per attempt, in the GenAI semantic conventions (the ``otel`` extra).

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

    A request with a ``schema`` gets an answer that parses or says why not: each answer
    is validated, and an invalid one re-asked up to ``max_reasks`` times, every re-ask an
    attempt like any other (see :mod:`sluice.structured`).
    ``prompt_cache="auto"`` (the default) plans for the providers' prompt caches: lines of
    ``map()`` that share a long prefix are grouped, one of each group sent first and the
    rest once its answer has begun, marked with Anthropic breakpoints or OpenAI cache keys,
    and reserved at the input their limits count (see :mod:`sluice.caching`); ``"off"``
    sends every request as it came.
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
        adapt_deployment: Callable[[Deployment], Deployment] | None = None,
        spending: Spending | None = None,
        max_reasks: int = MAX_REASKS,
        tracing: bool | Tracing | None = None,
        prompt_cache: str | PromptCache | None = "auto",
    ) -> None:
        if isinstance(deployments, Deployment):
            deployments = [deployments]
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be a positive integer, got {concurrency!r}")
        if buffer is not None and (not isinstance(buffer, int) or buffer < 1):
            raise ConfigError(f"buffer must be a positive integer, got {buffer!r}")
        if isinstance(max_reasks, bool) or not isinstance(max_reasks, int) or max_reasks < 0:
            raise ConfigError(f"max_reasks must be an integer >= 0, got {max_reasks!r}")
        self.retry = retry or RetryPolicy()
        self.concurrency = concurrency
        self.buffer = buffer or max(concurrency * 4, 64)
        self.store = store
        self.retry_failed = retry_failed
        # another engine's spending: one budget, one ledger of waiters, for both engines' requests
        self.spending = spending or Spending(
            budget_usd, allow_unpriced=allow_unpriced, cheaper=cheaper, shared=shared_budget
        )
        self.stats = Stats()
        self._limiter_factory = limiter_factory
        self._cooldown = cooldown or Cooldown()
        self._providers = ProviderSet(idle_timeout=self.retry.idle_timeout)
        self.router = Router(
            make_route=self._make_route,
            defaults=defaults,
            fallbacks=fallbacks,
            on_new_deployment=self.spending.pricing.known,  # now, not between an answer and its commit
            adapt=adapt_deployment,
        )
        for deployment in deployments:
            self.add_deployment(deployment)
        self.runtime = Runtime(concurrency, self.stats, on_result=on_result, grace=grace)
        self.attempts = Attempts(
            self.runtime,
            self.router,
            self.spending,
            self.retry,
            self.stats,
            store,
            retry_failed=retry_failed,
            on_retry=on_retry,
            max_reasks=max_reasks,
        )
        self.attempts.caching = prompt_cache_of(prompt_cache, self.spending.pricing)
        if tracing is not None and tracing is not False:  # spans' module only when asked for
            from ._tracing import make_tracer

            self.attempts.tracer = make_tracer(tracing)

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
        limits = (deployment.rpm, deployment.tpm, deployment.itpm, deployment.otpm, deployment.max_in_flight)
        unlimited = all(limit is None for limit in limits)
        if unlimited and isinstance(limiter, LocalLimiter):  # it may be a server that never says its limits
            route.adaptive = Adaptive(limiter)
        return route

    @property
    def on_result(self) -> Callable[[Result], object] | None:
        return self.runtime.on_result

    @on_result.setter
    def on_result(self, hook: Callable[[Result], object] | None) -> None:
        self.runtime.on_result = hook

    @property
    def on_retry(self) -> Callable[[RetryEvent], object] | None:
        return self.attempts.on_retry

    @on_retry.setter
    def on_retry(self, hook: Callable[[RetryEvent], object] | None) -> None:
        self.attempts.on_retry = hook

    @property
    def grace(self) -> float | None:
        """Seconds attempts at the provider get when the engine stops on its own (the store
        failed); None waits for them."""
        return self.runtime.grace

    @property
    def store_error(self) -> StoreError | None:
        """Why the store stopped taking writes, once it has; the engine stopped admitting then."""
        return self.runtime.store_error

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
        runtime = self.runtime
        runtime.check_open()
        request = make_request(model, messages, fields)
        job = self.attempts.job(request, priority if request.priority is None else request.priority, budget=budget)
        runtime.call_began()
        try:
            await runtime.gate.acquire(job.priority, job.seq)
            try:
                return await self.attempts.execute(job)
            finally:
                runtime.gate.release()
        finally:
            runtime.call_ended()

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
        self.runtime.check_open()
        request = make_request(model, messages, fields)
        if request.schema is not None:  # its answer is checked whole, and may be asked again
            raise InvalidRequestError("a request with a schema cannot be streamed; use complete() or map()")
        job = self.attempts.job(request, priority if request.priority is None else request.priority, budget=budget)
        from ._streaming import Stream  # imported on the first stream: most engines never open one

        return Stream(self.attempts, job)

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
        return fan_out(
            self.attempts, requests, model=model, ordered=ordered, priority=priority, budget=budget, room=self.buffer
        )

    async def embed(
        self,
        texts: Iterable[str | Sequence[int]] | AsyncIterable[str | Sequence[int]],
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
        vector is a float32 ``array('f')``, not a list (an eighth of a list's memory):
        ``v.tolist()`` makes one (``json.dumps`` needs it), and ``numpy.frombuffer(v,
        dtype=numpy.float32)`` reads it without a copy. With a store, every text's vector is stored as it lands
        and served from there on a rerun. A text the provider refuses fails alone.

        Raises :class:`~sluice.EmbeddingError` when any text could not be embedded: its
        ``results`` holds every text's :class:`~sluice.EmbeddingResult`, vectors included
        (use :meth:`embed_map` to handle failures text by text instead). A single string
        is one text (a list of one vector comes back). A text may also be a token array
        (a list of token ids, as OpenAI's API takes them), for deployments that take them.
        """
        from ._embeddings import EmbedOptions, embed

        self.runtime.check_open()
        options = EmbedOptions(model, dimensions, params, priority, budget, batch_size, batch_tokens)
        return await embed(self.attempts, texts, options)

    def embed_map(
        self,
        texts: Iterable[str | Sequence[int]] | AsyncIterable[str | Sequence[int]],
        *,
        model: str,
        dimensions: int | None = None,
        params: Mapping[str, Any] | None = None,
        ordered: bool = False,
        priority: int = Priority.NORMAL,
        budget: Budget | None = None,
        batch_size: int | None = None,
        batch_tokens: int | None = None,
        scope: str | None = None,
    ) -> AsyncIterator[EmbeddingResult]:
        """One :class:`~sluice.EmbeddingResult` per text (``.vector`` or ``.error``,
        ``.index`` its position), as requests finish (in input order with ``ordered``).

        The source is read only as room frees up, so memory stays flat however many texts
        it holds; leaving the loop early cancels what is in flight. Arguments as for
        :meth:`embed`; ``scope``: the texts share stored vectors only with texts of the
        same scope (a tenant's, say), not with everyone's.
        """
        from ._embeddings import EmbedOptions, embed_map

        self.runtime.check_open()
        options = EmbedOptions(model, dimensions, params, priority, budget, batch_size, batch_tokens, scope=scope)
        return embed_map(self.attempts, texts, options, ordered=ordered)

    def stop(self, *, grace: float | None = None) -> None:
        """Stop admitting new work and send nothing new.

        Batch items not at the provider right now (waiting for money or rate-limit
        capacity, or in a retry's backoff) are not sent: they come back at once as
        cancelled ("stopped before it was sent" / "stopped before retrying"). Attempts at
        the provider finish and are delivered; with ``grace``, those still there after
        ``grace`` seconds are cancelled and come back as cancelled (they were sent, so
        they may have been billed).
        """
        self.runtime.stop(grace=grace)

    async def close(self, *, drain: bool = True) -> None:
        """Stop admitting; let in-flight requests finish (or cancel them); release connections."""
        await self.runtime.close(drain=drain)
        await self.spending.flush()  # a shared budget's settles reach it before we say we are done
        await self._providers.aclose()

    def __repr__(self) -> str:
        names = ", ".join(d.label for d in self.deployments)
        runtime = self.runtime
        state = "closed" if runtime.closed else "stopping" if runtime.stopping else "open"
        return f"<Engine [{names}] {state} in_flight={runtime.gate.held}>"
