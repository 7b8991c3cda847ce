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
* **Results.** The batch is polled every ``poll_every`` seconds at most, sooner when its
  progress says it is about to end (:mod:`._polling`); when it ends, its output
  file is streamed and each answer journalled before the line's ``send`` returns, so a
  crash after the download loses nothing. A line the batch failed for a reason that is
  not the request's (a 5xx or 429 inside the batch, expiry, a cancel) raises a retryable
  error: the engine submits it again. A batch refused for the enqueued-token limit is
  submitted again when one of ours ends.
* **Parked lines' money** (see ``ParkedError``): when a batch's results are journalled,
  each parked line's budget hold is settled at once with what the batch billed for it
  (``on_settled``), rather than when the line comes back into the engine.
* **The deadline** (``--tier auto``): :mod:`._deadline`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._errors import (
    BatchIncompleteError,
    BatchResultsLostError,
    ConfigError,
    FatalProviderError,
    MovedToSyncError,
    NotFoundError,
    ParkedError,
    ProviderError,
    SluiceError,
)
from .._models import Deployment, Request, Usage, store_key
from .._readback import item_reply, plain_reply
from ..providers import AnthropicProvider, HttpProvider, HttpTransport, OpenAIProvider, Reply
from ._anthropic_api import AnthropicBatches
from ._api import BatchAPI
from ._deadline import DeadlinePlan, moved_note
from ._gathering import Filling, Gathering
from ._openai_api import OpenAIBatches
from ._polling import Polls
from ._recovery import Recovery
from ._settings import BatchJournal, BatchSettings

if TYPE_CHECKING:
    from ..store._batches import Chunk

__all__ = ["BatchTier"]

_log = logging.getLogger("sluice")

#: A batch's end, in either API's words.
_ENDED = ("completed", "failed", "expired", "cancelled", "ended")
#: Seconds between looks at a batch once the deadline has cancelled it.
_HURRIED = 1.0
#: Refusals for the enqueued-token limit in a row before a chunk is given up.
_MAX_REFUSALS = 8
#: Batches that may leave a parked line unanswered (5xx inside, expiry) before it fails.
_MAX_SUBMISSIONS = 5

#: The Batch API and the provider (its bodies, replies and errors) of each provider kind.
_APIS: dict[str, tuple[type[HttpProvider], type[BatchAPI]]] = {
    "openai": (OpenAIProvider, OpenAIBatches),
    "anthropic": (AnthropicProvider, AnthropicBatches),
}


_Answer = asyncio.Future[tuple[str, bytes]]  # (batch id, the line's result line)


