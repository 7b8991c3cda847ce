"""Lines of a ``--tier batch`` job that wait in provider batches, out of memory.

A line whose batch has been created and journalled leaves the engine (``ParkedError``):
only its number is kept here, under the journal's chunk that holds it. When the tier
says a chunk has ended (its lines' outcomes are journalled), its lines become due, and
the job reads them from the input again: the engine then answers each from the journal
at once (or submits it again, if the batch left it unanswered). So the lines waiting at
the provider at once are bounded by its queue, not by this process's memory (8 bytes a
line here, due or not; a set of a wave's lines, about one chunk's, while it is read).
"""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections.abc import Callable

__all__ = ["ParkedLines"]

#: Lines handed out to be read again at once (whole chunks' worth, unless one is bigger).
_WAVE = 10_000


class ParkedLines:
    """Parked line numbers by chunk, and those due to be read again."""

    __slots__ = ("_by_chunk", "_changed", "_due", "_due_lines", "_ended", "_more", "_once", "parked")

    def __init__(self) -> None:
        self._by_chunk: dict[int, array[int]] = {}
        self._ended: set[int] = set()  # chunks over: a line parked on one (a late report) is due at once
        self._due: list[array[int]] = []  # the lines of chunks over, in the order they ended
        self._due_lines = 0
        self._changed = asyncio.Event()
        #: Lines parked at least once (a bit each), and how often those parked again were.
        self._once = bytearray()
        self._more: dict[int, int] = {}
        #: Lines parked in chunks that have not ended yet.
        self.parked = 0

    @property
    def waiting(self) -> int:
        """Lines at the provider or due to be read again: not written yet, not in the engine."""
        return self.parked + self._due_lines

    @property
    def due(self) -> bool:
        """Whether lines are due to be read again."""
        return bool(self._due)

    def take_due(self) -> set[int]:
        """The lines of the chunks that ended first, about ``_WAVE`` of them."""
        taken: set[int] = set()
        while self._due and (not taken or len(taken) + len(self._due[0]) <= _WAVE):
            lines = self._due.pop(0)
            self._due_lines -= len(lines)
            taken.update(lines)
        return taken

    def _make_due(self, lines: array[int]) -> None:
        if self._due and len(lines) < 64 and len(self._due[-1]) < _WAVE:  # a late line: with the last
            self._due[-1].extend(lines)
        else:
            self._due.append(lines)
        self._due_lines += len(lines)

    def park(self, chunk: int, line: int) -> None:
        byte, bit = divmod(line, 8)
        if byte >= len(self._once):
            self._once.extend(bytes(byte - len(self._once) + 4096))
        if self._once[byte] & (1 << bit):
            self._more[line] = self._more.get(line, 1) + 1
        self._once[byte] |= 1 << bit
        if chunk in self._ended:
            self._make_due(array("q", (line,)))
        else:
            self._by_chunk.setdefault(chunk, array("q")).append(line)
            self.parked += 1
        self._changed.set()

    def times(self, line: int) -> int:
        """How many batches took ``line`` (0: never parked)."""
        byte, bit = divmod(line, 8)
        if byte >= len(self._once) or not self._once[byte] & (1 << bit):
            return 0
        return self._more.get(line, 1)

    def ended(self, chunk: int) -> None:
        """The tier's ``on_ended``: the chunk's lines are due."""
        self._ended.add(chunk)
        lines = self._by_chunk.pop(chunk, None)
        if lines is not None:
            self._make_due(lines)
            self.parked -= len(lines)
        self._changed.set()

    def nudge(self) -> None:
        """Something the wait below looks at changed (the engine emptied, a stop)."""
        self._changed.set()

    async def changed(self) -> None:
        """Until the next :meth:`nudge`, :meth:`park` or :meth:`ended` (a second at most)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), 1.0)

    async def next_due(self, idle: Callable[[], bool], stopping: Callable[[], bool]) -> set[int]:
        """The lines due now, once there are any; empty when none can come (nothing is
        parked and ``idle()``: the engine holds no line that could still park) or on a stop."""
        while True:
            if stopping():
                return set()
            if self._due:
                return self.take_due()
            if not self.parked and idle():
                return set()
            await self.changed()  # a stop is looked at every second
