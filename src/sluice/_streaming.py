"""A streamed request: text as it arrives, under the same limits, retries, budget and store.

::

    async with engine.stream("openai/gpt-4o-mini", "Tell me a story") as stream:
        async for delta in stream:           # str, as it arrives
            print(delta, end="")
    result = stream.result                   # text, usage, cost, timings.first_token

The consumer drives it: nothing is admitted until the first delta is asked for, and each
delta is read from the connection when it is asked for. Each attempt is a
:class:`~sluice._slot.Slot` like any request's (rate-limit reservation, worst-case budget
hold, durable intent), settled exactly once.

- **Retries only before the first delta.** An attempt's send is the opening of the
  provider's stream up to its first delta, run by the attempt core's one retry loop
  (:meth:`~sluice._attempts.Attempts.until_outcome`): a 429, a 5xx, a reset or an
  ``error`` event before any text is retried like any attempt. After the first delta
  nothing is retried: an error (a cut connection, an ``error`` event, a
  malformed chunk, an idle or attempt timeout) ends the stream with an error Result, and a
  second answer is never spliced onto the first. Such an attempt counts as possibly billed,
  at its worst case.
- **Leaving early** (``break``, an exception, the task cancelled) closes the connection,
  settles the attempt at its worst case (it was at the provider, which bills what it
  generated) and makes the Result a cancelled one.
- **Timeouts.** ``RetryPolicy.attempt_timeout`` (and the deadline) bound the time spent
  waiting for the provider in one attempt, not the consumer's own time between deltas;
  ``idle_timeout`` bounds the silence between two chunks.
- **Usage and cost** come from the provider's final usage (OpenAI's
  ``stream_options.include_usage``, Anthropic's ``message_start`` and ``message_delta``);
  a stream that reports none is charged its worst case.
- **Tool calls** are carried: :meth:`Stream.events` yields their deltas as they come,
  :attr:`Stream.tool_calls` holds them assembled, and ``Result.raw`` is an OpenAI
  ``chat.completion`` holding them (whatever the provider; ``finish_reason`` is OpenAI's),
  or the whole answer a stream ended with (a Response, from a deployment of the Responses
  API: its client is handed it as it is).
- **The store.** With one, the intent is noted before each attempt and the final Result
  put before anyone is told, as for ``complete()``. A request with a stored answer is not
  sent again: it is replayed as one delta (``result.cached``), because the store's promise
  is that a stored answer is never paid for twice. Identical requests in flight at once
  are not merged with a stream (a stream is not shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from ._attempts import Opening
from ._errors import (
    AttemptTimeoutError,
    CancelledError,
    FatalProviderError,
    SluiceError,
)
from ._models import Result, Usage
from ._slot import Slot, Tally
from .providers import Reply
from .providers._events import (
    Finish,
    StreamEvent,
    StreamingProvider,
    StreamStart,
    TextDelta,
    ToolCallDelta,
    UsageUpdate,
    reply_events,
)

if TYPE_CHECKING:
    from ._attempts import Attempts
    from ._job import Job
    from ._router import Route
    from .providers import Provider

__all__ = ["Delta", "Stream"]

#: What :meth:`Stream.events` yields.
Delta = TextDelta | ToolCallDelta


class _ToolCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.name or "", "arguments": "".join(self.arguments)}
        return {"id": self.id or "", "type": "function", "function": function}


class Stream:
    """One streamed request; made by :meth:`Engine.stream`. Use it as ``async with``."""

    __slots__ = (
        "_attempts",
        "_calls",
        "_deadline",
        "_ended_with",
        "_entered",
        "_events",
        "_finish",
        "_first",
        "_job",
        "_limit",
        "_pending",
        "_replay",
        "_result",
        "_slot",
        "_start",
        "_tally",
        "_text",
        "_usage",
        "_waited",
    )

    def __init__(self, attempts: Attempts, job: Job) -> None:
        self._attempts = attempts
        self._job = job
        self._entered = False
        self._tally = Tally(job.submitted)
        self._deadline: float | None = None
        self._slot: Slot | None = None
        self._events: AsyncIterator[StreamEvent] | None = None
        self._limit: float | None = None  # seconds this attempt may wait for the provider
        self._waited = 0.0  # ... and has waited so far
        self._replay: list[Delta] = []  # a stored answer's deltas, still to hand out
        self._pending: list[StreamEvent | None] = []  # read while opening, not yet taken (None: the end)
        self._result: Result | None = None
        self._first: float | None = None
        self._text: list[str] = []
        self._calls: dict[int, _ToolCall] = {}
        self._usage: Usage | None = None
        self._finish: str | None = None
        self._ended_with: Mapping[str, Any] | None = None  # the whole answer, if the stream's end gave it
        self._start = StreamStart()

    # -- the public surface ----------------------------------------------------------------

    async def __aenter__(self) -> Stream:
        """Wait for the engine's concurrency gate (interactive work goes first); nothing is
        sent until the first delta is asked for."""
        if self._entered:
            raise RuntimeError("a Stream can be entered once")
        runtime, job = self._attempts.runtime, self._job
        runtime.call_began()
        try:
            await runtime.gate.acquire(job.priority, job.seq)
        except BaseException:
            runtime.call_ended()
            raise
        self._entered = True
        self._tally = Tally(asyncio.get_running_loop().time())
        self._deadline = self._attempts.deadline(self._tally)
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Close the connection if the stream has not ended, settle, and free the gate."""
        runtime = self._attempts.runtime
        try:
            if self._result is None:
                await self._cut_short()
        finally:
            runtime.gate.release()
            runtime.call_ended()

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> str:
        """The next piece of text (tool-call deltas are gathered in :attr:`tool_calls`)."""
        while (delta := await self._next()) is not None:
            if isinstance(delta, TextDelta):
                return delta.text
        raise StopAsyncIteration

    def events(self) -> AsyncIterator[Delta]:
        """Every delta as it arrives: text and tool-call pieces (``async for`` over the
        stream itself gives the text alone). Iterate one or the other."""
        return _Deltas(self)

    async def collect(self) -> Result:
        """Read the rest of the stream; its Result."""
        while await self._next() is not None:
            pass
        return self.result

    @property
    def result(self) -> Result:
        """The whole Result, once the stream has ended (read to the end, or left)."""
        if self._result is None:
            raise RuntimeError("the stream has not ended: read it to the end, or leave its async with block")
        return self._result

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def text(self) -> str:
        """The text received so far (also what arrived before an error)."""
        return "".join(self._text)

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls received so far, assembled, in OpenAI's shape
        (``{"id", "type": "function", "function": {"name", "arguments"}}``)."""
        return [self._calls[index].as_openai() for index in sorted(self._calls)]

    def __repr__(self) -> str:
        state = "done" if self._result is not None else "streaming" if self._slot is not None else "waiting"
        return f"<Stream {self._job.request.model} {state} chars={sum(map(len, self._text))}>"

    # -- driving it ------------------------------------------------------------------------

    async def _next(self) -> Delta | None:
        """The next delta, running attempts (and retries before the first delta) as needed;
        None once the stream has ended."""
        if not self._entered:
            raise RuntimeError("use the stream inside `async with engine.stream(...) as stream:`")
        while True:
            if self._replay:
                return self._replay.pop(0)
            if self._result is not None:
                return None
            if self._slot is None:
                await self._open()
                continue
            event = self._pending.pop(0) if self._pending else await self._pull()
            if isinstance(event, SluiceError):
                await self._failed_after_first(event)
            elif event is None:
                await self._answered()
            else:
                delta = self._take(event)
                if delta is not None:
                    return delta

    async def _open(self) -> None:
        """The attempt core's loop until the provider's stream has sent its first delta
        (then the slot is this stream's to settle), or the stream ends: a final error."""
        attempts, job, tally = self._attempts, self._job, self._tally
        if not tally.attempts and self._replayed():
            return
        outcome = await attempts.until_outcome(job, tally, self._deadline, self._opening, streamed=True)
        if isinstance(outcome, SluiceError):
            await self._end(error=outcome)
            return
        assert isinstance(outcome, _Opened)
        slot = outcome.slot
        assert slot is not None
        self._slot, self._events = slot, outcome.events
        self._pending = [*outcome.seen, None] if outcome.ended else list(outcome.seen)
        self._first = slot.first_at = outcome.first
        timeout = attempts.retry.attempt_timeout
        if self._deadline is not None:
            timeout = min(timeout or self._deadline - slot.sent_at, self._deadline - slot.sent_at)
        self._limit, self._waited = timeout, outcome.waited

    async def _opening(self, route: Route) -> _Opened:
        """One attempt's send: open the provider's stream and read it up to its first delta
        (an error before it is the attempt's; the core retries it)."""
        job = self._job
        loop = asyncio.get_running_loop()
        began = loop.time()
        self._usage, self._finish, self._start = None, None, StreamStart()
        try:
            events = _events_of(route.provider, job, route.deployment)
        except Exception as exc:  # raised by the call itself, not by its iterator
            events = _raising(exc)
        seen: list[StreamEvent] = []
        try:
            while (event := await anext(events, None)) is not None:
                seen.append(event)
                if (isinstance(event, TextDelta) and event.text) or isinstance(event, ToolCallDelta):
                    return _Opened(events, seen, loop.time(), loop.time() - began, ended=False)
        except BaseException:
            await _aclose(events)
            raise
        return _Opened(events, seen, None, loop.time() - began, ended=True)

    async def _pull(self) -> StreamEvent | SluiceError | None:
        """The provider's next event (None: its stream ended), or the error that ended it."""
        assert self._events is not None
        assert self._slot is not None
        loop = asyncio.get_running_loop()
        began = loop.time()
        limit = None if self._limit is None else max(0.0, self._limit - self._waited)
        label = self._slot.route.deployment.label
        try:
            async with asyncio.timeout(limit):
                return await anext(self._events, None)
        except TimeoutError:
            return AttemptTimeoutError(f"no answer from {label} within {self._limit:g} s")
        except SluiceError as exc:
            return exc
        except Exception as exc:  # a provider's own bug must not escape as if it were ours
            provider = self._slot.route.provider
            return FatalProviderError(
                f"{type(exc).__name__} in provider {getattr(provider, 'name', '?')!r}: {exc}", maybe_billed=True
            )
        finally:
            self._waited += loop.time() - began

    def _take(self, event: StreamEvent) -> Delta | None:
        """Fold one event into the answer; the delta to hand on, if it is one."""
        if isinstance(event, TextDelta):
            if not event.text:
                return None
            self._text.append(event.text)
            return event
        if isinstance(event, ToolCallDelta):
            call = self._calls.get(event.index)
            if call is None:
                call = self._calls[event.index] = _ToolCall()
            call.id = event.id or call.id
            call.name = event.name or call.name
            if event.arguments:
                call.arguments.append(event.arguments)
            return event
        if isinstance(event, UsageUpdate):
            self._usage = event.usage
        elif isinstance(event, Finish):
            self._finish = event.reason
            if event.raw is not None:
                self._ended_with = event.raw
        elif isinstance(event, StreamStart):
            self._started(event)
        return None

    def _started(self, event: StreamStart) -> None:
        before = self._start
        self._start = StreamStart(
            event.request_id or before.request_id,
            event.ratelimit or before.ratelimit,
            event.id or before.id,
            event.model or before.model,
        )
        if event.ratelimit is not None and self._slot is not None:
            self._slot.route.limiter.observe(event.ratelimit)  # learn now, not when it ends

    # -- how an attempt ends -------------------------------------------------------------

    async def _failed_after_first(self, error: SluiceError) -> None:
        """An error after the first delta: nothing is retried (a second answer is never
        spliced onto the first); the attempt counts as possibly billed, and the
        deployment's health still learns from it."""
        slot = self._slot
        assert slot is not None
        self._slot = None
        try:
            await self._close_events()
        finally:  # settled even if cancelled while closing
            slot.settle(None, answered=False, cut_off=False, error=error)
        self._attempts.router.failed(slot.route, error, guarded=self._job.guarded, placed_at=slot.placed_at)
        await self._end(error=error)

    async def _answered(self) -> None:
        """The provider's stream ended whole: settle at the reported usage."""
        attempts, job = self._attempts, self._job
        slot = self._slot
        assert slot is not None
        self._slot, self._events = None, None
        route = slot.route
        usage = self._usage
        charge: float | None = None  # no usage reported: its worst case
        if usage is not None:
            slot.reconcile(usage, job.tokens)
            charge = attempts.spending.cost(route.deployment, usage) or 0.0
        latency = self._waited  # time waiting on the provider, not the consumer's own time
        output = usage.output_tokens if usage is not None else 0
        attempts.router.succeeded(route, latency, output, slot.placed_at)
        slot.settle(charge, answered=True, cut_off=False, usage=usage)
        text = "".join(self._text) if self._text or not self._calls else None
        raw = self._ended_with
        if raw is None:
            raw = self._raw(text, usage or Usage(), route.deployment.model_name)
        await self._end(
            reply=Reply(text, usage or Usage(), raw, self._finish, self._start.request_id, self._start.ratelimit)
        )

    async def _cut_short(self) -> None:
        """Left before the end: drop the connection, settle at the worst case, cancelled."""
        slot, self._slot = self._slot, None
        if slot is not None:
            try:
                await self._close_events()
            finally:  # settled even if cancelled again while closing
                slot.settle(None, answered=False, cut_off=False)
                self._attempts.router.released(slot.route)  # leaving early says nothing of the deployment
            note = "it was sent and may have been billed"
        elif self._tally.at_provider:  # left while it was being opened
            note = "it was sent and may have been billed"
        else:
            note = "its earlier attempts failed and it was not sent again" if self._tally.sent else "it was never sent"
        await self._end(error=CancelledError(f"cancelled: the stream was left before it ended; {note}"))

    async def _end(self, *, error: SluiceError | None = None, reply: Reply | None = None) -> None:
        """The Result: recorded (durably, with a store) before anyone is told, as ``complete()`` does."""
        attempts, job, tally = self._attempts, self._job, self._tally
        result = attempts.finish(job, tally, error=error, reply=reply, emit=False)
        first = None if self._first is None else self._first - job.submitted
        result = dataclasses.replace(result, timings=dataclasses.replace(result.timings, first_token=first))
        self._result = result
        try:
            await attempts.record(job, tally, result)
        finally:
            attempts.runtime.emit(result)

    async def _close_events(self) -> None:
        events, self._events = self._events, None
        if events is not None:
            await _aclose(events)

    # -- the store ---------------------------------------------------------------------------

    def _replayed(self) -> bool:
        """A stored answer (or kept rejection) for this request: replay it, send nothing."""
        stored = self._attempts.from_store(self._job)  # emitted there
        if stored is None:
            return False
        deltas: list[Delta] = [TextDelta(stored.text)] if stored.text else []
        for index, call in enumerate(_stored_calls(stored.raw)):
            function = call.get("function")
            if not isinstance(function, Mapping):
                continue
            deltas.append(
                ToolCallDelta(
                    index, _str(call.get("id")), _str(function.get("name")), _str(function.get("arguments")) or ""
                )
            )
        for delta in deltas:
            self._take(delta)
        self._replay = deltas
        self._result = stored
        return True

    # -- Result.raw ------------------------------------------------------------------------

    def _raw(self, text: str | None, usage: Usage, model: str) -> dict[str, Any]:
        """The answer as an OpenAI ``chat.completion``, whatever the provider streamed."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self._calls:
            message["tool_calls"] = self.tool_calls
        return {
            "id": self._start.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self._start.model or model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish}],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.total_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
                "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            },
            "streamed": True,
        }


class _Deltas:
    """:meth:`Stream.events`: an iterator object, not a generator, so leaving it early
    leaves nothing for the event loop to finalize (the stream's ``async with`` cleans up)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def __aiter__(self) -> _Deltas:
        return self

    async def __anext__(self) -> Delta:
        delta = await self._stream._next()
        if delta is None:
            raise StopAsyncIteration
        return delta


class _Opened(Opening):
    """A stream opened up to its first delta: the provider's events, those read so far,
    when the first delta came (None: the stream ended before one) and how long it took."""

    __slots__ = ("ended", "events", "first", "seen", "waited")

    def __init__(
        self,
        events: AsyncIterator[StreamEvent],
        seen: list[StreamEvent],
        first: float | None,
        waited: float,
        *,
        ended: bool,
    ) -> None:
        self.events = events
        self.seen = seen
        self.first = first
        self.waited = waited
        self.ended = ended


async def _aclose(events: AsyncIterator[StreamEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):  # closing must not hide how it ended
            await aclose()


def _events_of(provider: Provider, job: Job, deployment: Any) -> AsyncIterator[StreamEvent]:
    """The provider's stream of one attempt; a provider that cannot stream answers whole."""
    if isinstance(provider, StreamingProvider):
        return provider.stream(job.request, deployment, idempotency_key=job.idempotency_key)
    return _whole(provider, job, deployment)


async def _whole(provider: Provider, job: Job, deployment: Any) -> AsyncIterator[StreamEvent]:
    reply = await provider.send(job.request, deployment, idempotency_key=job.idempotency_key)
    for event in reply_events(reply):
        yield event


async def _raising(error: Exception) -> AsyncIterator[StreamEvent]:
    raise error
    yield  # an async generator that fails when first asked


def _stored_calls(raw: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The tool calls of a stored answer, in chat.completion's shape: a chat.completion's,
    or a Response's ``function_call`` items."""
    if raw is not None and raw.get("object") == "response":
        output = raw.get("output")
        return [
            {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            for item in (output if isinstance(output, list) else ())
            if isinstance(item, Mapping) and item.get("type") == "function_call"
        ]
    try:
        calls = raw["choices"][0]["message"].get("tool_calls") if raw else None
    except (KeyError, IndexError, TypeError, AttributeError):
        return []
    return [call for call in calls if isinstance(call, Mapping)] if isinstance(calls, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
