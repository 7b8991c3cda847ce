"""One batch at work: its lines through the app's engine, each result durable as it lands,
then the output and error files.

How it resumes and never pays twice for a finished line: each line's outcome is written
to the batch's own :class:`~sluice.store.SqliteStore` (``STATE_DIR/batches/<id>.db``,
committed by its writer thread, off the loop) as soon as it comes back; a run started
again (after a restart, ``kill -9`` included) skips every line that has one and sends the
rest. What a crash can cost is the lines at the provider when it happened: sent again,
possibly billed twice. When the app's engine has a store of its own (``Engine(store=...)``,
as ``sluice serve`` builds it), that is narrowed further: the engine notes each attempt
before it is sent and commits each answer before handing it over, so an answer that
landed but was not yet recorded here is served from the engine's store on the rerun.
Requests carry ``<batch id>/<custom_id>`` as their id, so that store never serves one
batch's line from another batch's answer.

Lines run at ``Priority.BATCH`` (interactive requests overtake them) under the client's
budget (a chat batch's lines under its batches' part of it, whose money a restart counts
from the engine store's charges: see ``core._batch_money``). Cancelling, and stopping the
server, stop feeding new lines; what the engine had already taken finishes and is
recorded. Chat lines are handed to the engine through a :class:`_Window` sized to the
capacity free right now, so that is about the lines at the provider; an embeddings batch
hands texts to the packing pipeline, which reads ahead.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import logging
import sys
import time
from array import array
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._embeddings import EmbedItem, EmbedPipeline, EmbedSpec
from ..._errors import CancelledError, CapacityError, InvalidInputError, SluiceError, StoreError
from ..._limits import Grant, LocalLimiter
from ..._models import Priority, Request, Result, Usage
from ...batch._embed_job import EmbedLine
from ...batch._inputs import InputItem, read_inputs
from ...store import SqliteStore
from ..files._ctx import CHAT, EMBEDDINGS, MESSAGES, RESPONSES, BatchContext
from ._check import check_batch_lines
from ._output import line_key, write_outputs
from ._shapes import Scrubber, batch_usage

if TYPE_CHECKING:
    from ..._budget import Budget
    from ..._engine import Engine
    from ..core._batch_money import BatchMoney
    from ..core._keys import ClientLike

__all__ = ["CHAT", "EMBEDDINGS", "MESSAGES", "RESPONSES", "BatchRun", "ModelNotFoundError", "public"]

_log = logging.getLogger("sluice.serve")

_SAVE_EVERY = 1.0  # seconds between saves of the live counts
#: The endpoint a chat line is for, by the API its body is written for (``Request.native``).
_NATIVE_ENDPOINTS = {None: CHAT, "responses": RESPONSES, "anthropic": MESSAGES}


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch object as OpenAI sends it (without sluice's own notes, ``_``-prefixed)."""
    return {k: v for k, v in batch.items() if not k.startswith("_")}


