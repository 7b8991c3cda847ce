"""``sluice serve``'s answer cache between tenants: whose answers a request may be given,
and the budget a hit must still fit.

A request the cache may answer (``[serve] cache``, narrowed by ``x-sluice-cache``; a
client cannot turn on what the operator turned off) gets an id naming its client's cache
group: the client's own name unless the operator gave several clients one
``cache_group``. The store keys a request by its id and its content, so a tenant is never
answered from another tenant's requests, a twin in flight is shared only within the group,
and how fast an answer comes says nothing about what another tenant asked.

A hit costs nothing (its group paid for the answer when it was asked), but it is given only
when the client's budget could pay for the request's worst case, as a miss would be: a
client whose budget is spent gets no answers, from the cache or upstream, and a hit and a
miss are refused alike.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..._budget import Budget
    from ..._engine import Engine
    from ..._models import Request

__all__ = ["cache_id", "fits_budget"]

#: The id of a request the cache may answer: this, then its group's digest.
_PREFIX = "serve-cache/"


def cache_id(group: str) -> str:
    """The id a cached request of ``group`` carries (a digest: the store key stays plain text)."""
    return _PREFIX + hashlib.sha256(group.encode()).hexdigest()[:32]


async def fits_budget(engine: Engine, request: Request, budget: Budget | None) -> None:
    """For a request the cache may answer (its id is a group's): raise
    BudgetExhaustedError, as the engine would for a miss, when ``budget`` (the client's,
    else the server's) cannot cover its worst case on the dearest deployment that may
    answer it; wait, as a miss waits, while requests in flight may still free enough.
    Nothing is held once it returns. Any other request is the engine's to check."""
    spending = engine.spending
    budget = budget or spending.budget
    if budget is None or request.id is None or not request.id.startswith(_PREFIX):
        return
    request = spending.choose_model(request, budget)
    worst = 0.0
    for group in engine.router.chain(request.model):
        for route in group.routes:
            worst = max(worst, spending.prepare(request, route.deployment, budget)[1])
    hold = await spending.reserve(budget, worst)
    if hold is not None:
        hold.release()
