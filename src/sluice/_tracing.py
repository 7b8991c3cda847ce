"""Tracing's seam in the engine: what the attempt core tells a tracer, and nothing else.

The engine knows no OpenTelemetry. ``Engine(tracing=...)`` makes a :class:`Tracer` (the
one implementation, :mod:`sluice.otel`, imports opentelemetry only then, so ``import
sluice`` never does), and the attempt core calls it at four points of a request's way:

* a request's first attempt is about to be admitted: :meth:`Tracer.request` starts its
  span (parented by the caller's current span) and hangs a :class:`RequestTrace` on the
  :class:`~sluice._job.Job`;
* an attempt leaves for the provider: :meth:`RequestTrace.attempt` starts its child span,
  current while the provider sends (:meth:`~RequestTrace.enter` / ``leave``), so HTTP
  instrumentation nests under it;
* the attempt's outcome is known: :meth:`RequestTrace.attempt_done`;
* the request's Result is made: :meth:`Tracer.finished` ends the span (or makes one, for a
  request answered from the state or never sent).

Without tracing every seam is one ``is None`` test: nothing is allocated or imported.

A tracer never raises into the engine: a span processor or exporter that raises (a bug of
theirs, a full disk) costs that span, never the request, and is logged once per process
(:func:`tracing_failed`; :data:`FAILURES` counts them all).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ._errors import ConfigError

if TYPE_CHECKING:
    from ._job import Job
    from ._models import Result
    from ._router import Route
    from ._slot import Tally

__all__ = ["FAILURES", "RequestTrace", "Tracer", "Tracing", "TracingFailures", "make_tracer", "tracing_failed"]

_log = logging.getLogger("sluice")


@dataclass(frozen=True, slots=True)
class Tracing:
    """How ``Engine(tracing=...)`` traces: a span per request and per attempt, following
    OpenTelemetry's GenAI semantic conventions (``pip install 'llm-sluice[otel]'``).

    ``provider``: the OpenTelemetry ``TracerProvider`` to use (None: the global one, as set
    with ``opentelemetry.trace.set_tracer_provider``). ``capture_content``: also record the
    prompts and answers (``gen_ai.input.messages``, ``gen_ai.output.messages``); off by
    default, as the conventions ask, since they may hold personal data.
    """

    provider: Any = None
    capture_content: bool = False

    def __post_init__(self) -> None:
        provider = self.provider
        if provider is not None and not callable(getattr(provider, "get_tracer", None)):
            raise ConfigError(
                f"Tracing(provider=...) must be an OpenTelemetry TracerProvider (or None: the global one), "
                f"got {type(provider).__name__}"
            )
        if not isinstance(self.capture_content, bool):
            raise ConfigError(f"Tracing(capture_content=...) must be True or False, got {self.capture_content!r}")


@dataclass(slots=True)
class TracingFailures:
    """How many times tracing raised in this process (the first is logged, with its traceback)."""

    count: int = 0


FAILURES = TracingFailures()


def tracing_failed(what: str) -> None:
    """Say that tracing raised in ``what`` (call it from an ``except`` block): logged the
    first time in the process, counted every time. The request goes on untouched."""
    FAILURES.count += 1
    if FAILURES.count == 1:
        _log.exception("sluice: tracing failed (%s); the request goes on (later tracing errors are not logged)", what)


class RequestTrace(Protocol):
    """One request's span and the span of its attempt under way."""

    def attempt(self, route: Route, number: int) -> None: ...

    def enter(self) -> object: ...

    def leave(self, token: object) -> None: ...

    def attempt_done(self, outcome: object) -> None: ...

    def ended(self, outcome: object, tally: Tally) -> None: ...


class Tracer(Protocol):
    def request(self, job: Job, operation: str = "chat") -> RequestTrace: ...

    def finished(self, job: Job, result: Result) -> None: ...


def make_tracer(tracing: bool | Tracing | None) -> Tracer | None:
    """The tracer ``Engine(tracing=...)`` asks for (None: off). Raises ConfigError when
    opentelemetry is not installed."""
    if tracing is None or tracing is False:
        return None
    if tracing is True:
        tracing = Tracing()
    if not isinstance(tracing, Tracing):
        raise ConfigError(f"tracing must be True, False or a sluice.Tracing, got {type(tracing).__name__}")
    try:
        from .otel._spans import GenAITracer
    except ImportError as exc:
        raise ConfigError(f"tracing needs the otel extra: pip install 'llm-sluice[otel]' ({exc})") from None
    return GenAITracer(tracing.provider, capture_content=tracing.capture_content)
