"""The batch tier: a provider whose ``send`` puts a request into the provider's Batch API
and returns when the batch has answered it.

The engine does everything else as for any request (the budget reserved at the tier's
price before the line joins a chunk, the durable intent, the answer stored before its
output line, retries and fallbacks), so a batch line is a request like any other. Here:

* **Chunks.** Lines gather into a chunk until it holds ``max_lines`` lines or
  ``max_bytes`` bytes, or no line has come for ``linger`` seconds; then it is submitted.
* **Submission that survives a crash** (see :mod:`sluice.store._batches`): the chunk is
  journalled before its upload, its batch created with the job's and chunk's tags and
  its id journalled at once; a chunk journalled without an id is looked up at the
  provider by its tags on the next run, so no line is submitted twice.
* **Results.** The batch is polled every ``poll_every`` seconds; when it ends, its output
  file is streamed and each answer journalled before the line's ``send`` returns, so a
  crash after the download loses nothing. A line the batch failed for a reason that is
  not the request's (a 5xx or 429 inside the batch, expiry, a cancel) raises a retryable
  error: the engine submits it again. A batch refused for the enqueued-token limit is
  submitted again when one of ours ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import _json
from .._errors import BatchIncompleteError, MalformedResponseError, ProviderError, SluiceError
from .._models import Deployment, Request, store_key
from ..providers import HttpProvider, HttpTransport, OpenAIProvider, Reply
from ._openai_api import OpenAIBatches

if TYPE_CHECKING:
    from ..store._batches import Chunk

__all__ = ["BatchJournal", "BatchSettings", "BatchTier"]

_log = logging.getLogger("sluice")
_ENDED = ("completed", "failed", "expired", "cancelled")


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How the batch tier submits and waits."""

    #: Seconds between two looks at a running batch.
    poll_every: float = 30.0
    #: Lines per batch (OpenAI takes up to 50,000): also about how many lines wait in memory.
    max_lines: int = 10_000
    #: Bytes of one batch's input file (OpenAI takes up to 200 MB).
    max_bytes: int = 190 * 1024 * 1024
    #: Seconds without a new line before a chunk that is not full is submitted.
    linger: float = 2.0

    def __post_init__(self) -> None:
        if not self.poll_every > 0:
            raise ValueError(f"poll_every must be a positive number of seconds, got {self.poll_every!r}")
        if not 1 <= self.max_lines <= 50_000:
            raise ValueError(f"batch size must be 1 to 50,000 lines (OpenAI's limit), got {self.max_lines!r}")
        if not self.linger >= 0:
            raise ValueError(f"linger must be >= 0 seconds, got {self.linger!r}")


class BatchJournal(Protocol):
    """Where the submission protocol writes (a :class:`~sluice.store.SqliteStore`)."""

    def batch_job_id(self) -> str: ...
    async def new_chunk(self, deployment: str, custom_ids: list[str]) -> int: ...
    async def note_batch(self, chunk: int, batch_id: str | None, status: str) -> None: ...
    async def save_batch_results(self, chunk: int, batch_id: str, lines: list[tuple[str, bytes]]) -> None: ...
    def open_chunks(self, deployment: str) -> list[Chunk]: ...
    def batch_result(self, custom_id: str) -> tuple[str, bytes] | None: ...


_Answer = asyncio.Future[tuple[str, bytes]]  # (batch id, the line's result line)


@dataclass(slots=True)
class _Filling:
    lines: list[bytes] = field(default_factory=list)
    waiting: dict[str, _Answer] = field(default_factory=dict)
    size: int = 0
    timer: asyncio.TimerHandle | None = None


