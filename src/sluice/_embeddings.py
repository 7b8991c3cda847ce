"""Embeddings in the engine: many texts per request, under the same limits, budgets,
retries and store as chat completions.

One embeddings request carries many inputs, so the unit the engine admits is a *pack*:
texts that share a model and parameters, packed up to the provider's per-request limits
(count and tokens, see :class:`~sluice.providers._embed.EmbedLimits`) and the
deployment's TPM. Each pack is one attempt series through the engine's own admission
(``Engine._admit``: a :class:`~sluice._slot.Slot` holding a reservation of one request
and the pack's estimated tokens, the budget hold of its worst case, the durable intent),
retried and learnt from (``Engine._after_failure``) as a chat request is.

A bad input fails alone. The embeddings API rejects a whole request for one bad input
(an empty or too long text) and does not say which one, so a pack refused with a 400
(or a 413, or for its size by the limiter or the budget) is split in two and each half
tried in turn, down to the text at fault: ``2 * log2(n)`` extra requests for one bad
text in ``n``. Two guards keep a refusal of the request itself (a wrong ``dimensions``)
from costing ``2n`` requests: a 400 that names a parameter is not split, and while no
request of that kind has succeeded, once two single texts have been refused, a failing
pack is not split further. When both halves of a refused pack succeed, the refusal was
about its size: later packs are made half as large (the limits are learnt).

Every text is stored under its own key (model, text and parameters: see
:func:`embedding_key`) as float32 bytes (``sluice.store._vectors``), so a rerun, another
job or another line with the same text embeds nothing again; a text the provider
rejected is stored with its error and kept, as a chat rejection is. The source is read
only while fewer than a few packs' worth of texts wait to be handed out, so a million
texts never sit in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import weakref
from array import array
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _json
from ._budget import Budget
from ._errors import (
    BadRequestError,
    BudgetExhaustedError,
    CancelledError,
    CapacityError,
    EngineClosedError,
    InvalidRequestError,
    MalformedResponseError,
    ProviderError,
    RateLimitError,
    SluiceError,
    StoreError,
    UnknownPriceError,
)
from ._models import Priority, Request, Usage
from ._records import error_from_record, error_record
from ._slot import Tally, stopped_note
from ._tokens import estimate_text_tokens
from .providers._embed import EmbeddingProvider, EmbedLimits, EmbedReply, embed_limits
from .store._vectors import StoredVector, VectorStore

if TYPE_CHECKING:
    from ._engine import Engine, _Job
    from ._router import Group, Route

__all__ = ["EmbedItem", "EmbedPipeline", "EmbedSpec", "EmbeddingError", "EmbeddingResult", "embed", "embedding_key"]

_KEY_VERSION = "sluice-embedding-v1"
#: Parameters that do not change a vector: left out of its key.
_NOT_IN_KEY = frozenset({"user", "encoding_format"})
#: Parameters sluice sets itself.
_OWN = frozenset({"model", "input", "encoding_format"})
#: A budget's bound on one input: every token of a byte-level BPE tokenizer covers at
#: least one byte, so a text bills at most its UTF-8 length; this covers the special
#: tokens some models add around each input (BERT-style [CLS]/[SEP], BOS/EOS).
BOUND_PER_INPUT = 8
#: Texts read from the source at a time (one store lookup each).
_CHUNK = 256
#: Packs in flight (admitted or waiting for admission) at once, per ``embed`` call.
DEFAULT_WINDOW = 8
#: Seconds a partly filled pack waits for more texts from a slow source before it goes.
_LINGER = 0.05
#: A 400 that names one of these is about the request, not an input: not split.
_PARAMETER_WORDS = re.compile(r"\b(dimensions|encoding_format)\b")


def _model_name(model: str) -> str:
    return model if "/" in model else f"openai/{model}"  # a bare name is the OpenAI-compatible one


def _key_prefix(model: str, params: Mapping[str, Any]) -> bytes:
    keyed = {k: v for k, v in params.items() if k not in _NOT_IN_KEY}
    return _json.canonical({"v": _KEY_VERSION, "model": _model_name(model), "params": keyed}) + b"\x00"


def _key(prefix: bytes, data: bytes, scope: str | None) -> str:
    digest = hashlib.sha256(prefix)
    if scope is not None:
        digest.update(scope.encode("utf-8", "surrogatepass") + b"\x1f")
    digest.update(data)
    return digest.hexdigest()[:32]


def embedding_key(model: str, text: str, params: Mapping[str, Any] | None = None, *, scope: str | None = None) -> str:
    """The store key of one text's vector: its model, text and parameters (``dimensions``...;
    not ``user`` or ``encoding_format``), versioned. ``scope`` (a line, under ``--no-cache``)
    keeps identical texts apart."""
    return _key(_key_prefix(model, params or {}), text.encode("utf-8", "surrogatepass"), scope)


@dataclass(frozen=True, slots=True)
class EmbedSpec:
    """What texts are embedded with: the model and the request's other parameters
    (``dimensions``, ``user``, a provider's own). Texts with equal specs share requests."""

    model: str
    params: Mapping[str, Any] = field(default_factory=dict)
    #: The key prefix (and group identity), computed once.
    prefix: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise InvalidRequestError(f"model must be a non-empty string, got {self.model!r}")
        if not isinstance(self.params, Mapping):
            raise InvalidRequestError(f"params must be a mapping, got {type(self.params).__name__}")
        own = sorted(_OWN & set(self.params))
        if own:
            raise InvalidRequestError(
                f"params must not set {', '.join(own)}: sluice sends the texts, the model and the wire encoding"
            )
        dimensions = self.params.get("dimensions")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise InvalidRequestError(f"dimensions must be a positive integer, got {dimensions!r}")
        object.__setattr__(self, "prefix", _key_prefix(self.model, self.params))


class EmbedItem(NamedTuple):
    """One input of :class:`EmbedPipeline`: a text (or the error that stands for a bad
    input record), what to embed it with, and its key's scope (None: shared)."""

    text: str | SluiceError
    spec: EmbedSpec
    scope: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class EmbeddingResult:
    """One text's outcome: ``vector`` (float32 ``array('f')``), or a typed ``error``.

    ``usage`` and ``cost_usd`` are the text's share of its request's (in proportion to
    its estimated tokens; the shares add up to what the provider reported); ``cached``:
    served from the store or from an identical text in the same run, nothing sent.
    """

    index: int
    vector: array[float] | None = None
    error: SluiceError | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    attempts: int = 0
    cached: bool = False
    deployment: str | None = None
    latency: float = 0.0
    key: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.vector is not None

    @property
    def dimensions(self) -> int:
        return len(self.vector) if self.vector is not None else 0

    def unwrap(self) -> array[float]:
        """The vector, or raise the error."""
        if self.vector is None:
            raise self.error or SluiceError(f"text {self.index} has no vector")
        return self.vector

    def __repr__(self) -> str:
        outcome = f"dimensions={self.dimensions}" if self.ok else f"error={self.error!r}"
        return f"EmbeddingResult(index={self.index}, {outcome}, cached={self.cached}, deployment={self.deployment!r})"


class EmbeddingError(SluiceError):
    """``embed()`` could not give every text a vector. ``results`` holds every text's
    :class:`EmbeddingResult` in input order (the vectors that were made are there, and in
    the store: a rerun embeds only the failed texts); ``failed`` the ones without."""

    kind = "embedding_failed"

    def __init__(self, message: str, results: list[EmbeddingResult]) -> None:
        super().__init__(message)
        self.results = results

    @property
    def failed(self) -> list[EmbeddingResult]:
        return [r for r in self.results if not r.ok]


# -- packs -------------------------------------------------------------------------------


class _Entry:
    """One distinct text in flight, and every input position waiting for it."""

    __slots__ = ("bound", "data", "done", "indices", "key", "tokens")

    def __init__(self, key: str, data: bytes, tokens: int, index: int) -> None:
        self.key = key
        self.data = data
        self.tokens = tokens
        self.bound = len(data) + BOUND_PER_INPUT
        self.indices = [index]
        self.done = False


class _Pack:
    """Texts sent in one request."""

    __slots__ = ("attempts_before", "by_count", "entries", "split", "tokens")

    def __init__(self, entries: list[_Entry] | None = None, *, split: bool = False, attempts_before: int = 0) -> None:
        self.entries = entries or []
        self.tokens = sum(e.tokens for e in self.entries)
        self.split = split
        self.attempts_before = attempts_before
        #: Sealed because it reached the count limit (not the token limit).
        self.by_count = False

    def add(self, entry: _Entry) -> None:
        self.entries.append(entry)
        self.tokens += entry.tokens

    @property
    def bound(self) -> int:
        return sum(e.bound for e in self.entries)

    def key(self) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for entry in self.entries:
            digest.update(entry.key.encode())
        return "embed-" + digest.hexdigest()

    def texts(self) -> list[str]:
        return [e.data.decode("utf-8") for e in self.entries]

    def halves(self, attempts: int) -> tuple[_Pack, _Pack]:
        middle = len(self.entries) // 2
        before = self.attempts_before + attempts
        return (
            _Pack(self.entries[:middle], split=True, attempts_before=before),
            _Pack(self.entries[middle:], split=True, attempts_before=before),
        )

    def __len__(self) -> int:
        return len(self.entries)


class _Group:
    """Texts of one spec: their deployments, limits (learnt as they go) and open pack."""

    __slots__ = (
        "error",
        "limits",
        "max_inputs",
        "ok_seen",
        "open",
        "refusal",
        "rejected_alone",
        "route_group",
        "spec",
        "token_cap",
    )

    def __init__(self, spec: EmbedSpec) -> None:
        self.spec = spec
        self.route_group: Group | None = None
        #: Why no text of this spec can be embedded (unknown model, no endpoint, no price).
        self.error: SluiceError | None = None
        self.limits = EmbedLimits()
        self.max_inputs = self.limits.max_inputs
        self.token_cap = self.limits.max_tokens
        self.open = _Pack()
        self.ok_seen = False
        self.rejected_alone = 0
        self.refusal: SluiceError | None = None

    @property
    def refused_outright(self) -> bool:
        """Nothing of this kind has gone through and single texts are refused too: the
        request itself is refused, not one input."""
        return not self.ok_seen and self.rejected_alone >= 2

    def learn(self, pack: _Pack) -> tuple[int, int]:
        """A pack refused whole whose halves both went through was too large: the limits
        from now on, (inputs, tokens) per request."""
        if pack.by_count or len(pack) >= self.max_inputs:
            self.max_inputs = max(1, min(self.max_inputs, len(pack) // 2))
        else:
            self.token_cap = max(1, min(self.token_cap, pack.tokens // 2))
        return self.max_inputs, self.token_cap


#: Per-request limits learnt from refusals, per engine and model: a later ``embed()`` on
#: the same engine starts from them instead of learning them again.
_LEARNT: weakref.WeakKeyDictionary[Engine, dict[str, tuple[int, int]]] = weakref.WeakKeyDictionary()


def _apportion(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, in whole numbers adding up to it
    (largest remainders first)."""
    weight = sum(weights)
    if not weights:
        return []
    if weight <= 0:
        weights, weight = [1] * len(weights), len(weights)
    exact = [total * w / weight for w in weights]
    shares = [int(x) for x in exact]
    left = total - sum(shares)
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - shares[i], reverse=True)[:left]:
        shares[i] += 1
    return shares


def _vector(data: bytes) -> array[float]:
    vector: array[float] = array("f")
    vector.frombytes(data)
    return vector


# -- the pipeline -------------------------------------------------------------------------


class EmbedPipeline:
    """Embeds a stream of :class:`EmbedItem`, packing them into requests (see the module
    docstring); :meth:`results` gives one :class:`EmbeddingResult` per item.

    ``window`` packs are in flight at once (each also takes a slot of the engine's
    ``concurrency``); ``batch_size`` and ``batch_tokens`` cap a request below what the
    deployment's limits allow.
    """

    def __init__(
        self,
        engine: Engine,
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
        self.engine = engine
        self.priority = priority
        self.budget = budget or engine.spending.budget
        self.ordered = ordered
        self.window = window
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        #: The whole source was read (not cut short by a stop).
        self.exhausted = False
        store = engine.store
        self._store: VectorStore | None = store if isinstance(store, VectorStore) else None
        self._groups: dict[bytes, _Group] = {}
        self._pending: dict[str, _Entry] = {}
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
        engine = self.engine
        if engine._closed:
            raise EngineClosedError("the engine is closed")
        loop = asyncio.get_running_loop()
        producer = loop.create_task(self._produce(source))
        engine._producers.add(producer)
        producer_done = False
        received = 0
        waiting: dict[int, EmbeddingResult] = {}
        next_index = 0
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
                waiting[item.index] = item
                while next_index in waiting:
                    ready = waiting.pop(next_index)
                    next_index += 1
                    self._handed_out()
                    yield ready
            if producer.cancelled():
                raise EngineClosedError("the engine was closed while the texts were still being read")
            await producer  # surfaces an error raised by the source itself
        finally:
            engine._producers.discard(producer)
            if self._flush_timer is not None:
                self._flush_timer.cancel()
            if not producer.done():
                producer.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(producer, *self._tasks, return_exceptions=True)

    def _handed_out(self) -> None:
        self._outstanding -= 1
        if self._outstanding + _CHUNK <= self._cap:
            self._room.set()

    def _emit(self, result: EmbeddingResult) -> None:
        _record(self.engine, result)
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
            group.open = _Pack()

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
        if self.engine._stopping:
            return False
        first = self._taken
        self._taken += len(chunk)
        self._outstanding += len(chunk)
        self.engine.stats.submitted += len(chunk)
        prepared: list[tuple[int, _Group, str, bytes, int] | EmbeddingResult] = []
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
            if hit is not None and (hit.ok or (_kept(hit) and not self.engine.retry_failed)):
                self._emit(_from_store(index, key, hit))
                continue
            entry = self._pending.get(key)
            if entry is not None:  # the same text is already on its way: it will share
                entry.indices.append(index)
                continue
            entry = self._pending[key] = _Entry(key, data, tokens, index)
            self._add(group, entry)
        self._arm_flush()
        return True

    def _prepare(
        self, index: int, text: str | SluiceError, spec: EmbedSpec, scope: str | None
    ) -> tuple[int, _Group, str, bytes, int] | EmbeddingResult:
        """The text's group, key, bytes and token estimate, or a failed result saying why
        it cannot be sent."""
        if isinstance(text, SluiceError):
            return EmbeddingResult(index, error=text)
        if not isinstance(text, str):
            return EmbeddingResult(
                index, error=InvalidRequestError(f"text {index} is a {type(text).__name__}, not a str")
            )
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
        key = _key(spec.prefix, data, scope)
        if group.error is not None:
            return EmbeddingResult(index, error=group.error, key=key)
        tokens = -(-len(data) // 4) if len(data) == len(text) else estimate_text_tokens(text)
        return index, group, key, data, tokens

    def _group(self, spec: EmbedSpec) -> _Group:
        group = self._groups.get(spec.prefix)
        if group is None:
            group = self._groups[spec.prefix] = _Group(spec)
            self._configure(group)
        return group

    def _configure(self, group: _Group) -> None:
        """Find the group's deployments and check they can embed, at their limits and price."""
        engine = self.engine
        try:
            route_group = group.route_group = engine.router.group(group.spec.model)
            routes = route_group.routes
            for route in routes:
                if not isinstance(route.provider, EmbeddingProvider):
                    raise InvalidRequestError(
                        f"model {group.spec.model!r}: the {route.provider.name!r} provider of "
                        f"{route.label} has no embeddings endpoint"
                    )
            limits = [embed_limits(route.deployment) for route in routes]
            pricing = engine.spending.pricing
            if self.budget is not None and not engine.spending.allow_unpriced:
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
        tpm = [route.deployment.tpm for route in routes if route.deployment.tpm is not None]
        group.token_cap = int(min([group.limits.max_tokens, self.batch_tokens or group.limits.max_tokens, *tpm]))
        learnt = _LEARNT.get(engine, {}).get(group.spec.model)
        if learnt is not None:
            group.max_inputs = min(group.max_inputs, learnt[0])
            group.token_cap = min(group.token_cap, learnt[1])

    # -- packing -----------------------------------------------------------------------------

    def _add(self, group: _Group, entry: _Entry) -> None:
        if entry.tokens > group.limits.max_input_tokens:
            self._seal(group, _Pack([entry]))  # it may be refused: alone, it fails alone
            return
        pack = group.open
        if pack.entries and (len(pack) >= group.max_inputs or pack.tokens + entry.tokens > group.token_cap):
            self._seal(group, pack)
            pack = group.open = _Pack()
        pack.add(entry)
        if len(pack) >= group.max_inputs:
            pack.by_count = True
            self._seal(group, pack)
            group.open = _Pack()

    def _seal_all(self) -> None:
        for group in self._groups.values():
            if group.open.entries:
                pack, group.open = group.open, _Pack()
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

    def _seal(self, group: _Group, pack: _Pack) -> None:
        task = asyncio.get_running_loop().create_task(self._run_pack(group, pack))
        self._tasks.add(task)
        self.engine._tasks.add(task)
        task.add_done_callback(self._pack_done)

    def _pack_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._room.set()  # the producer looks again: with nothing in flight, open packs must go
        engine = self.engine
        engine._tasks.discard(task)
        engine._stop_cancelled.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._out.put_nowait(task.exception())
        engine._maybe_idle()

    # -- one pack ---------------------------------------------------------------------------

    async def _run_pack(self, group: _Group, pack: _Pack) -> None:
        engine = self.engine
        try:
            async with self._slots:
                await engine._gate.acquire(self.priority, next(engine._seq))
                try:
                    await self._resolve(group, pack)
                finally:
                    engine._gate.release()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            stopped = task is not None and task in engine._stop_cancelled
            self._fail_open(pack, CancelledError("stopped before it was sent" if stopped else "cancelled"))
            if not stopped:
                raise
            assert task is not None
            engine._stop_cancelled.discard(task)
            task.uncancel()

    async def _resolve(self, group: _Group, pack: _Pack) -> bool:
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
                _LEARNT.setdefault(self.engine, {})[group.spec.model] = group.learn(pack)
            return first_ok and second_ok
        if pack.split and _refused(outcome):
            group.rejected_alone += 1
            group.refusal = outcome
        await self._failed(pack, outcome, tally, job)
        return False

    def _splittable(self, group: _Group, error: SluiceError) -> bool:
        if isinstance(error, (BudgetExhaustedError, CapacityError)):
            return True  # too large for what is left: smaller packs may fit
        if not _refused(error):
            return False
        if _PARAMETER_WORDS.search(error.message):
            return False  # about a parameter every text shares
        return not group.refused_outright  # then stop spending requests on halves

    async def _until_outcome(self, group: _Group, pack: _Pack) -> tuple[EmbedReply | SluiceError, Tally, _Job]:
        """Attempt until success, a final error, the attempt budget, the deadline or a stop
        (as ``Engine._until_outcome`` does for one request)."""
        engine = self.engine
        loop = asyncio.get_running_loop()
        tally = Tally(loop.time())
        job = self._job(group, pack, tally)
        deadline = tally.started + engine.retry.deadline if engine.retry.deadline is not None else None
        try:
            while True:
                if engine._stopping:  # not sent (again): a rerun does it
                    return CancelledError(stopped_note(tally)), tally, job
                outcome = await self._attempt(group, pack, job, tally, deadline)
                if isinstance(outcome, EmbedReply) or not tally.sent_this_time:
                    return outcome, tally, job  # an answer, or final: budget, capacity, deadline, store
                delay = engine._after_failure(job, outcome, tally.attempts, deadline)
                if delay is None:
                    return outcome, tally, job
                if delay > 0 and not isinstance(outcome, RateLimitError):  # a 429's pause is the limiter's
                    with engine._waiting_while(True):
                        await asyncio.sleep(delay)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task not in engine._stop_cancelled:
                raise
            engine._stop_cancelled.discard(task)  # stop() wants results, not a cancelled task
            task.uncancel()
            return CancelledError(stopped_note(tally)), tally, job

    def _job(self, group: _Group, pack: _Pack, tally: Tally) -> _Job:
        from ._engine import _Job

        engine = self.engine
        assert group.route_group is not None
        routes = group.route_group.routes
        pricing = engine.spending.pricing
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
        job = _Job(
            request=stand_in,
            route=routes[0],
            tokens=pack.tokens,
            priority=self.priority,
            seq=next(engine._seq),
            submitted=tally.started,
            index=0,  # batch work: a stop sends nothing new
            key=stand_in.id,
            budget=self.budget,
            worst_cost=worst,
        )
        job.own_worst = True
        job.groups = (group.route_group,)  # never a fallback model: its vectors would not compare
        job.guarded = engine.router.has_alternative(job.groups)
        return job

    async def _attempt(
        self, group: _Group, pack: _Pack, job: _Job, tally: Tally, deadline: float | None
    ) -> EmbedReply | SluiceError:
        """One attempt, made by ``Engine._attempt`` (admission, the provider, the slot
        settled whatever happens), sending the pack as one embeddings request."""

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

        outcome = await self.engine._attempt(job, tally, deadline, send)
        assert isinstance(outcome, (EmbedReply, SluiceError))  # made by the pack's own send
        return outcome

    # -- outcomes ---------------------------------------------------------------------------

    async def _succeeded(self, pack: _Pack, reply: EmbedReply, tally: Tally, job: _Job) -> None:
        deployment = job.route.deployment
        priced = self.engine.spending.pricing.has_price(deployment)
        weights = [e.tokens for e in pack.entries]
        tokens = _apportion(reply.usage.input_tokens, weights)
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

    async def _failed(self, pack: _Pack, error: SluiceError, tally: Tally, job: _Job) -> None:
        attempts = pack.attempts_before + tally.attempts
        priced = self.engine.spending.pricing.has_price(job.route.deployment)
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

    async def _finish(self, pack: _Pack, results: list[EmbeddingResult], rows: list[tuple[str, StoredVector]]) -> None:
        """Store the outcomes (durably, before anyone is told), then hand them out."""
        for entry in pack.entries:
            entry.done = True
            if self._pending.get(entry.key) is entry:
                del self._pending[entry.key]
        try:
            if rows and self._store is not None:
                await self._store.put_vectors(rows)
        except StoreError as exc:
            self.engine._store_failed(exc)  # the vectors still go out: the output may keep them
        finally:  # even when cancelled mid-write: what was received is handed out
            for result in results:
                self._emit(result)

    def _fail_open(self, pack: _Pack, error: SluiceError) -> None:
        """Results for the texts of a pack that never finished (cancelled, stopped)."""
        for entry in pack.entries:
            if entry.done:
                continue
            entry.done = True
            if self._pending.get(entry.key) is entry:
                del self._pending[entry.key]
            for index in entry.indices:
                self._emit(EmbeddingResult(index, error=error, key=entry.key))


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


def _record(engine: Engine, result: EmbeddingResult) -> None:
    """Count a text's outcome in the engine's stats, as ``Stats.record`` counts a Result."""
    stats = engine.stats
    if result.cached:
        stats.cached += 1
    if result.ok:
        stats.succeeded += 1
        if not result.cached:
            stats.input_tokens += result.usage.input_tokens
            stats.latency.add(result.latency)
            if result.cost_usd is None:
                stats.unpriced += 1
    elif isinstance(result.error, CancelledError):
        stats.cancelled += 1
    else:
        stats.failed += 1
        stats.errors[result.error.kind if result.error is not None else "error"] += 1


# -- the engine's methods --------------------------------------------------------------------


def _items(
    texts: Iterable[str] | AsyncIterable[str], spec: EmbedSpec
) -> Iterable[EmbedItem] | AsyncIterable[EmbedItem]:
    if isinstance(texts, AsyncIterable):

        async def items() -> AsyncIterator[EmbedItem]:
            async for text in texts:
                yield EmbedItem(text, spec)

        return items()
    return (EmbedItem(text, spec) for text in texts)


def _spec(model: str, dimensions: int | None, params: Mapping[str, Any] | None) -> EmbedSpec:
    merged = dict(params or {})
    if dimensions is not None:
        merged["dimensions"] = dimensions
    return EmbedSpec(model, merged)


def embed_map(
    engine: Engine,
    texts: Iterable[str] | AsyncIterable[str],
    *,
    model: str,
    dimensions: int | None = None,
    params: Mapping[str, Any] | None = None,
    ordered: bool = False,
    priority: int = Priority.NORMAL,
    budget: Budget | None = None,
    window: int = DEFAULT_WINDOW,
    batch_size: int | None = None,
    batch_tokens: int | None = None,
) -> AsyncIterator[EmbeddingResult]:
    """See :meth:`Engine.embed_map`."""
    if isinstance(texts, str):
        texts = [texts]
    pipeline = EmbedPipeline(
        engine,
        priority=priority,
        budget=budget,
        ordered=ordered,
        window=window,
        batch_size=batch_size,
        batch_tokens=batch_tokens,
    )
    return pipeline.results(_items(texts, _spec(model, dimensions, params)))


async def embed(
    engine: Engine,
    texts: Iterable[str] | AsyncIterable[str],
    *,
    model: str,
    dimensions: int | None = None,
    params: Mapping[str, Any] | None = None,
    priority: int = Priority.NORMAL,
    budget: Budget | None = None,
    window: int = DEFAULT_WINDOW,
    batch_size: int | None = None,
    batch_tokens: int | None = None,
) -> list[array[float]]:
    """See :meth:`Engine.embed`."""
    if isinstance(texts, str):
        texts = [texts]
    pipeline = EmbedPipeline(
        engine, priority=priority, budget=budget, window=window, batch_size=batch_size, batch_tokens=batch_tokens
    )
    results: list[EmbeddingResult | None] = []
    async for result in pipeline.results(_items(texts, _spec(model, dimensions, params))):
        if result.index >= len(results):
            results.extend(itertools.repeat(None, result.index + 1 - len(results)))
        results[result.index] = result
    done = [
        r if r is not None else EmbeddingResult(i, error=CancelledError("never read")) for i, r in enumerate(results)
    ]
    failed = [r for r in done if not r.ok]
    if failed or not pipeline.exhausted:
        first = failed[0] if failed else None
        what = f"{len(failed):,} of {len(done):,} texts could not be embedded"
        if first is not None and first.error is not None:
            what += f" (first: text {first.index}: {first.error.message})"
        if not pipeline.exhausted:
            what += f"; the engine stopped after reading {len(done):,} texts"
        raise EmbeddingError(
            what + "; the vectors made are in .results, and in the store: a rerun embeds only the rest", done
        )
    return [r.unwrap() for r in done]
