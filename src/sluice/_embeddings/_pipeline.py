"""The embeddings pipeline: a stream of texts packed into requests, each pack run by the
attempt core's one loop, each vector stored as it lands.

One embeddings request carries many inputs, so the unit the engine admits is a *pack*:
texts that share a model and parameters, packed up to the provider's per-request limits
(count and tokens, see :class:`~sluice.providers._embed.EmbedLimits`) and the
deployment's TPM. Each pack is one attempt series through the core
(:meth:`~sluice._attempts.Attempts.until_outcome`, sending itself): a Slot holding a
reservation of one request and the pack's estimated tokens, the budget hold of its worst
case, the durable intent; retried and learnt from as a chat request is.

A bad input fails alone. The embeddings API rejects a whole request for one bad input
(an empty or too long text) and does not say which one, so a pack refused with a 400
(or a 413, or for its size by the limiter or the budget) is split in two and each half
tried in turn, down to the text at fault: ``2 * log2(n)`` extra requests for one bad
text in ``n``. Two guards keep a refusal of the request itself (a wrong ``dimensions``)
from costing ``2n`` requests: a 400 that names a parameter is not split, and while no
request of that kind has succeeded, once two single texts have been refused, a failing
pack is not split further. When both halves of a refused pack succeed, the refusal was
about its size: later packs are made half as large (the limits are learnt, and kept by
the engine's runtime for its later calls).

Every text is stored under its own key (see :mod:`._keys`) as float32 bytes
(``sluice.store._vectors``); a text the provider rejected is stored with its error and
kept, as a chat rejection is. The source is read only while fewer than a few packs'
worth of texts wait to be handed out, so a million texts never sit in memory.
"""

from __future__ import annotations

import asyncio
import re
from array import array
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING

from .._budget import Budget
from .._errors import (
    BadRequestError,
    BudgetExhaustedError,
    CancelledError,
    CapacityError,
    InvalidRequestError,
    MalformedResponseError,
    ProviderError,
    SluiceError,
    UnknownPriceError,
)
from .._inorder import InOrder
from .._job import Job
from .._models import Priority, Request, Usage
from .._records import error_from_record, error_record
from .._slot import Tally
from .._tokens import estimate_text_tokens
from ..providers._embed import EmbeddingProvider, EmbedInput, EmbedLimits, EmbedReply, embed_limits, takes_token_arrays
from ..store._vectors import StoredVector, VectorStore
from ._keys import EmbedItem, EmbedSpec, input_bytes, key_of, token_array
from ._packing import Entry, Pack, SpecGroup, apportion
from ._results import EmbeddingResult

if TYPE_CHECKING:
    from .._attempts import Attempts
    from .._router import Route

__all__ = ["DEFAULT_WINDOW", "EmbedPipeline"]

#: Texts read from the source at a time (one store lookup each).
_CHUNK = 256
#: Packs in flight (admitted or waiting for admission) at once, per ``embed`` call.
DEFAULT_WINDOW = 8
#: Seconds a partly filled pack waits for more texts from a slow source before it goes.
_LINGER = 0.05
#: A 400 that names one of these is about the request, not an input: not split.
_PARAMETER_WORDS = re.compile(r"\b(dimensions|encoding_format)\b")


