"""``[serve] prompt_cache``: every chat-like request (Chat Completions, Messages, Responses;
plain or streamed) marked for the providers' prompt caches on its way to the engine, and
every answer's prompt tokens counted for ``/metrics`` and the dashboard as the provider
billed them: uncached, written, read, with duplicate writes and the dollars saved.

The plan is :class:`sluice.caching._served.ServedCache`'s (what it marks and why is said
there). With ``"off"`` requests go as their clients wrote them; the counts are kept all
the same (a client's own breakpoints and OpenAI's automatic caching read the cache too).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..._models import keyed_as
from ...caching._groups import cache_count
from ...caching._served import ServedCache, Ticket

if TYPE_CHECKING:
    from ..._engine import Engine
    from ..._models import Request, Result
    from ._metrics import Metrics

__all__ = ["ServePromptCache"]


class ServePromptCache:
    """The server's planner and its counts (see the module docstring)."""

    def __init__(self, engine: Engine, metrics: Metrics, *, on: bool) -> None:
        self._engine = engine
        self._metrics = metrics
        self.plan = ServedCache(engine.spending.pricing) if on else None

    def mark(self, client: str, request: Request) -> tuple[Request, Ticket | None]:
        """``request`` as it is sent (marked, or as it came), and its ticket for :meth:`done`."""
        if self.plan is None:
            return request, None
        deployments = [route.deployment for group in self._engine.router.chain(request.model) for route in group.routes]
        sent, ticket = self.plan.mark(request, deployments, client, asyncio.get_running_loop().time())
        # marks are how it is sent, not what was asked: [serve] cache finds its answer as for the request
        return keyed_as(sent, request), ticket

    def done(self, client: str, ticket: Ticket | None, result: Result | None) -> None:
        """A request's result (None: it was never sent): its groups learn, its tokens are counted."""
        route = self._engine.router.route_named(result.deployment) if result and result.deployment else None
        deployment = route.deployment if route is not None else None
        if ticket is not None and self.plan is not None:
            self.plan.done(ticket, result, deployment, asyncio.get_running_loop().time())
        if result is None or deployment is None or not result.attempts or result.cached:
            return
        expected = ticket is not None and ticket.reads is not None and not ticket.primes
        count = cache_count(self._engine.spending.pricing, deployment, result.usage, expected_read=expected)
        self._metrics.prompt_cache(client, deployment.label, count)
