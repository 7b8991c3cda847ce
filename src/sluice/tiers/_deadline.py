"""``--tier auto``: the deadline's plan of a batch tier (:class:`DeadlinePlan`, a part of
:class:`~sluice.tiers.BatchTier`).

Keep to the batch while the model's synchronous limits could still answer what is left
before the deadline, with a margin; then *move*: a line not in a created batch goes
synchronously at once, and the batches are cancelled. A line of a cancelled batch waits
for its batch to end: what the batch answered (and billed) is that line's answer; the
rest go synchronously, billed once. The wait may use the margin: if the batches have not
ended by the last moment (what is left could only just be answered synchronously, with
no margin but the 15 %), their lines go anyway, counted at their worst case (a batch may
still bill them); a batch that then answers one of them answered it twice.

A move must be able to help: when what is left would take longer synchronously than a
batch's own window (24 h, OpenAI's and Anthropic's), sync would finish after the batch
at its latest, at twice the price, so the plan keeps to the batch until the rate it
knows makes sync the quicker way. (At 1 request a second, the rate assumed when no
``rpm`` is given, a 200,000-line job moved at once under a day's deadline, where a
50,000-line job kept to the batch.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .._errors import MovedToSyncError, SluiceError

if TYPE_CHECKING:
    from ._settings import BatchSettings

__all__ = ["DeadlinePlan", "moved_note"]

_log = logging.getLogger("sluice")

#: Seconds a provider batch may take (OpenAI's ``completion_window``, Anthropic's expiry).
BATCH_WINDOW = 24 * 3600.0

#: The batch statuses after which nothing more is answered.
_ENDED = ("completed", "failed", "expired", "cancelled", "ended")


def moved_note(settings: BatchSettings) -> str:
    """Why a line was sent synchronously, as its record says."""
    deadline = settings.deadline
    at = time.strftime("%H:%M:%S", time.localtime(deadline)) if deadline is not None else "none"
    return f"sent synchronously: a batch could not answer it by the deadline (deadline {at})"


class DeadlinePlan:
    """The deadline's plan (see the module docstring); :class:`BatchTier` is one."""

    settings: BatchSettings
    moved: bool
    parks: bool
    batches: dict[str, str]
    _waiting: dict[str, asyncio.Future[tuple[str, bytes]]]
    _followed: dict[str, dict[str, asyncio.Future[tuple[str, bytes]]]]
    _chunk_of: dict[str, int]
    _collected: set[int]
    _running_at_move: set[int]
    _hurry: asyncio.Event

    def _take_filling(self) -> dict[str, asyncio.Future[tuple[str, bytes]]]:
        raise NotImplementedError

    def _fail(self, waiting: dict[str, asyncio.Future[tuple[str, bytes]]], error: BaseException) -> None:
        raise NotImplementedError

    def _chunk_over(self, chunk: int, failed: dict[str, SluiceError]) -> None:
        raise NotImplementedError

    async def _cancel_quietly(self, batch_id: str) -> None:
        raise NotImplementedError

    async def _plan(self) -> None:
        """Move when the time left needs it; then wait for the cancelled batches to end,
        until the last moment."""
        tick = min(self.settings.poll_every, 1.0)
        slower_noted = False
        while not self.moved:
            if self._short_of_time(margin=True):
                if self._sync_time() < BATCH_WINDOW:
                    await self._move_to_sync()
                    continue
                if not slower_noted:  # sync would end after the batch at its latest: no help
                    slower_noted = True
                    _log.warning(
                        "the deadline cannot be met synchronously at %g requests a second (give --rpm); "
                        "keeping to the batch, which answers within its 24 h window",
                        self.settings.sync_rate,
                    )
            await asyncio.sleep(tick)
        while self._followed:  # cancelled batches not collected yet: their lines wait for them
            if self._short_of_time(margin=False):
                self._give_up()
                return
            await asyncio.sleep(tick)

    def _short_of_time(self, *, margin: bool) -> bool:
        """Whether what is left could only just be answered synchronously before the
        deadline, at the model's rate with a 15 % margin (and ``margin``: 5 s or two polls
        more, the time a cancel has to land)."""
        settings = self.settings
        assert settings.deadline is not None
        if not self._left():
            return False
        needed = self._sync_time() + (max(5.0, 2 * settings.poll_every) if margin else 0.0)
        return time.time() + needed >= settings.deadline

    def _left(self) -> int:
        settings = self.settings
        return settings.remaining() if settings.remaining is not None else len(self._waiting)

    def _sync_time(self) -> float:
        """Seconds what is left takes synchronously, at the model's rate with a 15 % margin."""
        return self._left() / self.settings.sync_rate * 1.15

    async def _move_to_sync(self) -> None:
        """The lines gathering for a chunk go synchronously now (a chunk not created yet
        sends its lines when it sees the move); the batches are cancelled, and their lines
        wait for what the batches answered (see the module docstring)."""
        self.moved = True
        self._hurry.set()  # cancelled batches are looked at every second; a refused create gives up
        _log.warning("the deadline is near: cancelling the batches; the rest goes synchronously")
        self._fail(self._take_filling(), MovedToSyncError(moved_note(self.settings), maybe_billed=False))
        for batch_id, status in list(self.batches.items()):
            if status not in _ENDED:
                await self._cancel_quietly(batch_id)

    def _give_up(self) -> None:
        """The last moment: the lines of cancelled batches that have not ended go
        synchronously now, as possibly billed by their batch."""
        note = moved_note(self.settings)
        _log.warning(
            "%d cancelled batches have not ended by the last moment; their lines go synchronously "
            "(a line they answer too is billed twice)",
            len(self._followed),
        )
        for batch_id, waiting in list(self._followed.items()):
            self._fail(waiting, MovedToSyncError(note, maybe_billed=True))
            chunk = self._chunk_of.get(batch_id)
            if self.parks and chunk is not None and chunk not in self._collected:
                self._running_at_move.add(chunk)  # its lines, asked again, go as possibly billed
                self._chunk_over(chunk, {})