class EmbedPipeline:
    """Embeds a stream of :class:`EmbedItem`, packing them into requests (see the module
    docstring); :meth:`results` gives one :class:`EmbeddingResult` per item.

    ``window`` packs are in flight at once (each also takes a slot of the engine's
    ``concurrency``); ``batch_size`` and ``batch_tokens`` cap a request below what the
    deployment's limits allow.
    """

    def __init__(
        self,
        attempts: Attempts,
        *,
        priority: int = Priority.NORMAL,
        budget: Budget | None = None,
        ordered: bool = False,
        window: int = DEFAULT_WINDOW,
        batch_size: int | None = None,
        batch_tokens: int | None = None,
    ) -> None:
        for name, value in (("window", window), ("batch_size", batch_size), ("batch_tokens", batch_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}")
        self.attempts = attempts
        self.runtime = attempts.runtime
        self.priority = priority
        self.budget = budget or attempts.spending.budget
        self.ordered = ordered
        self.window = window
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        #: The whole source was read (not cut short by a stop).
        self.exhausted = False
        store = attempts.store
        self._store: VectorStore | None = store if isinstance(store, VectorStore) else None
        self._groups: dict[bytes, SpecGroup] = {}
        self._pending: dict[str, Entry] = {}
        self._out: asyncio.Queue[EmbeddingResult | BaseException | None] = asyncio.Queue()
        self._slots = asyncio.Semaphore(window)
        self._tasks: set[asyncio.Task[None]] = set()
        self._taken = 0
        self._outstanding = 0
        self._room = asyncio.Event()
        #: Texts taken from the source and not yet handed out: what memory holds at most.
        self._cap = window * 2048 + 2 * _CHUNK
        self._flush_timer: asyncio.TimerHandle | None = None
        self._last_take = 0.0
        self._waiting_for_room = False
        self._lingers = False

    # -- handing results out ---------------------------------------------------------------

    async def results(self, source: Iterable[EmbedItem] | AsyncIterable[EmbedItem]) -> AsyncIterator[EmbeddingResult]:
        """One result per item, as packs finish (in input order with ``ordered``)."""
        runtime = self.runtime
        runtime.check_open()
        loop = asyncio.get_running_loop()
        producer = loop.create_task(self._produce(source))
        runtime.producers.add(producer)
        producer_done = False
        received = 0
        in_order: InOrder[EmbeddingResult] = InOrder()
        try:
            while not producer_done or received < self._taken:
                item = await self._out.get()
                if item is None:
                    producer_done = True
                    continue
                if isinstance(item, BaseException):
                    raise item
                received += 1
                if not self.ordered:
                    self._handed_out()
                    yield item
                    continue
                for ready in in_order.arrived(item.index, item):
                    self._handed_out()
                    yield ready
            await runtime.producer_finished(producer, "the texts were still being read")
        finally:
            if self._flush_timer is not None:
                self._flush_timer.cancel()
            await runtime.end_fanout(producer, self._tasks)

    def _handed_out(self) -> None:
        self._outstanding -= 1
        if self._outstanding + _CHUNK <= self._cap:
            self._room.set()

    def _emit(self, result: EmbeddingResult) -> None:
        self.attempts.stats.record_embedding(result)
        self._out.put_nowait(result)

    # -- reading the source -----------------------------------------------------------------

    async def _produce(self, source: Iterable[EmbedItem] | AsyncIterable[EmbedItem]) -> None:
        try:
            if await self._read(source):
                self.exhausted = True
                self._seal_all()
            else:  # the engine is stopping: texts still in an open pack are not sent
                self._fail_all_open(CancelledError("stopped before it was sent"))
        except asyncio.CancelledError:
            # Closed under it (``close(drain=False)``), or the consumer left: texts still in an
            # open pack get their results here, and no new pack starts.
            self._fail_all_open(CancelledError("cancelled before it was sent"))
            raise
        except BaseException as exc:
            self._out.put_nowait(exc)
            raise
        finally:
            self._out.put_nowait(None)

    async def _read(self, source: Iterable[EmbedItem] | AsyncIterable[EmbedItem]) -> bool:
        """Take the source's items; True when it was read to the end, False on a stop."""
        if isinstance(source, AsyncIterable):
            self._lingers = True
            async for item in source:  # one at a time: a slow source's texts go out as they come
                if not await self._take([item]):
                    return False
            return True
        chunk: list[EmbedItem] = []
        for item in source:
            chunk.append(item)
            if len(chunk) >= _CHUNK:
                if not await self._take(chunk):
                    return False
                chunk = []
                await asyncio.sleep(0)  # let the packs just sealed start sending
        return not chunk or await self._take(chunk)

    def _fail_all_open(self, error: SluiceError) -> None:
        for group in self._groups.values():
            self._fail_open(group.open, error)
            group.open = Pack()

    async def _take(self, chunk: list[EmbedItem]) -> bool:
        """Admit a chunk of items once there is room; False when the engine is stopping."""
        while self._outstanding and self._outstanding + len(chunk) > self._cap:
            if self.ordered or not self._tasks:
                # Nothing in flight will free room (or the next result to hand out may sit
                # in an open pack): open packs go as they are rather than wait forever.
                self._seal_all()
            self._room.clear()
            self._waiting_for_room = True
            try:
                await self._room.wait()
            finally:
                self._waiting_for_room = False
        if self.runtime.stopping:
            return False
        first = self._taken
        self._taken += len(chunk)
        self._outstanding += len(chunk)
        self.attempts.stats.submitted += len(chunk)
        prepared: list[tuple[int, SpecGroup, str, bytes, int] | EmbeddingResult] = []
        for offset, (text, spec, scope) in enumerate(chunk):
            prepared.append(self._prepare(first + offset, text, spec, scope))
        stored: dict[str, StoredVector] = {}
        if self._store is not None:
            keys = [p[2] for p in prepared if not isinstance(p, EmbeddingResult)]
            if keys:
                stored = self._store.get_vectors(keys)
        for item in prepared:
            if isinstance(item, EmbeddingResult):
                self._emit(item)
                continue
            index, group, key, data, tokens = item
            hit = stored.get(key)
            if hit is not None and (hit.ok or (_kept(hit) and not self.attempts.retry_failed)):
                self._emit(_from_store(index, key, hit))
                continue
            entry = self._pending.get(key)
            if entry is not None:  # the same text is already on its way: it will share
                entry.indices.append(index)
                continue
            entry = self._pending[key] = Entry(key, data, tokens, index)
            self._add(group, entry)
        self._arm_flush()
        return True

    def _prepare(
        self, index: int, text: EmbedInput | SluiceError, spec: EmbedSpec, scope: str | None
    ) -> tuple[int, SpecGroup, str, bytes, int] | EmbeddingResult:
        """The text's group, key, bytes and token estimate, or a failed result saying why
        it cannot be sent."""
        if isinstance(text, SluiceError):
            return EmbeddingResult(index, error=text)
        if not isinstance(text, str):
            return self._prepare_tokens(index, text, spec, scope)
        if not text:
            return EmbeddingResult(
                index, error=InvalidRequestError(f"text {index} is empty; the embeddings API refuses empty inputs")
            )
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return EmbeddingResult(
                index, error=InvalidRequestError(f"text {index} is not valid Unicode ({exc.reason})")
            )
        group = self._group(spec)
        key = key_of(spec.prefix, data, scope)
        if group.error is not None:
            return EmbeddingResult(index, error=group.error, key=key)
        tokens = -(-len(data) // 4) if len(data) == len(text) else estimate_text_tokens(text)
        return index, group, key, data, tokens

    def _prepare_tokens(
        self, index: int, given: object, spec: EmbedSpec, scope: str | None
    ) -> tuple[int, SpecGroup, str, bytes, int] | EmbeddingResult:
        """A token array's group, key, bytes and token count (its length), as :meth:`_prepare`."""
        tokens = token_array(given)
        if tokens is None:
            kind = type(given).__name__
            what = f"text {index} is a {kind}, not a str or a token array (a non-empty list of token ids >= 0)"
            return EmbeddingResult(index, error=InvalidRequestError(what))
        group = self._group(spec)
        data = input_bytes(tokens)
        key = key_of(spec.prefix, data, scope)
        if group.error is not None:
            return EmbeddingResult(index, error=group.error, key=key)
        if group.text_only is not None:
            what = f"text {index} is a token array, and deployment {group.text_only!r} takes text only; send the text"
            return EmbeddingResult(index, error=InvalidRequestError(what), key=key)
        return index, group, key, data, len(tokens)

    def _group(self, spec: EmbedSpec) -> SpecGroup:
        group = self._groups.get(spec.prefix)
        if group is None:
            group = self._groups[spec.prefix] = SpecGroup(spec)
            self._configure(group)
        return group

    def _configure(self, group: SpecGroup) -> None:
        """Find the group's deployments and check they can embed, at their limits and price."""
        attempts = self.attempts
        try:
            route_group = group.route_group = attempts.router.group(group.spec.model)
            routes = route_group.routes
            for route in routes:
                if not isinstance(route.provider, EmbeddingProvider):
                    raise InvalidRequestError(
                        f"model {group.spec.model!r}: the {route.provider.name!r} provider of "
                        f"{route.label} has no embeddings endpoint"
                    )
            limits = [embed_limits(route.deployment) for route in routes]
            group.text_only = next((r.label for r in routes if not takes_token_arrays(r.provider, r.deployment)), None)
            pricing = attempts.spending.pricing
            if self.budget is not None and not attempts.spending.allow_unpriced:
                for route in routes:
                    if not pricing.has_price(route.deployment):
                        raise UnknownPriceError(
                            f"model {route.deployment.model!r} has no known price and this run has a budget; "
                            "set a price for its deployment, or allow unpriced models"
                        )
        except SluiceError as exc:
            group.error = exc
            return
        group.limits = EmbedLimits(
            max_inputs=min(lim.max_inputs for lim in limits),
            max_tokens=min(lim.max_tokens for lim in limits),
            max_input_tokens=min(lim.max_input_tokens for lim in limits),
        )
        group.max_inputs = min(group.limits.max_inputs, self.batch_size or group.limits.max_inputs)
        caps = [cap for route in routes for cap in (route.deployment.tpm, route.deployment.itpm) if cap is not None]
        group.token_cap = int(min([group.limits.max_tokens, self.batch_tokens or group.limits.max_tokens, *caps]))
        learnt = self.runtime.learnt_embedding_limits.get(group.spec.model)
        if learnt is not None:
            group.max_inputs = min(group.max_inputs, learnt[0])
            group.token_cap = min(group.token_cap, learnt[1])

    # -- packing -----------------------------------------------------------------------------

    def _add(self, group: SpecGroup, entry: Entry) -> None:
        if entry.tokens > group.limits.max_input_tokens:
            self._seal(group, Pack([entry]))  # it may be refused: alone, it fails alone
            return
        pack = group.open
        if pack.entries and (len(pack) >= group.max_inputs or pack.tokens + entry.tokens > group.token_cap):
            self._seal(group, pack)
            pack = group.open = Pack()
        pack.add(entry)
        if len(pack) >= group.max_inputs:
            pack.by_count = True
            self._seal(group, pack)
            group.open = Pack()

    def _seal_all(self) -> None:
        for group in self._groups.values():
            if group.open.entries:
                pack, group.open = group.open, Pack()
                self._seal(group, pack)

    def _arm_flush(self) -> None:
        """A slow (asynchronous) source must not leave texts waiting in a half-full pack: one
        that got no new text for ``_LINGER`` seconds goes as it is. A synchronous source is
        never slow that way: it is read whenever the producer runs."""
        if not self._lingers:
            return
        loop = asyncio.get_running_loop()
        self._last_take = loop.time()
        if self._flush_timer is None and any(g.open.entries for g in self._groups.values()):
            self._flush_timer = loop.call_at(self._last_take + _LINGER, self._flush)

    def _flush(self) -> None:
        self._flush_timer = None
        idle_since = self._last_take + _LINGER
        loop = asyncio.get_running_loop()
        if self._waiting_for_room:
            return  # the source is not what is slow: the producer seals when it must (and re-arms)
        if loop.time() < idle_since:
            self._flush_timer = loop.call_at(idle_since, self._flush)
            return
        self._seal_all()

    def _seal(self, group: SpecGroup, pack: Pack) -> None:
        task = asyncio.get_running_loop().create_task(self._run_pack(group, pack))
        self._tasks.add(task)
        self.runtime.track(task)
        task.add_done_callback(self._pack_done)

    def _pack_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._room.set()  # the producer looks again: with nothing in flight, open packs must go
        if not task.cancelled() and task.exception() is not None:
            self._out.put_nowait(task.exception())
        self.runtime.untrack(task)

    # -- one pack ---------------------------------------------------------------------------

    async def _run_pack(self, group: SpecGroup, pack: Pack) -> None:
        runtime = self.runtime
        try:
            async with self._slots:
                await runtime.gate.acquire(self.priority, runtime.next_seq())
                try:
                    await self._resolve(group, pack)
                finally:
                    runtime.gate.release()
        except asyncio.CancelledError:
            stopped = runtime.absorb_stop()
            self._fail_open(pack, CancelledError("stopped before it was sent" if stopped else "cancelled"))
            if not stopped:
                raise

    async def _resolve(self, group: SpecGroup, pack: Pack) -> bool:
        """Embed the pack, splitting it while a refusal may be about one of its texts.
        True when every text got its vector."""
        if pack.split and group.refused_outright and group.refusal is not None:
            self._fail_open(pack, _not_sent(group.refusal))  # a half not sent yet: not worth a request
            return False
        outcome, tally, job = await self._until_outcome(group, pack)
        if isinstance(outcome, EmbedReply):
            group.ok_seen = True
            await self._succeeded(pack, outcome, tally, job)
            return True
        if len(pack) > 1 and self._splittable(group, outcome):
            first, second = pack.halves(tally.attempts)
            first_ok = await self._resolve(group, first)  # one after the other: a refusal of the
            second_ok = await self._resolve(group, second)  # request itself is caught early
            if first_ok and second_ok and not isinstance(outcome, BudgetExhaustedError):
                self.runtime.learnt_embedding_limits[group.spec.model] = group.learn(pack)
            return first_ok and second_ok
        if pack.split and _refused(outcome):
            group.rejected_alone += 1
            group.refusal = outcome
        await self._failed(pack, outcome, tally, job)
        return False

    def _splittable(self, group: SpecGroup, error: SluiceError) -> bool:
        if isinstance(error, (BudgetExhaustedError, CapacityError)):
            return True  # too large for what is left: smaller packs may fit
        if not _refused(error):
            return False
        if _PARAMETER_WORDS.search(error.message):
            return False  # about a parameter every text shares
        return not group.refused_outright  # then stop spending requests on halves

    async def _until_outcome(self, group: SpecGroup, pack: Pack) -> tuple[EmbedReply | SluiceError, Tally, Job]:
        """The pack's attempts, by the attempt core's one loop, sending the pack as one
        embeddings request."""
        attempts = self.attempts
        tally = Tally(attempts.loop.time())  # the property: what runs the job reads the loop it left
        job = self._job(group, pack, tally)

        async def send(route: Route) -> EmbedReply:
            provider = route.provider
            assert isinstance(provider, EmbeddingProvider)
            reply = await provider.embed_batch(
                pack.texts(), route.deployment, params=group.spec.params, idempotency_key=job.idempotency_key
            )
            if len(reply.vectors) != len(pack):
                raise MalformedResponseError(
                    f"{route.deployment.label} sent {len(reply.vectors)} vectors for {len(pack)} texts",
                    maybe_billed=True,
                )
            return reply

        if attempts.tracer is not None:
            job.trace = attempts.tracer.request(job, "embeddings")
        ending: object = None
        try:
            outcome = ending = await attempts.until_outcome(job, tally, attempts.deadline(tally), send)
        except BaseException as exc:  # cancelled: its span ends too, saying so
            ending = exc
            raise
        finally:
            if job.trace is not None:
                job.trace.ended(ending, tally)
        assert isinstance(outcome, (EmbedReply, SluiceError))  # made by the pack's own send
        return outcome, tally, job

    def _job(self, group: SpecGroup, pack: Pack, tally: Tally) -> Job:
        attempts = self.attempts
        assert group.route_group is not None
        routes = group.route_group.routes
        pricing = attempts.spending.pricing
        bound = pack.bound
        worst = max((pricing.worst_case(route.deployment, bound, 0) or 0.0 for route in routes), default=0.0)
        count = len(pack)
        # The engine's retry hook is told of a Request: this one stands for the pack.
        stand_in = Request(
            model=group.spec.model,
            messages=[{"role": "user", "content": f"(embeddings: {count} texts)"}],
            id=pack.key(),
            metadata={"embeddings": count},
        )
        job = Job(
            request=stand_in,
            route=routes[0],
            tokens=pack.tokens,
            priority=self.priority,
            seq=self.runtime.next_seq(),
            submitted=tally.started,
            index=0,  # batch work: a stop sends nothing new
            key=stand_in.id,
            budget=self.budget,
            worst_cost=worst,
        )
        job.own_worst = True
        job.groups = (group.route_group,)  # never a fallback model: its vectors would not compare
        job.guarded = attempts.router.has_alternative(job.groups)
        return job

    # -- outcomes ---------------------------------------------------------------------------

    async def _succeeded(self, pack: Pack, reply: EmbedReply, tally: Tally, job: Job) -> None:
        deployment = job.route.deployment
        priced = self.attempts.spending.pricing.has_price(deployment)
        weights = [e.tokens for e in pack.entries]
        tokens = apportion(reply.usage.input_tokens, weights)
        total = sum(weights) or 1
        attempts = pack.attempts_before + tally.attempts
        results: list[EmbeddingResult] = []
        rows: list[tuple[str, StoredVector]] = []
        for entry, vector, used, weight in zip(pack.entries, reply.vectors, tokens, weights, strict=True):
            cost = tally.charged * (weight or 1) / total if priced else None
            first, *others = entry.indices
            results.append(
                EmbeddingResult(
                    first,
                    vector,
                    usage=Usage(input_tokens=used),
                    cost_usd=cost,
                    attempts=attempts,
                    deployment=deployment.label,
                    latency=tally.latency,
                    key=entry.key,
                )
            )
            for index in others:  # an identical text in the same run: paid for once
                results.append(
                    EmbeddingResult(
                        index,
                        array("f", vector),
                        cost_usd=0.0 if priced else None,
                        cached=True,
                        deployment=deployment.label,
                        key=entry.key,
                    )
                )
            rows.append(
                (entry.key, StoredVector(vector.tobytes(), used, cost, attempts, tally.latency, deployment.label))
            )
        await self._finish(pack, results, rows)

    async def _failed(self, pack: Pack, error: SluiceError, tally: Tally, job: Job) -> None:
        attempts = pack.attempts_before + tally.attempts
        priced = self.attempts.spending.pricing.has_price(job.route.deployment)
        weights = [e.tokens or 1 for e in pack.entries]
        total = sum(weights)
        keep = error.kept_on_rerun and tally.attempts > 0  # the provider rejected this text itself
        results: list[EmbeddingResult] = []
        rows: list[tuple[str, StoredVector]] = []
        record = error_record(error) if keep else None
        for entry, weight in zip(pack.entries, weights, strict=True):
            cost = tally.charged * weight / total if priced and tally.attempts else None
            for position, index in enumerate(entry.indices):
                results.append(
                    EmbeddingResult(
                        index,
                        error=error,
                        cost_usd=cost if position == 0 else None,
                        attempts=attempts,
                        deployment=job.route.deployment.label if tally.attempts else None,
                        latency=tally.latency,
                        key=entry.key,
                    )
                )
            if record is not None:
                rows.append((entry.key, StoredVector(None, 0, cost, attempts, tally.latency, None, record)))
        await self._finish(pack, results, rows)

    async def _finish(self, pack: Pack, results: list[EmbeddingResult], rows: list[tuple[str, StoredVector]]) -> None:
        """Store the outcomes (durably, before anyone is told), then hand them out."""
        for entry in pack.entries:
            entry.done = True
            if self._pending.get(entry.key) is entry:
                del self._pending[entry.key]
        try:
            if rows and self._store is not None:
                await self.attempts.durably(self._store.put_vectors(rows))
        finally:  # even when cancelled mid-write: what was received is handed out
            for result in results:
                self._emit(result)

    def _fail_open(self, pack: Pack, error: SluiceError) -> None:
        """Results for the texts of a pack that never finished (cancelled, stopped)."""
        for entry in pack.entries:
            if entry.done:
                continue
            entry.done = True
            if self._pending.get(entry.key) is entry:
                del self._pending[entry.key]
            for index in entry.indices:
                self._emit(EmbeddingResult(index, error=error, key=entry.key))


def _vector(data: bytes) -> array[float]:
    vector: array[float] = array("f")
    vector.frombytes(data)
    return vector


def _not_sent(refusal: SluiceError) -> BadRequestError:
    return BadRequestError(
        "not sent: every request of this kind was refused so far, single texts too, so the request "
        f"itself is refused ({refusal.message}); fix it, then rerun with --retry-failed"
    )


def _refused(error: SluiceError) -> bool:
    """The provider refused the request as it is (a 400/422, or a 413 for its size)."""
    return isinstance(error, BadRequestError) or (isinstance(error, ProviderError) and error.status == 413)


def _kept(stored: StoredVector) -> bool:
    return stored.error is not None and error_from_record(stored.error).kept_on_rerun


def _from_store(index: int, key: str, stored: StoredVector) -> EmbeddingResult:
    if stored.vector is not None:
        return EmbeddingResult(
            index,
            _vector(stored.vector),
            usage=Usage(input_tokens=stored.input_tokens),
            cost_usd=stored.cost_usd,
            attempts=stored.attempts,
            cached=True,
            deployment=stored.deployment,
            latency=stored.latency_s,
            key=key,
        )
    assert stored.error is not None
    return EmbeddingResult(index, error=error_from_record(stored.error), attempts=stored.attempts, cached=True, key=key)