class BatchRun:
    """Runs one batch from wherever it is (validating, in progress, finalizing, cancelling)
    to the end, or until the server stops (then the next start resumes it)."""

    def __init__(
        self,
        ctx: BatchContext,
        engine: Callable[[], Engine],
        owner: ClientLike,
        batch: dict[str, Any],
    ) -> None:
        self.ctx = ctx
        self._engine = engine
        self.owner = owner
        self.client = owner.name
        self.batch = batch
        self.budget = owner.budget
        self.task: asyncio.Task[None] | None = None
        #: The server is stopping: feed nothing new, leave the batch to the next start.
        self.stopping = False
        self._exhausted = False
        self._unfinished = 0
        self._store_failed = False
        self._last_save = 0.0
        #: Set on cancel or stop: wakes a line waiting for its client's rpm/tpm.
        self._halt = asyncio.Event()

    @property
    def id(self) -> str:
        return str(self.batch["id"])

    @property
    def lines_path(self) -> Path:
        return self.ctx.state_dir / "batches" / f"{self.id}.db"

    # -- control -------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.get_running_loop().create_task(self._guarded(), name=f"sluice batch {self.id}")
        return self.task

    def cancel(self) -> None:
        """Cancelling: nothing new is sent; what is in flight finishes; then ``cancelled``."""
        if self.batch["status"] in ("validating", "in_progress"):
            self._set("cancelling", cancelling_at=_now())
        self._halt.set()

    def stop(self) -> None:
        self.stopping = True
        self._halt.set()

    async def _client_quota(self, limiter: LocalLimiter, tokens: int) -> Grant | None:
        """Wait for the client's rpm/tpm to let a line go; None if the batch halts first."""
        acquiring = asyncio.ensure_future(limiter.acquire(tokens, Priority.BATCH))
        halted = asyncio.ensure_future(self._halt.wait())
        try:
            await asyncio.wait({acquiring, halted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halted.cancel()
            if not acquiring.done():
                acquiring.cancel()
        await asyncio.wait({acquiring})  # its cancellation done (never raises for it)
        if acquiring.cancelled():
            return None
        grant = acquiring.result()  # CapacityError: a line too large for the client's tpm
        if self._halted():
            grant.refund()
            return None
        return grant

    def _halted(self) -> bool:
        if self.stopping or self._store_failed or self.batch["status"] == "cancelling":
            return True
        if time.time() >= self.batch["expires_at"]:
            self.batch["_final"] = "expired"
            return True
        return False

    def _set(self, status: str, **fields: Any) -> None:
        self.batch["status"] = status
        self.batch.update(fields)
        self._save()

    def _save(self) -> None:
        self._last_save = time.monotonic()
        self.ctx.db.save_batch(self.client, self.batch)

    # -- the run ---------------------------------------------------------------------------

    async def _guarded(self) -> None:
        try:
            await self._run()
        except (SluiceError, OSError) as exc:  # the state cannot be written: the next start resumes
            message = exc.message if isinstance(exc, SluiceError) else str(exc)
            _log.warning(
                "sluice serve: batch %s stopped: %s; it resumes when the server starts again", self.id, message
            )
        except Exception as exc:
            _log.exception("sluice serve: batch %s failed", self.id)
            self.fail("internal_error", f"sluice could not run this batch ({type(exc).__name__}); see the server log")

    async def _run(self) -> None:
        if self.batch["status"] == "validating" and not await self._validate():
            return
        if self.batch["status"] in ("in_progress", "cancelling") and not await self._execute():
            return  # the server is stopping, or the state failed: resumed at the next start
        await self._finalize()

    async def _validate(self) -> bool:
        """Every line checked as OpenAI checks a batch's file (see ``_check``): one
        that is not a request fails the batch before anything is sent."""
        row = self.ctx.db.file(self.client, self.batch["input_file_id"])
        path = self.ctx.file_path(self.batch["input_file_id"])
        if row is None or not path.is_file():
            self.fail("invalid_file", f"the input file {self.batch['input_file_id']} no longer exists")
            return False
        limits = self.ctx.limits
        check = await asyncio.to_thread(
            check_batch_lines,
            path,
            self.batch["endpoint"],
            max_requests=limits.requests_for(self.batch["endpoint"]),
            max_line_bytes=limits.max_line_bytes,
            max_values=limits.max_values,
        )
        if check.errors:
            self._set("failed", failed_at=_now(), errors={"object": "list", "data": check.data()})
            return False
        counts = {"total": check.requests, "completed": 0, "failed": 0}
        self._set("in_progress", in_progress_at=_now(), request_counts=counts, model=check.model)
        return True

    def fail(self, code: str, message: str) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": message, "param": None, "line": None}]}
        self._set("failed", failed_at=_now(), errors=errors)

    async def _execute(self) -> bool:
        """Send every line not done yet; True when the batch is ready to finalize."""
        self.batch["request_counts"].update(completed=0, failed=0)  # recounted from the store
        store = SqliteStore(self.lines_path)
        try:
            if self.batch["endpoint"] == EMBEDDINGS:
                await self._embeddings(store)
            else:
                await self._chats(store)
        finally:
            store.close()
        self._save()
        if self._store_failed or self.stopping:
            return False
        if self.batch["status"] == "cancelling" or self.batch.get("_final") == "expired":
            return True
        return self._exhausted and not self._unfinished

    def _problem(self, item: InputItem, seen: set[str]) -> InvalidInputError | None:
        """Why a line cannot run in this batch, or None. Checked as OpenAI checks lines."""
        custom_id = item.custom_id
        if custom_id is not None:
            if custom_id in seen:
                return InvalidInputError(
                    f"line {item.line}: custom_id {custom_id!r} is used by an earlier line; each must be unique",
                    line=item.line,
                )
            seen.add(custom_id)
        if item.error is not None:
            return item.error
        if custom_id is None:
            return InvalidInputError(
                f"line {item.line}: not a Batch API request; each line needs 'custom_id', 'method', 'url' and 'body'",
                line=item.line,
            )
        endpoint = self.batch["endpoint"]
        url = _endpoint_of(item)
        if url != endpoint:
            return InvalidInputError(
                f"line {item.line}: its url {url} does not match the batch's endpoint {endpoint}", line=item.line
            )
        return None

    def _with_model(self, item: InputItem) -> InputItem | InvalidInputError:
        """The line with the engine's name for its model, or why the client may not use it."""
        resolve = self.ctx.resolve_model
        if resolve is None:
            return item
        asked = item.request.model if item.request is not None else item.embedding.model if item.embedding else ""
        name = resolve(self.owner, asked)
        if name is None:
            message = f"line {item.line}: the model `{asked}` does not exist or you do not have access to it"
            return ModelNotFoundError(message, line=item.line)
        if item.request is not None:
            return dataclasses.replace(item, request=dataclasses.replace(item.request, model=name))
        assert item.embedding is not None
        return dataclasses.replace(item, embedding=dataclasses.replace(item.embedding, model=name))

    async def _lines(self, store: SqliteStore, window: _Window | None = None) -> AsyncIterator[InputItem]:
        """The input's lines still to run; done ones are counted, bad ones recorded. With a
        ``window``, a line is handed on only when it has room."""
        seen: set[str] = set()
        path = self.ctx.file_path(self.batch["input_file_id"])
        for item in read_inputs(path, self.ctx.inputs):
            if self._halted():
                return
            stored = store.get(line_key(item.line))
            if stored is not None:
                if item.custom_id is not None:
                    seen.add(item.custom_id)
                self._count(stored.ok)
                continue
            problem = self._problem(item, seen)
            checked = self._with_model(item) if problem is None else problem
            if not isinstance(checked, InputItem):
                await self._record(store, item.line, Result(None, error=checked))
                continue
            item = checked
            if window is not None:
                await window.acquire()
                if self._halted():
                    return
            yield item
        self._exhausted = True

    async def _record(self, store: SqliteStore, line: int, result: Result) -> None:
        try:
            await store.put(line_key(line), result)
        except StoreError as exc:
            if not self._store_failed:
                self._store_failed = True
                _log.error("sluice serve: batch %s cannot record its results: %s", self.id, exc.message)
            return
        self._count(result.ok)

    def _count(self, ok: bool) -> None:
        counts = self.batch["request_counts"]
        counts["completed" if ok else "failed"] += 1
        if time.monotonic() - self._last_save >= _SAVE_EVERY:
            self._save()

    async def _chats(self, store: SqliteStore) -> None:
        engine = self._engine()
        lines: dict[int, int] = {}
        numbering = itertools.count()
        # Lines bound for a provider's Batch API wait there, not at a rate limit: hand them all
        # over at once, or they would go in batches of 8, 16, 32... one after another.
        provider_batches = any(d.tier == "batch" for d in engine.deployments)
        window = _Window(size=engine.concurrency if provider_batches else 8, hi=engine.concurrency)

        # The client's own rpm/tpm holds for its batch lines as for its interactive requests
        # (a batch must not be a way around them): a line waits for it before the engine
        # takes it, and its quota is trued up to the usage once it is answered.
        limiter: LocalLimiter | None = getattr(self.owner, "limiter", None)
        grants: dict[int, Grant] = {}

        async def source() -> AsyncIterator[Request]:
            async for item in self._lines(store, window):
                assert item.request is not None
                index = next(numbering)
                lines[index] = item.line
                request = dataclasses.replace(item.request, id=f"{self.id}/{item.custom_id}")
                if limiter is not None:
                    tokens = _estimate(engine, request)
                    try:
                        waited = await self._client_quota(limiter, tokens)
                    except CapacityError:
                        window.release(0.0)
                        del lines[index]
                        message = f"line {item.line}: its ~{tokens} tokens exceed this client's tpm"
                        await self._record(
                            store, item.line, Result(None, error=InvalidInputError(message, line=item.line))
                        )
                        continue
                    except BaseException:
                        window.release(0.0)
                        raise
                    if waited is None:  # cancelled or stopping: this line is not sent
                        del lines[index]
                        return
                    waited.done()  # a quota per minute, not of requests in flight
                    grants[index] = waited
                yield request

        async for result in engine.map(source(), priority=Priority.BATCH, budget=self._chat_budget(engine)):
            assert result.index is not None
            window.release(result.timings.queued + result.timings.limiter_wait)
            grant = grants.pop(result.index, None)
            if grant is not None:
                if not result.attempts or result.cached:
                    grant.refund()  # never sent: not the client's to count
                elif result.usage.total_tokens:
                    grant.reconcile(result.usage.total_tokens)
            line = lines.pop(result.index)
            if isinstance(result.error, CancelledError):  # stopped before it ran: a later run does it
                self._unfinished += 1
                continue
            await self._record(store, line, result)

    def _chat_budget(self, engine: Engine) -> Budget | None:
        """The budget the lines run under: with an engine store, the client's batches'
        (their money is the store's charges, counted back at a restart: ``core._batch_money``),
        noted before the first line goes; else the client's own."""
        money: BatchMoney | None = getattr(self.owner, "batches", None)
        if money is None or engine.store is None:
            return self.budget
        money.note(self.id)
        return money.budget

    async def _embeddings(self, store: SqliteStore) -> None:
        engine = self._engine()
        owners: dict[int, tuple[_EmbedLine, int]] = {}
        numbering = itertools.count()

        async def source() -> AsyncIterator[EmbedItem]:
            async for item in self._lines(store):
                assert item.embedding is not None
                try:
                    spec = EmbedSpec(item.embedding.model, item.embedding.params)
                except SluiceError as exc:
                    error = InvalidInputError(f"line {item.line}: {exc.message}", line=item.line)
                    await self._record(store, item.line, Result(None, error=error))
                    continue
                line = _EmbedLine(item)
                for position, text in enumerate(item.embedding.texts):
                    owners[next(numbering)] = (line, position)
                    yield EmbedItem(text, spec, self.id)

        pipeline = EmbedPipeline(engine.attempts, priority=Priority.BATCH, budget=self.budget)
        async for result in pipeline.results(source()):
            line, position = owners.pop(result.index)
            if not line.add(position, result):
                continue
            if line.cancelled:
                self._unfinished += 1
                continue
            await self._record(store, line.item.line, line.result())

    # -- the end ---------------------------------------------------------------------------

    async def _finalize(self) -> None:
        final = self.batch.get("_final") or ("cancelled" if self.batch["status"] == "cancelling" else "completed")
        self.batch["_final"] = final
        if final == "completed" and self.batch["status"] != "finalizing":
            self._set("finalizing", finalizing_at=_now())
        else:
            self._save()
        scrub = Scrubber(d.base_url for d in self._engine().deployments)
        made = await asyncio.to_thread(write_outputs, self.ctx, self.client, self.batch, self.lines_path, final, scrub)
        stamp = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}[final]
        self.batch["request_counts"].update(completed=made.completed, failed=made.failed)
        self._set(
            final,
            output_file_id=made.output,
            error_file_id=made.errors,
            usage=batch_usage(made.usage),
            **{stamp: _now()},
        )
        await asyncio.to_thread(self._drop_lines)

    def _drop_lines(self) -> None:
        """The per-line results are in the output and error files now."""
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.lines_path}{suffix}").unlink()


