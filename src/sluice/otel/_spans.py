"""A span per request and per attempt, in OpenTelemetry's GenAI semantic conventions.

The request's span is the GenAI inference (or embeddings) span: kind CLIENT, named
``{gen_ai.operation.name} {gen_ai.request.model}`` ("chat gpt-4o-mini"), with the model,
provider, usage, finish reasons and ``error.type`` the conventions name, and sluice's own
``sluice.*`` attributes (cost, attempts, retries, the deployment and tier that answered).
It covers the whole request: the wait for capacity and money, every retry, fallbacks.

Each attempt is a child span (``attempt <deployment>``, kind CLIENT: a call over HTTP),
current while the provider sends, so an HTTP client instrumentation nests under it. An
attempt's span carries no ``gen_ai.operation.name`` and no usage: a GenAI backend that
adds up tokens over the spans it recognises then counts each request once.

Content (prompts, answers) is recorded only with ``capture_content``, as JSON strings of
the conventions' message schemas (Python's span attributes take no structured values);
without it a failure's span says its ``error.type`` and a fixed text, never the error's
message (an invalid answer's message quotes the answer, a provider's may echo the prompt).

An answer from the state (or shared with an identical request in flight) is a span with
``sluice.cached``, no cost, no attempt and its tokens as ``sluice.cached.*``: a backend adding
up ``gen_ai.usage.*`` counts what was sent to a provider, once.

Nothing here raises into the engine: every method is guarded (:func:`_guarded`), so a span
processor or exporter that raises costs the span, never the request (see
:func:`~sluice._tracing.tracing_failed`). Integers are put on a span only within int64 (an
OTLP exporter cannot encode others, and logs a traceback for each).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec
from urllib.parse import urlsplit

import orjson
from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .. import __version__
from .._errors import ProviderError, SluiceError
from .._pricing import effective_base_url
from .._tracing import tracing_failed

if TYPE_CHECKING:
    from .._job import Job
    from .._models import Deployment, Request, Result
    from .._router import Route
    from .._slot import Tally

__all__ = ["GenAITracer"]

#: sluice's provider prefixes -> ``gen_ai.provider.name`` (the conventions' well-known values).
_PROVIDERS = {"openai": "openai", "azure": "azure.ai.openai", "anthropic": "anthropic", "simulate": "sluice.simulated"}
_DEFAULT_HOSTS = {"openai": "api.openai.com", "anthropic": "api.anthropic.com"}
#: Request parameters -> their GenAI attribute (numbers).
_PARAMS = {
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
#: The longest error message kept as a span's status description (with ``capture_content``).
_MESSAGE = 500
#: What an OTLP exporter can encode as an integer.
_INT64 = range(-(2**63), 2**63)
_P = ParamSpec("_P")


def _guarded(method: Callable[_P, None]) -> Callable[_P, None]:
    """``method``, which never raises: a span processor's or exporter's exception costs the
    span, never the request (logged once per process)."""

    @functools.wraps(method)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            method(*args, **kwargs)
        except Exception:
            tracing_failed(method.__qualname__.lstrip("_"))

    return guarded


class GenAITracer:
    """The engine's :class:`~sluice._tracing.Tracer` over an OpenTelemetry tracer."""

    __slots__ = ("_servers", "capture_content", "tracer")

    def __init__(self, provider: Any = None, *, capture_content: bool = False) -> None:
        self.tracer = trace.get_tracer("sluice", __version__, tracer_provider=provider)
        self.capture_content = capture_content
        self._servers: dict[int, tuple[str, int | None] | None] = {}

    def request(self, job: Job, operation: str = "chat") -> _RequestSpan:
        deployment = job.route.deployment
        model = deployment.model_name
        span: Span
        try:
            start = _epoch_ns(job.submitted)
            span = self.tracer.start_span(f"{operation} {model}", kind=SpanKind.CLIENT, start_time=start)
        except Exception:
            tracing_failed("starting a request's span")
            span = trace.INVALID_SPAN  # the request goes on, untraced
        if span.is_recording():
            request = job.request
            _set(span, lambda: _request_attributes(request, deployment, operation, model))
            if self.capture_content and operation == "chat":
                _set(span, lambda: {"gen_ai.input.messages": _dumps(input_messages(request.messages))})
        return _RequestSpan(self, span, operation)

    @_guarded
    def finished(self, job: Job, result: Result) -> None:
        trace_ = job.trace
        job.trace = None
        if not isinstance(trace_, _RequestSpan):  # answered from the state, or never sent
            trace_ = self.request(job)
        trace_.finish(result, self.server(job.route.deployment) if result.attempts and not result.cached else None)

    def server(self, deployment: Deployment) -> tuple[str, int | None] | None:
        """``server.address`` and ``server.port`` of a deployment (cached: the URL is fixed)."""
        key = id(deployment)
        if key not in self._servers:
            self._servers[key] = _server_of(deployment)
        return self._servers[key]