class BatchTier(DeadlinePlan, Recovery):
    """The Batch API of one deployment, as a provider (see the module docstring)."""

    def __init__(self, deployment: Deployment, journal: BatchJournal, settings: BatchSettings) -> None:
        kind = _APIS.get(deployment.provider_name)
        if kind is None:
            raise ConfigError(
                f"deployment {deployment.label!r}: the batch tier speaks OpenAI's Batch API (openai/..., or any "
                "server with base_url that speaks it) and Anthropic's Message Batches, "
                f"not {deployment.provider_name!r}"
            )
        self._real = deployment  # as the user configured it: its URL, key and model name
        self.name = deployment.provider_name  # prices and names follow the real provider
        self._journal = journal
        self.settings = settings
        self._transport = HttpTransport()
        self._inner: HttpProvider = kind[0](self._transport)
        self._api_kind = kind[1]
        self._api: BatchAPI | None = None
        self._max_lines = min(settings.max_lines, kind[1].max_lines)
        self._max_bytes = min(settings.max_bytes, kind[1].max_bytes)
        self._gathering = Gathering()
        self._waiting: dict[str, _Answer] = {}  # lines of batches still running, by custom id
        self._tasks: set[asyncio.Task[None]] = set()
        self._recovery: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()  # set each time one of our batches ends (token-limit waits)
        self._job: str | None = None
        #: Batches this tier created or adopted, and what became of them (for summaries).
        self.batches: dict[str, str] = {}
        #: ``--tier auto``: the deadline needs the rest synchronously (batches cancelled).
        self.moved = False
        self._hurry = asyncio.Event()  # set when it moves: cancelled batches are looked at often
        #: Lines a batch answered after they had been moved to synchronous requests (by
        #: their custom id): answered twice where the synchronous request was answered too.
        self.answered_after_move: set[str] = set()
        #: Told of each parked line whose batch is over (custom id, the usage its batch
        #: billed; None: it did not answer it): its budget hold is settled then (see
        #: ``Spending.settle_parked``). None: the hold is settled when the line is asked again.
        self.on_settled: Callable[[str, Usage | None], None] | None = None
        self._planner: asyncio.Task[None] | None = None
        #: Each created batch's lines, while it is followed; and the chunks being followed.
        self._followed: dict[str, dict[str, _Answer]] = {}
        self._following: set[int] = set()
        #: Parking: each created batch's chunk, and the lines its batches left unanswered
        #: (how many batches did, and why the last one did) or failed for good.
        self.parks = settings.on_ended is not None
        #: Chunks collected by this run (a failure journalled by an earlier run is not answered again).
        self._collected: set[int] = set()
        self._chunk_of: dict[str, int] = {}
        self._unanswered: dict[str, tuple[int, SluiceError]] = {}
        #: Parking under ``--tier auto``: chunks whose cancelled batch had not ended by the
        #: last moment (their lines go as possibly billed there too), and the lines moved so.
        self._running_at_move: set[int] = set()
        self._moved_ids: set[str] = set()
        #: Lines whose batch answers are being journalled: a line asked again meanwhile waits
        #: and reads its answer instead of finding none and being sent again (billed twice).
        self._saving: dict[str, asyncio.Future[None]] = {}

    # -- the Provider protocol -----------------------------------------------------------

    def estimate_tokens(self, request: Request, deployment: Deployment) -> int:
        return self._inner.estimate_tokens(request, self._real)

    def check(self, deployment: Deployment) -> None:
        """Raise ConfigError now if the real deployment cannot be called (no key)."""
        self._inner.check(self._real)

    async def send(self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None) -> Reply:
        custom_id = idempotency_key or store_key(request)
        if self._recovery is None or _failed(self._recovery):  # a failed look is tried again
            self._recovery = asyncio.get_running_loop().create_task(self._recover())
        await asyncio.shield(self._recovery)  # every line waits until an earlier run's batches are known
        if self.settings.deadline is not None and self._planner is None:
            self._planner = asyncio.get_running_loop().create_task(self._plan())
        saving = self._saving.get(custom_id)
        if saving is not None:  # its batch's answer is on its way to the journal
            await asyncio.shield(saving)
        saved, held = self._journal.line_state(custom_id)
        if saved is not None:  # answered by a batch of an earlier send (parked, or an earlier run)
            try:
                return self._reply(saved[0], saved[1], read_back=True)
            except SluiceError as exc:
                if saved[2] in self._collected:  # this run's batch refused the request itself: its verdict
                    exc.read_back = True
                    raise
                # an earlier run's verdict, recorded then: asked again (--retry-failed), it goes to a new batch
        if self.parks:
            self._park_if_held(custom_id, held)
            await self._gather_parked(custom_id, request, held)
        answer = self._waiting.get(custom_id)  # in a batch being followed: it waits for it, moved or not
        if answer is None:
            self._check_moved(custom_id, held)
            answer = self._add(custom_id, request).waiting[custom_id]
        got = await asyncio.shield(answer)  # a cancelled send leaves the batch's answer for the rerun
        return self._reply(*got)

    def _check_moved(self, custom_id: str, held: Chunk | None) -> None:
        """A line not in a batch, once the deadline has moved the job: it goes synchronously."""
        if self.moved:
            maybe = held is not None and held.id in self._running_at_move
            if maybe:  # if its batch answers it after all, it was answered twice
                self._moved_ids.add(custom_id)
            raise MovedToSyncError(moved_note(self.settings), maybe_billed=maybe)

    async def _gather_parked(self, custom_id: str, request: Request, held: Chunk | None) -> None:
        """Parking: the line joins the chunk gathering now and leaves memory at once
        (``ParkedError``); its bytes wait for its batch here (see ``_gathering``)."""
        gathering = self._gathering
        while True:
            number = gathering.unsent.get(custom_id)
            if number is not None:  # an identical line's chunk has no batch yet: parked with it
                parked = ParkedError("gathered for a batch", chunk=number, batch_id=None)
                parked.read_back = True
                raise parked
            self._check_moved(custom_id, held)
            if gathering.has_room:
                break
            await gathering.room()  # the chunks before it are being uploaded
        raise ParkedError("gathered for a batch", chunk=self._add(custom_id, request).number, batch_id=None)

    # -- parking ---------------------------------------------------------------------------

    def _park_if_held(self, custom_id: str, held: Chunk | None) -> None:
        """Raise the line's outcome if it has one without a new batch: parked again when a
        batch still holds it (``held``: its chunk); its error when batches failed it for
        good or too often."""
        failed = self._unanswered.get(custom_id)
        if failed is not None and failed[0] >= _MAX_SUBMISSIONS:
            if self.settings.deadline is not None:  # --tier auto: the model answers it synchronously
                raise MovedToSyncError(f"sent synchronously: {failed[1].message}", maybe_billed=False)
            error = copy.copy(failed[1])  # a fresh one each time: one instance raised again grows its traceback
            error.read_back = True
            raise error
        if held is None or held.id in self._running_at_move:  # moved as possibly billed there: not parked
            return
        if held.status == "submitted" and held.batch_id is not None:
            self._chunk_of.setdefault(held.batch_id, held.id)
            parked = self._parked(held.batch_id)
            parked.read_back = True  # it joins a batch sent before: nothing is sent now
            raise parked

    def _parked(self, batch_id: str) -> ParkedError:
        chunk = self._gathering.number_of(self._chunk_of[batch_id])
        return ParkedError(f"waiting in batch {batch_id}", chunk=chunk, batch_id=batch_id)

    def _chunk_over(self, chunk: int, failed: dict[str, SluiceError], error: SluiceError | None = None) -> None:
        """Parking: the chunk's batch is over; its lines that have no journalled outcome
        are counted (a later batch takes them, up to ``_MAX_SUBMISSIONS``; ``error``: none
        does, and each may have been billed) and the job is told to ask its lines again."""
        if error is not None:  # maybe billed: each hold is settled when its line is asked again
            failed = dict.fromkeys(self._journal.chunk_ids(chunk), error)
        self._lines_over(self._gathering.number_of(chunk), failed, maybe_billed=error is not None)

    def _not_created(self, filling: Filling, error: SluiceError) -> None:
        """Parking: ``filling``'s batch was never created (its upload or create failed): none
        of its lines was billed; asked again, each goes in a later batch, or fails with
        ``error`` when it is not one to try again."""
        self._gathering.released(filling)
        final = not (isinstance(error, ProviderError) and error.retryable)
        self._lines_over(filling.number, dict.fromkeys(filling.ids, error), final=final)

    def _lines_over(
        self, number: int, failed: dict[str, SluiceError], *, maybe_billed: bool = False, final: bool = False
    ) -> None:
        """The lines parked under ``number`` are due; ``failed`` have no journalled outcome."""
        if not maybe_billed and self.on_settled is not None:
            for custom_id in failed:  # not answered there, so not billed: asked again, it reserves afresh
                self.on_settled(custom_id, None)
        for custom_id, why in failed.items():
            given_up = maybe_billed or final
            times = _MAX_SUBMISSIONS if given_up else self._unanswered.get(custom_id, (0, why))[0] + 1
            if times >= _MAX_SUBMISSIONS and not given_up:
                why = FatalProviderError(f"{times} batches did not answer it; the last: {why.message}")
            self._unanswered[custom_id] = (times, why)
        assert self.settings.on_ended is not None
        self.settings.on_ended(number)

    async def aclose(self) -> None:
        """Stop polling (the provider's batches keep running: a rerun collects them)."""
        if self._planner is not None:
            self._planner.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._gathering.take()  # its timer stopped
        await self._inner.aclose()
        await self._transport.aclose()

    # -- chunks ----------------------------------------------------------------------------

    def _add(self, custom_id: str, request: Request) -> Filling:
        """The line joins the chunk gathering now (not parking: with its answer to wait for)."""
        api = self._api_ready()
        line = api.line(custom_id, api.body_of(request))
        filling = self._gathering.filling
        if filling.ids and (len(filling.ids) >= self._max_lines or filling.size + len(line) > self._max_bytes):
            self._submit_filling()
            filling = self._gathering.filling
        filling.lines.append(line)
        filling.ids.append(custom_id)
        if self.parks:
            self._gathering.unsent[custom_id] = filling.number
        else:
            filling.waiting[custom_id] = asyncio.get_running_loop().create_future()
        filling.size += len(line)
        filling.tokens += self._inner.estimate_tokens(request, self._real)
        if len(filling.ids) >= self._max_lines:
            self._submit_filling()
        else:
            if filling.timer is not None:
                filling.timer.cancel()
            filling.timer = asyncio.get_running_loop().call_later(self.settings.linger, self._submit_filling)
        return filling

    def _submit_filling(self) -> None:
        filling = self._gathering.take()
        if filling.ids:
            self._waiting.update(filling.waiting)
            if self.parks:
                self._gathering.uploading(filling)
            self._spawn(self._submit(filling))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, filling: Filling) -> None:
        api = self._api_ready()
        lines, waiting, tokens, count = filling.lines, filling.waiting, filling.tokens, len(filling.ids)
        chunk: int | None = None
        batch_id: str | None = None
        created = False
        try:
            chunk = await self._journal.new_chunk(self._real.label, filling.ids)
            self._gathering.uploading(filling, chunk)
            refusals = 0
            while True:
                if self.moved:  # the deadline moved its lines before it was created: none was billed
                    await self._journal.note_batch(chunk, None, "abandoned")
                    self._fail(waiting, MovedToSyncError(moved_note(self.settings), maybe_billed=False))
                    if self.parks:  # asked again, they go synchronously
                        self._gathering.released(filling)
                        self._chunk_over(chunk, {})
                    return
                batch = await api.submit(lines, self._tags(chunk), count=count)
                batch_id = str(batch["id"])
                await self._journal.note_batch(chunk, batch_id, "submitted")
                self.batches[batch_id] = api.status(batch)
                self._followed[batch_id] = waiting
                if self.parks:  # journalled: its parked lines are found there now; the file's bytes go
                    self._chunk_of[batch_id] = chunk
                    self._gathering.released(filling)
                    created = True
                    lines = []
                if self.moved:  # created as the deadline moved its lines: it must not answer them too
                    await self._cancel_quietly(batch_id)
                final = await self._follow(batch)
                if not api.token_limited(final):
                    api.forget(str(chunk))
                    break
                refusals += 1
                del self._followed[batch_id]
                limit = _enqueued_limit(api.why_unanswered(final))
                if limit is not None and tokens > limit:
                    raise FatalProviderError(
                        f"{self._real.label}: this batch holds about {tokens:,} tokens, above the provider's "
                        f"enqueued-token limit of {limit:,}: lower --batch-size and rerun"
                    )
                await self._journal.note_batch(chunk, None, "submitting")
                await self._wait_for_room(refusals)
            await self._collect(chunk, final, waiting)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every line hears why; the engine decides about retries
            error = exc if isinstance(exc, SluiceError) else BatchIncompleteError(f"the batch failed: {exc}")
            self._fail(waiting, error)
            if batch_id is not None:
                self._followed.pop(batch_id, None)
            if chunk is not None:
                self._api_ready().forget(str(chunk))
            if self.parks and not created:  # its lines were parked, their batch never made
                self._not_created(filling, error)
            elif self.parks and chunk is not None:  # they hear it when asked again
                self._chunk_over(chunk, {}, error)

    def _tags(self, chunk: int) -> dict[str, str]:
        self._api_ready()
        return {"sluice_job": str(self._job), "sluice_chunk": str(chunk)}

    async def _follow(self, batch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Poll the batch until it ends; its last state."""
        api = self._api_ready()
        batch_id = str(batch["id"])
        polls = Polls(self.settings.poll_every)  # soon when it should be about to end (see _polling)
        loop = asyncio.get_running_loop()
        while not api.ended(batch):
            if self.moved:  # cancelled by the deadline: its lines wait for it
                await asyncio.sleep(min(self.settings.poll_every, _HURRIED))
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), polls.wait(loop.time(), api.progress(batch)))
            try:
                batch = await api.retrieve(batch_id)
            except ProviderError as exc:
                if not exc.retryable:
                    raise
                # never given up while it may be running: its lines sent again would be billed twice
                _log.warning("batch %s could not be read (%s); trying again", batch_id, exc.message)
                continue
            self.batches[batch_id] = api.status(batch)
        if not api.token_limited(batch):  # a refused batch never ran: it frees no room
            self._ended.set()
            self._ended = asyncio.Event()
        return batch

    async def _wait_for_room(self, refusals: int) -> None:
        """Refused for the enqueued-token limit: wait until one of the job's batches ends
        (or, with none of them running, a while that doubles: another job's may hold the
        queue). Refused ``_MAX_REFUSALS`` times in a row: the chunk cannot fit."""
        if refusals >= _MAX_REFUSALS:
            raise FatalProviderError(
                f"{self._real.label}: the provider refused this batch {refusals} times for its enqueued-token "
                "limit; the batch alone may exceed it: lower --batch-size (or wait for other batches) and rerun"
            )
        running = any(status not in _ENDED for status in self.batches.values())
        wait = min(max(self.settings.poll_every, 1.0) * 2**refusals, 600.0)
        wakes = [asyncio.ensure_future(self._hurry.wait())]  # the deadline's move: its lines go
        if running:
            wakes.append(asyncio.ensure_future(self._ended.wait()))
        try:
            await asyncio.wait(wakes, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wake in wakes:
                wake.cancel()

    async def _collect(self, chunk: int, batch: Mapping[str, Any], waiting: dict[str, _Answer]) -> None:
        """Read an ended batch's result files: answers journalled, then handed to their lines;
        failures handed to theirs; a line with neither is told the batch did not answer it.

        A download that fails on the way is started again (the batch answered, and was
        billed for, its lines: they must not go out again); one the provider refuses (the
        file is gone) fails the rest as possibly billed, not to be resent by this run."""
        api = self._api_ready()
        batch_id = str(batch["id"])
        status = api.status(batch)
        delay = 1.0
        failed: dict[str, SluiceError] = {}  # parking: lines with no journalled outcome
        seen: set[str] = set()  # parking: lines the result files named
        while True:
            try:
                answered: list[tuple[str, bytes, Any]] = []
                async for custom_id, ok, line, item in api.results(batch):
                    if ok or self.parks:  # parked lines' failures are journalled too (the request's own)
                        if self.parks:
                            seen.add(custom_id)
                        answered.append((custom_id, line, item))
                        if len(answered) >= 1000:
                            await self._hand_out(chunk, batch_id, answered, waiting, failed)
                            answered = []
                    else:
                        self._resolve(waiting, custom_id, (batch_id, line))
                await self._hand_out(chunk, batch_id, answered, waiting, failed)
                break
            except NotFoundError as exc:  # the file is gone: the rest are lost, possibly billed
                lost = BatchResultsLostError(f"batch {batch_id}'s results could not be read: {exc.message}")
                self._fail(waiting, lost)
                await self._journal.note_batch(chunk, batch_id, "collected")
                self._collected.add(chunk)
                if self.parks:
                    self._chunk_over(chunk, {}, lost)
                return
            except ProviderError as exc:
                if not exc.retryable:
                    raise  # a key or permission problem: the batch stays recorded, a rerun collects it
                _log.warning("the results of batch %s could not be read (%s); trying again", batch_id, exc.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
        why = api.why_unanswered(batch)
        for custom_id in [c for c, answer in waiting.items() if not answer.done()]:
            unanswered = BatchIncompleteError(f"batch {batch_id} {status}: {why}")
            self._resolve(waiting, custom_id, None, self._again_or_moved(custom_id, unanswered))
        self._followed.pop(batch_id, None)
        if self.parks:
            unanswered = BatchIncompleteError(f"batch {batch_id} {status}: {why}")
            for custom_id in self._journal.chunk_ids(chunk):
                if custom_id not in seen:
                    failed[custom_id] = unanswered
        await self._journal.note_batch(chunk, batch_id, "collected")
        self._collected.add(chunk)
        if self.parks:
            self._chunk_over(chunk, failed)

    async def _hand_out(
        self,
        chunk: int,
        batch_id: str,
        answered: list[tuple[str, bytes, Any]],
        waiting: dict[str, _Answer],
        failed: dict[str, SluiceError],
    ) -> None:
        """Journal the answers (parking: and the request's own failures), then tell their lines.

        A failure that is not the request's (a 5xx or 429 inside the batch, a 200 that
        cannot be read) is not kept: the line goes in a later batch (parking: in ``failed``)."""
        if not answered:
            return
        usable = []
        billed: list[tuple[str, Usage]] = []  # parking: what each kept line cost there
        api, kind = self._api_ready(), self._real.provider_name
        for custom_id, line, item in answered:
            try:  # read once (the line was decoded on download); the API's reader says why it is not an answer
                reply = item_reply(kind, item, self._inner) or api.reply(batch_id, line)
            except SluiceError as exc:  # not kept: a rerun must be able to ask again
                if self.parks and not (isinstance(exc, ProviderError) and exc.retryable):
                    usable.append((custom_id, line))  # the request's own: asked again, it gets this
                    billed.append((custom_id, Usage()))
                elif self.parks:
                    failed[custom_id] = exc
                self._resolve(waiting, custom_id, None, self._again_or_moved(custom_id, exc), answered=True)
            else:
                usable.append((custom_id, line))
                billed.append((custom_id, reply.usage))
                if custom_id in self._moved_ids:  # parked, moved by the deadline, and answered here too
                    self.answered_after_move.add(custom_id)
        saving: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for custom_id, _ in usable:
            self._saving[custom_id] = saving
        try:
            await self._journal.save_batch_results(chunk, batch_id, usable)  # durable before anyone is told
        finally:
            for custom_id, _ in usable:
                if self._saving.get(custom_id) is saving:
                    del self._saving[custom_id]
            saving.set_result(None)  # a failed save: the lines asked meanwhile find no answer, as before
        if self.parks and self.on_settled is not None:  # kept: asked again, each is answered from it
            for custom_id, usage in billed:
                self.on_settled(custom_id, usage)
        for custom_id, line in usable:
            self._resolve(waiting, custom_id, (batch_id, line), answered=True)

    def _resolve(
        self,
        waiting: dict[str, _Answer],
        custom_id: str,
        outcome: tuple[str, bytes] | None,
        error: BaseException | None = None,
        *,
        answered: bool = False,
    ) -> None:
        answer = waiting.get(custom_id)
        if answer is not None and self._waiting.get(custom_id) is answer:
            del self._waiting[custom_id]
        if answer is None or answer.done():
            if answered and answer is not None and isinstance(answer.exception(), MovedToSyncError):
                self.answered_after_move.add(custom_id)  # the batch answered (and billed) a line already moved
            return
        if error is not None:
            answer.set_exception(error)
        else:
            assert outcome is not None
            answer.set_result(outcome)

    def _fail(self, waiting: dict[str, _Answer], error: BaseException) -> None:
        for custom_id in list(waiting):
            self._resolve(waiting, custom_id, None, error)

    def _again_or_moved(self, custom_id: str, error: SluiceError) -> SluiceError:
        """What a line in memory hears when its batch did not answer it for a reason not its
        own: the error (the engine tries it again), unless the deadline has moved the job or
        (under a deadline) batches have failed it ``_MAX_SUBMISSIONS`` times: then it goes
        synchronously, not billed here."""
        if self.parks or not (isinstance(error, ProviderError) and error.retryable):
            return error
        if self.moved:
            return MovedToSyncError(moved_note(self.settings), maybe_billed=False)
        if self.settings.deadline is None:
            return error
        times = self._unanswered.get(custom_id, (0, error))[0] + 1
        self._unanswered[custom_id] = (times, error)
        if times < _MAX_SUBMISSIONS:
            return error
        del self._unanswered[custom_id]
        return MovedToSyncError(f"sent synchronously: {times} batches did not answer it; the last: {error.message}")

    def _take_filling(self) -> dict[str, _Answer]:
        """The lines gathering for the next chunk, taken out of it (the deadline moves them;
        parked ones are asked again, and go synchronously then)."""
        filling = self._gathering.take()
        if self.parks and filling.ids:
            self._gathering.released(filling)
            self._lines_over(filling.number, {})
        return filling.waiting

    # -- a line's outcome ------------------------------------------------------------------

    @property
    def real_label(self) -> str:
        """The label of the deployment whose Batch API this is (its chunks' in the journal)."""
        return self._real.label

    def read_back(self, line: bytes) -> Reply | None:
        """The answer a result line holds, read in one pass (see ``_readback``); None when it
        holds none that reads plainly (``_reply`` says why)."""
        return plain_reply(self._real.provider_name, line, self._inner)

    def _reply(self, batch_id: str, line: bytes, *, read_back: bool = False) -> Reply:
        reply = self.read_back(line) or self._api_ready().reply(batch_id, line)  # the API's says why
        return Reply(
            reply.text, reply.usage, reply.raw, reply.finish_reason, reply.request_id, None, batch_id, read_back
        )

    async def _cancel_quietly(self, batch_id: str) -> None:
        try:
            batch = await self._api_ready().cancel(batch_id)
            self.batches[batch_id] = self._api_ready().status(batch)
        except ProviderError as exc:
            _log.warning("could not cancel batch %s (%s)", batch_id, exc.message)

    # -- crash recovery --------------------------------------------------------------------

    def _api_ready(self) -> BatchAPI:
        if self._api is None:
            self._api = self._api_kind(self._inner, self._real, self._transport.session())
            self._job = self._journal.batch_job_id()
        return self._api

    def __repr__(self) -> str:
        return f"BatchTier({self._real.label!r})"


def _enqueued_limit(message: str) -> int | None:
    """The limit OpenAI names in a ``token_limit_exceeded`` message ("Limit: 2,000,000
    enqueued tokens"), if it names one."""
    found = re.search(r"Limit:\s*([\d,]+)\s*enqueued", message)
    return int(found.group(1).replace(",", "")) if found else None


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)