class ModelNotFoundError(InvalidInputError):
    """A line names a model this server does not serve to its client (OpenAI's code)."""

    kind = "model_not_found"


def _endpoint_of(item: InputItem) -> str:
    """The endpoint a line's request is for: embeddings, or chat by the API it is written in."""
    if item.embedding is not None or item.request is None:
        return EMBEDDINGS
    native = item.request.native
    return _NATIVE_ENDPOINTS.get(native.api if native is not None else None, CHAT)


def _estimate(engine: Engine, request: Request) -> int:
    """A line's tokens as its first deployment counts them (for the client's tpm)."""
    for group in engine.router.chain(request.model)[:1]:
        for route in group.routes[:1]:
            return int(route.provider.estimate_tokens(request, route.deployment))
    return 0


class _Window:
    """How many of a batch's lines the engine may hold at once, sized to what its
    deployments take right now: grown by one per line that found capacity free, shrunk
    by one per line that had to wait for it (AIMD's additive half, both ways).

    Why: ``Engine.map`` takes items as long as its concurrency gate has room (256 by
    default), and an item it took cannot be withdrawn without stopping every caller of the
    engine. Handing lines over only as they can be sent keeps a cancel (or a server stop)
    from sending more than about the lines at the provider; it also keeps batch work from
    filling the engine's gate ahead of interactive requests.
    """

    __slots__ = ("_room", "hi", "lo", "size", "taken")

    #: A line that waited longer than this for the gate or a limiter found no free capacity.
    WAITED = 0.05

    def __init__(self, size: int = 8, lo: int = 4, hi: int = 4096) -> None:
        self.lo = lo
        self.hi = max(lo, hi)
        self.size = min(max(size, lo), self.hi)
        self.taken = 0
        self._room = asyncio.Event()
        self._room.set()

    async def acquire(self) -> None:
        while self.taken >= self.size:
            self._room.clear()
            await self._room.wait()
        self.taken += 1

    def release(self, waited: float) -> None:
        self.taken = max(0, self.taken - 1)
        if waited > self.WAITED:
            self.size = max(self.lo, self.size - 1)
        else:
            self.size = min(self.hi, self.size + 1)
        if self.taken < self.size:
            self._room.set()