class _RequestSpan:
    """One request's span and its attempt under way (the :class:`~sluice._tracing.RequestTrace`)."""

    __slots__ = ("_attempt", "_owner", "operation", "span")

    def __init__(self, owner: GenAITracer, span: Span, operation: str) -> None:
        self._owner = owner
        self.span = span
        self.operation = operation
        self._attempt: Span | None = None

    @_guarded
    def attempt(self, route: Route, number: int) -> None:
        self.attempt_done(None)  # one at a time: a stale one (never told its outcome) ends here
        deployment = route.deployment
        parent = trace.set_span_in_context(self.span)
        span = self._owner.tracer.start_span(f"attempt {route.label}", context=parent, kind=SpanKind.CLIENT)
        if span.is_recording():
            attributes: dict[str, Any] = {
                "gen_ai.provider.name": _provider(deployment),
                "gen_ai.request.model": deployment.model_name,
                "sluice.attempt": number,
                "sluice.deployment": route.label,
                "sluice.tier": deployment.tier,
            }
            span.set_attributes(_add_server(attributes, self._owner.server(deployment)))
        self._attempt = span

    def enter(self) -> object:
        span = self._attempt
        if span is None:
            return None
        try:
            return context.attach(trace.set_span_in_context(span))
        except Exception:
            tracing_failed("making an attempt's span current")
            return None

    @_guarded
    def leave(self, token: object) -> None:
        if token is not None:
            context.detach(token)  # type: ignore[arg-type]  # the token enter() made

    @_guarded
    def attempt_done(self, outcome: object) -> None:
        """The attempt under way ended with ``outcome`` (a reply, an error; None: unknown)."""
        span = self._attempt
        if span is None:
            return
        self._attempt = None
        if isinstance(outcome, BaseException):
            _failed(span, outcome, self._owner.capture_content)
        elif outcome is not None:
            span.set_attribute("sluice.outcome", "ok")
        span.end()

    @_guarded
    def ended(self, outcome: object, tally: Tally) -> None:
        """An embeddings pack's end: its reply (usage) or error, from the attempt core's loop."""
        self.attempt_done(outcome)
        span = self.span
        if span.is_recording():
            attributes: dict[str, Any] = {
                "sluice.attempts": tally.attempts,
                "sluice.retries": max(0, tally.attempts - 1),
                "sluice.cost_usd": tally.charged,
            }
            usage = getattr(outcome, "usage", None)
            if usage is not None:
                attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
            _set(span, lambda: attributes)
            if isinstance(outcome, BaseException):
                _failed(span, outcome, self._owner.capture_content)
        span.end()

    @_guarded
    def finish(self, result: Result, server: tuple[str, int | None] | None) -> None:
        """The request's end: its Result, and where its last attempt went."""
        span = self.span
        if self._attempt is not None:  # a stream's: it ended with the request
            error = result.error
            self.attempt_done(error if error is not None else result)
        if span.is_recording():
            _set(span, lambda: _add_server(_result_attributes(result), server))
            if result.error is not None:
                _failed(span, result.error, self._owner.capture_content)
            elif self._owner.capture_content:
                _set(span, lambda: {"gen_ai.output.messages": _dumps(output_messages(result))})
        span.end()


# -- attributes ------------------------------------------------------------------------------------


