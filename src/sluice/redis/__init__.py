"""Sluice on Redis: limits and budgets shared by every process that uses them.

``pip install 'llm-sluice[redis]'``. Nothing here is imported by ``import sluice``; the
local, in-process limiter and budget stay the default.

* :class:`RedisLimits` — ``Engine(limiter_factory=RedisLimits(url).limiter_factory)``:
  every process using the same deployment (provider, base URL, model and API key,
  identified by a fingerprint of the key) shares one limiter.
* :class:`RedisBudget` — ``Engine(shared_budget=RedisBudget(url, "job-42", usd=50))``:
  a named budget any processes share.
"""

try:
    import redis as _redis_py  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("sluice.redis needs redis-py: pip install 'llm-sluice[redis]'") from None

from ._budget import BudgetTotals, RedisBudget, SharedBudgetHold
from ._connection import Connection, RedisDown, RedisFailed, redis_target
from ._limiter import RedisLimiter, RedisLimits, deployment_fingerprint

__all__ = [
    "BudgetTotals",
    "Connection",
    "RedisBudget",
    "RedisDown",
    "RedisFailed",
    "RedisLimiter",
    "RedisLimits",
    "SharedBudgetHold",
    "deployment_fingerprint",
    "redis_target",
]
