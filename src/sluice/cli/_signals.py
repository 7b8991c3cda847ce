"""How a long-running command meets Ctrl-C and SIGTERM: the first asks it to stop (it
finishes or hands back what is in flight, then says so), the second aborts at once."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from ._loop import run_on_loop

__all__ = ["run_until_stopped"]


def run_until_stopped(main: Callable[[], Coroutine[Any, Any, None]], on_first: Callable[[], None]) -> bool:
    """Run ``main()`` on a new event loop; the first SIGINT/SIGTERM calls ``on_first``, the
    second cancels ``main``. True when it was aborted (the exit status is then 130)."""

    async def guarded() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        presses = 0

        def on_signal() -> None:
            nonlocal presses
            presses += 1
            if presses == 1:
                on_first()
            elif task is not None:
                task.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal)
        await main()

    # The loop resets SIGINT to Python's default (a KeyboardInterrupt) when it closes; put
    # back the command's own quiet handler (``_entry``) for the summary that follows.
    before = signal.getsignal(signal.SIGINT)
    try:
        run_on_loop(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        return True
    finally:
        if callable(before):
            signal.signal(signal.SIGINT, before)
    return False