def _request_attributes(request: Request, deployment: Deployment, operation: str, model: str) -> dict[str, Any]:
    provider = _provider(deployment)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,  # the name before semconv 1.37, which many backends still read
        "gen_ai.request.model": model,
    }
    if operation != "chat":
        count = request.metadata.get("embeddings")
        if isinstance(count, int):
            attributes["sluice.embeddings.inputs"] = count
        return attributes
    params = request.params
    max_tokens = request.max_tokens or params.get("max_completion_tokens")
    if _int64(max_tokens):
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if _number(request.temperature):
        attributes["gen_ai.request.temperature"] = float(request.temperature)  # type: ignore[arg-type]
    for name, key in _PARAMS.items():
        value = params.get(name)
        if isinstance(value, float) or _int64(value):
            attributes[key] = value
    stop = params.get("stop")
    if isinstance(stop, str):
        attributes["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attributes["gen_ai.request.stop_sequences"] = stop
    choices = params.get("n")
    if _int64(choices) and choices != 1:
        attributes["gen_ai.request.choice.count"] = choices
    output = params.get("response_format")
    if request.schema is not None or (
        isinstance(output, Mapping) and output.get("type") in ("json_object", "json_schema")
    ):
        attributes["gen_ai.output.type"] = "json"
    if request.id is not None:
        attributes["sluice.request.id"] = request.id
    return attributes


def _result_attributes(result: Result) -> dict[str, Any]:
    usage = result.usage
    tokens = result.ok or usage.input_tokens or usage.output_tokens
    if result.cached:  # nothing was sent, nothing paid: the answer's tokens are not this request's usage
        attributes: dict[str, Any] = {"sluice.attempts": 0, "sluice.retries": 0, "sluice.cost_usd": 0.0}
        if tokens:
            attributes["sluice.cached.input_tokens"] = usage.input_tokens
            attributes["sluice.cached.output_tokens"] = usage.output_tokens
    else:
        reasks = result.reasks
        attributes = {
            "sluice.attempts": result.attempts,
            "sluice.retries": max(0, result.attempts - 1 - reasks),  # a re-ask is not a retry
        }
        if tokens:
            attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        if result.cost_usd is not None:
            attributes["sluice.cost_usd"] = result.cost_usd
        if reasks or (result.request is not None and result.request.schema is not None):
            attributes["sluice.reasks"] = reasks
            if result.reask_cost_usd is not None:
                attributes["sluice.reask_cost_usd"] = result.reask_cost_usd
    attributes["sluice.cached"] = result.cached
    attributes["sluice.queue_s"] = result.timings.queued + result.timings.limiter_wait
    if result.deployment is not None:
        attributes["sluice.deployment"] = result.deployment
    if result.tier is not None:
        attributes["sluice.tier"] = result.tier
    if result.model is not None:
        attributes["sluice.model"] = result.model
    if result.finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = [result.finish_reason]
    raw = result.raw
    if isinstance(raw, Mapping):
        if isinstance(raw.get("model"), str):
            attributes["gen_ai.response.model"] = raw["model"]
        if isinstance(raw.get("id"), str):
            attributes["gen_ai.response.id"] = raw["id"]
    if result.request_id is not None:
        attributes["sluice.provider_request_id"] = result.request_id
    return attributes


def _failed(span: Span, error: BaseException, capture_content: bool) -> None:
    """``error.type`` (sluice's kind of error: ``rate_limited``, ``timeout``...) and an ERROR
    status; its description is the error's message only with ``capture_content`` (it may
    quote the answer, or a provider's echo of the prompt), else a fixed text."""
    if isinstance(error, SluiceError):
        kind, message = error.kind, error.message
    elif isinstance(error, asyncio.CancelledError):
        kind, message = "cancelled", "cancelled"
    else:
        kind, message = type(error).__qualname__, str(error)
    if not capture_content:
        message = f"{kind} (the message is recorded only with capture_content)"
    span.set_attribute("error.type", kind)
    span.set_attribute("sluice.outcome", "error")
    if isinstance(error, ProviderError):
        if _int64(error.status):
            span.set_attribute("http.response.status_code", error.status)
        if error.retry_after is not None:
            span.set_attribute("sluice.retry_after_s", error.retry_after)
    span.set_status(Status(StatusCode.ERROR, message[:_MESSAGE]))


def _provider(deployment: Deployment) -> str:
    name = deployment.provider_name
    return _PROVIDERS.get(name, name)


def _server_of(deployment: Deployment) -> tuple[str, int | None] | None:
    url = effective_base_url(deployment)
    if url is None:
        host = _DEFAULT_HOSTS.get(deployment.provider_name)
        return (host, 443) if host else None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None  # never the URL: it may hold credentials


def _add_server(attributes: dict[str, Any], server: tuple[str, int | None] | None) -> dict[str, Any]:
    if server is not None:
        attributes["server.address"] = server[0]
        if server[1] is not None:
            attributes["server.port"] = server[1]
    return attributes


def _set(span: Span, make: Callable[[], Mapping[str, Any]]) -> None:
    """Set the attributes ``make`` gives. They are made from what the caller sent (messages,
    parameters) and what the provider answered, so a bug on odd input costs those
    attributes, never the request itself; an integer outside int64 is left out (the OTLP
    exporter cannot encode it, and would log a traceback for it in every export)."""
    try:
        attributes = make()
        span.set_attributes(
            {k: v for k, v in attributes.items() if not isinstance(v, int) or isinstance(v, bool) or v in _INT64}
        )
    except Exception:
        tracing_failed("describing a request on its span")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int64(value: object) -> bool:
    """An integer (not a bool) an OTLP exporter can encode."""
    return isinstance(value, int) and not isinstance(value, bool) and value in _INT64


def _epoch_ns(loop_time: float) -> int:
    """A moment on the event loop's clock as OpenTelemetry's (nanoseconds since the epoch)."""
    return time.time_ns() - int((asyncio.get_running_loop().time() - loop_time) * 1e9)


# -- content (opt-in) ------------------------------------------------------------------------------


def input_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages in the conventions' input-messages schema (role, parts)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role", "user"))
        parts = list(_parts(message.get("content")))
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if not isinstance(call, Mapping):
                continue
            function = call.get("function")
            function = function if isinstance(function, Mapping) else {}
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
        if role == "tool":
            parts = [
                {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message.get("content")}
            ]
        out.append({"role": role, "parts": parts})
    return out


def _parts(content: Any) -> Iterable[dict[str, Any]]:
    if isinstance(content, str):
        yield {"type": "text", "content": content}
        return
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text":
            yield {"type": "text", "content": part.get("text")}
        else:  # images, audio, files: named, never their bytes
            yield {"type": str(part.get("type", "unknown"))}


def output_messages(result: Result) -> list[dict[str, Any]]:
    parts = [] if result.text is None else [{"type": "text", "content": result.text}]
    return [{"role": "assistant", "parts": parts, "finish_reason": result.finish_reason or "stop"}]


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()
