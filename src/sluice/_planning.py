"""How a Request becomes a Job, and how a Job's plan changes: the model its budget lets it
use, the groups of deployments it may go to (its model's, then its fallbacks'), its token
estimate and its worst case, worked out again when it moves to a fallback or is asked again
(a re-ask). Part of the attempt core (:class:`~sluice._attempts.Attempts` is one of these)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._coerce import coerce
from ._errors import CancelledError, InvalidRequestError, SluiceError
from ._job import Job
from ._models import Request, Result, store_key
from .caching._rules import rules_for
from .providers import max_output_tokens

if TYPE_CHECKING:
    from ._budget import Budget
    from ._router import Route, Router
    from ._runtime import Runtime
    from ._spending import Spending
    from ._stats import Stats
    from .caching import Planned, PromptCache
    from .store import Store

__all__ = ["JobPlanning"]


class JobPlanning:
    """The planning half of the attempt core (see the module docstring)."""

    runtime: Runtime
    router: Router
    spending: Spending
    stats: Stats
    store: Store | None
    #: The prompt-cache planner (``Engine(prompt_cache=...)``); None: off.
    caching: PromptCache | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, asked for once: on Python 3.11 every ``get_running_loop()`` is
        a ``getpid`` system call, and a request asked ~5 times. Asked again once that loop
        has closed (an engine is used on one loop at a time: its HTTP pool is bound to it).

        Every job is made through this (:meth:`job`, an embeddings pack's tally), so what
        runs a job after it reads ``_loop`` as it was left: no property call, no
        ``is_closed()``, four times a request."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def job(self, request: Request, priority: int, index: int | None = None, budget: Budget | None = None) -> Job:
        """The Job of ``request``; raises (before anything is sent) when it cannot be one."""
        budget = budget or self.spending.budget
        try:
            key = store_key(request) if self.store is not None else None  # as asked: before a switch or a cap
        except (TypeError, ValueError) as exc:  # text that is not valid Unicode, or not JSON at all
            raise InvalidRequestError(f"the request cannot be stored: {exc}") from None
        request = self.spending.choose_model(request, budget)
        groups = self.router.chain(request.model)
        route = groups[0].routes[0]
        request, worst = self.spending.prepare(request, route.deployment, budget)
        tokens, output = _estimate(request, route)
        fits = route.fits(tokens, output) or any(r.fits(tokens, output) for group in groups for r in group.routes)
        if not fits:
            route.limiter.check(tokens, output=output)  # no deployment it may use can ever take it
        self.stats.submitted += 1
        now = self.loop.time()
        job = Job(request, route, tokens, priority, self.runtime.next_seq(), now, index, key, budget, worst)
        job.output = output
        job.groups = groups
        job.guarded = self.router.has_alternative(groups)
        if budget is not None and job.guarded:
            job.worst_cost = self.worst_of_candidates(job)
        return job

    def prepare_item(
        self, item: object, index: int, model: str | None, priority: int, budget: Budget | None
    ) -> Job | Result:
        """A job for an input item of ``map()``, or a failed Result saying why it cannot be one."""
        try:
            request = coerce(item, model)
            return self.job(request, priority if request.priority is None else request.priority, index, budget)
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
            self.runtime.emit(result)
            return result

    def not_started(self, job: Job) -> Result:
        result = Result(job.request, error=CancelledError("not started: the engine was stopping"), index=job.index)
        self.runtime.emit(result)
        return result

    def worst_of_candidates(self, job: Job) -> float:
        """Under a budget: the worst case of the dearest deployment that may still run it."""
        worst = 0.0
        for group in job.groups[job.step :]:
            for route in group.routes:
                worst = max(worst, self.spending.prepare(job.request, route.deployment, job.budget)[1])
        return worst

    def fall_back(self, job: Job) -> bool:
        """Move the job to the next model of its fallback list; False when there is none."""
        if job.step + 1 >= len(job.groups):
            return False
        job.step += 1
        job.tried = frozenset()
        route = job.groups[job.step].routes[0]
        job.tokens, job.output = _estimate(job.request, route)
        if job.budget is not None:
            job.worst_cost = self.worst_of_candidates(job)
        self.stats.fallbacks += 1
        return True

    def replan(self, job: Job, request: Request) -> None:
        """Ask ``request`` next for ``job`` (a re-ask): its cap, token estimate and worst
        case worked out again, as for a new job. Raises CapacityError when it can never fit."""
        route = job.route
        request, worst = self.spending.prepare(request, route.deployment, job.budget)
        tokens, output = _estimate(request, route)
        if not route.fits(tokens, output):
            route.limiter.check(tokens, output=output)
        job.request, job.tokens, job.output, job.tried = request, tokens, output, frozenset()
        if job.budget is not None:
            job.worst_cost = self.worst_of_candidates(job) if job.guarded else worst

    def planned(self, job: Job, planned: Planned) -> None:
        """Send ``job`` on its prompt-cache plan: it reserves the input its limit will count
        (a read the plan expects is left out where reads are free of it), and under a budget
        its worst case covers an hour-long write when it asks for one."""
        job.cache = planned
        rules = rules_for(job.route.deployment)
        if planned.expect_read and rules is not None and rules.reads_free:
            job.tokens = max(job.output + 1, job.tokens - planned.expect_read)
        if planned.hour and job.budget is not None:
            hour = self.spending.worst_cost(job.request, job.route.deployment, hour=True)
            job.worst_cost = max(job.worst_cost, hour)

    def worst(self, job: Job) -> float:
        """What an attempt counts for when it may have been billed unseen: its worst case."""
        if job.budget is not None or job.own_worst:
            return job.worst_cost
        deployment = job.route.deployment
        if not self.spending.pricing.has_price(deployment):
            return 0.0  # what worst_cost says for an unknown price, without counting the prompt's bytes
        return self.spending.worst_cost(job.request, deployment)


def _estimate(request: Request, route: Route) -> tuple[int, int]:
    """What an attempt of ``request`` reserves on ``route``: its tokens (the provider's
    estimate: prompt + output cap) and, of those, the output cap."""
    tokens = route.provider.estimate_tokens(request, route.deployment)
    return tokens, min(tokens, max_output_tokens(request, route.deployment))
