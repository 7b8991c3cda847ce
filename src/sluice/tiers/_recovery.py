"""Crash recovery and ``sluice cancel`` of a batch tier (:class:`Recovery`, a part of
:class:`~sluice.tiers.BatchTier`): the batches an earlier run submitted and did not
collect are followed (their lines wait for them, or are parked on them), and found by
their tags when a crash kept their id from the journal."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import BatchIncompleteError, NotFoundError, ProviderError, SluiceError

if TYPE_CHECKING:
    from .._models import Deployment
    from ._api import BatchAPI
    from ._settings import BatchJournal

__all__ = ["Recovery"]

_log = logging.getLogger("sluice")

_Answer = asyncio.Future[tuple[str, bytes]]


class Recovery:
    """What an earlier run left at the provider (see the module docstring)."""

    parks: bool
    batches: dict[str, str]
    _real: Deployment
    _journal: BatchJournal
    _waiting: dict[str, _Answer]
    _followed: dict[str, dict[str, _Answer]]
    _following: set[int]
    _chunk_of: dict[str, int]

    def _api_ready(self) -> BatchAPI:
        raise NotImplementedError

    def _tags(self, chunk: int) -> dict[str, str]:
        raise NotImplementedError

    def _spawn(self, work: Any) -> None:
        raise NotImplementedError

    async def _follow(self, batch: Mapping[str, Any]) -> Mapping[str, Any]:
        raise NotImplementedError

    async def _collect(self, chunk: int, batch: Mapping[str, Any], waiting: dict[str, _Answer]) -> None:
        raise NotImplementedError

    def _fail(self, waiting: dict[str, _Answer], error: BaseException) -> None:
        raise NotImplementedError

    def _chunk_over(self, chunk: int, failed: dict[str, SluiceError], error: SluiceError | None = None) -> None:
        raise NotImplementedError

    async def cancel_open(self) -> list[tuple[str, str]]:
        """``sluice cancel``: cancel this deployment's batches an earlier run left running;
        (batch, status or what went wrong) for each. A batch whose id a crash kept from
        being written is found by its tags; with a provider that cannot tag (Anthropic)
        it cannot be told from another job's, so it is reported, not cancelled. What the
        batches finished stays collectable: a rerun keeps it."""
        api = self._api_ready()
        done: list[tuple[str, str]] = []
        chunks = self._journal.open_chunks(self._real.label)
        for chunk in chunks:
            if chunk.batch_id is not None:
                done.append((chunk.batch_id, await self._cancel_one(chunk.batch_id)))
        for chunk in chunks:
            if chunk.batch_id is not None:
                continue
            if not api.tags_batches:
                done.append((f"(batch {chunk.id}, not recorded)", "not identifiable without tags; not cancelled"))
                continue
            found = await api.find(self._tags(chunk.id), since=chunk.created_at, lines=len(chunk.custom_ids))
            if found is not None:
                await self._journal.note_batch(chunk.id, str(found["id"]), "submitted")
                done.append((str(found["id"]), await self._cancel_one(str(found["id"]))))
        return done

    async def _cancel_one(self, batch_id: str) -> str:
        api = self._api_ready()
        try:
            batch = await api.retrieve(batch_id)
            if api.ended(batch) or api.status(batch) in ("cancelling", "canceling"):
                return api.status(batch)
            return api.status(await api.cancel(batch_id))
        except ProviderError as exc:
            return f"not cancelled: {exc.message}"

    async def _recover(self) -> None:
        """Once, before the first line: follow the batches an earlier run submitted and did
        not collect, so their lines wait for them instead of going out again. Safe to run
        again after a failure: a chunk already followed is not followed twice."""
        api = self._api_ready()
        chunks = [c for c in self._journal.open_chunks(self._real.label) if c.id not in self._following]
        recorded: dict[int, Mapping[str, Any]] = {}
        for chunk in chunks:  # first: none of these is taken for an unrecorded chunk's batch
            if chunk.batch_id is None:
                continue
            try:
                recorded[chunk.id] = await api.retrieve(chunk.batch_id)
            except NotFoundError as exc:  # gone (purged, another project): only then given up
                await self._journal.note_batch(chunk.id, chunk.batch_id, "abandoned")
                _log.warning(
                    "batch %s (%d lines) of an earlier run cannot be read (%s); its lines are sent again",
                    chunk.batch_id,
                    len(chunk.custom_ids),
                    exc.message,
                )
        for chunk in chunks:
            batch: Mapping[str, Any] | None = recorded.get(chunk.id)
            if batch is None and chunk.batch_id is not None:
                continue  # abandoned above
            if batch is None:  # journalled, maybe uploaded and created, but its id never recorded
                batch = await api.find(self._tags(chunk.id), since=chunk.created_at, lines=len(chunk.custom_ids))
                if batch is None:
                    await self._journal.note_batch(chunk.id, None, "abandoned")  # sent afresh
                    if not api.tags_batches:
                        _log.warning(
                            "batch %d (%d lines) may have been created before a crash; %s batches carry no "
                            "tags and none matched it for sure, so its lines are submitted again (if it exists, "
                            "those lines may be billed twice)",
                            chunk.id,
                            len(chunk.custom_ids),
                            self._real.provider_name,
                        )
                    continue
                await self._journal.note_batch(chunk.id, str(batch["id"]), "submitted")
                _log.info("found batch %s of chunk %d at the provider (its id was not recorded)", batch["id"], chunk.id)
            batch_id = str(batch["id"])
            if self.parks:  # its lines are parked when asked (the journal says where)
                self._chunk_of[batch_id] = chunk.id
                self.batches[batch_id] = api.status(batch)
                self._followed[batch_id] = {}  # followed (the deadline waits for it): no line in memory
                self._following.add(chunk.id)
                self._spawn(self._resume(chunk.id, batch, {}))
                continue
            loop = asyncio.get_running_loop()
            waiting: dict[str, _Answer] = {custom_id: loop.create_future() for custom_id in chunk.custom_ids}
            for answer in waiting.values():
                answer.add_done_callback(_quiet)
            self._waiting.update(waiting)
            self.batches[batch_id] = api.status(batch)
            self._followed[batch_id] = waiting
            self._following.add(chunk.id)
            self._spawn(self._resume(chunk.id, batch, waiting))

    async def _resume(self, chunk: int, batch: Mapping[str, Any], waiting: dict[str, _Answer]) -> None:
        try:
            final = await self._follow(batch)
            await self._collect(chunk, final, waiting)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc if isinstance(exc, SluiceError) else BatchIncompleteError(str(exc))
            self._fail(waiting, error)
            self._followed.pop(str(batch["id"]), None)
            if self.parks:
                self._chunk_over(chunk, {}, error)


def _quiet(answer: asyncio.Future[Any]) -> None:
    """A recovered line nobody asks for again (its answer was stored): no 'never retrieved'."""
    if not answer.cancelled():
        answer.exception()
