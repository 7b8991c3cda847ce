"""sluice: run many LLM requests at once, as fast as the provider allows, inside its limits.

::

    import sluice

    async with sluice.Engine([sluice.Deployment("openai/gpt-4o-mini", rpm=500, tpm=200_000)]) as engine:
        result = await engine.complete("openai/gpt-4o-mini", "Say hi")
        async for result in engine.map(requests):
            print(result.id, result.text if result.ok else result.error)

    results = sluice.run(prompts, model="simulate/demo")   # blocking, notebook-safe
"""

from __future__ import annotations

import sys

from ._entry import is_the_command

if is_the_command(sys.orig_argv):  # `sluice` or `python -m sluice` is starting, not a program importing it
    from ._entry import quiet_interrupts

    quiet_interrupts()  # first, so a Ctrl-C while the rest loads is not a traceback

from typing import TYPE_CHECKING

from ._errors import (
    AttemptTimeoutError,
    AuthenticationError,
    BadRequestError,
    BatchIncompleteError,
    BatchResultsLostError,
    BudgetExhaustedError,
    CancelledError,
    CapacityError,
    ConfigError,
    ConnectError,
    EngineClosedError,
    FatalProviderError,
    FlexUnavailableError,
    InvalidInputError,
    InvalidRequestError,
    MalformedResponseError,
    MovedToSyncError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    ProviderError,
    RateLimitError,
    RetryableError,
    ServerError,
    SluiceError,
    StoreError,
    UnknownPriceError,
)
from ._lazy import lazy_attributes
from ._models import (
    Deployment,
    Native,
    Price,
    Priority,
    Request,
    Result,
    Secret,
    Timings,
    Usage,
    request_key,
    store_key,
)
from ._retry import RetryPolicy, backoff_delay, parse_retry_after

if TYPE_CHECKING:
    from ._budget import Budget
    from ._embeddings import EmbeddingError, EmbeddingResult, embedding_key
    from ._engine import Engine, RetryEvent
    from ._limits import Limiter, LocalLimiter, RateLimitSnapshot, Reservation
    from ._router import Cooldown, RouteStatus
    from ._session import Session
    from ._spending import CheaperModel
    from ._stats import Stats
    from ._streaming import Stream
    from ._sync import complete, run, run_sync
    from ._tracing import Tracing
    from .providers import CallableProvider, Provider, Reply, SimulatedProvider

# What needs asyncio (~60 ms to import) loads on first use, so ``import sluice`` stays fast.
_LAZY = {
    "Engine": "._engine",
    "Budget": "._budget",
    "EmbeddingError": "._embeddings",
    "EmbeddingResult": "._embeddings",
    "embedding_key": "._embeddings",
    "CheaperModel": "._spending",
    "Session": "._session",
    "RetryEvent": "._engine",
    "Limiter": "._limits",
    "LocalLimiter": "._limits",
    "RateLimitSnapshot": "._limits",
    "Reservation": "._limits",
    "Stats": "._stats",
    "Stream": "._streaming",
    "Tracing": "._tracing",
    "Cooldown": "._router",
    "RouteStatus": "._router",
    "complete": "._sync",
    "run": "._sync",
    "run_sync": "._sync",
    "CallableProvider": ".providers",
    "Provider": ".providers",
    "Reply": ".providers",
    "SimulatedProvider": ".providers",
}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(__all__)


__version__ = "0.1.0"

__all__ = [
    "AttemptTimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BatchIncompleteError",
    "BatchResultsLostError",
    "Budget",
    "BudgetExhaustedError",
    "CallableProvider",
    "CancelledError",
    "CapacityError",
    "CheaperModel",
    "ConfigError",
    "ConnectError",
    "Cooldown",
    "Deployment",
    "EmbeddingError",
    "EmbeddingResult",
    "Engine",
    "EngineClosedError",
    "FatalProviderError",
    "FlexUnavailableError",
    "InvalidInputError",
    "InvalidRequestError",
    "Limiter",
    "LocalLimiter",
    "MalformedResponseError",
    "MovedToSyncError",
    "Native",
    "NotFoundError",
    "OverloadedError",
    "PermissionDeniedError",
    "Price",
    "Priority",
    "Provider",
    "ProviderError",
    "RateLimitError",
    "RateLimitSnapshot",
    "Reply",
    "Request",
    "Reservation",
    "Result",
    "RetryEvent",
    "RetryPolicy",
    "RetryableError",
    "RouteStatus",
    "Secret",
    "ServerError",
    "Session",
    "SimulatedProvider",
    "SluiceError",
    "Stats",
    "StoreError",
    "Stream",
    "Timings",
    "Tracing",
    "UnknownPriceError",
    "Usage",
    "__version__",
    "backoff_delay",
    "complete",
    "embedding_key",
    "parse_retry_after",
    "request_key",
    "run",
    "run_sync",
    "store_key",
]
