"""The event loop the commands run on: uvloop where it is installed (a dependency on the
platforms it supports), asyncio's own otherwise or when ``SLUICE_LOOP=asyncio`` says so.

Only the commands choose: the library runs on whatever loop its caller gives it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .._errors import ConfigError

__all__ = ["loop_factory", "run_on_loop"]

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop, unless ``SLUICE_LOOP`` is ``asyncio`` (or it is not installed); None: asyncio's."""
    choice = os.environ.get("SLUICE_LOOP", "auto").strip().lower()
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"SLUICE_LOOP must be auto, uvloop or asyncio, got {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("SLUICE_LOOP=uvloop, but uvloop is not installed: pip install uvloop") from None
        return None
    return uvloop.new_event_loop


def run_on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
