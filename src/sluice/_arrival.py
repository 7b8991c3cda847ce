"""How a provider tells the attempt core that a slow answer is still arriving, and when
its request really left.

The core times a whole (non-streamed) answer's ``idle_timeout`` with its shared timer, so
a fast answer costs no per-read timer. An answer whose body keeps coming for longer (a
big body, a gateway's keep-alive whitespace) must not be cut off as silent: the provider
reads such a body piece by piece and calls :func:`heard` for each, which moves the
attempt's idle deadline on. A module of its own, with no imports, so providers reach it
without reaching into the engine.

The attempt core stamps an attempt as sent just before it calls the provider; a request
that must first open a connection (a TCP and TLS handshake, behind a busy loop) reaches
the server later than that. The provider calls :func:`departed` when the connection is
ready and the request is written, and the limiter counts its window from then
(:meth:`~sluice._limits.Grant.sent`): otherwise the next window's requests, sent on warm
connections, reach the server before the first window's have left its count.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

__all__ = ["Listener", "departed", "departing", "heard", "listening"]


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


#: The reservation of the attempt this task is sending (None: nobody counts its departure);
#: one with a ``sent(at)`` is told when the request leaves (``Reservation.sent`` is optional).
departing: ContextVar[object | None] = ContextVar("sluice_attempt_departing", default=None)


def departed(at: float) -> None:
    """The current attempt's request is leaving now (``at``: the loop's clock)."""
    reservation = departing.get()
    if reservation is not None:
        sent = getattr(reservation, "sent", None)
        if sent is not None:
            sent(at)
