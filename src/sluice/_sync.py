"""Blocking entry points for scripts and notebooks.

``asyncio.run`` raises inside a running event loop (Jupyter, IPython, some web
frameworks). There the work runs on a fresh loop in a helper thread and the caller
blocks until it is done, so the same call works everywhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ._coerce import with_schema
from ._engine import Engine, RequestLike
from ._models import Deployment, Result
from ._retry import RetryPolicy
from .structured import MAX_REASKS

__all__ = ["complete", "run", "run_sync"]

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, loop or no loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sluice-sync") as pool:
        return pool.submit(asyncio.run, coro).result()


def _deployments(
    model: str | None,
    deployments: Iterable[Deployment] | None,
    rpm: float | None,
    tpm: float | None,
    max_in_flight: int | None,
) -> list[Deployment]:
    found = list(deployments or ())
    if model is not None and not any(model in (d.model, d.label) for d in found):
        found.append(Deployment(model, rpm=rpm, tpm=tpm, max_in_flight=max_in_flight))
    return found


def run(
    requests: Iterable[RequestLike] | AsyncIterable[RequestLike],
    *,
    model: str | None = None,
    rpm: float | None = None,
    tpm: float | None = None,
    max_in_flight: int | None = None,
    deployments: Iterable[Deployment] | None = None,
    retry: RetryPolicy | None = None,
    concurrency: int = 256,
    schema: Any = None,
    max_reasks: int = MAX_REASKS,
) -> list[Result]:
    """Run every request and return the results in input order (blocking).

    ``sluice.run(["a question", "another"], model="openai/gpt-4o-mini", rpm=500)``

    ``schema`` (a JSON Schema dict or a Pydantic model) is every request's that has none
    of its own: each ``result.parsed`` is then a valid answer (see :mod:`sluice.structured`).
    """

    async def go() -> list[Result]:
        engine = Engine(
            _deployments(model, deployments, rpm, tpm, max_in_flight),
            retry=retry,
            concurrency=concurrency,
            max_reasks=max_reasks,
        )
        async with engine:
            return await engine.run(requests if schema is None else with_schema(requests, schema, model), model=model)

    return run_sync(go())


def complete(
    model: str,
    messages: Sequence[Mapping[str, Any]] | str,
    *,
    deployments: Iterable[Deployment] | None = None,
    retry: RetryPolicy | None = None,
    **fields: Any,
) -> Result:
    """Run one request (blocking) and return its Result."""

    async def go() -> Result:
        async with Engine(_deployments(model, deployments, None, None, None), retry=retry) as engine:
            return await engine.complete(model, messages, **fields)

    return run_sync(go())
