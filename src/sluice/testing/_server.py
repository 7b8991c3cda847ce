"""The fake provider: request flow, limits, faults, counting and billing.

See the package docstring (:mod:`sluice.testing`) for how to use it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Mapping
from hashlib import sha256
from typing import Any, NamedTuple

from aiohttp import web

from ._batches import BatchDesk
from ._broken import drop, gone, hang, truncate, unstreamed
from ._cache_usage import billed_usd
from ._count_tokens import CountTokens
from ._embeddings import EmbeddingsFormat
from ._faults import STATUS_OF, STREAM_FAULTS, Fault, FaultPlan, FaultSpec
from ._formats import (
    AnthropicFormat,
    ApiError,
    Call,
    Format,
    OpenAIFormat,
    decode_body,
    dumps,
    model_of,
    openai_error_body,
)
from ._lifecycle import LoopbackServer
from ._limits import Entry, Limiter, Rejection, retry_after_headers
from ._prompt_cache import PromptCache, PromptCacheMode, PromptCacheSettings, owner_of
from ._responses import ResponsesFormat
from ._stats import LedgerEntry, LedgerKind, ServerStats, Tier
from ._streams import StreamMode, error_frame, stream_frames, stream_mode
from ._structured import StructuredAnswers, render, streamed_text
from ._tokenizer import PromptCounter, TokenizerSpec

__all__ = ["FakeServer"]

#: What the ``malformed`` fault sends with status 200.
_MALFORMED_BODY = b'{"id": "chatcmpl-broken", "object": "chat.completion", "choi'
_JSON = "application/json"


class FakeServer(LoopbackServer):
    """An OpenAI- and Anthropic-compatible HTTP server on loopback, with real limits:
    Chat Completions, Anthropic's Messages and OpenAI's Responses (see :mod:`._responses`).

    Limits (one state shared by every endpoint): at most ``rpm`` requests and ``tpm``
    tokens in any sliding ``window`` seconds. With ``slice`` seconds set, requests are
    also spread evenly, as OpenAI may enforce 60,000/min as 1,000/s: a bucket refilling
    at ``rpm / window`` per second holding ``max(1, rpm * slice / window)``, forgiving
    ``jitter`` seconds of early arrival. So ``rpm=3, window=60`` admits one request per
    20 s; pass ``slice=None`` for a pure sliding window. ``itpm`` and ``otpm`` are input
    and output tokens per ``window``, each a token bucket as Anthropic enforces them (see
    :mod:`._buckets`): a request's prompt is taken from the first, its ``max_tokens`` from
    the second and the unused part put back when its answer is done. Anthropic answers
    carry ``anthropic-ratelimit-{input,output}-tokens-*`` headers for them.

    ``latency`` (+ up to ``latency_jitter``) seconds pass before each real answer;
    ``output_tokens`` is the reply length unless ``max_tokens`` cuts it; ``api_key``
    makes the key mandatory; ``fault_rates`` (``{"503": 0.1}``) draws random faults with
    ``seed``; ``send_retry_after=False`` drops ``retry-after`` hints from 429s; ``prices``
    maps a model (or ``"*"``) to USD per million input and output tokens (and, optionally,
    cache reads and writes) for :attr:`ledger`. ``latency``, ``latency_jitter``, ``output_tokens``, ``api_key``,
    ``send_retry_after`` and ``prices`` may be changed while it runs.

    ``prompt_cache`` (``"auto"``, ``"on"``, ``"off"`` or a :class:`PromptCacheSettings`)
    caches prompts as OpenAI and Anthropic document it (see :mod:`._prompt_cache`): usage,
    ITPM and the bill follow; ``"auto"`` only for requests that ask for it (breakpoints, a
    ``prompt_cache_key``), so others are answered as without a cache.

    ``tokenizer`` is how the fake counts prompt tokens (see :mod:`._tokenizer`):
    ``"chars"`` (~4 characters a token), ``"bytes"`` (one token per UTF-8 byte, the
    most a byte-level BPE tokenizer can bill) or a ``str -> int`` callable.

    Billing follows a real provider: every generated answer is billed, including one
    whose client stopped waiting (latency past its timeout) and the garbled or cut
    200s of the ``malformed`` and ``truncated`` faults. :attr:`ledger` entries say
    which (:attr:`LedgerEntry.kind`).

    A request with ``"stream": true`` is answered as the API streams (see
    :mod:`._streams`): in at most :attr:`stream_pieces` pieces with the latency spread
    over them. The ``stream_cut`` and ``stream_error`` faults break a stream after
    ``inject(..., after=N)`` pieces (billed, ledger kind ``truncated``); a client that
    closes the connection part-way is billed the whole answer (``abandoned``).
    """

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        itpm: float | None = None,
        otpm: float | None = None,
        window: float = 60.0,
        slice: float | None = 1.0,
        jitter: float = 0.02,
        latency: float = 0.0,
        latency_jitter: float = 0.0,
        output_tokens: int = 16,
        api_key: str | None = None,
        fault_rates: Mapping[str, float] | None = None,
        seed: int | None = None,
        send_retry_after: bool = True,
        prices: Mapping[str, tuple[float, ...]] | None = None,
        tokenizer: TokenizerSpec = "chars",
        prompt_cache: PromptCacheMode | PromptCacheSettings = "auto",
        echo_key_in_errors: bool = False,
        context_window: int | None = None,
        capacity: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if output_tokens < 0:
            raise ValueError("output_tokens must not be negative")
        self.latency = latency
        self.latency_jitter = latency_jitter
        self.output_tokens = output_tokens
        self.api_key = api_key
        #: Quote a wrong key back in the 401 message, as some compatible servers do (hostile).
        self.echo_key_in_errors = echo_key_in_errors
        #: Prompt + max_tokens above this is a 400 (``context_length_exceeded``), as real models do.
        self.context_window = context_window
        #: Requests it works on at once, like a vLLM server's batch; the rest queue (latency grows).
        self._capacity = asyncio.Semaphore(capacity) if capacity is not None else None
        self.send_retry_after = send_retry_after
        self._watchers: list[asyncio.Future[None]] = []
        #: Called with each request's headers as it arrives (tests check what the client
        #: had done by then, e.g. its state file).
        self.on_arrival: Callable[[Mapping[str, str]], None] | None = None
        self.prices: dict[str, tuple[float, ...]] = dict(prices or {})
        super().__init__(host, port)
        self._limiter: Limiter | None = None
        if rpm is not None or tpm is not None or itpm is not None or otpm is not None:
            self._limiter = Limiter(rpm, tpm, window, slice, jitter, itpm=itpm, otpm=otpm)
        self._faults = FaultPlan(fault_rates, seed)
        self._rng = random.Random(seed)
        counter = self.counter = PromptCounter(tokenizer)
        self.tokenizer = tokenizer
        self._routes: dict[str, Format] = {
            "/v1/chat/completions": OpenAIFormat(counter),
            "/v1/messages": AnthropicFormat(counter),
            "/v1/responses": ResponsesFormat(counter),
            "/v1/embeddings": EmbeddingsFormat(counter),
        }
        self.stats = ServerStats()
        self.ledger: list[LedgerEntry] = []
        self._billed = 0.0
        self._seq = 0
        self._in_flight = 0
        #: The most pieces a streamed answer's text (or tool arguments) comes in.
        self.stream_pieces = 4
        #: OpenAI's Files + Batches and Anthropic's Message Batches (see :mod:`._batches`).
        self.batches = BatchDesk(self)
        #: Share of the price a ``service_tier: "flex"`` request is billed.
        self.flex_discount = 0.5
        #: Share of flex requests refused as :meth:`refuse_flex` does, at random (``seed``).
        self.flex_refusal_rate = 0.0
        self._flex_refusals = 0
        #: Answers to requests that ask for JSON, and the invalid ones to give (see
        #: :mod:`._structured`): ``server.structured.configure(rate=0.2)``.
        self.structured = StructuredAnswers(seed)
        #: ``POST /v1/messages/count_tokens``: whether it is served, the calls (see ``._count_tokens``).
        self.count_tokens = CountTokens()
        settings = prompt_cache if isinstance(prompt_cache, PromptCacheSettings) else PromptCacheSettings(prompt_cache)
        #: The prompt caches, their settings and :attr:`~PromptCache.stats` (see :mod:`._prompt_cache`).
        self.prompt_cache = PromptCache(settings, counter, seed)

    @property
    def embeddings(self) -> EmbeddingsFormat:
        """``POST /v1/embeddings``: its limits and marker to set, what it answered (see
        :mod:`._embeddings`)."""
        endpoint = self._routes["/v1/embeddings"]
        assert isinstance(endpoint, EmbeddingsFormat)
        return endpoint

    @property
    def in_flight(self) -> int:
        """Requests being handled right now."""
        return self._in_flight

    @property
    def total_billed_usd(self) -> float:
        """The sum of :attr:`ledger` costs: everything billed, delivered or not."""
        return self._billed

    @property
    def fault_rates(self) -> dict[Fault, float]:
        """Probability per request of each random fault."""
        return self._faults.rates

    @fault_rates.setter
    def fault_rates(self, rates: Mapping[str, float]) -> None:
        self._faults.set_rates(rates)

    @property
    def pending_faults(self) -> int:
        """Requests that still have an injected fault waiting for them."""
        return self._faults.pending

    def inject(
        self,
        kind: Fault | str,
        times: int = 1,
        *,
        retry_after: float | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
        after: int = 1,
        every: float = 0.0,
    ) -> None:
        """Answer the next ``times`` requests (after faults already queued) with ``kind``.

        ``retry_after`` adds ``retry-after``/``retry-after-ms`` (a 429 gets 1 s unless
        ``send_retry_after`` is off); ``headers`` are added to the response; ``delay``
        waits before answering; ``after`` is how many pieces of a streamed answer go out
        before a ``stream_cut`` or ``stream_error`` breaks it, or how many spaces a
        ``trickle`` sends, ``every`` seconds apart, before its JSON.
        """
        if after < 0:
            raise ValueError("after must not be negative")
        if every < 0:
            raise ValueError("every must not be negative")
        spec = FaultSpec(Fault(kind), retry_after, dict(headers or {}), delay, after, every)
        self._faults.inject(spec, times)

    def refuse_flex(self, times: int = 1) -> None:
        """Answer the next ``times`` flex-tier requests with OpenAI's 429 "resource
        unavailable" (no capacity for flex now; no ``retry-after``)."""
        self._flex_refusals += times

    def clear_faults(self) -> None:
        """Drop injected faults that have not been used yet."""
        self._faults.clear()

    def reset_stats(self) -> None:
        """Start :attr:`stats`, :attr:`ledger` and the billed total again from zero."""
        self.stats = ServerStats()
        self.ledger = []
        self._billed = 0.0
        self.prompt_cache.stats.reset()

    def reset_limits(self) -> None:
        """Forget every request counted against the rate limits."""
        if self._limiter is not None:
            self._limiter.reset()

    async def until(self, condition: Callable[[], bool], timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until ``condition()`` holds, checked each time a request arrives, is answered
        or ends: a test waits for the server's state, not for a guessed length of time.
        For a server in the same event loop (``async with FakeServer()``)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while not condition():
                watcher: asyncio.Future[None] = loop.create_future()
                self._watchers.append(watcher)
                await watcher

    def _changed(self) -> None:
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)

    # -- request flow ------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "POST":
            fmt = self._routes.get(request.path)
            if fmt is not None:
                return await self._serve(request, fmt)
            if request.path == "/v1/messages/count_tokens" and self.count_tokens.served:
                return await self.count_tokens.answer(request, self.counter, self.api_key, echo=self.echo_key_in_errors)
        if request.path.startswith(("/v1/files", "/v1/batches", "/v1/messages/batches")):
            answered = await self.batches.handle(request)
            if answered is not None:
                return answered
        if request.path == "/_fake/stats":
            return web.Response(body=dumps(self._summary()), content_type=_JSON)
        message = f"No route {request.method} {request.path} on the sluice fake server."
        body = OpenAIFormat().error("not_found", message)
        return web.Response(status=404, body=body, content_type=_JSON)

    async def _serve(self, request: web.BaseRequest, fmt: Format) -> web.StreamResponse:
        stats = self.stats
        stats.received += 1
        stats.by_path[request.path] += 1
        self._seq += 1
        n = self._seq
        fault = self._faults.draw()
        self._in_flight += 1
        if self._in_flight > stats.max_in_flight:
            stats.max_in_flight = self._in_flight
        if self._watchers:
            self._changed()
        if self.on_arrival is not None:
            self.on_arrival(request.headers)
        try:
            raw = await request.read()
            key = request.headers.get("Idempotency-Key") or sha256(raw).hexdigest()
            by_key = stats.by_key
            by_key[key] = by_key.get(key, 0) + 1  # .get: Counter's __missing__ is slow
            if fault is not None:
                return await self._fault(request, fmt, fault, n, raw, key)
            return await self._answer(request, fmt, n, raw, key)
        finally:
            self._in_flight -= 1
            if self._watchers:
                self._changed()

    async def _answer(
        self, request: web.BaseRequest, fmt: Format, n: int, raw: bytes, key: str, fault: FaultSpec | None = None
    ) -> web.StreamResponse:
        headers = request.headers
        try:
            fmt.check_auth(headers, self.api_key, echo=self.echo_key_in_errors)
            body = decode_body(raw)
            call = fmt.parse(body, headers)
        except ApiError as exc:
            return self._respond(fmt, n, exc.status, fmt.error(exc.kind, exc.message, exc.param))
        flex = isinstance(body, dict) and body.get("service_tier") == "flex" and isinstance(fmt, OpenAIFormat)
        if flex and (self._flex_refusals > 0 or 0 < self.flex_refusal_rate > self._rng.random()):
            self._flex_refusals = max(0, self._flex_refusals - 1)
            message = "Resource unavailable: no capacity for flex processing now. Please retry later."
            return self._respond(fmt, n, 429, openai_error_body(message, "resource_unavailable"), refused_by="flex")
        mode = stream_mode(body, fmt.api)
        if fault is not None and mode is None:  # a stream fault for an answer that is not streamed
            return await self._fault(request, fmt, unstreamed(fault), n, raw, key)
        cost = call.prompt_tokens + call.max_tokens
        if self.context_window is not None and cost > self.context_window:
            return self._too_long(fmt, n, call)
        assert self._loop is not None
        now = self._loop.time()
        plan = self.prompt_cache.consult(fmt.api, body, call, owner_of(headers), now)
        limiter = self._limiter
        entry = None
        if limiter is not None:
            counted = call.prompt_tokens if plan is None else plan.counted_input  # Anthropic: reads are free
            verdict = limiter.admit(now, cost, counted, call.max_tokens)
            if isinstance(verdict, Rejection):
                return self._reject(fmt, n, verdict)
            entry = verdict
        self.stats.arrivals.append((now, cost))
        delay = self.latency
        if self.latency_jitter > 0:
            delay += self._rng.uniform(0.0, self.latency_jitter)
        if plan is not None:  # readable once the answer begins: its first piece, or all of it
            begins = now + (delay if mode is None else delay / max(1, self.stream_pieces))
            call = call._replace(cache=self.prompt_cache.commit(plan, now, begins))
        completion = min(call.max_tokens, self.output_tokens)
        ask = self.structured.ask_of(body, fmt.api)
        structured = self.structured.answer(ask)[0] if ask is not None else None
        if ask is not None and mode is not None and ask.tool is None:  # Anthropic streams a tool's input itself
            call = call._replace(text=streamed_text(structured))
        if mode is not None:
            return await self._stream(request, fmt, n, _Streamed(call, completion, mode, entry, key), delay, fault)
        try:
            if self._capacity is not None:  # a self-hosted server: beyond capacity, requests queue
                async with self._capacity:
                    await asyncio.sleep(delay)
            elif delay > 0:
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            # aiohttp cancels a handler whose client left only with handler_cancellation
            # on (it is off here) and at shutdown; a provider finishes and bills anyway.
            self._finish(entry, key, call, completion, "abandoned")
            raise
        # A client that timed out has gone by now: the answer is billed, not delivered.
        transport = request.transport
        gone = transport is None or transport.is_closing()
        self._finish(
            entry, key, call, completion, "abandoned" if gone else "delivered", tier="flex" if flex else "sync"
        )
        cut = completion < self.output_tokens
        if ask is not None:
            answer = render(fmt, n, call, completion, structured, ask, int(time.time()))
        else:
            answer = fmt.success(n, call, completion, cut, int(time.time()))
        if flex:  # the tier it was served in, as OpenAI says it
            answer = answer[:-1] + b',"service_tier":"flex"}'
        return self._respond(fmt, n, 200, answer)

    async def _stream(
        self,
        request: web.BaseRequest,
        fmt: Format,
        n: int,
        answer: _Streamed,
        delay: float,
        fault: FaultSpec | None,
    ) -> web.StreamResponse:
        """A streamed answer: its pieces with the latency spread over them (the first after
        ``delay / pieces``). A stream fault breaks it after ``fault.after`` pieces: the
        connection drops (``stream_cut``) or an ``error`` event ends it (``stream_error``).
        Billed as a provider bills: delivered; ``abandoned`` when the client left part-way
        (closed the connection); ``truncated`` when the fault broke it."""
        call, completion = answer.call, answer.completion
        frames = stream_frames(
            fmt.api,
            n,
            call,
            completion,
            completion < self.output_tokens,
            int(time.time()),
            answer.mode,
            self.stream_pieces,
        )
        headers = self._headers(fmt, n, "text/event-stream", {"Cache-Control": "no-cache"})
        response = web.StreamResponse(status=200, headers=headers)
        self.stats.by_status[200] += 1
        kind: LedgerKind = "abandoned"
        try:
            await response.prepare(request)
            await response.write(b"".join(frames.head))
            step = delay / len(frames.body) if frames.body else delay
            for number, frame in enumerate(frames.body):
                if fault is not None and number >= fault.after:
                    break
                if step > 0:
                    await asyncio.sleep(step)
                if gone(request):
                    break
                await response.write(frame)
            if not gone(request):
                if fault is None:
                    await response.write(b"".join(frames.tail))
                    kind = "delivered"
                else:
                    kind = "truncated"
                    if fault.kind is Fault.STREAM_ERROR:
                        await response.write(
                            error_frame(fmt.api, len(frames.head) + min(fault.after, len(frames.body)))
                        )
                    elif request.transport is not None:
                        request.transport.close()  # mid-body: the client sees the payload end early
        except ConnectionError:  # the client left while we wrote
            kind = "abandoned"
        finally:  # cancelled (the server stopping) or not, the answer was generated: billed
            if kind == "truncated":
                self._settle(answer.entry, call, completion)
                self._bill(answer.key, call, completion, kind)
            else:
                self._finish(answer.entry, answer.key, call, completion, kind)
            if self._watchers:
                self._changed()
        return response

    def _finish(
        self, entry: Entry | None, key: str, call: Call, completion: int, kind: LedgerKind, tier: Tier = "sync"
    ) -> None:
        """Generation is over: settle the rate-limit reservation and bill the answer."""
        self._settle(entry, call, completion)
        self._record_success(key, call, completion, kind, tier)

    def _settle(self, entry: Entry | None, call: Call, completion: int) -> None:
        """The rate-limit reservation of an answer generated: its real tokens and output."""
        if self._limiter is not None and entry is not None and self._loop is not None:
            self._limiter.settle(entry, call.prompt_tokens + completion, output=completion, now=self._loop.time())

    def next_number(self) -> int:
        """A fresh request number (answer and request ids)."""
        self._seq += 1
        return self._seq

    def record_batch_success(self, key: str, call: Call, completion: int, discount: float) -> None:
        """A batch line answered: counted like any completion (a key answered twice is a
        duplicate), billed at ``discount`` of the price."""
        self._record_success(key, call, completion, "delivered", "batch", discount)
        self._changed()

    def announce(self) -> None:
        """Wake :meth:`until` waiters: something changed (a batch ended)."""
        self._changed()

    def _respond(
        self,
        fmt: Format,
        n: int,
        status: int,
        body: bytes,
        extra: Mapping[str, str] | None = None,
        refused_by: str = "injected",
    ) -> web.Response:
        """A JSON response with the request id, the rate-limit headers and ``extra``
        (``refused_by``: for a 429, the limit that refused it, see ``rate_limited_by``)."""
        headers = self._headers(fmt, n, _JSON, extra)
        stats = self.stats
        stats.by_status[status] += 1
        if status == 429:
            stats.rate_limited += 1
            stats.rate_limited_by[refused_by] += 1
        if self._watchers:
            self._changed()
        return web.Response(status=status, body=body, headers=headers)

    def _headers(self, fmt: Format, n: int, content_type: str, extra: Mapping[str, str] | None) -> dict[str, str]:
        """The request id, the rate-limit headers (per minute) and ``extra``."""
        headers = {"Content-Type": content_type, fmt.request_id_header: f"req_{n}"}
        limiter = self._limiter
        if limiter is not None and self._loop is not None:
            # per minute, as real providers count in their headers whatever they enforce
            snapshot = limiter.snapshot(self._loop.time(), per=60.0)
            headers.update(fmt.limit_headers(snapshot, time.time()))
        if extra:
            headers.update(extra)
        return headers

    def _too_long(self, fmt: Format, n: int, call: Call) -> web.Response:
        """The prompt and its max_tokens exceed the model's context window: a 400, worded
        the way each API words it."""
        assert self.context_window is not None
        message, param = fmt.too_long(call.prompt_tokens, call.max_tokens, self.context_window)
        return self._respond(fmt, n, 400, fmt.error("context_length", message, param))

    def _reject(self, fmt: Format, n: int, rejection: Rejection) -> web.Response:
        extra = None
        if self.send_retry_after and rejection.wait is not None:
            extra = retry_after_headers(rejection.wait)
        return self._respond(fmt, n, 429, fmt.rate_limited(rejection), extra, rejection.limit)

    def _record_success(
        self,
        key: str,
        call: Call,
        completion: int,
        kind: LedgerKind = "delivered",
        tier: Tier = "sync",
        discount: float | None = None,
    ) -> None:
        """Count a real completion (delivered or abandoned) and bill it."""
        stats = self.stats
        stats.accepted += 1
        succeeded = stats.succeeded_keys
        before = succeeded.get(key, 0)
        if before:
            stats.duplicate_successes += 1
        succeeded[key] = before + 1
        stats.prompt_tokens += call.prompt_tokens
        stats.completion_tokens += completion
        if discount is None:
            discount = self.flex_discount if tier == "flex" else 1.0
        self._bill(key, call, completion, kind, tier, discount)

    def _bill(
        self, key: str, call: Call, completion: int, kind: LedgerKind, tier: Tier = "sync", discount: float = 1.0
    ) -> None:
        prompt = call.prompt_tokens
        use = call.cache
        cost = billed_usd(self.prices, call.model, prompt, completion, use) * discount if self.prices else 0.0
        read, written = (0, 0) if use is None else (use.read, use.writes if use.writes_priced else 0)
        self.ledger.append(LedgerEntry(key, call.model, prompt, completion, cost, kind, tier, read, written))
        self._billed += cost
        if kind != "delivered":
            self.stats.undelivered += 1

    def _summary(self) -> dict[str, Any]:
        summary = self.stats.summary()
        summary["in_flight"] = self._in_flight
        summary["pending_faults"] = self._faults.pending
        summary["total_billed_usd"] = self._billed
        summary["prompt_cache"] = self.prompt_cache.stats.summary()
        return summary

    # -- faults ------------------------------------------------------------------------

    async def _fault(
        self, request: web.BaseRequest, fmt: Format, spec: FaultSpec, n: int, raw: bytes, key: str
    ) -> web.StreamResponse:
        if spec.delay > 0:
            await asyncio.sleep(spec.delay)
        kind = spec.kind
        if kind is Fault.LATE:  # counted only now, and answered
            return await self._answer(request, fmt, n, raw, key)
        if kind in STREAM_FAULTS:  # a real answer, broken part-way
            return await self._answer(request, fmt, n, raw, key, dataclasses.replace(spec, delay=0.0))
        status = STATUS_OF.get(kind)
        if status is not None:
            return self._fault_status(fmt, spec, n, status)
        if kind is Fault.HANG:
            assert self._closing is not None
            await hang(request, self._closing)
        if kind is Fault.RESET or kind is Fault.HANG:
            return drop(request, self.stats.by_status)
        extra = dict(spec.headers)
        if kind is Fault.EMPTY_CHOICES:
            return self._respond(fmt, n, 200, fmt.empty(n, model_of(raw), int(time.time())), extra)
        # malformed, truncated: the answer was generated, and is billed, but its body
        # breaks on the way to the client.
        call = self._generated(request, fmt, raw)
        if kind is Fault.MALFORMED:
            if call is not None:
                self._bill(key, call, min(call.max_tokens, self.output_tokens), "malformed")
            return self._respond(fmt, n, 200, _MALFORMED_BODY, extra)
        if call is None:
            empty = fmt.empty(n, model_of(raw), int(time.time()))
            return await truncate(request, self._cut_headers(fmt, n, extra), empty, self.stats.by_status)
        completion = min(call.max_tokens, self.output_tokens)
        body = fmt.success(n, call, completion, completion < self.output_tokens, int(time.time()))
        if kind is Fault.TRICKLE:
            return await self._trickle(request, fmt, n, body, extra, spec, key, call, completion)
        self._bill(key, call, completion, "truncated")
        return await truncate(request, self._cut_headers(fmt, n, extra), body, self.stats.by_status)

    def _generated(self, request: web.BaseRequest, fmt: Format, raw: bytes) -> Call | None:
        """The call a faulted request would have been answered for; None if it was invalid
        (a provider bills no answer for a 400 or a 401)."""
        try:
            fmt.check_auth(request.headers, self.api_key, echo=self.echo_key_in_errors)
            return fmt.parse(decode_body(raw), request.headers)
        except ApiError:
            return None

    def _fault_status(self, fmt: Format, spec: FaultSpec, n: int, status: int) -> web.Response:
        wait = spec.retry_after
        if spec.kind is Fault.RATE_LIMIT:
            message = "Rate limit reached for requests (injected fault)."
            body = fmt.rate_limited(Rejection("requests", wait, message))
            if wait is None and self.send_retry_after:
                wait = 1.0
        else:
            body = fmt.fault_error(spec.kind)
        extra = retry_after_headers(wait) if wait is not None else {}
        if spec.kind is Fault.NO_RETRY:
            extra["x-should-retry"] = "false"
        extra.update(spec.headers)
        return self._respond(fmt, n, status, body, extra)

    def _cut_headers(self, fmt: Format, n: int, extra: dict[str, str]) -> dict[str, str]:
        """The headers of an answer cut mid-body (no rate-limit headers)."""
        return {"Content-Type": _JSON, fmt.request_id_header: f"req_{n}", **extra}

    async def _trickle(
        self,
        request: web.BaseRequest,
        fmt: Format,
        n: int,
        body: bytes,
        extra: dict[str, str],
        spec: FaultSpec,
        key: str,
        call: Call,
        completion: int,
    ) -> web.StreamResponse:
        """The headers at once, then ``spec.after`` spaces ``spec.every`` s apart, then the
        answer: a slow body that is never silent for long. Billed however it ends."""
        headers = self._headers(fmt, n, _JSON, extra)
        response = web.StreamResponse(status=200, headers=headers)
        self.stats.by_status[200] += 1
        kind: LedgerKind = "abandoned"
        try:
            await response.prepare(request)
            for _ in range(spec.after):
                await response.write(b" ")
                await asyncio.sleep(spec.every)
                if gone(request):
                    break
            else:
                await response.write(body)
                await response.write_eof()
                kind = "delivered"
        except ConnectionError:  # the client left while we wrote
            pass
        finally:
            self._record_success(key, call, completion, kind)
            if self._watchers:
                self._changed()
        return response


class _Streamed(NamedTuple):
    """An admitted request to answer as a stream."""

    call: Call
    completion: int
    mode: StreamMode
    entry: Entry | None
    key: str
