"""An asyncio event loop whose clock jumps instead of waiting.

Timers (``asyncio.sleep``, ``loop.call_at``) fire in order, but when the loop would
block waiting for the next timer it advances its clock to that timer at once. A minute
of rate limiting runs in milliseconds and every test is deterministic. Real I/O still
works (it is polled without waiting), but a loop that only waits on I/O with no timer
due is a deadlock in virtual time and raises.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "run_in_virtual_time"]

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls real file descriptors without waiting; a wait becomes a clock jump."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise RuntimeError("virtual time: the loop is waiting with no timer scheduled (a deadlock)")
        assert self.loop is not None
        self.loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual and starts at 0."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._virtual_now += seconds


def run_in_virtual_time(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh :class:`VirtualTimeLoop`."""
    loop = VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
