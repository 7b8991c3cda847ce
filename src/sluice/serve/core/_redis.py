"""``sluice serve --redis URL``: replicas that share limits, budgets and client spend.

Every replica that names the same Redis shares, through ``sluice.redis``:

* each deployment's limiter (:class:`ServeRedisLimiter`, a ``RedisLimiter`` keeping the
  server's bookkeeping: the grant hook, the count of the provider's 429s, a wait estimate
  for the queue's Retry-After, from the wait Redis last returned, no extra round trip);
* each client's ``budget_usd`` (a ``RedisBudget`` named ``client:<name>``, held by every
  request of the client's session budget) and the server's own ``budget_usd``;
* each client's rpm/tpm (a shared limiter named by the client, not by a deployment).

Files and batches live in the state dir of the replica that took them; any replica answers
for them by forwarding to that one (see ``_replicas``).
While Redis cannot be reached nothing is granted, and a waiting request is refused with
a 503 that names the problem once its wait is up; never a silent local fallback unless
``fail_open`` (then the limiters grant locally meanwhile; budgets still wait).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..._models import Deployment
from ...redis import BudgetTotals, RedisBudget, RedisLimiter, RedisLimits, deployment_fingerprint
from ...redis._limiter import SharedGrant
from ._queue import mark_granted, pacing_interval
from ._settings import ClientSpec

__all__ = ["ServeRedis", "ServeRedisLimiter"]

#: The shared budget of the server's own ``budget_usd`` (every replica's engine).
SERVER_BUDGET = "serve:server"


class ServeRedisLimiter(RedisLimiter):
    """A shared limiter that tells the server when its requests are granted, counts the
    provider's 429s and estimates a wait (as :class:`~sluice.serve.core._queue.ServeLimiter`)."""

    def __init__(self, limits: RedisLimits, deployment: Deployment, fingerprint: str) -> None:
        super().__init__(limits, deployment, fingerprint)
        self.penalties = 0
        self.on_grant: Any = None

    async def acquire(self, tokens: int, priority: int = 0, seq: int | None = None, *, output: int = 0) -> SharedGrant:
        grant = await super().acquire(tokens, priority, seq, output=output)
        mark_granted()
        if self.on_grant is not None:
            self.on_grant()
        return grant

    def penalize(self, seconds: float) -> None:
        self.penalties += 1
        super().penalize(seconds)

    def eta(self, tokens: int, ahead: float, latency: float | None) -> float:
        """Seconds until a request of ``tokens`` behind ``ahead`` others could go: the wait
        Redis last gave this replica, then one pacing interval per request ahead."""
        interval = pacing_interval(
            self.requests_limit, self.tokens_limit, self.window, self.max_in_flight, tokens, latency
        )
        return self.estimate_wait() + max(0.0, ahead) * interval


def _client_key(name: str) -> str:
    return "client-" + hashlib.sha256(name.encode()).hexdigest()[:16]


class ServeRedis:
    """One replica's link to the shared state (see the module docstring)."""

    def __init__(self, url: str, *, fail_open: bool = False) -> None:
        self.url = url
        self.limits = RedisLimits(url, fail_open=fail_open)
        self.budgets: dict[str, RedisBudget] = {}
        self.server_budget: RedisBudget | None = None
        #: Each client's budget as Redis last said (refreshed every few seconds, and by /health).
        self.totals: dict[str, BudgetTotals] = {}

    def limiter_factory(self, deployment: Deployment) -> ServeRedisLimiter:
        limiter = self.limits.limiter_for(deployment, deployment_fingerprint(deployment), cls=ServeRedisLimiter)
        assert isinstance(limiter, ServeRedisLimiter)
        return limiter

    def client_limiter(self, spec: ClientSpec) -> ServeRedisLimiter:
        """The client's rpm/tpm shared by every replica: a quota, the whole minute may go at once."""
        quota = Deployment(
            "openai/sluice-client",
            rpm=spec.rpm,
            tpm=spec.tpm,
            burst_requests=spec.rpm or 0.0,
            burst_tokens=spec.tpm or 0.0,
            name=f"client {spec.name}",
        )
        limiter = self.limits.limiter_for(quota, _client_key(spec.name), cls=ServeRedisLimiter)
        assert isinstance(limiter, ServeRedisLimiter)
        return limiter

    def client_budget(self, name: str, usd: float) -> RedisBudget:
        budget = self.budgets.get(name)
        if budget is None:
            budget = self.budgets[name] = RedisBudget(self.url, f"client:{name}", usd)
        return budget

    def engine_budget(self, usd: float | None) -> RedisBudget | None:
        if usd is None:
            return None
        if self.server_budget is None:
            self.server_budget = RedisBudget(self.url, SERVER_BUDGET, usd)
        return self.server_budget

    @property
    def problem(self) -> str | None:
        """What keeps requests from being admitted, in words (None while every connection
        answers). With ``fail_open`` the limiters grant locally while Redis is down, so only
        a budget's trouble counts."""
        if self.limits.problem is not None and not self.limits.fail_open:
            return self.limits.problem
        for budget in (self.server_budget, *self.budgets.values()):
            if budget is not None and budget.problem is not None:
                return budget.problem
        return None

    async def client_totals(self) -> dict[str, dict[str, float]]:
        """Each client's budget as Redis has it (one round trip each): spent, reserved, limit."""
        found: dict[str, dict[str, float]] = {}
        for name, budget in self.budgets.items():
            totals = await budget.totals()
            self.totals[name] = totals
            found[name] = {"limit_usd": totals.limit, "spent_usd": totals.spent, "reserved_usd": totals.reserved}
        return found

    def client_spend(self) -> dict[str, tuple[float, float]]:
        """(spent, limit) of each client as Redis last said (for ``/metrics``: no round trip)."""
        return {name: (t.spent, t.limit) for name, t in self.totals.items()}

    async def close(self) -> None:
        for budget in (self.server_budget, *self.budgets.values()):
            if budget is not None:
                await budget.close()
        await self.limits.close()