class _EmbedLine(EmbedLine):
    """One embeddings line's texts coming back, until its body can be made."""

    __slots__ = ()

    def __init__(self, item: InputItem) -> None:
        assert item.embedding is not None
        super().__init__(item, len(item.embedding.texts))

    def result(self) -> Result:
        embedding = self.item.embedding
        assert embedding is not None
        usage = Usage(input_tokens=self.tokens)
        if self.error is not None or any(v is None for v in self.vectors):
            error = self.error or SluiceError("no vector came back for one of its inputs")
            return Result(None, error=error, usage=usage, attempts=self.attempts, cost_usd=self.cost)
        encode = _base64 if embedding.base64 else _numbers
        model = embedding.model.partition("/")[2] if "/" in embedding.model else embedding.model
        body = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encode(v)}
                for i, v in enumerate(self.vectors)
                if v is not None
            ],
            "model": model,
            "usage": {"prompt_tokens": self.tokens, "total_tokens": self.tokens},
        }
        return Result(
            None, raw=body, usage=usage, attempts=self.attempts, deployment=self.deployment, cost_usd=self.cost
        )


def _numbers(vector: array[float]) -> list[float]:
    return vector.tolist()


def _base64(vector: array[float]) -> str:
    """As OpenAI sends ``encoding_format: "base64"``: float32 little-endian bytes."""
    if sys.byteorder != "little":  # pragma: no cover
        vector = array("f", vector)
        vector.byteswap()
    return base64.b64encode(vector.tobytes()).decode()


def _now() -> int:
    return int(time.time())
