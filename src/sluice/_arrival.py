"""How a provider tells the attempt core that a slow answer is still arriving.

The core times a whole (non-streamed) answer's ``idle_timeout`` with its shared timer, so
a fast answer costs no per-read timer. An answer whose body keeps coming for longer (a
big body, a gateway's keep-alive whitespace) must not be cut off as silent: the provider
reads such a body piece by piece and calls :func:`heard` for each, which moves the
attempt's idle deadline on. A module of its own, with no imports, so providers reach it
without reaching into the engine.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

__all__ = ["Listener", "heard", "listening"]


class Listener(Protocol):
    def heard(self) -> None:
        """Bytes of the answer arrived just now."""


#: The attempt being timed in this task, while its whole answer is awaited (None: nobody
#: times its silences here; a stream's transport times its own).
listening: ContextVar[Listener | None] = ContextVar("sluice_attempt_listening", default=None)


def heard() -> None:
    """Bytes of the current attempt's answer arrived: it is not silent."""
    listener = listening.get()
    if listener is not None:
        listener.heard()
