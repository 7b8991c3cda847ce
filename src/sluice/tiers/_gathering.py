"""The batch tier's lines gathering into chunks, and the chunks on their way to becoming
provider batches (:class:`Gathering`).

A chunk gathers lines until it is full (``max_lines`` or ``max_bytes``), or no line has
come for ``linger`` seconds; then the tier submits it. When the tier parks lines (see
``ParkedError``), a line leaves the engine as soon as it has joined a chunk: what stays
is its body's bytes, here, until its batch is created. So that those stay bounded
whatever the job's size, a line waits to join while ``_UPLOADS`` chunks are being
uploaded (the engine's room bounds the lines that wait so).

Each chunk has a *number*, the name its parked lines go by until their batch is over
(``BatchSettings.on_ended``): a chunk's journal id comes only once it is journalled, and
a chunk of an earlier run's journal gets a number when one of its lines is parked.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

__all__ = ["Filling", "Gathering"]

#: Chunks of parked lines being uploaded (journalled, their batch not created yet) before
#: a line waits to join the next one: their bytes are what a parking job keeps of its lines.
_UPLOADS = 2


@dataclass(slots=True, eq=False)
class Filling:
    """One chunk's lines, gathering and then on their way up."""

    number: int
    lines: list[bytes] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    #: Not parking: each line's answer, by custom id (its ``send`` waits for it).
    waiting: dict[str, asyncio.Future[tuple[str, bytes]]] = field(default_factory=dict)
    size: int = 0
    tokens: int = 0
    timer: asyncio.TimerHandle | None = None
    #: Handed to the tier to submit, and not yet created or given up.
    uploading: bool = False


class Gathering:
    """The chunk gathering now, the parked lines of chunks not yet created, and the numbers."""

    __slots__ = ("_by_chunk", "_numbers", "_room", "filling", "unsent", "uploads")

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self.filling = Filling(next(self._numbers))
        #: Parking: the custom ids of lines whose chunk has no batch yet, and its number (an
        #: identical line asked meanwhile is parked with it, not put in a second batch).
        self.unsent: dict[str, int] = {}
        #: Chunks handed to the tier and not yet created or given up.
        self.uploads = 0
        self._room = asyncio.Event()
        self._by_chunk: dict[int, int] = {}

    def take(self) -> Filling:
        """The chunk gathering now, taken out (its timer stopped); a new one gathers."""
        filling, self.filling = self.filling, Filling(next(self._numbers))
        if filling.timer is not None:
            filling.timer.cancel()
        return filling

    def uploading(self, filling: Filling, chunk: int | None = None) -> None:
        """``filling`` goes to be submitted (``chunk``: and is journalled as that chunk)."""
        if chunk is not None:
            self._by_chunk[chunk] = filling.number
        elif not filling.uploading:
            filling.uploading = True
            self.uploads += 1

    def released(self, filling: Filling) -> None:
        """``filling``'s batch is created (its lines are found in the journal from now on),
        or it was given up: its lines leave ``unsent``, its bytes go, the next may gather."""
        for custom_id in filling.ids:
            if self.unsent.get(custom_id) == filling.number:
                del self.unsent[custom_id]
        filling.lines = []
        if filling.uploading:
            filling.uploading = False
            self.uploads -= 1
            self._room.set()
            self._room = asyncio.Event()

    @property
    def has_room(self) -> bool:
        return self.uploads < _UPLOADS

    async def room(self) -> None:
        """Until a chunk being uploaded is created or given up."""
        await self._room.wait()

    def number_of(self, chunk: int) -> int:
        """The number the lines of the journal's ``chunk`` are parked under."""
        number = self._by_chunk.get(chunk)
        if number is None:
            number = self._by_chunk[chunk] = next(self._numbers)
        return number