class BatchTier:
    """The Batch API of one deployment, as a provider (see the module docstring)."""

    endpoint = "/v1/chat/completions"

    def __init__(self, deployment: Deployment, journal: BatchJournal, settings: BatchSettings) -> None:
        self._real = deployment  # as the user configured it: its URL, key and model name
        self.name = deployment.provider_name  # prices and names follow the real provider
        self._journal = journal
        self.settings = settings
        self._transport = HttpTransport()
        self._inner: HttpProvider = OpenAIProvider(self._transport)
        self._api: OpenAIBatches | None = None
        self._filling = _Filling()
        self._waiting: dict[str, _Answer] = {}  # lines of batches still running, by custom id
        self._tasks: set[asyncio.Task[None]] = set()
        self._recovery: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()  # set each time one of our batches ends (token-limit waits)
        self._job: str | None = None
        #: Batches this tier created or adopted, and what became of them (for summaries).
        self.batches: dict[str, str] = {}

    # -- the Provider protocol -----------------------------------------------------------

    def estimate_tokens(self, request: Request, deployment: Deployment) -> int:
        return self._inner.estimate_tokens(request, self._real)

    async def send(self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None) -> Reply:
        custom_id = idempotency_key or store_key(request)
        if self._recovery is None or _failed(self._recovery):  # a failed look is tried again
            self._recovery = asyncio.get_running_loop().create_task(self._recover())
        await asyncio.shield(self._recovery)  # every line waits until an earlier run's batches are known
        saved = self._journal.batch_result(custom_id)
        if saved is None:
            answer = self._waiting.get(custom_id)
            if answer is None:
                answer = self._add(custom_id, request)
            saved = await asyncio.shield(answer)  # a cancelled send leaves the batch's answer for the rerun
        return self._reply(*saved)

    async def aclose(self) -> None:
        """Stop polling (the provider's batches keep running: a rerun collects them)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._filling.timer is not None:
            self._filling.timer.cancel()
        await self._inner.aclose()
        await self._transport.aclose()

    # -- chunks ----------------------------------------------------------------------------

    def _add(self, custom_id: str, request: Request) -> _Answer:
        body = self._inner.build_body(request, self._real)
        line = _json.dumps({"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body}) + b"\n"
        filling = self._filling
        if filling.lines and (
            len(filling.lines) >= self.settings.max_lines or filling.size + len(line) > self.settings.max_bytes
        ):
            self._submit_filling()
            filling = self._filling
        answer: _Answer = asyncio.get_running_loop().create_future()
        filling.lines.append(line)
        filling.waiting[custom_id] = answer
        filling.size += len(line)
        if len(filling.lines) >= self.settings.max_lines:
            self._submit_filling()
        else:
            if filling.timer is not None:
                filling.timer.cancel()
            filling.timer = asyncio.get_running_loop().call_later(self.settings.linger, self._submit_filling)
        return answer

    def _submit_filling(self) -> None:
        filling, self._filling = self._filling, _Filling()
        if filling.timer is not None:
            filling.timer.cancel()
        if filling.lines:
            self._waiting.update(filling.waiting)
            self._spawn(self._submit(b"".join(filling.lines), filling.waiting))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, content: bytes, waiting: dict[str, _Answer]) -> None:
        try:
            chunk = await self._journal.new_chunk(self._real.label, list(waiting))
            while True:
                batch = await self._create(chunk, content)
                await self._journal.note_batch(chunk, batch["id"], "submitted")
                self.batches[batch["id"]] = str(batch.get("status"))
                final = await self._follow(batch)
                if not _token_limited(final):
                    break
                await self._journal.note_batch(chunk, None, "submitting")
                await self._wait_for_room()
            await self._collect(chunk, final, waiting)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every line hears why; the engine decides about retries
            error = exc if isinstance(exc, SluiceError) else BatchIncompleteError(f"the batch failed: {exc}")
            self._fail(waiting, error)

    async def _create(self, chunk: int, content: bytes) -> dict[str, Any]:
        api = await self._api_ready()
        file_id = await api.upload(content, f"sluice-{self._job}-{chunk}.jsonl")
        tags = {"sluice_job": str(self._job), "sluice_chunk": str(chunk)}
        try:
            return await api.create(file_id, self.endpoint, tags)
        except ProviderError as exc:
            if not exc.retryable:
                raise
            found = await api.find(tags, since=time.time() - 3600)  # it may have landed: never twice
            if found is None:
                return await api.create(file_id, self.endpoint, tags)
            return found

    async def _follow(self, batch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Poll the batch until it ends; its last state."""
        api = await self._api_ready()
        batch_id = str(batch["id"])
        while str(batch.get("status")) not in _ENDED:
            await asyncio.sleep(self.settings.poll_every)
            try:
                batch = await api.retrieve(batch_id)
            except ProviderError as exc:
                if not exc.retryable:
                    raise
                # never given up while it may be running: its lines sent again would be billed twice
                _log.warning("sluice: batch %s could not be read (%s); trying again", batch_id, exc.message)
                continue
            self.batches[batch_id] = str(batch.get("status"))
        self._ended.set()
        self._ended = asyncio.Event()
        return batch

    async def _wait_for_room(self) -> None:
        """Refused for the enqueued-token limit: wait until one of our batches ends (or a
        while, when none of ours is running: another job's may be)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ended.wait(), max(self.settings.poll_every * 4, 1.0))

    async def _collect(self, chunk: int, batch: Mapping[str, Any], waiting: dict[str, _Answer]) -> None:
        """Read an ended batch's result files: answers journalled, then handed to their lines;
        failures handed to theirs; a line with neither is told the batch did not answer it."""
        api = await self._api_ready()
        batch_id = str(batch["id"])
        status = str(batch.get("status"))
        for file_key in ("output_file_id", "error_file_id"):
            file_id = batch.get(file_key)
            if not file_id:
                continue
            answered: list[tuple[str, bytes]] = []
            async for line in api.lines(str(file_id)):
                custom_id, ok = _line_outcome(line)
                if custom_id is None:
                    continue
                if ok:
                    answered.append((custom_id, line))
                    if len(answered) >= 1000:
                        await self._hand_out(chunk, batch_id, answered, waiting)
                        answered = []
                else:
                    self._resolve(waiting, custom_id, (batch_id, line))
            await self._hand_out(chunk, batch_id, answered, waiting)
        why = _why_unanswered(batch)
        for custom_id in [c for c, answer in waiting.items() if not answer.done()]:
            self._resolve(waiting, custom_id, None, BatchIncompleteError(f"batch {batch_id} {status}: {why}"))
        await self._journal.note_batch(chunk, batch_id, "collected")

    async def _hand_out(
        self, chunk: int, batch_id: str, answered: list[tuple[str, bytes]], waiting: dict[str, _Answer]
    ) -> None:
        if not answered:
            return
        await self._journal.save_batch_results(chunk, batch_id, answered)  # durable before anyone is told
        for custom_id, line in answered:
            self._resolve(waiting, custom_id, (batch_id, line))

    def _resolve(
        self,
        waiting: dict[str, _Answer],
        custom_id: str,
        outcome: tuple[str, bytes] | None,
        error: BaseException | None = None,
    ) -> None:
        answer = waiting.get(custom_id)
        self._waiting.pop(custom_id, None)
        if answer is None or answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            assert outcome is not None
            answer.set_result(outcome)

    def _fail(self, waiting: dict[str, _Answer], error: BaseException) -> None:
        for custom_id in list(waiting):
            self._resolve(waiting, custom_id, None, error)

    # -- a line's outcome ------------------------------------------------------------------

    def _reply(self, batch_id: str, line: bytes) -> Reply:
        try:
            item = _json.loads(line)
            response = item.get("response")
            error = item.get("error")
        except (ValueError, AttributeError):
            raise MalformedResponseError(f"{self._real.label}: batch {batch_id} gave a line that is not JSON") from None
        if not isinstance(response, Mapping):
            what = error.get("message") if isinstance(error, Mapping) else "no response"
            code = error.get("code") if isinstance(error, Mapping) else None
            raise BatchIncompleteError(f"batch {batch_id} did not answer this line ({code}: {what})")
        status = int(response.get("status_code") or 0)
        body = _json.dumps(response.get("body") or {})
        request_id = response.get("request_id")
        if status != 200:
            raise self._inner.error_of(status, body, {}, request_id, None, self._real)
        reply = self._inner.reply_of(body, request_id, None, self._real)
        return Reply(reply.text, reply.usage, reply.raw, reply.finish_reason, reply.request_id, None, batch_id)

    # -- crash recovery --------------------------------------------------------------------

    async def _api_ready(self) -> OpenAIBatches:
        if self._api is None:
            self._api = OpenAIBatches(self._inner, self._real, self._transport.session())
            self._job = self._journal.batch_job_id()
        return self._api

    async def _recover(self) -> None:
        """Once, before the first line: follow the batches an earlier run submitted and did
        not collect, so their lines wait for them instead of going out again."""
        api = await self._api_ready()
        for chunk in self._journal.open_chunks(self._real.label):
            batch: Mapping[str, Any] | None = None
            if chunk.batch_id is not None:
                batch = await api.retrieve(chunk.batch_id)
            else:  # journalled, maybe uploaded and created, but its id never recorded
                tags = {"sluice_job": str(self._job), "sluice_chunk": str(chunk.id)}
                batch = await api.find(tags, since=chunk.created_at)
                if batch is None:
                    await self._journal.note_batch(chunk.id, None, "abandoned")  # never created: sent afresh
                    continue
                await self._journal.note_batch(chunk.id, str(batch["id"]), "submitted")
                _log.info("found batch %s of chunk %d at the provider (its id was not recorded)", batch["id"], chunk.id)
            loop = asyncio.get_running_loop()
            waiting: dict[str, _Answer] = {custom_id: loop.create_future() for custom_id in chunk.custom_ids}
            for answer in waiting.values():
                answer.add_done_callback(_quiet)
            self._waiting.update(waiting)
            self.batches[str(batch["id"])] = str(batch.get("status"))
            self._spawn(self._resume(chunk.id, batch, waiting))

    async def _resume(self, chunk: int, batch: Mapping[str, Any], waiting: dict[str, _Answer]) -> None:
        try:
            final = await self._follow(batch)
            await self._collect(chunk, final, waiting)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(waiting, exc if isinstance(exc, SluiceError) else BatchIncompleteError(str(exc)))

    def __repr__(self) -> str:
        return f"BatchTier({self._real.label!r})"


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


def _quiet(answer: asyncio.Future[Any]) -> None:
    """A recovered line nobody asks for again (its answer was stored): no 'never retrieved'."""
    if not answer.cancelled():
        answer.exception()


def _line_outcome(line: bytes) -> tuple[str | None, bool]:
    try:
        item = _json.loads(line)
    except ValueError:
        return None, False
    if not isinstance(item, Mapping) or not isinstance(item.get("custom_id"), str):
        return None, False
    response = item.get("response")
    ok = isinstance(response, Mapping) and response.get("status_code") == 200
    return str(item["custom_id"]), ok


def _token_limited(batch: Mapping[str, Any]) -> bool:
    if batch.get("status") != "failed":
        return False
    errors = (batch.get("errors") or {}).get("data") or []
    return any(isinstance(e, Mapping) and e.get("code") == "token_limit_exceeded" for e in errors)


def _why_unanswered(batch: Mapping[str, Any]) -> str:
    errors = (batch.get("errors") or {}).get("data") or []
    messages = [str(e.get("message")) for e in errors if isinstance(e, Mapping)]
    return "; ".join(messages[:3]) or "no result for this line"
